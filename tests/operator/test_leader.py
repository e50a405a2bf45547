"""Leader election: exactly one replica schedules; a standby takes over when the leader stops."""

from __future__ import annotations

import asyncio
import datetime
import logging
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import pytest
from kubernetes_asyncio import client

from bindery.cli import main
from bindery.controller.leadership.elector import LeaderElector
from bindery.controller.leadership.fence import FencedBinder
from bindery.controller.leadership.rules import (
    LeaseTiming,
    Observation,
    claimed_spec,
    may_acquire,
    micro_time,
    observe,
    past_exit_point,
    within_renew_deadline,
)
from bindery.controller.leadership.term import Leadership
from bindery.controller.startup.entry import EmbeddedOperator
from bindery.controller.startup.options import OperatorOptions
from bindery.devcluster.nodes import create_node
from bindery.scheduling.podspec import PodInfo
from tests.operator.conftest import (
    create_pod,
    eventually,
    pod_body,
    read_pod,
    resource_manager,
)
from tests.operator.fakerm import FakeRM
from tests.operator.test_leader_processes import grant_lease
from tests.scheduling.fakes import pod

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
TIMING = LeaseTiming()  # 15 / 10 / 2 s


def _lease(
    holder: str | None, renewed: datetime.datetime, version: str, duration: int = 15
) -> dict[str, object]:
    return {
        "metadata": {"resourceVersion": version},
        "spec": {
            "holderIdentity": holder,
            "renewTime": micro_time(renewed),
            "leaseDurationSeconds": duration,
        },
    }


def _watch(records: list[tuple[float, dict[str, object] | None]]) -> Observation | None:
    """What a standby remembers after reading `records` at the given monotonic times."""
    seen: Observation | None = None
    for now, lease in records:
        seen = observe(previous=seen, lease=lease, now=now)
    return seen


def test_a_held_lease_is_taken_only_after_it_went_unchanged_for_its_duration() -> None:
    assert may_acquire(observation=None, identity="me", now=100.0)
    lease = _lease("other", NOW, "1")
    seen = _watch([(100.0, lease), (110.0, lease)])
    assert not may_acquire(observation=seen, identity="me", now=110.0)
    assert not may_acquire(observation=seen, identity="me", now=115.0)  # exactly the duration: not yet
    assert may_acquire(observation=_watch([(100.0, lease), (115.5, lease)]), identity="me", now=115.5)


def test_a_renew_time_far_in_the_past_does_not_expire_a_lease_that_keeps_changing() -> None:
    """The holder's clock is an hour behind ours: its renewTime always looks stale, yet it renews."""
    skewed = NOW - datetime.timedelta(hours=1)
    records: list[tuple[float, dict[str, object] | None]] = [
        (100.0 + 2 * i, _lease("other", skewed + datetime.timedelta(seconds=2 * i), str(i)))
        for i in range(30)
    ]
    seen = _watch(records)
    assert seen is not None
    assert seen.observed_at == 158.0
    assert not may_acquire(observation=seen, identity="me", now=158.0)
    assert not may_acquire(observation=seen, identity="me", now=172.0)
    assert may_acquire(observation=seen, identity="me", now=173.5)  # it stopped changing 15 s ago


def test_a_renew_time_in_the_future_does_not_keep_a_dead_lease_alive() -> None:
    """The holder's clock was ahead when it died: only our own observation counts."""
    lease = _lease("other", NOW + datetime.timedelta(hours=1), "7")
    seen = _watch([(100.0, lease), (102.0, lease), (116.0, lease)])
    assert seen is not None
    assert seen.observed_at == 100.0
    assert may_acquire(observation=seen, identity="me", now=116.0)


def test_a_new_standby_waits_a_full_duration_even_for_a_stale_looking_lease() -> None:
    lease = _lease("other", NOW - datetime.timedelta(days=3), "9")
    seen = _watch([(500.0, lease)])
    assert not may_acquire(observation=seen, identity="me", now=500.0)
    assert may_acquire(observation=seen, identity="me", now=515.1)


def test_a_released_or_own_lease_is_taken_at_once() -> None:
    assert may_acquire(observation=_watch([(1.0, _lease(None, NOW, "3"))]), identity="me", now=1.0)
    assert may_acquire(observation=_watch([(1.0, _lease("", NOW, "3"))]), identity="me", now=1.0)
    assert may_acquire(observation=_watch([(1.0, _lease("me", NOW, "3"))]), identity="me", now=1.0)


