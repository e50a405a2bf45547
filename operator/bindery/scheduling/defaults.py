"""The default plugins: Bindery's built-in binding cycle, expressed as framework plugins.

Making the built-in steps ordinary plugins keeps the cycle itself a short, generic loop over
extension points, and gives third-party plugins the same footing (and the same error handling).
Every default is always enabled; configuration only adds plugins (or replaces the binder).

* Reserve: :class:`ResourceManagerReservation`, the RM reservation (idempotency key = pod UID);
  its ``unreserve`` releases the reservation at most once per cycle.
* PreBind: :class:`PodStillPending` (the pod still exists with the same UID and is unbound, as the
  watch sees it) then :class:`NodeCheck` (the RM's node passes the checks of ``spec.nodeCheck``).
* Bind: :class:`DefaultBinder`, a Binding with the pod UID precondition and the reservation id
  annotation; a 409 that names the chosen node is a lost response, i.e. success, but only if the
  pod there carries our reservation and UID (else someone else bound it).
* PostBind: :class:`ScheduledEvent` (kube-scheduler's ``Scheduled`` event) then
  :class:`CommitReservation`.

Only the Binding and the event write to the apiserver; the PreBind checks read the watch caches.

The reservation is a lease (:mod:`bindery.scheduling.lease`): the Reserve plugin records when it
runs out, and every later call of the cycle (each Binding attempt, the event) gets a timeout that
ends before it, renewing the lease first when it runs low (contract v1.1, RM traffic only).  On an
RM that cannot renew, no Binding is sent on a lease that may have run out: the reservation is
released and the pod retried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import pydantic

from bindery.constraints import matches_required_affinity
from bindery.logcontext import add_log_context
from bindery.rm.batching import reserve_urgency
from bindery.rm.errors import ProblemType, RMConflict, RMUnsupported
from bindery.rm.models import Reservation, ReservationRequest, ReservationState
from bindery.scheduling.decisions import Failure, FailureKind, Stage, failure_from_exception
from bindery.scheduling.dynamicresources import DEVICE_REQUESTS
from bindery.scheduling.events import Requeue
from bindery.scheduling.framework import RESERVATION_ANNOTATION, CycleContext, ReservationClient, Status
from bindery.scheduling.lease import MIN_CALL_SECONDS, CallStep, Lease, lease_from_answer, plan_call
from bindery.scheduling.nodecheck import NodeCheckMode, check_node, rules_problem
from bindery.scheduling.placementrules import (
    NARROWING,
    RULE_PREEMPTION,
    VERDICT,
    Narrowing,
    counted_by,
    may_be_awaited,
    rules_refusing,
)
from bindery.scheduling.podspec import PodInfo, reservation_request
from bindery.scheduling.ports import BindConflict, BindError

__all__ = [
    "BUILTIN_NAMES",
    "COMMIT_FAILED",
    "CommitReservation",
    "DefaultBinder",
    "NodeCheck",
    "PodStillPending",
    "ResourceManagerReservation",
    "ScheduledEvent",
    "call_budget",
    "lease_of",
]

log = logging.getLogger(__name__)

#: ``ctx.state`` key set by :class:`CommitReservation` when the commit failed.
COMMIT_FAILED = "CommitReservation/failed"
_RELEASED = "ResourceManagerReservation/released"
_LEASE = "ResourceManagerReservation/lease"
_NOT_RENEWABLE = "ResourceManagerReservation/not-renewable"

#: The longest one Binding attempt may take (the lease may allow less); a Binding normally takes
#: milliseconds, and the apiserver itself gives up on a request after 60 s.
BIND_ATTEMPT_SECONDS = 30.0
#: The longest the ``Scheduled`` event POST may take (the lease may allow less).
EVENT_SECONDS = 10.0


def _failure(ctx: CycleContext, error: BaseException, stage: Stage, plugin: str) -> Status:
    return Status.failed(
        failure_from_exception(
            error=error, stage=stage, rm_name=ctx.profile.name, node=ctx.node, plugin=plugin
        )
    )


def lease_of(ctx: CycleContext) -> Lease | None:
    """The reservation's lease as this cycle last knew it (None before Reserve)."""
    lease = ctx.state.get(_LEASE)
    return lease if isinstance(lease, Lease) else None


