"""The tracker of an unanswered Binding keeps its reservation alive while the pod is pending.

Unit tests: the pod reads are scripted (no apiserver) and the RM is the scheduling fake; the lease
is a fraction of a second so the renewals happen within the test.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.reservations.unconfirmed import UnconfirmedBind, UnconfirmedBinds
from bindery.rm.errors import RMConflict, RMUnsupported
from bindery.rm.models import Reservation
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.scheduling.fakes import Calls, FakeRM, pod

TTL = 0.6
POD = pod("web")


def pending() -> dict[str, Any]:
    return {"metadata": {"uid": POD.uid}, "spec": {}, "status": {"phase": "Pending"}}


def bound(*, reservation: str | None, node: str = "n1") -> dict[str, Any]:
    annotations = {RESERVATION_ANNOTATION: reservation} if reservation else {}
    return {
        "metadata": {"uid": POD.uid, "annotations": annotations},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


class Scripted(UnconfirmedBinds):
    """Reads return `body`; every renewal records (when, the deadline it was asked before)."""

    body: dict[str, Any] | None = None

    async def _read(self, bind: UnconfirmedBind) -> dict[str, Any] | None:
        return self.body


class RecordingRM(FakeRM):
    def __init__(self, calls: Calls, tracker: list[Scripted]) -> None:
        super().__init__(calls)
        self.tracker = tracker
        self.renewals: list[tuple[float, float]] = []

    async def renew(self, reservation_id: str, /, *, pod_uid: str, ttl_seconds: int) -> Reservation:
        known = self.tracker[0]._pending.get(reservation_id)
        self.renewals.append((time.monotonic(), known.deadline if known else float("nan")))
        return await super().renew(reservation_id, pod_uid=pod_uid, ttl_seconds=ttl_seconds)


@pytest.fixture
async def api() -> AsyncIterator[client.ApiClient]:
    api = client.ApiClient()
    try:
        yield api
    finally:
        await api.close()


def tracker_with(api: client.ApiClient) -> tuple[Scripted, RecordingRM, Calls]:
    calls = Calls()
    holder: list[Scripted] = []
    rm = RecordingRM(calls, holder)
    tracker = Scripted(api=api, rm=lambda: rm, logger=logging.getLogger("test"), first_retry=0.05)
    holder.append(tracker)
    return tracker, rm, calls


def track(tracker: Scripted, rid: str = "r1") -> None:
    tracker.track(reservation_id=rid, pod=POD, node="n1", ttl_seconds=TTL, expires=time.monotonic() + TTL)


async def until(check: Any, *, within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_pending_pods_reservation_is_renewed_before_it_runs_out_then_committed(
    api: client.ApiClient,
) -> None:
    tracker, rm, calls = tracker_with(api)
    tracker.body = pending()
    track(tracker)
    await until(lambda: len(rm.renewals) >= 3)  # three leases' worth: each renewed in time
    for at, deadline in rm.renewals:
        assert at < deadline
    assert {details["ttl"] for name, details in calls.log if name == "rm.renew"} == {1}  # whole seconds
    tracker.body = bound(reservation="r1")
    await until(lambda: calls.count("rm.commit") == 1)
    assert "r1" not in tracker._pending
    await tracker.close()


async def test_an_rm_without_renew_leaves_the_reservation_to_the_next_cycle(api: client.ApiClient) -> None:
    tracker, rm, calls = tracker_with(api)
    rm.renew_error = RMUnsupported("contract v1.0")
    tracker.body = pending()
    track(tracker)
    await until(lambda: calls.count("rm.renew") == 1)
    await until(lambda: not tracker._tasks)  # the follow-up ended
    assert "r1" in tracker  # a late Binding seen by the watch, or the next cycle, still settles it
    assert calls.count("rm.release") == 0


async def test_a_reservation_the_rm_no_longer_holds_is_dropped(api: client.ApiClient) -> None:
    tracker, rm, calls = tracker_with(api)
    rm.renew_error = RMConflict("reservation r1 is expired", status=409)
    tracker.body = pending()
    track(tracker)
    await until(lambda: not tracker._tasks)
    assert "r1" not in tracker
    assert calls.count("rm.release") == 0


@pytest.mark.parametrize("holder", [None, "r0"], ids=["another-scheduler", "a-stale-cycle"])
async def test_a_pod_bound_there_keeps_this_reservation_whatever_its_annotation_says(
    api: client.ApiClient, holder: str | None
) -> None:
    """The annotation is never authority (issue 20, scenario 7): the pod this reservation was made
    for runs on its node, so the reservation is committed, not released, whatever the annotation
    names (another reservation, or none)."""
    tracker, _, calls = tracker_with(api)
    tracker.body = bound(reservation=holder)
    track(tracker)
    await until(lambda: calls.count("rm.commit") == 1)
    assert calls.count("rm.release") == 0


async def test_only_the_reservation_a_later_cycle_bound_with_is_forgotten(api: client.ApiClient) -> None:
    tracker, _, _ = tracker_with(api)
    tracker.body = None
    tracker._pending["r1"] = UnconfirmedBind(reservation_id="r1", pod=POD, node="n1", deadline=1e12)
    tracker.forget("r2")  # the later cycle got another reservation: r1 may still be landing
    assert "r1" in tracker
    tracker.forget("r1")
    assert "r1" not in tracker


async def test_renewals_back_off_while_the_rm_is_away(api: client.ApiClient) -> None:
    """Each failed renewal doubles the wait, so an unreachable RM is not asked (and the pod not read)
    every `first_retry` until the lease runs out."""
    from bindery.rm.errors import RMUnavailable

    calls = Calls()
    holder: list[Scripted] = []
    rm = RecordingRM(calls, holder)
    rm.renew_error = RMUnavailable("the RM is away")
    tracker = Scripted(api=api, rm=lambda: rm, logger=logging.getLogger("test"), first_retry=0.02)
    holder.append(tracker)
    tracker.body = pending()
    tracker.track(reservation_id="r1", pod=POD, node="n1", ttl_seconds=3.0, expires=time.monotonic() + 1.5)
    await until(lambda: not tracker._tasks, within=10)  # gave up when the lease ran out
    # Doubling from 0.02 s fits about 6 tries in the 1.5 s lease; a fixed 0.02 s would fit ~70.
    assert 2 <= len(rm.renewals) <= 12, [at for at, _ in rm.renewals]
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(rm.renewals)]
    assert gaps[-1] > 4 * gaps[0], gaps
    assert not tracker._renew_delays


@pytest.mark.parametrize("event_type", ["ADDED", "DELETED"])
async def test_another_pod_copying_the_annotation_neither_releases_nor_untracks_it(
    api: client.ApiClient, event_type: str
) -> None:
    """Scenario 2 through the tracker: a hostile pod names the victim's unconfirmed reservation."""
    tracker, _, calls = tracker_with(api)
    tracker._pending["r1"] = UnconfirmedBind(reservation_id="r1", pod=POD, node="n1", deadline=1e12)
    attacker = bound(reservation="r1")
    attacker["metadata"]["uid"] = "attacker"
    await tracker.observe(event_type=event_type, pod=attacker)
    assert "r1" in tracker
    assert calls.count("rm.release") == 0
    await tracker.observe(event_type="MODIFIED", pod=bound(reservation="r1"))  # the victim's own
    assert calls.count("rm.commit") == 1


