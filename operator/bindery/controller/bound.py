"""Give capacity back to the RM when a pod Bindery placed goes away.

A committed reservation is an allocation: it lasts until Bindery releases it (contract v1, "when
the pod is gone, Bindery releases"). The Kopf watch sees only unbound pods (`spec.nodeName=`), so
bound pods are followed by a second, narrow watch per scheduler name with the server-side field
selector `spec.schedulerName=<name>,spec.nodeName!=`: the pods this profile placed and nothing
else. When one is deleted or reaches a terminal phase (Succeeded/Failed: it no longer uses its
resources, as kube-scheduler counts it), the reservation named by its `bindery.dev/reservation-id`
annotation is released. Releases are idempotent at the RM, and ids already released by this
process are remembered (bounded) so relists do not repeat them.

Pods that went away while no operator was running are found by the reconciler's passes.

An operator limited to some namespaces (`bindery run --namespace`) lists and watches bound pods in
those namespaces only (one list/watch each, as Kopf does): it has no business, and in a namespaced
install no RBAC, reading pods elsewhere. For the same reason it never releases a committed
reservation of a pod outside its namespaces: that pod is not in its list, not gone.

A watch that ends (timeout, 410 Gone, an error, an apiserver restart) is followed by a relist, and a
pod deleted in the gap is simply absent from the new list: no DELETED event ever comes for it. So
the watcher remembers, per bound pod it saw with a reservation, only (reservation id, node), and
diffs every relist against that: a pod that vanished is treated as DELETED (its reservation is
released with its UID). Entries are pruned on DELETED and terminal phases, so the memory is one
small tuple per running pod Bindery bound. After every relist `on_relist` is called, so that the
ResourceManager's reconciler runs a pass for what no watch can tell (see
`bindery.controller.reconcile`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from bindery.rm.errors import RMError, RMPodMismatch
from bindery.scheduling.framework import RESERVATION_ANNOTATION, ReservationClient

TERMINAL_PHASES = ("Succeeded", "Failed")
REMEMBERED_RELEASES = 10_000
#: Explicit bound on one LIST of bound pods (thousands of pods take a while on a busy apiserver).
LIST_TIMEOUT_SECONDS = 60.0
Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


def bound_pods_selector(*, scheduler_name: str) -> str:
    return f"spec.schedulerName={scheduler_name},spec.nodeName!="


async def list_bound_pods(
    *,
    core: client.CoreV1Api,
    scheduler_name: str,
    namespace: str | None,
    within: float = LIST_TIMEOUT_SECONDS,
) -> tuple[list[dict[str, Any]], str]:
    """One LIST of the bound pods of `scheduler_name` (in `namespace`, None = all): items and version.

    Read raw: only a few fields are looked at, and `V1Pod` models would parse every timestamp.
    `within` bounds the whole call.
    """
    selector = bound_pods_selector(scheduler_name=scheduler_name)
    async with asyncio.timeout(within):
        if namespace is None:
            response = await core.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False)
        else:
            response = await core.list_namespaced_pod(
                namespace, field_selector=selector, _preload_content=False
            )
        try:
            document = json.loads(await response.read())
        finally:
            response.release()
    if response.status != 200:
        raise RuntimeError(f"listing bound pods answered HTTP {response.status}: {document.get('message')}")
    items: list[dict[str, Any]] = document.get("items") or []
    return items, str(document["metadata"].get("resourceVersion", ""))


def reservation_to_release(*, event_type: str, pod: Mapping[str, Any]) -> str | None:
    """Pure: the reservation id to release for this watch event of a bound pod, if any."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    reservation_id = annotations.get(RESERVATION_ANNOTATION)
    if not reservation_id:
        return None  # not bound by Bindery (or bound before reservations were annotated)
    phase = (pod.get("status") or {}).get("phase")
    if event_type == "DELETED" or phase in TERMINAL_PHASES:
        return str(reservation_id)
    return None


