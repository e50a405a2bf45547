"""Give capacity back to the RM when a pod Bindery placed goes away.

A committed reservation is an allocation: it lasts until Bindery releases it (contract v1, "when
the pod is gone, Bindery releases"). The unbound-pod watch sees only unbound pods (`spec.nodeName=`), so
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

The list and watch are :func:`bindery.k8s.watching.list_watch`: a watch that ends (the server's
timeout, a broken or silent stream, an apiserver restart) resumes from the last resourceVersion;
only a 410 Gone relists. That relist is diffed against the pods known (the generator keeps, per
bound pod, the small projection :func:`remembered`: identity, reservation id, node), so a pod
deleted in the gap arrives as DELETED and its reservation is released with its UID. It used to
relist after every watch end (each 300 s); a relist is now rare, and only a real one calls
`on_relist`, so that the ResourceManager's reconciler runs a pass for what no watch can tell (see
`bindery.controller.reconcile`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from bindery.backoff import Backoff, BackoffPolicy
from bindery.controller.rmstack import RMStack
from bindery.k8s import resources
from bindery.k8s.api import ApiClient, list_pages
from bindery.k8s.watching import WATCH_BACKOFF, Cursor, Event, Listed, identity, list_watch
from bindery.rm.errors import RMError, RMPodMismatch
from bindery.scheduling.framework import RESERVATION_ANNOTATION, ReservationClient
from bindery.typedefs import Logger

TERMINAL_PHASES = ("Succeeded", "Failed")
REMEMBERED_RELEASES = 10_000
#: How often the releases that failed (the RM away, its breaker open) are tried again.
RELEASE_RETRY_SECONDS = 10.0
#: Explicit bound on one LIST of bound pods (thousands of pods take a while on a busy apiserver).
LIST_TIMEOUT_SECONDS = 60.0


def bound_pods_selector(*, scheduler_name: str) -> str:
    return f"spec.schedulerName={scheduler_name},spec.nodeName!="


def listed_bound_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: what a reconcile pass reads of a listed bound pod (identity, the reservation
    annotation, node, scheduler name, phase, the PodScheduled condition), in the pod's own shape.

    A pass lists every bound pod of its names; holding their whole bodies (a spec of 1.5 MB is
    allowed) for the pass made its memory grow with the largest pods anyone can create.
    """
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    kept_metadata = {
        key: metadata[key]
        for key in ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp")
        if key in metadata
    }
    reservation_id = (metadata.get("annotations") or {}).get(RESERVATION_ANNOTATION)
    if reservation_id:
        kept_metadata["annotations"] = {RESERVATION_ANNOTATION: str(reservation_id)}
    conditions = [c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"]
    return {
        "metadata": kept_metadata,
        "spec": {key: spec[key] for key in ("nodeName", "schedulerName") if key in spec},
        "status": {"phase": status.get("phase"), "conditions": conditions},
    }


async def list_bound_pods(
    *,
    api: ApiClient,
    scheduler_name: str,
    namespace: str | None,
    within: float = LIST_TIMEOUT_SECONDS,
) -> tuple[list[dict[str, Any]], str]:
    """One paged LIST of the bound pods of `scheduler_name` (in `namespace`, None = all): each
    pod as :func:`listed_bound_pod` keeps it, and the list's version. Each page is reduced before
    the next is read. `within` bounds each page. Raises :class:`bindery.k8s.ApiError`.
    """
    items: list[dict[str, Any]] = []
    version = ""
    async for page in list_pages(
        api,
        resources.PODS,
        namespace=namespace,
        field_selector=bound_pods_selector(scheduler_name=scheduler_name),
        request_timeout=within,
    ):
        version = version or str((page.get("metadata") or {}).get("resourceVersion") or "")
        items.extend(listed_bound_pod(pod) for pod in page.get("items") or ())
    return items, version


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


def remembered(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """Pure: what the watch keeps of a bound pod, and the body of its DELETED should it vanish
    between two lists: its identity, and for a pod Bindery placed its reservation id and node (all
    a release needs). A pod body per running pod would be the bulk of the operator's memory."""
    kept = identity(pod)
    reservation_id = ((pod.get("metadata") or {}).get("annotations") or {}).get(RESERVATION_ANNOTATION)
    if not reservation_id:
        return kept
    metadata = {**kept["metadata"], "annotations": {RESERVATION_ANNOTATION: str(reservation_id)}}
    return {"metadata": metadata, "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")}}