async def test_a_replica_past_its_renew_deadline_releases_and_renews_nothing(api: client.ApiClient) -> None:
    """Another replica may lead and may have reused the pod's reservation (same idempotency key)."""
    from bindery.controller.metrics import Metrics
    from bindery.controller.rmstack import NotLeading, RMStack

    tracker, rm, calls = tracker_with(api)
    leading = False
    stack = RMStack(
        client=rm,  # type: ignore[arg-type]
        metrics=Metrics(),
        resource_manager="rm",
        holds=lambda: leading,
        logger=logging.getLogger("test"),
    )
    stack.settle_through(tracker)
    await stack.release("r1", pod_uid=POD.uid)
    with pytest.raises(NotLeading):
        await stack.renew("r1", pod_uid=POD.uid, ttl_seconds=1)
    assert calls.count("rm.release") == 0
    assert calls.count("rm.renew") == 0
    leading = True
    await stack.release("r1", pod_uid=POD.uid)
    assert calls.count("rm.release") == 1


async def test_a_replaced_rm_client_is_closed_once_no_cycle_can_use_it() -> None:
    """Each credential rotation replaces the client: the old pool must not stay open for ever."""
    import types

    from bindery.controller.profile.runner import ProfileRunner

    class Client:
        closed = False

        async def aclose(self) -> None:
            self.closed = True

    runner = types.SimpleNamespace(
        _retired_clients=set(), _closing=set(), config=types.SimpleNamespace(name="rm")
    )
    old = Client()
    ProfileRunner._retire(runner, old, after=0.05)  # type: ignore[arg-type]
    assert not old.closed  # cycles that started with it may still be running
    await until(lambda: old.closed)
    assert not runner._retired_clients
    await until(lambda: not runner._closing)
