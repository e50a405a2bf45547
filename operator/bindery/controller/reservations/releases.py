"""Give capacity back to the RM when a pod Bindery placed goes away.

:class:`BoundPodReleases` is one profile's subscriber of the shared watch of placed pods
(:class:`bindery.controller.watches.bound.BoundPodSubscriber`). When one of its pods is deleted or
reaches a terminal phase (Succeeded/Failed: it no longer uses its resources, as kube-scheduler
counts it), the reservation named by its `bindery.dev/reservation-id` annotation is released.
Releases are idempotent at the RM, and ids already released by this process are remembered (bounded)
so relists do not repeat them. Events are queued (a slim projection each,
:func:`~.boundpods.listed_bound_pod`) and handled by the subscriber's own task: a release waits on
the RM (retries, a breaker, the settling of an unanswered Binding), and the shared stream must not
stall the placed-pod cache meanwhile, nor one profile's RM the others'.

A profile subscribes when it starts scheduling (after its reconcile pass) and unsubscribes when it
pauses (leadership lost) or stops. A profile that subscribes, or gains a scheduler name, after the
shared watch listed is replayed what the watch's cursor knows of those pods
(:func:`~.boundpods.remembered` keeps, per pod carrying a reservation annotation, its identity,
reservation id, node, scheduler name and a terminal phase): as a watch of its own would have listed
them, so a pod that finished before is still released. Pods that went away while no profile was
subscribed are found by the reconciler's passes (one runs before each start).

An operator limited to some namespaces (`bindery run --namespace`) lists and watches pods in those
namespaces only (one list/watch each, as Kopf does): it has no business, and in a namespaced install
no RBAC, reading pods elsewhere. For the same reason it never releases a committed reservation of a
pod outside its namespaces: that pod is not in its list, not gone.

The shared list and watch are :func:`bindery.apiserver.watching.list_watch`: a watch that ends resumes
from the last resourceVersion; only a 410 Gone relists. That relist is diffed against the pods known
(:func:`~.boundpods.remembered`), so a pod deleted in the gap arrives as DELETED and its reservation
is released with its UID. Only a real relist calls `on_relist` (queued after the relist's events),
so that the ResourceManager's reconciler runs a pass for what no watch can tell (see
`bindery.controller.reservations.reconcile`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from bindery.controller.reservations.boundpods import is_stand_in, listed_bound_pod
from bindery.controller.reservations.fate import reservation_to_release
from bindery.controller.rmstack import RMStack
from bindery.rm.errors import RMError, RMPodMismatch
from bindery.scheduling.framework import RESERVATION_ANNOTATION, ReservationClient
from bindery.typedefs import Logger

REMEMBERED_RELEASES = 10_000
#: How often the releases that failed (the RM away, its breaker open) are tried again.
RELEASE_RETRY_SECONDS = 10.0


class BoundPodReleases:
    """One profile's bound pods: releases the reservations of departed ones (a :class:`BoundPodSubscriber`).

    `scheduler_names` may be replaced while it runs (the ResourceManager's spec changed); the feed
    reads it per event. `on_event` sees every event of a pod carrying a reservation annotation first
    (the profile settles Bindings that got no answer with it; listed or replayed pods as ADDED),
    including the stand-in DELETED of a pod that vanished between two lists. Pods without the
    annotation are not queued at all: there is nothing to release, and no Binding of this profile to
    settle, for them. `on_relist` is called after every relist, once its vanished pods were handled.

    `defer_release(uid, reservation_id)` is asked before each release; True means the pod's
    scheduling cycle still runs and releases the reservation itself once it ends. A pod can finish
    (a Job pod that exits at once, a container that crashes at start) or be deleted between its
    Binding and its cycle's commit; releasing first would make that commit fail with a 409.

    Events wait in an unbounded queue, each as its slim projection (:func:`listed_bound_pod`):
    bounding it would make the shared stream wait on this profile's RM.
    """

    def __init__(
        self,
        *,
        scheduler_names: Collection[str],
        rm: Callable[[], ReservationClient],
        logger: Logger,
        namespaces: Collection[str] = (),
        on_released: Callable[[], None] = lambda: None,
        on_event: Callable[[str, Mapping[str, Any]], Awaitable[None]] | None = None,
        on_relist: Callable[[], None] = lambda: None,
        defer_release: Callable[[str, str], bool] = lambda uid, reservation_id: False,
        release_retry_seconds: float = RELEASE_RETRY_SECONDS,
    ) -> None:
        self.scheduler_names: frozenset[str] = frozenset(scheduler_names)
        self.namespaces: frozenset[str] = frozenset(namespaces)
        self._release_retry = release_retry_seconds
        #: reservation id → (pod UID, pod key) of departed pods whose release failed or was kept:
        #: tried again every `release_retry_seconds` (a finished pod may send no event for hours)
        self._unreleased: dict[str, tuple[str, str]] = {}
        self._rm = rm
        self._logger = logger
        self._on_released = on_released
        self._on_event = on_event
        self._on_relist = on_relist
        self._defer_release = defer_release
        self._released: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: (event type, slim pod) in the stream's order; None: a relist's events end here
        self._queue: asyncio.Queue[tuple[str, Mapping[str, Any]] | None] = asyncio.Queue()

    # -- what the feed calls (inside the shared stream: no await) ----------------------------------

    def deliver(self, event_type: str, pod: Mapping[str, Any]) -> None:
        annotations = (pod.get("metadata") or {}).get("annotations")
        if not annotations or not annotations.get(RESERVATION_ANNOTATION):
            return
        self._queue.put_nowait((event_type, pod if is_stand_in(pod) else listed_bound_pod(pod)))

    def relisted(self) -> None:
        self._queue.put_nowait(None)

    async def settled(self) -> None:
        """Until every event delivered so far was handled (tests and benchmarks wait on it)."""
        await self._queue.join()

    # -- the profile's task ----------------------------------------------------------------------

    async def run(self) -> None:
        """Run until cancelled: handle the delivered events in order; releases that failed are
        tried again meanwhile."""
        async with asyncio.TaskGroup() as group:
            retrying = group.create_task(self._retry_releases(), name="bindery bound pods: retry releases")
            try:
                await self._drain()
            finally:
                retrying.cancel()

    async def _drain(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if item is None:
                    self._on_relist()
                    continue
                event_type, pod = item
                if event_type == "DELETED" and is_stand_in(pod):
                    uid = (pod.get("metadata") or {}).get("uid")
                    self._logger.info(
                        f"bound pod {uid} of {sorted(self.scheduler_names)} is gone from a relist: "
                        "it was deleted while the watch was down"
                    )
                await self._handle(event_type, pod)
            except Exception as exc:  # one pod's failure must not end the handling of all
                what = "a relist" if item is None else f"a bound-pod {item[0]} event"
                self._logger.warning(f"handling {what} failed: {exc}")
            finally:
                self._queue.task_done()

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