def test_only_a_changed_record_moves_the_observation() -> None:
    first = _lease("other", NOW, "1")
    seen = _watch([(10.0, first), (12.0, first)])
    assert seen is not None
    assert seen.observed_at == 10.0
    moved = _watch([(10.0, first), (12.0, _lease("other", NOW, "2"))])  # same renewTime, new write
    assert moved is not None
    assert moved.observed_at == 12.0
    assert _watch([(10.0, first), (12.0, None)]) is None


def test_the_renew_deadline_is_the_fence() -> None:
    assert not within_renew_deadline(last_renewal=None, now=5.0, timing=TIMING)
    assert within_renew_deadline(last_renewal=100.0, now=109.9, timing=TIMING)
    assert not within_renew_deadline(last_renewal=100.0, now=110.0, timing=TIMING)
    # A process frozen for longer than the lease finds itself outside at once when it wakes.
    assert not within_renew_deadline(last_renewal=100.0, now=160.0, timing=TIMING)


def test_past_the_exit_point_it_is_too_late_to_pause() -> None:
    assert not past_exit_point(last_renewal=None, now=1000.0, timing=TIMING)
    assert not past_exit_point(last_renewal=100.0, now=110.0, timing=TIMING)  # deadline: pause now
    assert not past_exit_point(last_renewal=100.0, now=112.4, timing=TIMING)
    assert past_exit_point(last_renewal=100.0, now=112.5, timing=TIMING)  # midway to expiry at 115
    assert past_exit_point(last_renewal=100.0, now=160.0, timing=TIMING)  # woke from a freeze


def test_timing_leaves_room_to_stop_before_the_lease_expires() -> None:
    assert TIMING.request_timeout == 2.0
    assert TIMING.pause_budget == 2.5
    assert TIMING.renew_deadline + TIMING.pause_budget < TIMING.lease_duration
    short = LeaseTiming(lease_duration=4.0, renew_deadline=3.0, retry_period=1.0)
    assert short.request_timeout == 1.0
    assert short.renew_deadline + short.pause_budget < short.lease_duration
    for unsafe in ((10.0, 10.0, 2.0), (15.0, 10.0, 10.0), (15.0, 10.0, 0.0), (5.0, 10.0, 2.0)):
        with pytest.raises(ValueError, match="renew deadline"):
            LeaseTiming(lease_duration=unsafe[0], renew_deadline=unsafe[1], retry_period=unsafe[2])


def test_claiming_counts_transitions_and_keeps_acquire_time_while_renewing() -> None:
    timing = LeaseTiming()
    first = claimed_spec(lease=None, identity="me", now=NOW, timing=timing)
    assert first["leaseTransitions"] == 0
    later = NOW + datetime.timedelta(seconds=2)
    renewed = claimed_spec(lease={"spec": first}, identity="me", now=later, timing=timing)
    assert renewed["acquireTime"] == first["acquireTime"]
    assert renewed["renewTime"] == micro_time(later)
    taken = claimed_spec(lease={"spec": renewed}, identity="other", now=later, timing=timing)
    assert taken["leaseTransitions"] == 1
    assert taken["holderIdentity"] == "other"