class BoundPodWatcher:
    """Follows the bound pods of one scheduler name and releases reservations of departed ones.

    `namespace` limits the list and watch to one namespace; None = all namespaces. `on_event` sees
    every event first (the profile settles Bindings that got no answer with it; listed pods as
    ADDED), including the stand-in DELETED of a pod that vanished between two lists. `on_relist` is
    called after every relist (not the first list, nor a resumed watch), once its vanished pods
    were handled.

    `defer_release(uid, reservation_id)` is asked before each release; True means the pod's
    scheduling cycle still runs and releases the reservation itself once it ends. A pod can finish
    (a Job pod that exits at once, a container that crashes at start) or be deleted between its
    Binding and its cycle's commit; releasing first would make that commit fail with a 409.
    """

    def __init__(
        self,
        *,
        api: ApiClient,
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
        release_retry_seconds: float = RELEASE_RETRY_SECONDS,
    ) -> None:
        self._api = api
        self._release_retry = release_retry_seconds
        #: reservation id → (pod UID, pod key) of departed pods whose release failed or was kept:
        #: tried again every `release_retry_seconds` (a finished pod may send no event for hours)
        self._unreleased: dict[str, tuple[str, str]] = {}
        self._watch_seconds = watch_seconds
        self._selector = bound_pods_selector(scheduler_name=scheduler_name)
        self._namespace = namespace
        self._rm = rm
        self._logger = logger
        self._max_backoff = max_backoff
        self._on_released = on_released
        self._on_event = on_event
        self._on_relist = on_relist
        self._defer_release = defer_release
        #: where the list-then-watch stands: its version and the bound pods known (see `remembered`)
        self.cursor = Cursor(remember=remembered)
        self._released: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def run(self) -> None:
        """Run until cancelled: list, release for terminal pods, then watch (resumed, or relisted
        and diffed on a 410); releases that failed are tried again meanwhile."""
        async with asyncio.TaskGroup() as group:
            retrying = group.create_task(self._retry_releases(), name="bindery bound pods: retry releases")
            try:
                await self._follow()
            finally:
                retrying.cancel()

    async def _retry_releases(self) -> None:
        """Before the watch stopped relisting every 300 s, each relist offered a finished pod whose
        release had failed again; now its next event may never come."""
        while True:
            await asyncio.sleep(self._release_retry)
            for reservation_id, (uid, key) in list(self._unreleased.items()):
                if reservation_id in self._released:
                    self._unreleased.pop(reservation_id, None)
                    continue
                try:
                    await self._release(reservation_id, uid=uid, key=key)
                except Exception as exc:
                    self._logger.warning(
                        f"retrying the release of reservation {reservation_id} failed: {exc}"
                    )

    async def _follow(self) -> None:
        async for item in list_watch(
            self._api,
            resources.PODS,
            namespace=self._namespace,
            field_selector=self._selector,
            watch_seconds=self._watch_seconds,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=self.cursor,
            backoff=Backoff(BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)),
            logger=self._logger,
            what=f"bound pods ({self._selector} in {self._namespace or 'all namespaces'})",
        ):
            if isinstance(item, Listed):
                if item.relist:
                    self._on_relist()
                continue
            assert isinstance(item, Event)
            if item.type == "DELETED" and "status" not in item.object:  # synthesized: `remembered` only
                self._logger.info(
                    f"bound pod {(item.object.get('metadata') or {}).get('uid')} is gone from the relist of "
                    f"{self._selector}: it was deleted while the watch was down"
                )
            try:
                await self._handle(item.type or "ADDED", item.object)
            except Exception as exc:  # one pod's failure must not end the watch of all
                self._logger.warning(f"handling a bound-pod {item.type or 'listed'} event failed: {exc}")

    def _remember_released(self, reservation_id: str) -> None:
        """Later events of the same pod (finished, then deleted) must not release it again."""
        self._released[reservation_id] = None
        while len(self._released) > REMEMBERED_RELEASES:
            self._released.popitem(last=False)

    async def _handle(self, event_type: str, pod: Mapping[str, Any]) -> None:
        if self._on_event is not None:
            await self._on_event(event_type, pod)
        metadata = pod.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        reservation_id = reservation_to_release(event_type=event_type, pod=pod)
        if reservation_id is None or reservation_id in self._released:
            return
        if uid and self._defer_release(uid, reservation_id):
            self._remember_released(reservation_id)  # its cycle releases it, after its commit
            return
        await self._release(
            reservation_id, uid=uid, key=f"{metadata.get('namespace')}/{metadata.get('name')}"
        )

    async def _release(self, reservation_id: str, *, uid: str, key: str) -> None:
        """Release the reservation of a departed pod; remembered for a retry if it did not happen.

        The retries are bounded like the released ids: past `REMEMBERED_RELEASES` the oldest is
        left to the reconciler's passes (a standby, fenced, would otherwise collect every departure).
        """
        self._unreleased[reservation_id] = (uid, key)
        while len(self._unreleased) > REMEMBERED_RELEASES:
            del self._unreleased[next(iter(self._unreleased))]
        rm = self._rm()
        try:
            if isinstance(rm, RMStack):
                if not await rm.release_unless_kept(reservation_id, pod_uid=uid or None):
                    return  # kept (fence, or committed here, its pod unreadable): tried again later
            else:
                await rm.release(reservation_id, pod_uid=uid or None)
        except RMPodMismatch:  # a copied annotation: the RM refused, so the owner keeps its capacity
            self._unreleased.pop(reservation_id, None)
            self._logger.warning(
                f"pod {key} ({uid}) carries the reservation "
                f"annotation of reservation {reservation_id}, which belongs to another pod; not releasing it"
            )
            return
        except RMError as exc:
            self._logger.warning(f"could not release reservation {reservation_id} of a departed pod: {exc}")
            return
        self._unreleased.pop(reservation_id, None)
        self._remember_released(reservation_id)
        self._logger.info(f"released reservation {reservation_id}: its pod was deleted or finished")
        self._on_released()
