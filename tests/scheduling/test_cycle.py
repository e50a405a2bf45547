"""schedule_one: the success path's exact writes, every failure path's release and report, plugins."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import pytest

from bindery.rm.errors import RMConflict, RMProtocolError, RMRejected, RMUnavailable, RMUnschedulable
from bindery.rm.models import Reservation, ReservationRequest, ReservationState
from bindery.scheduling.cycle import CycleOutcome, schedule_one
from bindery.scheduling.decisions import FailureKind, Outcome
from bindery.scheduling.framework import CycleContext, PluginSet, Ports, Profile, Status
from bindery.scheduling.nodecheck import NodeCheckMode
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import BindConflict, BindError, NodeProjection, PodGone
from bindery.scheduling.throttle import EventThrottle
from tests.scheduling.fakes import (
    Calls,
    FakeBinder,
    FakeClock,
    FakeConditions,
    FakeEvents,
    FakeNodes,
    FakePods,
    FakeRM,
    pod,
)
from tests.scheduling.plugins import Announcer, CustomBinder, GateKeeper, RecordingReserve

KUBE_WRITES = (
    "binder.bind",
    "events.scheduled",
    "events.failed_scheduling",
    "conditions.pod_scheduled_false",
)


@dataclasses.dataclass
class World:
    calls: Calls
    rm: FakeRM
    nodes: FakeNodes
    pods: FakePods
    binder: FakeBinder
    events: FakeEvents
    conditions: FakeConditions
    pod: PodInfo

    def ports(self) -> Ports:
        return Ports(
            nodes=self.nodes,
            pods=self.pods,
            binder=self.binder,
            events=self.events,
            conditions=self.conditions,
        )

    def profile(self, **changes: Any) -> Profile:
        return Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=self.rm, **changes)

    async def run(self, *, throttle: EventThrottle | None = None, **changes: Any) -> CycleOutcome:
        return await schedule_one(
            pod=self.pod, profile=self.profile(**changes), ports=self.ports(), throttle=throttle
        )

    def writes(self) -> list[str]:
        return [name for name in self.calls.names() if name in KUBE_WRITES]


@pytest.fixture
def world() -> World:
    calls = Calls()
    the_pod = pod("web")
    pods = FakePods(calls)
    pods.pods[the_pod.uid] = the_pod
    return World(
        calls=calls,
        rm=FakeRM(calls, node="n1"),
        nodes=FakeNodes(calls, {"n1": NodeProjection(name="n1")}),
        pods=pods,
        binder=FakeBinder(calls),
        events=FakeEvents(calls),
        conditions=FakeConditions(calls),
        pod=the_pod,
    )


async def test_success_writes_the_binding_and_the_event_then_commits(world: World) -> None:
    outcome = await world.run()
    assert outcome.outcome is Outcome.BOUND
    assert outcome.node == "n1"
    assert outcome.reservation_id == "r1"
    assert world.calls.names() == [
        "rm.reserve",
        "pods.get",  # watch cache, not an API read
        "nodes.get",  # watch cache, not an API read
        "binder.bind",
        "events.scheduled",
        "rm.commit",
    ]
    assert world.writes() == ["binder.bind", "events.scheduled"]
    _, bind = world.calls.log[3]
    assert bind == {"pod": "uid-web", "node": "n1", "annotations": {"bindery.dev/reservation-id": "r1"}}
    assert world.calls.log[4][1]["scheduler_name"] == "bindery"
    assert world.calls.log[5][1] == {"id": "r1"}


async def test_reservation_request_uses_the_pod_uid_as_idempotency_key_and_the_profile_ttl(
    world: World,
) -> None:
    await world.run(reservation_ttl_seconds=42)
    (request,) = world.rm.requests
    assert request.idempotency_key == "uid-web"
    assert request.ttl_seconds == 42
    assert request.resources == {"cpu": "100m"}


@pytest.mark.parametrize(
    ("error", "kind", "outcome", "reason"),
    [
        (
            RMUnschedulable("409", reason="0/3 nodes are available: 3 Insufficient cpu."),
            FailureKind.RM_UNSCHEDULABLE,
            Outcome.UNSCHEDULABLE,
            "Unschedulable",
        ),
        (RMUnavailable("connection refused"), FailureKind.RM_UNAVAILABLE, Outcome.ERROR, "SchedulerError"),
        (RMProtocolError("body is not JSON"), FailureKind.RM_PROTOCOL_ERROR, Outcome.ERROR, "SchedulerError"),
        (RMRejected("bad request", status=400), FailureKind.RM_REJECTED, Outcome.ERROR, "SchedulerError"),
    ],
    ids=["unschedulable", "unavailable", "protocol", "rejected"],
)
async def test_reserve_failure_reports_without_releasing(
    world: World, error: Exception, kind: FailureKind, outcome: Outcome, reason: str
) -> None:
    world.rm.reserve_error = error
    result = await world.run()
    assert result.outcome is outcome
    assert result.failure is not None
    assert result.failure.kind is kind
    assert world.calls.count("rm.release") == 0  # nothing was reserved
    assert not result.released
    assert world.writes() == ["events.failed_scheduling", "conditions.pod_scheduled_false"]
    condition = world.calls.log[-1][1]
    assert condition["reason"] == reason
    assert 'resource manager "pool"' in condition["message"]


async def test_rm_reason_and_retry_hint_reach_the_event_and_the_outcome(world: World) -> None:
    world.rm.reserve_error = RMUnschedulable(
        "409", reason="0/3 nodes are available: 3 Insufficient cpu.", retry_after=7
    )
    result = await world.run()
    assert result.retry_after == 7
    event = world.calls.log[1][1]
    assert (
        event["message"]
        == 'resource manager "pool" has no room for the pod: 0/3 nodes are available: 3 Insufficient cpu.'
    )


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (None, 'resource manager "pool" chose node "n1", which does not exist'),
        (
            NodeProjection(name="n1", unschedulable=True),
            'resource manager "pool" chose node "n1", which is cordoned (spec.unschedulable)',
        ),
        (
            NodeProjection(name="n1", taints=({"key": "gpu", "value": "yes", "effect": "NoSchedule"},)),
            'resource manager "pool" chose node "n1", '
            "whose taint {gpu=yes:NoSchedule} the pod does not tolerate",
        ),
        (
            NodeProjection(name="n1", deleting=True),
            'resource manager "pool" chose node "n1", which is being deleted',
        ),
    ],
    ids=["missing", "cordoned", "tainted", "deleting"],
)
async def test_bad_node_is_released_and_reported_as_scheduler_error(
    world: World, node: NodeProjection | None, message: str
) -> None:
    world.nodes.nodes = {"n1": node} if node else {}
    result = await world.run()
    assert result.outcome is Outcome.ERROR
    assert world.calls.count("rm.release") == 1
    assert world.calls.count("binder.bind") == 0
    assert world.writes() == ["events.failed_scheduling", "conditions.pod_scheduled_false"]
    assert world.calls.log[-2][1]["message"] == message
    assert world.calls.log[-1][1]["reason"] == "SchedulerError"


async def test_node_check_off_trusts_the_rm(world: World) -> None:
    world.nodes.nodes = {}
    result = await world.run(node_check=NodeCheckMode.OFF)
    assert result.bound


async def test_pod_deleted_between_reserve_and_bind_is_released_silently(world: World) -> None:
    world.pods.pods.clear()
    result = await world.run()
    assert result.outcome is Outcome.DROPPED
    assert world.calls.count("rm.release") == 1
    assert world.writes() == []


async def test_pod_deleted_during_bind_is_released_silently(world: World) -> None:
    world.binder.error = PodGone()
    result = await world.run()
    assert result.outcome is Outcome.DROPPED
    assert world.calls.count("rm.release") == 1
    assert world.writes() == ["binder.bind"]


async def test_conflict_naming_the_chosen_node_is_a_lost_response_and_succeeds(world: World) -> None:
    world.binder.error = BindConflict(
        'pod web is already assigned to node "n1"', current_node="n1", pod_uid="uid-web", reservation_id="r1"
    )
    result = await world.run()
    assert result.bound
    assert world.calls.count("rm.release") == 0
    assert world.calls.count("rm.commit") == 1
    assert world.writes() == ["binder.bind", "events.scheduled"]


async def test_pod_bound_elsewhere_releases_without_any_report(world: World) -> None:
    world.binder.error = BindConflict('pod web is already assigned to node "n9"', current_node="n9")
    result = await world.run()
    assert result.outcome is Outcome.DROPPED
    assert result.released
    assert world.calls.count("rm.release") == 1
    assert world.writes() == ["binder.bind"]


async def test_other_conflict_and_bind_errors_release_and_report(world: World) -> None:
    world.binder.error = BindConflict("the UID precondition failed")
    result = await world.run()
    assert result.outcome is Outcome.ERROR
    assert world.calls.count("rm.release") == 1
    world.calls.log.clear()
    sentence = "binding pod ns/web to node 'n1' failed: HTTP 422: Binding is invalid"
    world.binder.error = BindError(sentence, status=422)
    result = await world.run()
    assert result.failure is not None
    assert result.failure.kind is FailureKind.BIND_ERROR
    assert world.calls.count("rm.release") == 1
    assert world.calls.log[-2][1]["message"] == sentence


async def test_a_reserve_answered_with_a_committed_reservation_ends_the_cycle_quietly(world: World) -> None:
    """An earlier Binding of the pod landed and was committed: no second Binding, no second
    Scheduled event, and above all no release of the running pod's allocation."""
    committed = Reservation(
        id="r-earlier",
        node="n1",
        state=ReservationState.COMMITTED,
        pod_uid=world.pod.uid,
        scheduler_name=world.pod.scheduler_name,
    )

    async def replay(request: ReservationRequest, /) -> Reservation:
        world.calls.record("rm.reserve", pod=request.pod.uid, key=request.idempotency_key)
        return committed

    world.rm.reserve = replay  # type: ignore[method-assign]
    result = await world.run()
    assert result.outcome is Outcome.DROPPED
    assert world.calls.count("rm.release") == 0
    assert world.calls.count("binder.bind") == 0
    assert [name for name, _ in world.calls.log if name.startswith(("events.", "conditions."))] == []