async def call_budget(ctx: CycleContext, *, cap: float, needed: float = MIN_CALL_SECONDS) -> float | None:
    """Seconds the cycle's next call may take so that it ends before the reservation's lease does.

    Renews the lease first when it runs low (at most once per call; RM traffic only).  ``None``: no
    call fits any more (the RM could not renew), so the caller must not start it.  Without a lease
    (no RM reservation in this cycle) the call gets ``cap``.
    """
    lease = lease_of(ctx)
    if lease is None:
        return cap
    plan = plan_call(
        lease=lease,
        now=ctx.profile.clock(),
        cap=cap,
        needed=needed,
        renewable=not ctx.state.get(_NOT_RENEWABLE),
    )
    if plan.step is CallStep.RENEW:
        lease = await _renew(ctx, lease)
        plan = plan_call(lease=lease, now=ctx.profile.clock(), cap=cap, needed=needed, renewable=False)
    return plan.timeout if plan.step is CallStep.CALL else None


async def _renew(ctx: CycleContext, lease: Lease) -> Lease:
    """The renewed lease; the old one if the RM cannot renew now; an ended one if it is gone."""
    ttl = ctx.profile.reservation_ttl_seconds
    sent_at, sent_at_wall = ctx.profile.clock(), datetime.now(UTC)
    try:
        renewed = await ctx.profile.client.renew(lease.reservation_id, pod_uid=ctx.pod.uid, ttl_seconds=ttl)
    except RMUnsupported as error:
        ctx.state[_NOT_RENEWABLE] = True
        log.info("cannot renew reservation %s of pod %s: %s", lease.reservation_id, ctx.pod.key, error)
        return lease
    except RMConflict as error:  # no longer active (expired, released) or not this pod's
        ctx.state[_NOT_RENEWABLE] = True
        log.warning(
            "reservation %s of pod %s can no longer be renewed: %s", lease.reservation_id, ctx.pod.key, error
        )
        return dataclasses.replace(lease, expires=sent_at)
    except Exception as error:
        log.warning(
            "renewing reservation %s of pod %s failed (%s); going on with what is left of its lease",
            lease.reservation_id,
            ctx.pod.key,
            error,
        )
        return lease
    ctx.reservation = renewed
    renewed_lease = lease_from_answer(
        reservation=renewed, ttl_seconds=ttl, sent_at=sent_at, sent_at_wall=sent_at_wall
    )
    ctx.state[_LEASE] = renewed_lease
    return renewed_lease


def _lease_left(ctx: CycleContext) -> float:
    """Seconds until the reservation's lease runs out (the whole TTL if the cycle knows no lease)."""
    ttl = float(ctx.profile.reservation_ttl_seconds)
    lease = lease_of(ctx)
    return ttl if lease is None else max(0.0, min(ttl, lease.remaining(now=ctx.profile.clock())))