@pytest.mark.parametrize(
    "timing",
    [["--lease-duration", "10"], ["--renew-deadline", "1", "--retry-period", "2"], ["--retry-period", "0"]],
)
def test_bindery_run_refuses_unsafe_lease_timing(
    timing: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--leader-elect", *timing])
    assert exited.value.code == 2
    assert "it needs lease duration > renew deadline > retry period > 0" in capsys.readouterr().err


class Exited(Exception):
    pass


def _leadership(*, on_stopped: Callable[[], Any], exits: list[int]) -> tuple[Leadership, LeaderElector]:
    def exit_process(status: int) -> NoReturn:
        exits.append(status)
        raise Exited

    async def started() -> None:
        pass

    timing = LeaseTiming(lease_duration=2.0, renew_deadline=1.0, retry_period=0.2)  # pause budget 0.5 s
    leadership = Leadership(
        namespace="ns",
        name="lease",
        hostname="h",
        timing=timing,
        logger=logging.getLogger("test"),
        on_started=started,
        on_stopped=on_stopped,
        exit_process=exit_process,
    )
    elector = LeaderElector(
        api=client.ApiClient(),
        namespace="ns",
        name="lease",
        identity="me",
        timing=timing,
        logger=leadership._logger,
    )
    return leadership, elector


async def _stop(leadership: Leadership, elector: LeaderElector) -> None:
    async def nothing() -> None:
        pass

    await leadership._stop_leading(elector=elector, started=asyncio.create_task(nothing()), graceful=False)


async def test_a_lost_term_pauses_in_order_when_there_is_time() -> None:
    exits: list[int] = []
    paused = asyncio.Event()

    async def pause() -> None:
        paused.set()

    leadership, elector = _leadership(on_stopped=pause, exits=exits)
    elector.last_renewal = time.monotonic() - 1.0  # just reached the renew deadline
    await _stop(leadership, elector)
    assert paused.is_set()
    assert exits == []
    assert not leadership.holds()


async def test_a_pause_that_overruns_the_exit_point_exits_the_process() -> None:
    exits: list[int] = []

    async def stuck() -> None:
        await asyncio.Event().wait()

    leadership, elector = _leadership(on_stopped=stuck, exits=exits)
    elector.last_renewal = time.monotonic() - 1.0
    started = time.monotonic()
    with pytest.raises(Exited):
        await _stop(leadership, elector)
    assert exits == [1]
    assert time.monotonic() - started < 1.0  # at the exit point (0.5 s), before the lease expires


async def test_a_term_noticed_lost_after_a_freeze_exits_without_cancelling_its_cycles() -> None:
    exits: list[int] = []
    paused: list[bool] = []

    async def pause() -> None:
        paused.append(True)

    leadership, elector = _leadership(on_stopped=pause, exits=exits)
    elector.last_renewal = time.monotonic() - 30.0  # frozen far past the lease
    with pytest.raises(Exited):
        await _stop(leadership, elector)
    assert exits == [1]
    assert paused == []  # cancelling would release reservations the next leader may be using


class _Binder:
    """Records each Binding it sends; `seconds` is how long a Binding takes before it is written (a
    connection being opened), and `started` is set once the first one is under way."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.sent: list[str] = []
        self.started = asyncio.Event()

    async def bind(
        self,
        *,
        pod: PodInfo,
        node: str,
        annotations: Mapping[str, str],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        self.started.set()
        await asyncio.sleep(self.seconds)
        self.sent.append(pod.name)


def _fenced(inner: _Binder, deadline: Callable[[], float]) -> FencedBinder:
    """A FencedBinder whose lease holds until `deadline()` (monotonic), as the elector's fence does."""
    return FencedBinder(
        binder=inner,
        holds=lambda: time.monotonic() < deadline(),
        holds_for=lambda: max(0.0, deadline() - time.monotonic()),
        logger=logging.getLogger("test"),
    )


async def test_the_fenced_binder_sends_nothing_without_the_lease() -> None:
    inner, holds = _Binder(), [True]
    fenced = _fenced(inner, lambda: time.monotonic() + 60.0 if holds[0] else 0.0)
    await fenced.bind(pod=pod("a"), node="n", annotations={})
    holds[0] = False
    waiting = asyncio.create_task(fenced.bind(pod=pod("b"), node="n", annotations={}))
    await eventually(lambda: _async(fenced.withheld == 1), within=5, what="the Binding withheld")
    assert not waiting.done()
    waiting.cancel()  # what the pause does
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert inner.sent == ["a"]


async def test_a_binding_in_flight_when_the_event_loop_froze_past_the_deadline_is_not_sent() -> None:
    """The freeze is real: the event loop is blocked (as SIGSTOP blocks it) while the Binding waits on
    its connection; on waking, the fence's timer runs before the Binding resumes, so it is cut."""
    inner = _Binder(0.05)
    deadline = time.monotonic() + 0.2
    fenced = _fenced(inner, lambda: deadline)
    binding = asyncio.create_task(fenced.bind(pod=pod("a"), node="n", annotations={}))
    await inner.started.wait()  # the Binding is waiting on its "connection"
    time.sleep(0.4)  # the freeze (the loop blocked), past the renew deadline
    await eventually(lambda: _async(fenced.withheld == 1), within=5, what="the Binding cut")
    assert inner.sent == []
    assert not binding.done()  # it waits for the pause, which cancels it and keeps its reservation
    binding.cancel()
    with pytest.raises(asyncio.CancelledError):
        await binding


async def test_a_binding_that_outlives_a_renewed_deadline_is_sent() -> None:
    """Renewals move the deadline: a Binding slower than the first deadline but inside the renewed one
    is not cut (the timer looks again instead)."""
    inner = _Binder(2.5)
    deadline = [time.monotonic() + 1.0]

    async def renew() -> None:  # every 0.2 s a deadline 1 s ahead: slack for a loaded machine
        while True:
            await asyncio.sleep(0.2)
            deadline[0] = time.monotonic() + 1.0

    renewing = asyncio.create_task(renew())
    fenced = _fenced(inner, lambda: deadline[0])
    try:
        await asyncio.wait_for(fenced.bind(pod=pod("a"), node="n", annotations={}), timeout=5)
    finally:
        renewing.cancel()
    assert inner.sent == ["a"]
    assert fenced.withheld == 0


async def test_a_pause_during_a_binding_cancels_it_as_before() -> None:
    inner = _Binder(30)
    fenced = _fenced(inner, lambda: time.monotonic() + 60.0)
    binding = asyncio.create_task(fenced.bind(pod=pod("a"), node="n", annotations={}))
    await inner.started.wait()
    binding.cancel()
    with pytest.raises(asyncio.CancelledError):
        await binding
    assert fenced.withheld == 0


@pytest.mark.controlplane
async def test_one_leader_schedules_and_a_standby_takes_over(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    lease = uniq("lease")
    await grant_lease(kube_api, namespace=namespace, lease_name=lease)
    options = OperatorOptions(
        kubeconfig=operator_kubeconfig,
        probe_interval=1.0,
        leader_election=True,
        lease_namespace=namespace,
        lease_name=lease,
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.5,
    )
    replicas = [EmbeddedOperator(options=options), EmbeddedOperator(options=options)]
    node, scheduler = uniq("n"), uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 10
    for replica in replicas:
        await replica.start()
    try:
        async with resource_manager(
            kube_api, name=uniq("rm"), scheduler_names=[scheduler], endpoint=fake_rm.url
        ):
            await eventually(lambda: _async(sum(r.runtime.leading for r in replicas) == 1), what="one leader")
            await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="first", scheduler_name=scheduler)
            )
            await eventually(lambda: _node_of(kube_api, namespace, "first"), what="first bound")
            leader = next(r for r in replicas if r.runtime.leading)
            standby = next(r for r in replicas if r is not leader)
            assert sum(r.runtime.writes.snapshot().get("binding", 0) for r in replicas) == 1
            await leader.stop()
            await eventually(lambda: _async(standby.runtime.leading), within=15, what="the standby leading")
            await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="second", scheduler_name=scheduler)
            )
            await eventually(lambda: _node_of(kube_api, namespace, "second"), what="second bound")
            assert standby.runtime.writes.snapshot().get("binding") == 1
            assert len(fake_rm.reservations) == 2
    finally:
        for replica in replicas:
            await replica.stop()