async def test_a_binding_answered_with_a_server_error_keeps_its_reservation(world: World) -> None:
    """An etcd timeout (500) or the apiserver's deadline (504) may have stored the Binding."""
    world.binder.error = BindError("binding failed: HTTP 500: etcdserver: request timed out", status=500)
    result = await world.run()
    assert result.failure is not None
    assert result.failure.kind is FailureKind.BIND_UNCONFIRMED
    assert world.calls.count("rm.release") == 0


async def test_release_failure_is_logged_and_does_not_change_the_outcome(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.nodes.nodes = {}
    world.rm.release_error = RMUnavailable("connection refused")
    with caplog.at_level(logging.WARNING):
        result = await world.run()
    assert result.outcome is Outcome.ERROR
    assert "expires by itself" in caplog.text


async def test_commit_failure_keeps_the_pod_bound_and_is_flagged(world: World) -> None:
    # A conflict (reservation expired meanwhile) is not retried, so no background task outlives the test.
    world.rm.commit_error = RMConflict("reservation-not-active", status=409)
    result = await world.run()
    assert result.bound
    assert result.commit_failed
    assert world.calls.count("rm.release") == 0


async def test_scheduled_event_failure_does_not_change_the_outcome_and_still_commits(world: World) -> None:
    world.events.error = RuntimeError("apiserver hiccup")
    result = await world.run()
    assert result.bound
    assert world.calls.count("rm.commit") == 1


async def test_report_failures_are_swallowed(world: World) -> None:
    world.rm.reserve_error = RMUnavailable("down")
    world.events.error = PodGone()
    world.conditions.error = RuntimeError("403 Forbidden")
    result = await world.run()
    assert result.outcome is Outcome.ERROR


async def test_repeated_failures_are_throttled_and_the_condition_not_rewritten(world: World) -> None:
    now = [0.0]
    throttle = EventThrottle(interval=60.0, clock=lambda: now[0])
    world.rm.reserve_error = RMUnschedulable("409", reason="0/3 nodes are available: 3 Insufficient cpu.")
    first = await world.run(throttle=throttle)
    assert first.reported
    # The watch delivers the pod with the condition we wrote.
    condition = world.calls.log[-1][1]
    world.pod = dataclasses.replace(
        world.pod, unschedulable_condition=(condition["reason"], condition["message"])
    )
    for _ in range(5):
        now[0] += 10
        assert not (await world.run(throttle=throttle)).reported
    now[0] += 10
    assert (await world.run(throttle=throttle)).reported
    assert world.calls.count("events.failed_scheduling") == 2
    assert world.calls.count("conditions.pod_scheduled_false") == 1
    assert "(and 5 similar failures not reported)" in world.calls.log[-1][1]["message"]
    # A different kind of failure is news: reported at once, and the condition reason changes.
    world.rm.reserve_error = RMUnavailable("connection refused")
    now[0] += 1
    assert (await world.run(throttle=throttle)).reported
    assert world.calls.log[-1][1]["reason"] == "SchedulerError"


async def test_cancellation_after_reserve_releases_and_propagates(world: World) -> None:
    started = asyncio.Event()

    class Hang:
        name = "hang"

        async def pre_bind(self, *, ctx: object) -> Status:
            started.set()
            await asyncio.Event().wait()
            return Status.success()

    task = asyncio.create_task(world.run(plugins=PluginSet(pre_bind=(Hang(),))))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert world.calls.count("rm.release") == 1


# -- extension points with test plugins -----------------------------------------------------------


async def test_pre_bind_plugin_runs_after_the_defaults_with_the_chosen_node(world: World) -> None:
    result = await world.run(plugins=PluginSet(pre_bind=(GateKeeper(world.calls),)))
    assert result.bound
    names = world.calls.names()
    assert names.index("nodes.get") < names.index("gatekeeper.pre_bind") < names.index("binder.bind")
    assert world.calls.log[names.index("gatekeeper.pre_bind")][1] == {"node": "n1"}


@pytest.mark.parametrize(
    ("plugin_status", "error", "expected"),
    [
        (
            Status.unschedulable("GPU driver not ready"),
            None,
            (
                Outcome.UNSCHEDULABLE,
                "Unschedulable",
                'PreBind plugin "gatekeeper" rejected the pod: GPU driver not ready',
            ),
        ),
        (
            Status.error("quota service down"),
            None,
            (Outcome.ERROR, "SchedulerError", 'PreBind plugin "gatekeeper" failed: quota service down'),
        ),
        (
            None,
            ValueError("boom"),
            (
                Outcome.ERROR,
                "SchedulerError",
                'internal error in PreBind plugin "gatekeeper": ValueError: boom',
            ),
        ),
    ],
    ids=["unschedulable", "error", "raises"],
)
async def test_failing_pre_bind_plugin_releases_and_requeues(
    world: World,
    plugin_status: Status | None,
    error: Exception | None,
    expected: tuple[Outcome, str, str],
) -> None:
    outcome, reason, message = expected
    gate = GateKeeper(world.calls, status=plugin_status, error=error)
    result = await world.run(plugins=PluginSet(pre_bind=(gate,)))
    assert result.outcome is outcome
    assert world.calls.count("rm.release") == 1
    assert world.calls.count("binder.bind") == 0
    assert world.calls.log[-1][1] == {"pod": "uid-web", "reason": reason, "message": message}


async def test_replacement_bind_plugin_is_used_instead_of_the_default_binder(world: World) -> None:
    result = await world.run(plugins=PluginSet(bind=(CustomBinder(world.calls),)))
    assert result.bound
    assert world.calls.count("binder.bind") == 0
    assert ("custom-binder.bind", {"node": "n1", "reservation": "r1"}) in world.calls.log
    assert world.calls.count("events.scheduled") == 1
    assert world.calls.count("rm.commit") == 1


async def test_bind_plugins_that_skip_pass_to_the_next_and_all_skipping_fails(world: World) -> None:
    skipper = CustomBinder(world.calls, name="skipper", status=Status.skip())
    result = await world.run(plugins=PluginSet(bind=(skipper, CustomBinder(world.calls))))
    assert result.bound
    world.calls.log.clear()
    result = await world.run(plugins=PluginSet(bind=(skipper,)))
    assert result.outcome is Outcome.ERROR
    assert world.calls.count("rm.release") == 1
    assert "every Bind plugin skipped the pod (skipper)" in world.calls.log[-1][1]["message"]


async def test_failing_replacement_binder_releases(world: World) -> None:
    failing = CustomBinder(world.calls, status=Status.error("external binder refused"))
    result = await world.run(plugins=PluginSet(bind=(failing,)))
    assert result.outcome is Outcome.ERROR
    assert world.calls.count("rm.release") == 1


async def test_post_bind_plugin_raising_does_not_change_the_outcome(world: World) -> None:
    first = Announcer(world.calls, name="first", error=RuntimeError("webhook down"))
    second = Announcer(world.calls, name="second")
    result = await world.run(plugins=PluginSet(post_bind=(first, second)))
    assert result.bound
    assert world.calls.names()[-3:] == ["rm.commit", "first.post_bind", "second.post_bind"]
    assert world.calls.count("rm.release") == 0


async def test_extra_reserve_plugins_run_after_the_rm_and_unreserve_in_reverse(world: World) -> None:
    a = RecordingReserve(world.calls, name="a")
    b = RecordingReserve(world.calls, name="b", status=Status.error("no licence seat"))
    c = RecordingReserve(world.calls, name="c")
    result = await world.run(plugins=PluginSet(reserve=(a, b, c)))
    assert result.outcome is Outcome.ERROR
    assert world.calls.names()[:3] == ["rm.reserve", "a.reserve", "b.reserve"]
    # All Reserve plugins are unreserved in reverse order, including c whose reserve never ran.
    assert world.calls.names()[3:7] == ["c.unreserve", "b.unreserve", "a.unreserve", "rm.release"]


async def test_release_happens_once_even_if_a_plugin_fails_late(world: World) -> None:
    a = RecordingReserve(world.calls, name="a")
    world.binder.error = BindError("boom", status=422)
    await world.run(plugins=PluginSet(reserve=(a,), pre_bind=(GateKeeper(world.calls),)))
    assert world.calls.count("rm.release") == 1
    assert world.calls.count("a.unreserve") == 1


async def test_rm_unreserve_is_idempotent(world: World) -> None:
    from bindery.scheduling.defaults import ResourceManagerReservation
    from bindery.scheduling.framework import CycleContext

    ctx = CycleContext(pod=world.pod, profile=world.profile(), ports=world.ports())
    plugin = ResourceManagerReservation()
    await plugin.unreserve(ctx=ctx)  # before reserve: nothing to release
    assert world.calls.count("rm.release") == 0
    assert (await plugin.reserve(ctx=ctx)).ok
    await plugin.unreserve(ctx=ctx)
    await plugin.unreserve(ctx=ctx)
    assert world.calls.count("rm.release") == 1


class RecordingSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


async def test_failed_commit_is_retried_in_the_background_until_it_succeeds(world: World) -> None:
    from bindery.scheduling.defaults import CommitReservation
    from bindery.scheduling.framework import CycleContext
    from bindery.scheduling.podspec import reservation_request

    sleep = RecordingSleep()
    plugin = CommitReservation(sleep=sleep)
    world.rm.commit_errors = [RMUnavailable("down"), RMUnavailable("still down"), RMUnavailable("again")]
    ctx = CycleContext(pod=world.pod, profile=world.profile(), ports=world.ports())
    ctx.reservation = await world.rm.reserve(reservation_request(pod=world.pod, ttl_seconds=60))
    with pytest.raises(RMUnavailable):
        await plugin.post_bind(ctx=ctx)
    for _ in range(10):
        await asyncio.sleep(0)
    assert sleep.delays == [1.0, 2.0, 4.0]
    assert world.calls.count("rm.commit") == 4


async def test_commit_retries_stop_before_the_reservation_expires_or_once_it_is_gone(world: World) -> None:
    from bindery.scheduling.defaults import CommitReservation

    sleep = RecordingSleep()
    plugin = CommitReservation(sleep=sleep)
    world.rm.commit_error = RMUnavailable("down")
    assert not await plugin.retry_commit(client=world.rm, reservation_id="r1", pod="ns/p", ttl_seconds=10)
    assert sleep.delays == [1.0, 2.0, 4.0]  # the next wait would end after the 10 s TTL
    sleep.delays.clear()
    world.rm.commit_error = RMConflict("reservation-not-active", status=409)
    assert not await plugin.retry_commit(client=world.rm, reservation_id="r1", pod="ns/p", ttl_seconds=60)
    assert sleep.delays == [1.0]


async def test_a_refusal_after_an_unanswered_attempt_keeps_the_reservation(world: World) -> None:
    """The first attempt may have landed (an apiserver restarting mid-Binding); the retry's 403 (its
    authorizer not loaded yet) says nothing about that one, so the reservation must not be released."""
    from bindery.scheduling.defaults import DefaultBinder

    binder = DefaultBinder(retry_delays=(0.2, 1.0), sleep=RecordingSleep())

    class UnansweredThenForbidden(FakeBinder):
        async def bind(self, **kwargs: Any) -> None:
            await super().bind(**kwargs)
            if self.calls.count("binder.bind") == 1:
                raise BindError("binding pod ns/web got no answer")
            raise BindError("binding pod ns/web failed: HTTP 403: forbidden", status=403)

    world.binder = UnansweredThenForbidden(world.calls)
    result = await world.run(plugins=PluginSet(bind=(binder,)))
    assert result.failure is not None
    assert result.failure.kind is FailureKind.BIND_UNCONFIRMED
    assert "HTTP 403" in result.failure.message
    assert world.calls.count("rm.release") == 0


async def test_unanswered_binding_is_retried_and_a_landed_first_attempt_counts_as_success(
    world: World,
) -> None:
    from bindery.scheduling.defaults import DefaultBinder

    sleep = RecordingSleep()
    binder = DefaultBinder(retry_delays=(0.2, 1.0), sleep=sleep)

    class FirstLandsButTimesOut(FakeBinder):
        async def bind(self, **kwargs: Any) -> None:
            await super().bind(**kwargs)
            if self.calls.count("binder.bind") == 1:
                raise BindError("binding pod ns/web timed out")
            raise BindConflict(
                'pod web is already assigned to node "n1"',
                current_node="n1",
                pod_uid="uid-web",
                reservation_id="r1",
            )

    world.binder = FirstLandsButTimesOut(world.calls)
    result = await world.run(plugins=PluginSet(bind=(binder,)))
    assert result.bound
    assert sleep.delays == [0.2]
    assert world.calls.count("binder.bind") == 2
    assert world.calls.count("rm.release") == 0
    assert world.calls.count("rm.commit") == 1


async def test_binding_never_answered_keeps_the_reservation_and_reports(world: World) -> None:
    from bindery.scheduling.defaults import DefaultBinder

    sleep = RecordingSleep()
    world.binder.error = BindError("binding pod ns/web failed: the apiserver did not answer: timeout")
    result = await world.run(plugins=PluginSet(bind=(DefaultBinder(sleep=sleep),)))
    assert result.outcome is Outcome.ERROR
    assert result.failure is not None
    assert result.failure.kind is FailureKind.BIND_UNCONFIRMED
    assert sleep.delays == [0.2, 1.0]
    assert world.calls.count("binder.bind") == 3
    assert world.calls.count("rm.release") == 0
    assert not result.released
    assert (
        "reservation is kept until Bindery sees whether the Binding was applied"
        in world.calls.log[-1][1]["message"]
    )


async def test_refused_binding_is_not_retried(world: World) -> None:
    world.binder.error = BindError("binding pod ns/web failed: HTTP 403: forbidden", status=403)
    result = await world.run()
    assert result.outcome is Outcome.ERROR
    assert world.calls.count("binder.bind") == 1
    assert world.calls.count("rm.release") == 1


async def test_cancellation_during_bind_keeps_the_reservation(world: World) -> None:
    started = asyncio.Event()

    class HangingBinder(FakeBinder):
        async def bind(self, **kwargs: Any) -> None:
            await super().bind(**kwargs)
            started.set()
            await asyncio.Event().wait()

    world.binder = HangingBinder(world.calls)
    task = asyncio.create_task(world.run())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert world.calls.count("rm.release") == 0


# -- the 409 that names our node -------------------------------------------------------------------


@pytest.mark.parametrize(("holder", "uid"), [("r-stale", "uid-web"), (None, "uid-web"), ("r1", "uid-other")])
async def test_conflict_naming_our_node_is_success_only_with_our_reservation_and_uid(
    world: World, holder: str | None, uid: str
) -> None:
    """Someone else (another scheduler, or a stale cycle with an older reservation) bound the pod to
    the very node the RM chose: it is not our Binding, so our reservation is released, nothing is
    committed and nothing is reported."""
    world.binder.error = BindConflict(
        'pod web is already assigned to node "n1"', current_node="n1", pod_uid=uid, reservation_id=holder
    )
    result = await world.run()
    assert result.outcome is Outcome.DROPPED
    assert result.released
    assert world.calls.count("rm.commit") == 0
    assert world.calls.count("rm.release") == 1
    assert world.writes() == ["binder.bind"]
    assert result.failure is not None
    assert result.failure.kind is FailureKind.BOUND_ELSEWHERE


# -- the lease: every call ends before it, renewed when it runs low ------------------------------


class LeaseWorld:
    """A fake monotonic clock the fake ports advance, as slow calls would."""

    def __init__(self, world: World, *, ttl: int = 60) -> None:
        self.world = world
        self.ttl = ttl
        self.clock = FakeClock(start=1000.0)
        self.started: list[tuple[str, float, float | None]] = []  # (call, at, timeout)

    async def sleep(self, delay: float) -> None:
        self.clock.advance(delay)

    async def run(self, **changes: Any) -> CycleOutcome:
        from bindery.scheduling.defaults import DefaultBinder

        changes.setdefault("plugins", PluginSet(bind=(DefaultBinder(sleep=self.sleep),)))
        return await self.world.run(reservation_ttl_seconds=self.ttl, clock=self.clock.now, **changes)


def _slow_binder(lease: LeaseWorld, outcomes: list[str]) -> FakeBinder:
    """A binder whose attempts take their whole timeout and go unanswered ("lost"), or answer at once."""

    class Slow(FakeBinder):
        async def bind(self, **kwargs: Any) -> None:
            timeout = kwargs.get("timeout")
            lease.started.append(("bind", lease.clock.now(), timeout))
            await super().bind(**kwargs)
            outcome = outcomes.pop(0)
            if outcome == "lost":
                lease.clock.advance(timeout if timeout is not None else 30.0)
                raise BindError("binding pod ns/web failed: the apiserver did not answer: timeout")

    return Slow(lease.world.calls)


async def test_a_binding_retry_that_could_outlast_the_lease_renews_it_first(world: World) -> None:
    lease = LeaseWorld(world)
    world.binder = _slow_binder(lease, ["lost", "ok"])
    result = await lease.run()
    assert result.bound
    assert world.calls.names() == [
        "rm.reserve",
        "pods.get",
        "nodes.get",
        "binder.bind",
        "rm.renew",
        "binder.bind",
        "events.scheduled",
        "rm.commit",
    ]
    assert world.writes() == ["binder.bind", "binder.bind", "events.scheduled"]  # renewal is RM traffic
    (first_at, first_timeout), (second_at, second_timeout) = [(at, t) for _, at, t in lease.started]
    assert first_timeout is not None
    assert first_at + first_timeout <= 1000.0 + 60 - 10
    renewed_at = first_at + first_timeout + 0.2  # the retry delay
    assert second_timeout is not None
    assert second_at + second_timeout <= renewed_at + 60 - 10


async def test_no_binding_attempt_outlasts_a_lease_that_cannot_be_renewed(world: World) -> None:
    """A v1.0 RM cannot renew: every attempt ends before the lease (minus the margin); once too
    little is left, the cycle stops, keeping the reservation of the unanswered attempts."""
    from bindery.rm.errors import RMUnsupported

    lease = LeaseWorld(world)
    world.rm.renew_error = RMUnsupported("contract v1.0: no renew")
    world.binder = _slow_binder(lease, ["lost"] * 3)
    result = await lease.run()
    assert result.failure is not None
    assert result.failure.kind is FailureKind.BIND_UNCONFIRMED
    assert world.calls.count("rm.release") == 0
    assert lease.started, "at least one attempt"
    for _, at, timeout in lease.started:
        assert timeout is not None
        assert at + timeout <= 1000.0 + 60 - 10
    assert world.calls.count("binder.bind") == 2  # the third would start with too little left


async def test_a_binding_is_not_sent_on_a_replayed_reservation_about_to_expire(world: World) -> None:
    """The reservation came back with its old expiresAt (an earlier, unanswered cycle) and the RM
    cannot renew it: the Binding is not sent at all; the reservation is released and the pod retried."""
    import datetime

    from bindery.rm.errors import RMUnsupported

    lease = LeaseWorld(world)
    world.rm.renew_error = RMUnsupported("contract v1.0: no renew")
    reserve = world.rm.reserve

    async def replayed(request: Any, /) -> Any:
        reservation = await reserve(request)
        soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3)
        return reservation.model_copy(update={"expires_at": soon})

    world.rm.reserve = replayed  # type: ignore[method-assign]
    result = await lease.run()
    assert result.outcome is Outcome.ERROR
    assert world.calls.count("binder.bind") == 0
    assert world.calls.count("rm.renew") == 1
    assert world.calls.count("rm.release") == 1
    assert result.released
    assert result.failure is not None
    assert "lease" in result.failure.message