class ResourceManagerReservation:
    """Reserve: ask the RM for capacity and a node; Unreserve: release it (once)."""

    name = "ResourceManagerReservation"

    def events_to_register(self, *, pod: PodInfo, failure: Failure) -> Requeue | None:
        """The RM had no room: the pod waits until capacity may have freed (a reservation
        released, a Node added or changed). Its other failures come back on their backoff."""
        if failure.kind is not FailureKind.RM_UNSCHEDULABLE:
            return None
        return Requeue.no_room()

    async def reserve(self, *, ctx: CycleContext) -> Status:
        narrowing = ctx.state.get(NARROWING)
        if isinstance(narrowing, Narrowing):
            # Sent to a region Bindery chose (PodPlacementRules, so that later pods of its
            # Deployment need not wait): asked without preemption, as the region is not the pod's
            # own constraint; refused there, the pod is reserved once more without it.
            status = await self._reserve(ctx, narrowed=True)
            if status.failure is None or status.failure.kind is not FailureKind.RM_UNSCHEDULABLE:
                return status
            ctx.state.pop(NARROWING, None)
            narrowing.undo(ctx.node_constraints)
            if (placed := ctx.ports.placed) is not None:
                placed.in_flight.unplace(ctx.pod.uid)
                placed.in_flight.narrowed_refused(ctx.pod.uid)
        return await self._reserve(ctx, narrowed=False)

    async def _reserve(self, ctx: CycleContext, *, narrowed: bool) -> Status:
        try:
            request = reservation_request(
                pod=ctx.pod,
                ttl_seconds=ctx.profile.reservation_ttl_seconds,
                required_node_affinity=ctx.required_node_terms(),
                preferred_node_affinity=ctx.preferred_node_terms(),
            )
            if (devices := ctx.state.get(DEVICE_REQUESTS)) is not None:
                # Contract v1.3 (feature devices): the client refuses them for an RM without it.
                request = request.model_copy(update={"devices": devices})
            if narrowed:
                request = request.model_copy(update={"preemption_policy": None})
            elif (for_rules := ctx.state.get(RULE_PREEMPTION)) is not None:
                request = request.model_copy(update={"rule_preemption": for_rules})
        except (ValueError, pydantic.ValidationError) as error:
            return Status.failed(
                Failure(
                    kind=FailureKind.INVALID_REQUEST,
                    message=f"the pod cannot be expressed as a reservation request of contract v1: {error}",
                    stage=Stage.RESERVE,
                    plugin=self.name,
                )
            )
        sent_at, sent_at_wall = ctx.profile.clock(), datetime.now(UTC)
        try:
            with reserve_urgency(may_be_awaited(ctx)):
                ctx.reservation = await ctx.profile.client.reserve(request)
        except RMConflict as error:
            if error.problem.get("type") != ProblemType.IDEMPOTENCY_KEY_REUSED:
                return _failure(ctx, error, Stage.RESERVE, self.name)
            try:
                ctx.reservation = await self._earlier_or_anew(ctx, request)
            except Exception as again:
                return _failure(ctx, again, Stage.RESERVE, self.name)
        except Exception as error:
            return _failure(ctx, error, Stage.RESERVE, self.name)
        if ctx.reservation.state is ReservationState.COMMITTED:
            # The RM replayed this pod's reservation as committed: an earlier Binding of this pod
            # landed and was settled (a Binding that got no answer, committed by the tracker).
            # Binding again would meet a 409 and write a second Scheduled event; releasing it would
            # free capacity under the running pod.
            return Status.failed(
                Failure(
                    kind=FailureKind.ALREADY_BOUND,
                    message=f"the pod is already bound with committed reservation {ctx.reservation.id}",
                    stage=Stage.RESERVE,
                    plugin=self.name,
                )
            )
        add_log_context(reservation=ctx.reservation.id)
        ctx.state[_LEASE] = lease_from_answer(
            reservation=ctx.reservation,
            ttl_seconds=ctx.profile.reservation_ttl_seconds,
            sent_at=sent_at,
            sent_at_wall=sent_at_wall,
        )
        return Status.success()

    async def _earlier_or_anew(self, ctx: CycleContext, request: ReservationRequest) -> Reservation:
        """The RM holds a reservation for this pod (same key) made from a different request.

        It happens when a reservation outlives its cycle (a Binding that got no answer, a leader
        change) and the pod's placement constraints changed meanwhile: its claim got bound to a
        volume in PreBind, so the volume's node affinity is now part of the request. Keep that
        reservation if its node satisfies the new request; otherwise release it (with the pod's UID)
        and reserve anew, once.
        """
        earlier = [
            r
            for r in await ctx.profile.client.list_reservations(pod_uid=ctx.pod.uid)
            if r.pod_uid == ctx.pod.uid and r.state.active
        ]
        node = ctx.ports.nodes.get(earlier[0].node) if earlier else None
        terms = request.placement.affinity_terms()
        if earlier and (
            earlier[0].state is ReservationState.COMMITTED
            or (
                node is not None
                and matches_required_affinity(terms=terms, labels=node.labels, node_name=node.name)
            )
        ):
            log.info(
                "pod %s: keeping its reservation %s on %s, made before its placement constraints changed",
                ctx.pod.key,
                earlier[0].id,
                earlier[0].node,
            )
            return earlier[0]
        for stale in earlier:
            await ctx.profile.client.release(stale.id, pod_uid=ctx.pod.uid)
            log.info(
                "pod %s: released its reservation %s on %s, which its new placement constraints rule out",
                ctx.pod.key,
                stale.id,
                stale.node,
            )
        return await ctx.profile.client.reserve(request)

    async def unreserve(self, *, ctx: CycleContext) -> None:
        if ctx.reservation is None or ctx.state.get(_RELEASED):
            return
        ctx.state[_RELEASED] = True  # before awaiting: a second unreserve must not release again
        try:
            await ctx.profile.client.release(ctx.reservation.id, pod_uid=ctx.pod.uid)
        except Exception as error:
            log.warning(
                "could not release reservation %s of pod %s at resource manager %r: %s; "
                "it expires by itself after %d s",
                ctx.reservation.id,
                ctx.pod.key,
                ctx.profile.name,
                error,
                ctx.profile.reservation_ttl_seconds,
            )