def seen_entry(*, event_type: str, pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Pure: (reservation id, node) to remember for this event's pod; None to forget it.

    Remembered: a bound pod carrying a reservation, neither deleted nor finished (the only pods whose
    disappearance from a relist must release something).
    """
    reservation_id = ((pod.get("metadata") or {}).get("annotations") or {}).get(RESERVATION_ANNOTATION)
    node = (pod.get("spec") or {}).get("nodeName")
    if not reservation_id or not node or reservation_to_release(event_type=event_type, pod=pod):
        return None
    return str(reservation_id), str(node)


def vanished(
    *, seen: Mapping[str, tuple[str, str]], listed_uids: Collection[str]
) -> dict[str, tuple[str, str]]:
    """Pure: the remembered pods a relist no longer shows: deleted while the watch was down."""
    return {uid: entry for uid, entry in seen.items() if uid not in listed_uids}


def departed_body(*, uid: str, reservation_id: str, node: str) -> dict[str, Any]:
    """Pure: the stand-in DELETED object of a vanished pod (all the watcher knows of it)."""
    return {
        "metadata": {"uid": uid, "annotations": {RESERVATION_ANNOTATION: reservation_id}},
        "spec": {"nodeName": node},
    }


def watch_event(line: bytes) -> tuple[str, dict[str, Any]] | None:
    """Pure: (type, object) of one line of a watch stream; None for a blank line.

    Raises ValueError for a line that is not a watch event (the watch is then relisted).
    """
    if not line.strip():
        return None
    event = json.loads(line)
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict) or "type" not in event:
        raise ValueError(f"not a watch event: {line[:200]!r}")
    return str(event["type"]), event["object"]


class BoundPodWatcher:
    """Follows the bound pods of one scheduler name and releases reservations of departed ones.

    `namespace` limits the list and watch to one namespace; None = all namespaces. `on_event` sees
    every event first (the profile settles Bindings that got no answer with it), including the
    stand-in DELETED of a pod that vanished between two lists. `on_relist` is called after every
    relist (not the first list), once its vanished pods were handled.

    `defer_release(uid, reservation_id)` is asked before each release; True means the pod's
    scheduling cycle still runs and releases the reservation itself once it ends. A pod can finish
    (a Job pod that exits at once, a container that crashes at start) or be deleted between its
    Binding and its cycle's commit; releasing first would make that commit fail with a 409.
    """

    def __init__(
        self,
        *,
        api: client.ApiClient,
        scheduler_name: str,
        rm: Callable[[], ReservationClient],
        logger: Logger,
        namespace: str | None = None,
        on_released: Callable[[], None] = lambda: None,
        on_event: Callable[[str, Mapping[str, Any]], Awaitable[None]] | None = None,
        on_relist: Callable[[], None] = lambda: None,
        defer_release: Callable[[str, str], bool] = lambda uid, reservation_id: False,
        max_backoff: float = 10.0,
        watch_seconds: int = 300,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._watch_seconds = watch_seconds
        self._scheduler_name = scheduler_name
        self._selector = bound_pods_selector(scheduler_name=scheduler_name)
        self._namespace = namespace
        self._rm = rm
        self._logger = logger
        self._max_backoff = max_backoff
        self._on_released = on_released
        self._on_event = on_event
        self._on_relist = on_relist
        self._defer_release = defer_release
        #: uid → (reservation id, node) of the bound pods seen with a reservation (see `seen_entry`)
        self.seen: dict[str, tuple[str, str]] = {}
        self._released: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def run(self) -> None:
        """Run until cancelled: list, release for terminal pods, then watch; relist on any error."""
        backoff = 0.5
        listed_before = False
        while True:
            try:
                items, version = await self._list()
                await self._forget_vanished(items)
                for item in items:
                    await self._handle("ADDED", item)
                if listed_before:
                    self._on_relist()
                listed_before = True
                backoff = 0.5
                await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._logger.warning(
                    f"bound-pod watch ({self._selector} in {self._namespace or 'all namespaces'}) "
                    f"failed: {exc}; relisting in {backoff:.1f}s"
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    async def _list(self) -> tuple[list[dict[str, Any]], str]:
        return await list_bound_pods(
            core=self._core, scheduler_name=self._scheduler_name, namespace=self._namespace
        )

    async def _forget_vanished(self, items: list[dict[str, Any]]) -> None:
        """Pods seen before but absent from this list were deleted in the gap: handle as DELETED."""
        listed = {str((item.get("metadata") or {}).get("uid") or "") for item in items}
        for uid, (reservation_id, node) in vanished(seen=self.seen, listed_uids=listed).items():
            self._logger.info(
                f"bound pod {uid} (reservation {reservation_id} on {node}) is gone from the relist of "
                f"{self._selector}: it was deleted while the watch was down"
            )
            await self._handle("DELETED", departed_body(uid=uid, reservation_id=reservation_id, node=node))

    async def _watch(self, version: str) -> None:
        """Follow the watch from `version`, one JSON event per line, until it ends or errs.

        Read as raw lines rather than through `kubernetes_asyncio.watch.Watch`, which would build
        a `V1Pod` model (every timestamp parsed) per event only for the dict to be used.
        """
        lister, args = self._lister()
        response = await lister(
            *args,
            field_selector=self._selector,
            resource_version=version,
            timeout_seconds=self._watch_seconds,
            allow_watch_bookmarks=True,
            watch=True,
            _preload_content=False,
            # The server ends the watch after timeout_seconds; a connection silent for longer is
            # half-open (the apiserver's host vanished, a load balancer dropped it) and would hang
            # here forever, releasing nothing: give it up and relist.
            _request_timeout=aiohttp.ClientTimeout(
                sock_connect=10, sock_read=self._watch_seconds + max(5, self._watch_seconds / 10)
            ),
        )
        try:
            if response.status != 200:
                body = await response.read()
                raise RuntimeError(f"watching bound pods answered HTTP {response.status}: {body[:500]!r}")
            while line := await response.content.readline():
                event = watch_event(line)
                if event is None:
                    continue  # a blank keep-alive line
                kind, pod = event
                if kind == "BOOKMARK":
                    continue
                if kind == "ERROR":
                    return  # expired resource version or similar: relist
                await self._handle(kind, pod)
        finally:
            response.release()

    def _remember_released(self, reservation_id: str) -> None:
        """Later events of the same pod (finished, then deleted) must not release it again."""
        self._released[reservation_id] = None
        while len(self._released) > REMEMBERED_RELEASES:
            self._released.popitem(last=False)

    def _lister(self) -> tuple[Callable[..., Any], tuple[str, ...]]:
        """The list call of the scope and its positional arguments (the list and the watch use both)."""
        if self._namespace is None:
            return self._core.list_pod_for_all_namespaces, ()
        return self._core.list_namespaced_pod, (self._namespace,)

    async def _handle(self, event_type: str, pod: Mapping[str, Any]) -> None:
        if self._on_event is not None:
            await self._on_event(event_type, pod)
        metadata = pod.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        entry = seen_entry(event_type=event_type, pod=pod)
        if entry is None:
            self.seen.pop(uid, None)
        elif uid:
            self.seen[uid] = entry
        reservation_id = reservation_to_release(event_type=event_type, pod=pod)
        if reservation_id is None or reservation_id in self._released:
            return
        if uid and self._defer_release(uid, reservation_id):
            self._remember_released(reservation_id)  # its cycle releases it, after its commit
            return
        try:
            await self._rm().release(reservation_id, pod_uid=uid or None)
        except RMPodMismatch:  # a copied annotation: the RM refused, so the owner keeps its capacity
            self._logger.warning(
                f"pod {metadata.get('namespace')}/{metadata.get('name')} ({uid}) carries the reservation "
                f"annotation of reservation {reservation_id}, which belongs to another pod; not releasing it"
            )
            return
        except RMError as exc:
            self._logger.warning(f"could not release reservation {reservation_id} of a departed pod: {exc}")
            return
        self._remember_released(reservation_id)
        self._logger.info(f"released reservation {reservation_id}: its pod was deleted or finished")
        self._on_released()