async def test_the_scheduled_event_post_is_bounded_by_the_lease(world: World) -> None:
    from bindery.rm.errors import RMUnsupported
    from bindery.scheduling.lease import margin_for

    lease = LeaseWorld(world, ttl=40)
    world.rm.renew_error = RMUnsupported("contract v1.0: no renew")

    class SlowBind(FakeBinder):
        async def bind(self, **kwargs: Any) -> None:
            await super().bind(**kwargs)
            lease.clock.advance(29.0)  # answered just inside its 30 s timeout: 11 s of the lease left

    world.binder = SlowBind(world.calls)
    result = await lease.run()
    assert result.bound
    assert world.calls.count("rm.renew") == 1  # less than a third of the lease was left
    (timeout,) = world.events.timeouts
    assert timeout is not None
    assert 0 < timeout <= 40 - 29 - margin_for(40)
    assert world.calls.count("rm.commit") == 1


async def test_a_fresh_lease_costs_no_renewal(world: World) -> None:
    lease = LeaseWorld(world)
    result = await lease.run()
    assert result.bound
    assert world.calls.count("rm.renew") == 0
    assert world.binder.timeouts == [30.0]
    assert world.events.timeouts == [10.0]


async def test_a_failed_commit_is_retried_only_for_what_is_left_of_the_lease(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bindery.scheduling.defaults import CommitReservation

    windows: list[float] = []

    async def record(self: CommitReservation, **kwargs: Any) -> bool:
        windows.append(kwargs["ttl_seconds"])
        return False

    monkeypatch.setattr(CommitReservation, "retry_commit", record)
    lease = LeaseWorld(world)

    class SlowBind(FakeBinder):
        async def bind(self, **kwargs: Any) -> None:
            await super().bind(**kwargs)
            lease.clock.advance(25.0)

    world.binder = SlowBind(world.calls)
    world.rm.commit_error = RMUnavailable("down")
    result = await lease.run()
    await asyncio.sleep(0)
    assert result.commit_failed
    assert windows == [35.0]  # 60 s lease, 25 s of it spent binding


# -- waiting apart: a PreBind wait leaves the scheduling budget for the binding pool -------------


class RecordingGate:
    """A binding gate that records when the cycle enters and leaves it (admits at once)."""

    def __init__(self, calls: Calls, *, status: Status | None = None) -> None:
        self.calls = calls
        self.status = status or Status.success()

    async def enter(self, *, ctx: CycleContext) -> Status:
        self.calls.record("gate.enter")
        return self.status

    def leave(self, *, ctx: CycleContext) -> None:
        self.calls.record("gate.leave")


class Waiter:
    """A PreBind plugin that waits apart, then returns `status`."""

    name = "waiter"

    def __init__(self, calls: Calls, *, status: Status | None = None) -> None:
        self.calls = calls
        self.status = status or Status.success()

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        entered = await ctx.wait_apart()
        if not entered.ok:
            return entered
        again = await ctx.wait_apart()  # once per cycle: a second call returns at once
        assert again.ok
        self.calls.record("waiter.waited")
        return self.status


async def test_a_pre_bind_wait_apart_keeps_the_order_of_the_points_and_leaves_at_the_end(
    world: World,
) -> None:
    gate = RecordingGate(world.calls)
    result = await schedule_one(
        pod=world.pod,
        profile=world.profile(plugins=PluginSet(pre_bind=(Waiter(world.calls),))),
        ports=world.ports(),
        gate=gate,
    )
    assert result.bound
    names = world.calls.names()
    assert names.count("gate.enter") == 1
    assert (
        names.index("rm.reserve")
        < names.index("gate.enter")
        < names.index("waiter.waited")
        < names.index("binder.bind")
        < names.index("rm.commit")
        < names.index("gate.leave")
    )
    assert names[-1] == "gate.leave"


async def test_a_failure_after_waiting_apart_unreserves_in_reverse_then_leaves(world: World) -> None:
    a = RecordingReserve(world.calls, name="a")
    gate = RecordingGate(world.calls)
    waiter = Waiter(world.calls, status=Status.error("device not ready"))
    result = await schedule_one(
        pod=world.pod,
        profile=world.profile(plugins=PluginSet(reserve=(a,), pre_bind=(waiter,))),
        ports=world.ports(),
        gate=gate,
    )
    assert result.outcome is Outcome.ERROR
    assert result.released
    names = world.calls.names()
    assert names.index("waiter.waited") < names.index("a.unreserve")
    assert names.index("a.unreserve") < names.index("rm.release") < names.index("gate.leave")
    assert names[-1] == "gate.leave"
    assert world.calls.count("binder.bind") == 0


async def test_a_pod_the_gate_refuses_is_released_and_a_cycle_that_never_waited_never_leaves(
    world: World,
) -> None:
    from bindery.scheduling.decisions import Failure, Stage

    refused = Status.failed(
        Failure(kind=FailureKind.LEASE_EXPIRED, message="lease lost while queued", stage=Stage.PRE_BIND)
    )
    gate = RecordingGate(world.calls, status=refused)
    result = await schedule_one(
        pod=world.pod,
        profile=world.profile(plugins=PluginSet(pre_bind=(Waiter(world.calls),))),
        ports=world.ports(),
        gate=gate,
    )
    assert result.failure is not None
    assert result.failure.kind is FailureKind.LEASE_EXPIRED
    assert world.calls.count("waiter.waited") == 0
    assert world.calls.count("binder.bind") == 0
    assert world.calls.names()[-1] == "gate.leave"

    world.calls.log.clear()
    result = await schedule_one(pod=world.pod, profile=world.profile(), ports=world.ports(), gate=gate)
    assert result.bound
    assert "gate.enter" not in world.calls.names()
    assert "gate.leave" not in world.calls.names()