class PodStillPending:
    """PreBind: the pod is still there, with the same UID, unbound, not terminating, not gated."""

    name = "PodStillPending"

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        current = ctx.ports.pods.get(ctx.pod.uid)
        if current is not None and current.schedulable:
            return Status.success()
        if current is None:
            why = "the pod was deleted or bound by someone else while its reservation was made"
        else:
            why = "the pod started terminating or got scheduling gates while its reservation was made"
        return Status.failed(
            Failure(kind=FailureKind.POD_GONE, message=why, stage=Stage.PRE_BIND, plugin=self.name)
        )


class NodeCheck:
    """PreBind: the RM's node passes the checks selected by the ResourceManager's ``nodeCheck``."""

    name = "NodeCheck"

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        node_name = ctx.node
        if node_name is None:
            return Status.error("no reservation was made before PreBind; is the Reserve chain intact?")
        problem = check_node(
            pod=ctx.pod,
            node_name=node_name,
            node=ctx.ports.nodes.get(node_name),
            rm_name=ctx.profile.name,
            mode=ctx.profile.node_check,
        )
        placed = ctx.ports.placed
        if (
            problem is None
            and ctx.profile.node_check is NodeCheckMode.FULL
            and placed is not None
            and (ctx.pod.rules or VERDICT in ctx.state)
        ):
            # The inter-pod rules again, against the placed pods as they are now: an RM that ignored
            # the node constraints it was sent (or a pod bound meanwhile by another scheduler) is
            # caught before the Binding, which no kubelet would check.
            # Only the chosen node is asked about: the same answer as the whole verdict's.
            problem = rules_problem(
                rules_refusing(ctx.pod, placed, node_name, without=counted_by(ctx)),
                node_name=node_name,
                rm_name=ctx.profile.name,
            )
        if problem is None:
            return Status.success()
        return Status.failed(
            Failure(kind=FailureKind.NODE_CHECK, message=problem, stage=Stage.PRE_BIND, plugin=self.name)
        )


