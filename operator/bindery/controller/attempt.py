"""One pod's attempt: its trace span, its log context, the cycle, and what the outcome leaves behind.

The runner's workers pop a pod and hand it to :meth:`Attempts.run`; everything from there to the
next pod is here. The cycle (:func:`bindery.scheduling.cycle.schedule_one`) decides; an attempt
records the decision (metrics, the trace's attributes), tells the queue (requeue after backoff,
park, or drop), tracks a reservation whose Binding got no answer, and releases what a pod that left
while its cycle ran no longer needs. The state kept across attempts (the pods found gone, the
cycles running, the departures left to a cycle, the event throttle) belongs to one runner, so
there is one :class:`Attempts` per :class:`bindery.controller.profile.runner.ProfileRunner`.

A pod can vanish without the watch saying so (Kopf emits no DELETED for a pod deleted while its
watch was down). Like kube-scheduler, which looks the pod up before reporting a failure, a cycle
checks with one GET that its pod still exists before it writes a FailedScheduling event (the
failure path only: the success path still reads nothing); a pod found gone or replaced is dropped
instead of requeued. The runtime's periodic sweep of unbound pods catches the rest.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from bindery import tracing
from bindery.adapters.reads import read_pod
from bindery.apiserver import ApiClient
from bindery.controller.metrics import Metrics, result_label
from bindery.controller.preemption import PendingPlan, Preemptions
from bindery.controller.reservations.unconfirmed import UnconfirmedBinds
from bindery.logcontext import log_context
from bindery.rm.errors import RMError
from bindery.scheduling.cycle import CycleOutcome, schedule_one
from bindery.scheduling.decisions import REASON_UNSCHEDULABLE, FailureKind, Outcome
from bindery.scheduling.framework import BindingGate, Ports, Profile
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import ConditionWriter, EventSink, PodGone
from bindery.scheduling.queue import SchedulingQueue
from bindery.scheduling.throttle import EventThrottle
from bindery.typedefs import Logger

#: Pods whose Scheduled event was written, remembered so that it is written once (see _CheckedEvents).
REMEMBERED_SCHEDULED = 10_000
#: how long the existence check before a FailedScheduling event may take
EXISTENCE_CHECK_SECONDS = 5.0


class Attempts:
    """The attempts of one runner's pods: :meth:`run` is one pod's, start to settling."""

    def __init__(
        self,
        *,
        profile: Callable[[], Profile],
        queue: SchedulingQueue,
        ports: Ports,
        api: ApiClient,
        unconfirmed: UnconfirmedBinds,
        metrics: Metrics,
        logger: Logger,
        on_released: Callable[[], None],
        on_released_departed: Callable[[], None],
        on_dropped: Callable[[str], None],
        preemptions: Preemptions | None = None,
        gate: BindingGate | None = None,
    ) -> None:
        """`gate`: where a cycle waiting in PreBind goes (the runner's binding pool); None: it waits
        in its slot."""
        self._profile = profile
        self._gate = gate
        self._preemptions = preemptions
        self._queue = queue
        self._unconfirmed = unconfirmed
        self._metrics = metrics
        self._logger = logger
        self._on_released = on_released
        self._on_released_departed = on_released_departed
        self._on_dropped = on_dropped
        self._throttle = EventThrottle()
        self._gone: set[str] = set()  # pods a failed cycle found gone: dropped when the cycle ends
        self._cycling: set[str] = set()  # UIDs of the pods whose cycle runs now
        #: uid → reservation id: the pod finished or left while its cycle ran; released when it ends
        self._departed: dict[str, str] = {}
        #: The ports the cycles (and the runner's pod groups) write through.
        self.ports = dataclasses.replace(
            ports,
            events=_CheckedEvents(inner=ports.events, api=api, gone=self._gone),
            conditions=_NoticedConditions(inner=ports.conditions, gone=self._gone),
        )
        if preemptions is not None:
            preemptions.report = self._report_preemption

    async def _report_preemption(self, pod: PodInfo, message: str) -> None:
        """Why the pod's plan was not carried out, as kube-scheduler reports a failed PostFilter:
        a FailedScheduling event (throttled like the cycle's) and PodScheduled=False."""
        note = self._throttle.admit(uid=pod.uid, key="Preemption", message=message)
        if note is not None:
            await self.ports.events.failed_scheduling(
                pod=pod, message=note, scheduler_name=pod.scheduler_name
            )
        await self.ports.conditions.pod_scheduled_false(pod=pod, reason=REASON_UNSCHEDULABLE, message=message)

    def forget(self, uid: str) -> None:
        """The pod left: drop what the attempts kept about it."""
        self._throttle.forget(uid)
        if self._preemptions is not None:
            self._preemptions.forget(uid)
        self._gone.discard(uid)  # a gang member found gone has no cycle to drop it

    def preemption_backoff(self, uid: str) -> tuple[float, str] | None:
        """Seconds until the pod may preempt again and why its last plan failed, or None."""
        return self._preemptions.backed_off(uid) if self._preemptions is not None else None

    def preemption_plan(self, uid: str) -> PendingPlan | None:
        """The pod's confirmed preemption plan while it waits for its victims or its reserve."""
        return self._preemptions.pending(uid) if self._preemptions is not None else None

    def sizes(self) -> dict[str, int]:
        """Entries held per pod, by structure (see ProfileRunner.per_pod_sizes)."""
        return {"event_throttle": len(self._throttle), "gone": len(self._gone)}

    async def run(self, pod: PodInfo) -> None:
        """One pod: the scheduling cycle, then its outcome to the queue, the metrics and the settling."""
        with log_context(pod=pod.key, pod_uid=pod.uid, resource_manager=self._profile().name):
            if tracing.state.on:
                await self._traced(pod)
            else:
                await self._in_context(pod)

    async def _traced(self, pod: PodInfo) -> None:
        """The cycle as one trace: its root span, the time the pod waited in the queue before it."""
        attempt = self._queue.attempts(pod.uid) + 1
        attributes: dict[str, str | int] = {
            "k8s.namespace.name": pod.namespace,
            "k8s.pod.name": pod.name,
            "k8s.pod.uid": pod.uid,
            "bindery.resource_manager": self._profile().name,
            "bindery.scheduler_name": pod.scheduler_name,
            "bindery.attempt": attempt,
        }
        now_ns = time.time_ns()
        ready = self._queue.ready_since(pod.uid)  # the end of its backoff; None on a first attempt
        if ready is not None:
            waited_ns = int(max(self._queue.now() - ready, 0.0) * 1e9)
        else:
            waited_ns = max(now_ns - int(pod.created.timestamp() * 1e9), 0)
        # The attempt's span starts when the pod was due, so the trace shows its wait before it too.
        with tracing.span("Schedule pod", attributes, start_ns=now_ns - waited_ns):
            tracing.record_span(
                "Queue wait", start_ns=now_ns - waited_ns, end_ns=now_ns, attributes=attributes
            )
            await self._in_context(pod)

    async def _in_context(self, pod: PodInfo) -> None:
        started = time.perf_counter()
        self._cycling.add(pod.uid)
        asked = pod
        if (
            self._preemptions is not None
            and pod.preemption_policy != "Never"
            and self._preemptions.paused(pod.uid)
        ):
            # Backing off after a failed plan: this reserve asks the RM for no plan (no loops).
            asked = dataclasses.replace(pod, preemption_policy="Never")
        try:
            result = await schedule_one(
                pod=asked, profile=self._profile(), ports=self.ports, throttle=self._throttle, gate=self._gate
            )
        except asyncio.CancelledError:  # paused or stopped: the cycle has unreserved; requeue
            self._queue.done(pod.uid, outcome=Outcome.ERROR)
            self._departed.pop(pod.uid, None)  # left to reconciliation: the lease may be lost
            raise
        except Exception:  # a bug in the cycle must not kill the worker
            self._logger.exception(f"scheduling cycle of pod {pod.key} crashed; retrying after backoff")
            self._queue.done(pod.uid, outcome=Outcome.ERROR)
            self._record(pod, Outcome.ERROR, started)
            await self._release_departed(pod)
            return
        finally:
            self._cycling.discard(pod.uid)
        if pod.uid in self._gone and result.outcome is not Outcome.BOUND:
            result = dataclasses.replace(result, outcome=Outcome.DROPPED)  # a ghost: do not requeue
        self._gone.discard(pod.uid)
        self._record(pod, result.outcome, started)
        if tracing.state.on:
            tracing.set_attributes(
                {
                    "bindery.result": result_label(result.outcome),
                    "k8s.node.name": result.node,
                    "bindery.reservation": result.reservation_id,
                }
            )
        self.follow_up(pod, result)
        if result.released:
            self._metrics.release(resource_manager=self._profile().name, reason="cycle_failure")
        # The plugin that refused the pod declared what can make it schedulable (a release, a Node,
        # a placed pod in its scope): the queue parks it until then. A refusal nobody declared
        # events for (a claim not created yet hangs on objects Bindery does not watch) comes back
        # on its backoff.
        no_room = result.failure is not None and result.failure.kind is FailureKind.RM_UNSCHEDULABLE
        self._queue.settle(
            pod.uid,
            outcome=result.outcome,
            retry_after=result.retry_after,
            requeue=result.failure.requeue if result.failure is not None else None,
        )
        plan = result.failure.plan if no_room and result.failure is not None else None
        # After `done`: the victims' deletion is the event that wakes the pod for its reserve. But
        # victims another scheduler placed release no reservation when they go, and nothing else
        # wakes the pod: it also polls on its backoff until the RM places it on the held room.
        if (
            plan is not None
            and self._preemptions is not None
            and result.failure is not None
            and await self._preemptions.carry_out(pod, plan, asked=result.failure.plan_asked)
        ):
            self._queue.retry_within(pod.uid, 0.0)
        if plan is None and no_room and pod.nominated_node and self._preemptions is not None:
            # Nominated, yet no plan behind it: the process that nominated died and the plan ended
            # with it, or the RM holds nothing for the pod any more. Nothing is being preempted.
            await self._preemptions.clear_nomination(pod)
        if no_room and self._preemptions is not None and (pause := self._preemptions.paused(pod.uid)):
            self._queue.retry_within(pod.uid, pause)  # it may preempt again then, event or not
        if result.outcome is Outcome.DROPPED:
            self._throttle.forget(pod.uid)
            self._on_dropped(pod.uid)  # gone or bound elsewhere, even if the watch missed it
        if result.released:
            self._on_released()
        # After `follow_up`: an unanswered Binding's reservation is tracked by now, and the release
        # goes through the RM stack, which reads the pod first (finished: released, not committed).
        await self._release_departed(pod)

    def defer_departed(self, uid: str, reservation_id: str) -> bool:
        """The bound-pod watch saw this pod finish or go: while its cycle runs, the cycle releases.

        Its PostBind commit may not have been sent yet; a release before it would make the commit
        fail (409) and report a failure for a pod that did nothing wrong.
        """
        if uid not in self._cycling:
            return False
        self._departed[uid] = reservation_id
        return True

    async def _release_departed(self, pod: PodInfo) -> None:
        """Release what the bound-pod watch left to this pod's cycle (see `defer_departed`)."""
        reservation_id = self._departed.pop(pod.uid, None)
        if reservation_id is None:
            return
        try:
            await self._profile().client.release(reservation_id, pod_uid=pod.uid)
        except RMError as exc:
            self._logger.warning(
                f"could not release reservation {reservation_id} of pod {pod.key}, which finished or was "
                f"deleted while it was being scheduled: {exc}; reconciliation releases it"
            )
            return
        self._logger.info(
            f"released reservation {reservation_id}: pod {pod.key} finished or was deleted while it was "
            "being scheduled"
        )
        self._on_released_departed()

    def follow_up(self, pod: PodInfo, result: CycleOutcome) -> None:
        """A Binding that got no answer leaves a reservation to settle; a bind with it settles it.

        Only the reservation this cycle bound with is forgotten: a cycle that failed before getting
        an earlier unanswered Binding's reservation back did not settle it (its releases go through
        the RM stack), and that Binding may still land. Pod groups' binds come through here too.
        """
        unconfirmed = result.failure is not None and result.failure.kind is FailureKind.BIND_UNCONFIRMED
        if unconfirmed and result.reservation_id is not None and result.node is not None:
            self._unconfirmed.track(
                reservation_id=result.reservation_id,
                pod=pod,
                node=result.node,
                ttl_seconds=self._profile().reservation_ttl_seconds,
                expires=result.lease_expires,
            )
        elif result.bound and result.reservation_id is not None:
            self._unconfirmed.forget(result.reservation_id)

    def _record(self, pod: PodInfo, outcome: Outcome, started: float) -> None:
        self._metrics.attempt(
            resource_manager=self._profile().name,
            uid=pod.uid,
            outcome=outcome,
            seconds=time.perf_counter() - started,
            attempts=self._queue.attempts(pod.uid) + 1,  # before `done` counts this one
        )


class _CheckedEvents:
    """The event sink of the cycles: a FailedScheduling event is written only for a pod that exists,
    and a Scheduled event once per pod.

    One GET (failure path only; the throttle already let the event through), as kube-scheduler
    looks the pod up in its informer before deciding whether to requeue. A pod gone, or replaced
    under its name, raises PodGone (the cycle treats that as harmless: nobody reads events of a
    pod that does not exist) and is marked for dropping. A failed read does not hold the report back.

    Scheduled: a Binding that got no answer can land while the pod's next cycle runs; then the
    tracker (reading the pod) and the cycle (meeting a 409 naming our node with our reservation)
    both see it bound, in the same instant. The first to report wins; the UIDs reported are
    remembered, bounded (the race is over within a cycle).
    """

    def __init__(self, *, inner: EventSink, api: ApiClient, gone: set[str]) -> None:
        self._inner = inner
        self._api = api
        self._gone = gone
        self._scheduled: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def scheduled(
        self,
        *,
        pod: PodInfo,
        node: str,
        scheduler_name: str,
        timeout: float | None = None,  # noqa: ASYNC109 (the EventSink protocol's bound on the request)
    ) -> None:
        if pod.uid in self._scheduled:
            return  # the other path reported this pod's bind already
        self._scheduled[pod.uid] = None  # before awaiting: the other path may run meanwhile
        while len(self._scheduled) > REMEMBERED_SCHEDULED:
            self._scheduled.popitem(last=False)
        await self._inner.scheduled(pod=pod, node=node, scheduler_name=scheduler_name, timeout=timeout)

    async def failed_scheduling(self, *, pod: PodInfo, message: str, scheduler_name: str) -> None:
        with tracing.span("Event FailedScheduling"):  # a shared no-op unless tracing is on
            try:
                async with asyncio.timeout(EXISTENCE_CHECK_SECONDS):
                    body = await read_pod(api=self._api, namespace=pod.namespace, name=pod.name)
            except Exception:
                body = {"metadata": {"uid": pod.uid}}  # unknown: report as before
            if not _exists(body, uid=pod.uid):
                self._gone.add(pod.uid)
                raise PodGone(f"pod {pod.key} no longer exists (or another pod took its name)")
            await self._inner.failed_scheduling(pod=pod, message=message, scheduler_name=scheduler_name)


class _NoticedConditions:
    """The condition writer of the cycles: a 404 on the PodScheduled patch marks the pod for dropping."""

    def __init__(self, *, inner: ConditionWriter, gone: set[str]) -> None:
        self._inner = inner
        self._gone = gone

    async def pod_scheduled_false(self, *, pod: PodInfo, reason: str, message: str) -> None:
        try:
            await self._inner.pod_scheduled_false(pod=pod, reason=reason, message=message)
        except PodGone:
            self._gone.add(pod.uid)
            raise

    async def pod_scheduled_true(self, *, pod: PodInfo) -> None:
        await self._inner.pod_scheduled_true(pod=pod)


def _exists(body: Mapping[str, Any] | None, *, uid: str) -> bool:
    """Pure: the pod body read (None = not found) is still the pod with this UID.

    A pod bound meanwhile still exists: its failure is reported as usual (a Binding that got no
    answer is one), and the watch reports it leaving.
    """
    return body is not None and (body.get("metadata") or {}).get("uid") == uid
