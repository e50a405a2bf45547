"""One scheduling cycle for one pod: pre-filter, reserve, pre-bind, bind, post-bind; unreserve on any
failure after reserving.

This is kube-scheduler's binding cycle with the placement decision delegated to the resource
manager.  :func:`schedule_one` runs the extension points in order (through
:mod:`bindery.scheduling.points`, the runners the pod-group path uses too) and never raises for an ordinary
failure: it returns a :class:`CycleOutcome` that tells the caller where the pod goes next
(``SchedulingQueue.settle(uid, outcome=..., retry_after=..., requeue=failure.requeue)``: the events
the refusing plugin declared, see :class:`~bindery.scheduling.framework.EnqueueExtensions`) and
whether capacity was released
(then the caller should ``move_all_to_active``, since the released capacity may fit a parked pod).

Invariants the tests pin down:

* The success path writes exactly twice to the apiserver (the Binding and the ``Scheduled``
  event) and reads nothing from it (the pre-bind checks use the watch caches).
* After a reservation, every failure path, and cancellation, runs every Reserve plugin's
  ``unreserve`` in reverse order, which releases the reservation exactly once.  The exception is
  a Binding whose fate is unknown (no answer, or cancelled while in flight): the pod may be bound,
  so its reservation is kept: the caller settles it once the pod's fate is known (see
  ``bindery.controller.reservations.unconfirmed``), or the pod's next cycle reuses it.
* A failure is reported (``FailedScheduling`` event + ``PodScheduled=False``) unless the pod is
  gone or bound by someone else; repeats are throttled (:class:`~bindery.scheduling.throttle.
  EventThrottle`) and an unchanged condition is not rewritten.
* PostBind plugins cannot change the outcome: their exceptions are logged and ignored.
* A PreBind plugin that waits (``ctx.wait_apart()``) moves the rest of the cycle out of the
  scheduling budget into the binding pool (``gate``); the order of the points and of unreserve is
  the same, and the pool's place is given back once the cycle ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable

from bindery.scheduling.decisions import Decision, Failure, FailureKind, Outcome, decide
from bindery.scheduling.defaults import (
    COMMIT_FAILED,
    CommitReservation,
    DefaultBinder,
    NodeCheck,
    PodStillPending,
    ResourceManagerReservation,
    ScheduledEvent,
    lease_of,
)
from bindery.scheduling.dynamicresources import DynamicResources
from bindery.scheduling.events import Requeue
from bindery.scheduling.framework import (
    BindingGate,
    BindPlugin,
    CycleContext,
    PluginChain,
    Ports,
    PostBindPlugin,
    PreBindPlugin,
    PreFilterPlugin,
    Profile,
    ReservePlugin,
)
from bindery.scheduling.placementrules import PodPlacementRules
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.points import (
    run_bind,
    run_post_bind,
    run_pre_bind,
    run_pre_filter,
    run_reserve,
    run_unreserve,
)
from bindery.scheduling.ports import PodGone
from bindery.scheduling.throttle import EventThrottle
from bindery.scheduling.traced import traced
from bindery.scheduling.volumes import VolumeBinding

__all__ = ["CycleOutcome", "PluginChain", "plugin_chain", "schedule_one"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class CycleOutcome:
    """How one cycle ended, and what the caller does next."""

    outcome: Outcome
    node: str | None = None
    reservation_id: str | None = None
    failure: Failure | None = None
    decision: Decision | None = None
    #: The reservation was released (capacity may fit a parked pod now).
    released: bool = False
    #: A FailedScheduling event was written (not suppressed by the throttle).
    reported: bool = False
    #: Bound, but the RM commit failed: the reservation expires unless committed later.
    commit_failed: bool = False
    #: When the reservation's lease runs out (``profile.clock``), as the cycle last knew it.
    lease_expires: float | None = None

    @property
    def bound(self) -> bool:
        return self.outcome is Outcome.BOUND

    @property
    def retry_after(self) -> float | None:
        return self.decision.retry_after if self.decision is not None else None


_VOLUMES = VolumeBinding()
_RULES = PodPlacementRules()
#: One for the process: claims are cluster objects, so its in-flight view spans every profile.
DEVICES = DynamicResources()
_DEFAULT_PRE_FILTER: tuple[PreFilterPlugin, ...] = (DEVICES, _VOLUMES, _RULES)
# VolumeBinding and PodPlacementRules after the RM's reservation: their unreserve (undo the claims'
# selected node, forget the assumed pod) runs before the release, in reverse order.
_DEFAULT_RESERVE: tuple[ReservePlugin, ...] = (ResourceManagerReservation(), _RULES, _VOLUMES, DEVICES)
_DEFAULT_PRE_BIND: tuple[PreBindPlugin, ...] = (PodStillPending(), NodeCheck(), _VOLUMES, DEVICES)
_DEFAULT_BIND: tuple[BindPlugin, ...] = (DefaultBinder(),)
_DEFAULT_POST_BIND: tuple[PostBindPlugin, ...] = (ScheduledEvent(), CommitReservation())


def plugin_chain(*, profile: Profile) -> PluginChain:
    """Defaults first, then the ResourceManager's extra plugins; a configured binder replaces the default."""
    extra = profile.plugins
    return PluginChain(
        pre_filter=_DEFAULT_PRE_FILTER + extra.pre_filter,
        reserve=_DEFAULT_RESERVE + extra.reserve,
        pre_bind=_DEFAULT_PRE_BIND + extra.pre_bind,
        bind=extra.bind if extra.bind is not None else _DEFAULT_BIND,
        post_bind=_DEFAULT_POST_BIND + extra.post_bind,
    )