class DefaultBinder:
    """Bind: POST a Binding with the UID precondition and the reservation id annotation.

    A Binding that got no answer (timeout, connection reset) may or may not have been applied.
    Retrying it is safe: the UID precondition keeps it from binding a replacement pod, and if the
    first attempt landed the retry gets a 409 naming our node, which is success when the pod there
    carries our reservation id and UID (anything else is someone else's Binding: release, silently).
    Each attempt's timeout ends before the reservation's lease (renewed first when it runs low); if
    the lease leaves no time and cannot be renewed, no further attempt is sent.  If every attempt
    goes unanswered the outcome stays unknown, and the reservation is *kept* (see
    ``FailureKind.BIND_UNCONFIRMED``) until the pod is seen bound (commit), gone or bound elsewhere
    (release), or scheduled again (its next cycle reuses it): releasing the capacity of a pod that
    may be running there is worse than holding unused capacity a little longer.
    """

    name = "DefaultBinder"

    def __init__(
        self,
        *,
        retry_delays: Sequence[float] = (0.2, 1.0),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        attempt_seconds: float = BIND_ATTEMPT_SECONDS,
    ) -> None:
        self._retry_delays = tuple(retry_delays)
        self._sleep = sleep
        self._attempt_seconds = attempt_seconds

    async def bind(self, *, ctx: CycleContext) -> Status:
        if ctx.reservation is None:
            return Status.error("no reservation was made before Bind; is the Reserve chain intact?")
        node = ctx.reservation.node
        reservation_id = ctx.reservation.id
        annotations = {RESERVATION_ANNOTATION: reservation_id}
        needed, unanswered = MIN_CALL_SECONDS, 0
        for delay in (*self._retry_delays, None):
            timeout = await call_budget(ctx, cap=self._attempt_seconds, needed=needed)
            if timeout is None:
                return Status.failed(self._out_of_lease(ctx, unanswered=unanswered))
            try:
                await ctx.ports.binder.bind(pod=ctx.pod, node=node, annotations=annotations, timeout=timeout)
            except BindConflict as conflict:
                if conflict.current_node != node:
                    return _failure(ctx, conflict, Stage.BIND, self.name)
                if conflict.reservation_id == reservation_id and conflict.pod_uid == ctx.pod.uid:
                    log.info("pod %s was already bound to %s (a lost response): success", ctx.pod.key, node)
                    return Status.success()
                return Status.failed(self._someone_elses(ctx, conflict, node=node))
            except BindError as error:
                if unanswered and error.status is not None:
                    # An earlier attempt may have landed; this answer speaks only for itself.
                    return Status.failed(self._after_unanswered(ctx, error, unanswered=unanswered))
                if error.status is not None or delay is None:
                    return _failure(ctx, error, Stage.BIND, self.name)
                unanswered, needed = unanswered + 1, timeout
                log.info("binding pod %s got no answer (%s); retrying in %g s", ctx.pod.key, error, delay)
                await self._sleep(delay)
            except Exception as error:
                return _failure(ctx, error, Stage.BIND, self.name)
            else:
                return Status.success()
        raise AssertionError("unreachable: the last attempt always returns")

    def _someone_elses(self, ctx: CycleContext, conflict: BindConflict, *, node: str) -> Failure:
        """409 naming our node, but the pod there is not bound with our reservation (or is another pod)."""
        assert ctx.reservation is not None
        if conflict.pod_uid != ctx.pod.uid:
            holder = f"a pod with UID {conflict.pod_uid} now holds its name"
        elif conflict.reservation_id is None:
            holder = "it carries no Bindery reservation"
        else:
            holder = f"it carries reservation {conflict.reservation_id}"
        return Failure(
            kind=FailureKind.BOUND_ELSEWHERE,
            message=(
                f'the pod was bound to node "{node}" by someone else: {holder}, not ours '
                f"({ctx.reservation.id})"
            ),
            stage=Stage.BIND,
            plugin=self.name,
        )

    def _after_unanswered(self, ctx: CycleContext, error: BindError, *, unanswered: int) -> Failure:
        """A refusal (e.g. 403 from an apiserver still loading its authorizer) after attempts that got
        no answer: those may have bound the pod, so the reservation is kept and the pod read."""
        return Failure(
            kind=FailureKind.BIND_UNCONFIRMED,
            message=(
                f"{error.message}, after {unanswered} attempt{'s' if unanswered > 1 else ''} that got no "
                "answer; its reservation is kept until Bindery sees whether the Binding was applied"
            ),
            stage=Stage.BIND,
            plugin=self.name,
        )

    def _out_of_lease(self, ctx: CycleContext, *, unanswered: int) -> Failure:
        """No time is left on the lease for a Binding attempt, and it could not be renewed."""
        assert ctx.reservation is not None
        ttl = ctx.profile.reservation_ttl_seconds
        if unanswered:
            return Failure(
                kind=FailureKind.BIND_UNCONFIRMED,
                message=(
                    f"binding pod {ctx.pod.key} to node {ctx.reservation.node!r} got no answer "
                    f"({unanswered} attempt{'s' if unanswered > 1 else ''}), and reservation "
                    f"{ctx.reservation.id}'s {ttl} s lease leaves no time for another and could not be "
                    "renewed; its reservation is kept until Bindery sees whether the Binding was applied"
                ),
                stage=Stage.BIND,
                plugin=self.name,
            )
        return Failure(
            kind=FailureKind.LEASE_EXPIRED,
            message=(
                f"reservation {ctx.reservation.id} on node {ctx.reservation.node!r} may expire before a "
                f"Binding could be answered (its {ttl} s lease is nearly over and resource manager "
                f'"{ctx.profile.name}" could not renew it), so no Binding was sent; released it and '
                "retrying. If this repeats, raise spec.reservationTTLSeconds or upgrade the resource "
                "manager to contract v1.1 (renew)"
            ),
            stage=Stage.BIND,
            plugin=self.name,
        )