@pytest.mark.controlplane
async def test_a_standby_does_not_take_a_live_lease_whose_renew_time_looks_stale(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    uniq: Callable[[str], str],
) -> None:
    """A leader whose clock is an hour behind keeps renewing: its renewTime always looks an hour old.

    The "leader" is this test, writing the Lease with the resourceVersion it last wrote, so if the
    operator took the lease the next renewal fails with 409 Conflict. Once the renewals stop, the
    operator takes the lease after one lease duration: proof that it was contending all along.
    """
    lease = uniq("lease")
    await grant_lease(kube_api, namespace=namespace, lease_name=lease)
    coordination = client.CoordinationV1Api(kube_api)

    def behind() -> dict[str, object]:
        an_hour_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
        return {
            "holderIdentity": "skewed-leader",
            "leaseDurationSeconds": 3,
            "acquireTime": micro_time(an_hour_ago),
            "renewTime": micro_time(an_hour_ago),
        }

    written = await coordination.create_namespaced_lease(
        namespace=namespace, body={"metadata": {"name": lease}, "spec": behind()}
    )
    options = OperatorOptions(
        kubeconfig=operator_kubeconfig,
        probe_interval=1.0,
        leader_election=True,
        lease_namespace=namespace,
        lease_name=lease,
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.5,
    )
    replica = EmbeddedOperator(options=options)
    await replica.start()
    loop = asyncio.get_running_loop()
    try:
        renew_until = loop.time() + 4 * options.lease_duration
        while loop.time() < renew_until:
            await asyncio.sleep(0.5)
            assert not replica.runtime.leading, "the standby took a lease that was being renewed"
            body = {"metadata": {"name": lease, "resourceVersion": written.metadata.resource_version}}
            try:
                written = await coordination.replace_namespaced_lease(
                    name=lease, namespace=namespace, body={**body, "spec": behind()}
                )
            except client.ApiException as exc:
                holder = (await coordination.read_namespaced_lease(name=lease, namespace=namespace)).spec
                raise AssertionError(
                    f"renewing the live lease failed (HTTP {exc.status}): the standby took it; now {holder}"
                ) from exc
        stopped = loop.time()
        await eventually(lambda: _async(replica.runtime.leading), within=15, what="the standby leading")
        assert loop.time() - stopped >= options.lease_duration - 0.5  # a full duration unchanged
    finally:
        await replica.stop()


async def _node_of(api: client.ApiClient, namespace: str, name: str) -> str | None:
    node: str | None = (await read_pod(api, namespace=namespace, name=name))["spec"].get("nodeName")
    return node


async def _async(value: bool) -> bool:
    return value