async def schedule_one(
    *,
    pod: PodInfo,
    profile: Profile,
    ports: Ports,
    throttle: EventThrottle | None = None,
    gate: BindingGate | None = None,
) -> CycleOutcome:
    """Run one binding cycle for ``pod`` (popped from the profile's queue) and report failures.

    ``throttle`` rate-limits FailedScheduling events; share one per profile across cycles.
    ``gate``: where a PreBind plugin that waits sends the pod (the binding pool); its place there
    is given back when the cycle ends, however it ends. ``None``: such a plugin waits in the slot.
    """
    ctx = CycleContext(pod=pod, profile=profile, ports=ports, gate=gate)
    try:
        return await _cycle(ctx, throttle)
    finally:
        if gate is not None and ctx.apart:
            gate.leave(ctx=ctx)


async def _cycle(ctx: CycleContext, throttle: EventThrottle | None) -> CycleOutcome:
    pod, profile = ctx.pod, ctx.profile
    plain = plugin_chain(profile=profile)
    chain = traced(plain)  # spans around each plugin when tracing is on
    binding = False
    try:
        failure = await run_pre_filter(ctx=ctx, plugins=chain.pre_filter)
        if failure is None:
            failure = await run_reserve(ctx=ctx, plugins=chain.reserve)
        if failure is None:
            failure = await run_pre_bind(ctx=ctx, plugins=chain.pre_bind)
        if failure is None:
            binding = True
            failure = await run_bind(ctx=ctx, plugins=chain.bind)
    except asyncio.CancelledError:
        if binding:
            log.warning("cancelled while binding pod %s; keeping its reservation until it expires", pod.key)
        else:
            await run_unreserve(ctx=ctx, plugins=chain.reserve)
        raise
    if failure is None:
        await run_post_bind(ctx=ctx, plugins=chain.post_bind)
        log.info("bound pod %s to node %s", pod.key, ctx.node)
        return CycleOutcome(
            outcome=Outcome.BOUND,
            node=ctx.node,
            reservation_id=ctx.reservation.id if ctx.reservation else None,
            commit_failed=bool(ctx.state.get(COMMIT_FAILED)),
        )
    if failure.requeue is None:  # what can make the pod schedulable, as the refusing plugin says
        requeue = plain.requeue_of(pod=pod, failure=failure)
        if requeue is None and failure.kind is FailureKind.RM_UNSCHEDULABLE:
            requeue = Requeue.no_room()  # the RM's "no room", relayed by a plugin that declares nothing
        elif requeue is None and failure.kind is FailureKind.RM_UNAVAILABLE:
            requeue = Requeue.rm_ready()
        failure = dataclasses.replace(failure, requeue=requeue)
    decision = decide(failure=failure)
    released = ctx.reservation is not None and decision.release
    if decision.release:
        await run_unreserve(ctx=ctx, plugins=chain.reserve)
    reported = await _report(ctx, failure, decision, throttle) if decision.report else False
    log.log(
        logging.INFO if decision.report else logging.DEBUG,
        "pod %s not bound (%s at %s): %s",
        pod.key,
        failure.kind,
        failure.stage,
        failure.message,
    )
    return CycleOutcome(
        outcome=decision.outcome,
        node=ctx.node,
        reservation_id=ctx.reservation.id if ctx.reservation else None,
        failure=failure,
        decision=decision,
        released=released,
        reported=reported,
        lease_expires=lease.expires if (lease := lease_of(ctx)) is not None else None,
    )


# -- reporting ---------------------------------------------------------------------------------


async def _report(
    ctx: CycleContext, failure: Failure, decision: Decision, throttle: EventThrottle | None
) -> bool:
    """The FailedScheduling event (throttled) and the PodScheduled=False condition (if changed)."""
    pod = ctx.pod
    message = decision.message
    event = message if throttle is None else throttle.admit(uid=pod.uid, key=failure.kind, message=message)
    if event is not None:
        await _best_effort(
            "write the FailedScheduling event",
            pod,
            ctx.ports.events.failed_scheduling(pod=pod, message=event, scheduler_name=ctx.scheduler_name),
        )
    current = pod.unschedulable_condition
    condition = (decision.condition_reason, message)
    if current != condition and (event is not None or current is None or current[0] != condition[0]):
        await _best_effort(
            "set PodScheduled=False",
            pod,
            ctx.ports.conditions.pod_scheduled_false(pod=pod, reason=condition[0], message=message),
        )
    return event is not None


async def _best_effort(what: str, pod: PodInfo, write: Awaitable[None]) -> None:
    try:
        await write
    except PodGone:
        log.debug("could not %s for pod %s: it is gone", what, pod.key)
    except Exception as error:
        log.warning("could not %s for pod %s: %s", what, pod.key, error)