class ScheduledEvent:
    """PostBind: the ``Scheduled`` event, exactly as kube-scheduler writes it."""

    name = "ScheduledEvent"

    def __init__(self, *, timeout_seconds: float = EVENT_SECONDS) -> None:
        self._timeout_seconds = timeout_seconds

    async def post_bind(self, *, ctx: CycleContext) -> None:
        if ctx.node is None:
            return
        timeout = await call_budget(ctx, cap=self._timeout_seconds)
        if timeout is None:  # the commit that follows matters more than the event
            log.warning(
                "not writing the Scheduled event of pod %s (bound to %s): the reservation's lease is "
                "nearly over and could not be renewed, so it is committed at once",
                ctx.pod.key,
                ctx.node,
            )
            return
        await ctx.ports.events.scheduled(
            pod=ctx.pod, node=ctx.node, scheduler_name=ctx.scheduler_name, timeout=timeout
        )


class CommitReservation:
    """PostBind: turn the reservation into an allocation so it no longer expires.

    The pod is bound by now, so a failed commit cannot fail the cycle; but an uncommitted
    reservation expires after its TTL and the RM would then hand the pod's capacity to another
    pod.  So a failed commit is retried in the background (by default after 1, 2, 4, 8 and 16 s,
    only while the reservation's lease, as the cycle knows it, has not run out), and given up loudly.
    """

    name = "CommitReservation"

    def __init__(
        self,
        *,
        retry_delays: Sequence[float] = (1.0, 2.0, 4.0, 8.0, 16.0),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._retry_delays = tuple(retry_delays)
        self._sleep = sleep
        self._retries: set[asyncio.Task[bool]] = set()

    async def post_bind(self, *, ctx: CycleContext) -> None:
        if ctx.reservation is None:
            return
        try:
            await ctx.profile.client.commit(ctx.reservation.id, pod_uid=ctx.pod.uid)
        except Exception as error:
            ctx.state[COMMIT_FAILED] = True
            if isinstance(error, RMConflict):  # already released or expired: retrying cannot help
                raise
            retry = asyncio.create_task(
                self.retry_commit(
                    client=ctx.profile.client,
                    reservation_id=ctx.reservation.id,
                    pod=ctx.pod.key,
                    pod_uid=ctx.pod.uid,
                    ttl_seconds=_lease_left(ctx),
                ),
                name=f"commit {ctx.reservation.id}",
            )
            self._retries.add(retry)
            retry.add_done_callback(self._retries.discard)
            raise

    async def retry_commit(
        self,
        *,
        client: ReservationClient,
        reservation_id: str,
        pod: str,
        ttl_seconds: float,
        pod_uid: str | None = None,
    ) -> bool:
        """Retry a failed commit while the reservation lives; returns whether it was committed."""
        waited = 0.0
        for delay in self._retry_delays:
            waited += delay
            if waited >= ttl_seconds:
                break
            await self._sleep(delay)
            try:
                await client.commit(reservation_id, pod_uid=pod_uid)
            except RMConflict as error:  # released or expired meanwhile: retrying cannot help
                log.error(
                    "reservation %s of bound pod %s can no longer be committed: %s",
                    reservation_id,
                    pod,
                    error,
                )
                return False
            except Exception as error:
                log.warning(
                    "committing reservation %s of bound pod %s failed again: %s", reservation_id, pod, error
                )
                continue
            log.info("committed reservation %s of bound pod %s after a retry", reservation_id, pod)
            return True
        log.error(
            "gave up committing reservation %s of bound pod %s: it expires after %g s and the resource "
            "manager may then place other pods on that pod's capacity; check the resource manager",
            reservation_id,
            pod,
            ttl_seconds,
        )
        return False


#: Names that cannot be used for third-party plugins (they are always enabled).
BUILTIN_NAMES: frozenset[str] = frozenset(
    {
        ResourceManagerReservation.name,
        PodStillPending.name,
        NodeCheck.name,
        DefaultBinder.name,
        ScheduledEvent.name,
        CommitReservation.name,
        "PodPlacementRules",  # bindery.scheduling.placementrules (it imports this module)
    }
)
