"""Giving a bound pod back the reservation its resource manager lost.

Why: an RM can forget a reservation it acknowledged. slurmctld saves its state a moment after it
answers, so a SIGKILL in between loses the placeholder job's commit (the job comes back pending,
unclaimed, and Slurm then ends it); a reference RM restored from last night's backup has never
heard of today's reservations. Bindery bound the pod on the RM's word, so the pod keeps running
while the RM counts its CPUs, memory and GPUs as free and hands them to the next pod: the node is
overcommitted from then on. The reconcile pass finds such a pod (bound, running, no active
reservation) and, when Bindery bound it (its ``bindery.dev/reservation-id`` annotation names the
lost reservation), asks the RM for the pod's room again, pinned to the node the pod runs on, and
commits it. That is how YuniKorn recovers after a restart: existing allocations are handed back to
its core from the pods, not from memory.

The request is an ordinary reserve (the RM applies its quota, its policy and its capacity check),
pinned with ``matchFields metadata.name In [node]``, the pod's tolerations kept and nothing else of
its placement (it runs there already), ``preemptionPolicy: Never`` (no pod is ever displaced to
restore another) and its own idempotency key, ``restore:<lost id>:<pod uid>``: a pass that dies
between reserve and commit gets the same reservation back from the next one. A reserve on another
node, or a failed commit, is released at once.

The pod's annotation keeps naming the lost reservation: the operator may not patch pods (only their
status and Bindings, as kube-scheduler), and needs not. The new reservation carries the pod's UID,
so reconcile passes keep it while the pod runs and release it once the pod is gone (within
``reconcileIntervalSeconds``; the watch of bound pods releases only what the annotation names). The
reference RM recognises a pod by that annotation, so after a restore it counts the pod twice on its
node, too much rather than too little, until the pod ends.

Only a reservation the RM lost is restored: the RM lists none of the pod's reservations as
``released`` or ``revoked`` (:func:`restore_refused`). One it ended on purpose (an acknowledged
revocation with ``onRevoked: Warn``, a release) stays ended, and so does, conservatively, any
lost one of a pod whose earlier attempt was released (a cycle that failed after its reserve).

What cannot be restored stays as it was before: a pod bound outside Bindery (no annotation) gets
the ``ReservationMissing`` warning only, and so does a pod whose restore the RM refuses (no room
left on the node, a quota); a later pass asks again once that pod's backoff is over. An RM that is
not answering (restarting, not ready yet) is asked again by the next pass, with no warning between.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Container, Mapping, Sequence
from typing import Any, Protocol

from bindery.adapters.events import KubeEventSink
from bindery.controller.metrics import Metrics
from bindery.rm.errors import RMError, RMUnavailable
from bindery.rm.models import Reservation, ReservationRequest, ReservationState
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.podspec import PodInfo, reservation_request
from bindery.typedefs import Logger

__all__ = ["RESTORED_REASON", "NotRestored", "Restorer", "RestoringRM", "restore_refused", "restore_request"]

RESTORED_REASON = "ReservationRestored"
REPORTING_CONTROLLER = "bindery"
#: The lease of the restoring reserve: it is committed at once, so this only bounds a pass that dies
#: between reserve and commit (the next pass replays the same key and commits it).
RESTORE_TTL_SECONDS = 120
_REMEMBERED = 10_000


class RestoringRM(Protocol):
    async def reserve(self, request: ReservationRequest) -> Reservation: ...

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation: ...

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None: ...


@dataclasses.dataclass(frozen=True)
class NotRestored:
    """Why a pod did not get its reservation back. `ours`: Bindery bound it (the annotation names a
    reservation), so a later pass asks again; `transient`: the RM did not answer, so nobody is told."""

    why: str
    ours: bool = True
    transient: bool = False


def restore_request(*, pod: Mapping[str, Any], lost: str) -> ReservationRequest:
    """Pure: the reserve that gives `pod` its room again on the node it is bound to.

    Raises :class:`PodSpecError` when the pod's requests cannot be parsed.
    """
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    info = PodInfo.from_body(pod)
    pinned = dataclasses.replace(
        info,
        node_selector={},
        affinity_terms=({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]},),
        preferred_terms=(),
        preemption_policy="Never",
    )
    request = reservation_request(pod=pinned, ttl_seconds=RESTORE_TTL_SECONDS)
    return request.model_copy(update={"idempotency_key": f"restore:{lost}:{info.uid}"[:253]})


def restore_refused(history: Sequence[Reservation], *, own: Container[str] = ()) -> str | None:
    """Pure: why the pod's room must not be restored, given every reservation the RM lists for it
    (none active), or None. A reservation the RM lists as released or revoked was ended on purpose
    (Bindery's own release, an acknowledged revocation, an administrator): its room is not Bindery's
    to take back. Only what the RM lost (it lists nothing) or let expire is restored. `own`: ids a
    failed restore released itself (a commit that failed), which do not count."""
    for reservation in history:
        if reservation.id in own:
            continue
        if reservation.state in (ReservationState.RELEASED, ReservationState.REVOKED):
            return (
                f"the resource manager lists reservation {reservation.id} of this pod as "
                f"{reservation.state.value}: it ended it on purpose, so Bindery does not reserve again"
            )
    return None


class Restorer:
    """One ResourceManager's restores; :meth:`restore` is called by its reconcile pass."""

    def __init__(
        self,
        *,
        resource_manager: str,
        logger: Logger,
        events: KubeEventSink,
        metrics: Metrics,
    ) -> None:
        self.resource_manager = resource_manager
        self._logger = logger
        self._events = events
        self._metrics = metrics
        #: Reservations a failed restore released itself (bounded): not a reason to stop restoring.
        self._given_back: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def restore(
        self, rm: RestoringRM, pod: Mapping[str, Any], *, history: Sequence[Reservation]
    ) -> Reservation | NotRestored:
        """Reserve and commit for `pod` (bound, running, with no active reservation) on its node;
        `history`: every reservation the RM lists for the pod's UID (none of them active)."""
        metadata = pod.get("metadata") or {}
        lost = str((metadata.get("annotations") or {}).get(RESERVATION_ANNOTATION) or "")
        if not lost:
            return NotRestored(
                "Bindery did not bind it (no bindery.dev/reservation-id annotation)", ours=False
            )
        ended = restore_refused(history, own=self._given_back)
        if ended is not None:
            return NotRestored(ended)
        uid, namespace, name = (
            str(metadata.get("uid")),
            str(metadata.get("namespace")),
            str(metadata.get("name")),
        )
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        try:
            request = restore_request(pod=pod, lost=lost)
        except ValueError as error:  # PodSpecError; a pydantic ValidationError past the contract's caps
            return NotRestored(f"its spec cannot be sent to the resource manager: {error}")
        try:
            reservation = await rm.reserve(request)
        except RMUnavailable as error:
            return NotRestored(str(error), transient=True)
        except RMError as error:
            return NotRestored(f"the resource manager refused a reservation on node {node}: {error}")
        if reservation.node != node:  # an RM that ignored the pin: never keep room where the pod is not
            await self._give_back(rm, reservation, uid)
            return NotRestored(
                f"the resource manager placed the new reservation on node {reservation.node}, not on {node}"
            )
        try:
            await rm.commit(reservation.id, pod_uid=uid)
        except RMError as error:
            await self._give_back(rm, reservation, uid)
            return NotRestored(
                f"committing reservation {reservation.id} failed: {error}",
                transient=isinstance(error, RMUnavailable),
            )
        self._metrics.reconcile_action(resource_manager=self.resource_manager, action="restore")
        note = (
            f"ResourceManager {self.resource_manager} no longer held reservation {lost} of this pod, so it "
            f"counted the pod's resources on node {node} as free. Bindery reserved and committed them "
            f"again (new reservation {reservation.id}). Check the resource manager's durability (a restart "
            "that lost acknowledged writes, or a restore from an older backup)."
        )
        self._logger.warning(f"reconcile: pod {namespace}/{name} ({uid}) on node {node}: {note}")
        try:
            await self._events.warning(
                pod=PodInfo.slim(pod),
                reason=RESTORED_REASON,
                action="Reconciling",
                note=note,
                reporter=REPORTING_CONTROLLER,
            )
        except Exception as exc:  # the log and the metric already tell; the event is best effort
            self._logger.warning(
                f"could not post the {RESTORED_REASON} event of pod {namespace}/{name}: {exc}"
            )
        return reservation

    async def _give_back(self, rm: RestoringRM, reservation: Reservation, uid: str) -> None:
        self._given_back[reservation.id] = None
        while len(self._given_back) > _REMEMBERED:
            self._given_back.popitem(last=False)
        try:
            await rm.release(reservation.id, pod_uid=uid)
        except RMError as error:  # its lease ends it; the next pass replays the same key meanwhile
            self._logger.warning(
                f"reconcile: could not release reservation {reservation.id} of a failed restore: {error}"
            )
