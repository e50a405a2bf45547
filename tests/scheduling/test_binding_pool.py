"""The binding pool and the queue's side of waiting apart: a PreBind wait holds no scheduling slot.

The pool (`bindery.scheduling.binding`) is bounded, shares places per namespace when asked to, and
gives places namespace by namespace in turn; the queue stops counting a pod whose cycle waits
apart against `max_in_flight` and its namespace's share.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from bindery.scheduling.binding import BindingPool, BindingStats, admit
from bindery.scheduling.decisions import FailureKind, Outcome
from bindery.scheduling.framework import CycleContext, Ports, Profile
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.queue import SchedulingQueue
from tests.scheduling.fakes import (
    Calls,
    FakeBinder,
    FakeConditions,
    FakeEvents,
    FakeNodes,
    FakePods,
    FakeRM,
    pod,
)


async def test_the_pool_holds_at_most_its_size_and_the_next_queued_pod_gets_a_freed_place() -> None:
    pool = BindingPool(size=2)
    first, second, third = (pool.ask(uid=f"a{i}", namespace="a") for i in range(3))
    assert first.done()
    assert second.done()
    assert not third.done()
    assert pool.stats() == BindingStats(admitted=2, queued=1)
    pool.release("a0")
    assert third.done()
    assert pool.stats() == BindingStats(admitted=2, queued=0)
    pool.release("a0")  # idempotent
    pool.release("nobody")
    assert pool.stats() == BindingStats(admitted=2, queued=0)


async def test_a_namespace_with_many_queued_pods_does_not_keep_anothers_pod_behind_them() -> None:
    pool = BindingPool(size=2)
    tickets = [pool.ask(uid=f"a{i}", namespace="a") for i in range(10)]
    late = pool.ask(uid="b0", namespace="b")
    assert not late.done()
    pool.release("a0")
    assert late.done(), "the freed place went to namespace a's next pod instead of b's turn"
    assert not tickets[2].done()


async def test_a_namespace_at_its_share_leaves_the_other_places_to_other_namespaces() -> None:
    pool = BindingPool(size=4, per_namespace=2)
    tenant = [pool.ask(uid=f"a{i}", namespace="a") for i in range(5)]
    assert [t.done() for t in tenant] == [True, True, False, False, False]
    other = [pool.ask(uid=f"b{i}", namespace="b") for i in range(2)]
    assert all(t.done() for t in other)
    assert pool.stats() == BindingStats(admitted=4, queued=3)
    pool.release("b0")  # a is at its share: the place stays free for another namespace
    assert pool.stats() == BindingStats(admitted=3, queued=3)
    pool.reconfigure(size=4, per_namespace=None)
    assert tenant[2].done()


async def test_a_queued_pod_that_gives_up_leaves_the_queue() -> None:
    pool = BindingPool(size=1)
    pool.ask(uid="a0", namespace="a")
    queued = pool.ask(uid="a1", namespace="a")
    pool.release("a1")
    assert queued.cancelled()
    assert pool.stats() == BindingStats(admitted=1, queued=0)
    pool.release("a0")
    assert pool.stats() == BindingStats(admitted=0, queued=0)


def test_the_pool_refuses_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BindingPool(size=0)
    with pytest.raises(ValueError, match="at least 1"):
        BindingPool(size=1, per_namespace=0)


async def test_a_pod_waiting_apart_frees_its_slot_and_its_namespaces_share() -> None:
    queue = SchedulingQueue(max_in_flight=2, max_in_flight_per_namespace=1)
    waiting, tenant_next = (
        dataclasses.replace(pod("w"), namespace="a"),
        dataclasses.replace(pod("x"), namespace="a"),
    )
    other = dataclasses.replace(pod("o"), namespace="b")
    for p in (waiting, tenant_next, other):
        queue.add(p)
    popped = [queue.pop_nowait(), queue.pop_nowait()]
    assert {p.uid for p in popped if p} == {waiting.uid, other.uid}
    assert queue.pop_nowait() is None  # namespace a at its share, the budget spent
    queue.binding(waiting.uid)
    queue.binding(waiting.uid)  # idempotent
    stats = queue.stats()
    assert (stats.in_flight, stats.binding) == (1, 1)
    assert queue.position(waiting.uid) is not None
    assert queue.position(waiting.uid).queue == "binding"  # type: ignore[union-attr]
    nxt = queue.pop_nowait()
    assert nxt is not None
    assert nxt.uid == tenant_next.uid
    queue.done(waiting.uid, outcome=Outcome.ERROR)  # its cycle ends: requeued as ever
    assert queue.stats().binding == 0
    assert queue.stats().backoff == 1
    with pytest.raises(KeyError):
        queue.binding(waiting.uid)


async def test_a_pod_forgotten_while_waiting_apart_is_dropped_when_its_cycle_ends() -> None:
    queue = SchedulingQueue(max_in_flight=1)
    waiting = pod("w")
    queue.add(waiting)
    assert queue.pop_nowait() is not None
    queue.binding(waiting.uid)
    queue.forget(waiting.uid)
    queue.done(waiting.uid, outcome=Outcome.ERROR)
    assert len(queue) == 0
    assert queue.footprint() == 0


async def test_pop_wakes_when_a_pod_leaves_for_the_binding_pool() -> None:
    queue = SchedulingQueue(max_in_flight=1)
    first, second = pod("a"), pod("b")
    queue.add(first)
    queue.add(second)
    assert await queue.pop() is not None
    waiter = asyncio.create_task(queue.pop())
    await asyncio.sleep(0)
    assert not waiter.done()
    queue.binding(first.uid)
    assert (await asyncio.wait_for(waiter, timeout=5)).uid == second.uid


def _context(pods: FakePods, the_pod: PodInfo) -> CycleContext:
    calls = pods.calls
    ports = Ports(
        nodes=FakeNodes(calls, {}),
        pods=pods,
        binder=FakeBinder(calls),
        events=FakeEvents(calls),
        conditions=FakeConditions(calls),
    )
    profile = Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=FakeRM(calls, node="n1"))
    return CycleContext(pod=the_pod, profile=profile, ports=ports)


async def test_a_pod_queued_for_the_pool_is_admitted_when_a_place_frees() -> None:
    pods = FakePods(Calls())
    the_pod = pod("queued")
    pods.pods[the_pod.uid] = the_pod
    pool = BindingPool(size=1)
    pool.ask(uid="other", namespace="other")
    waiting = asyncio.create_task(admit(ctx=_context(pods, the_pod), pool=pool))
    await asyncio.sleep(0)
    assert pool.stats() == BindingStats(admitted=1, queued=1)
    pool.release("other")
    assert (await asyncio.wait_for(waiting, timeout=5)).ok
    assert pool.stats() == BindingStats(admitted=1, queued=0)


async def test_a_pod_deleted_while_queued_for_the_pool_gives_up_its_place_in_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("bindery.scheduling.binding.QUEUED_POLL_SECONDS", 0.01)
    pods = FakePods(Calls())
    the_pod = pod("queued")
    pods.pods[the_pod.uid] = the_pod
    pool = BindingPool(size=1)
    pool.ask(uid="other", namespace="other")
    waiting = asyncio.create_task(admit(ctx=_context(pods, the_pod), pool=pool))
    await asyncio.sleep(0)
    del pods.pods[the_pod.uid]
    status = await asyncio.wait_for(waiting, timeout=5)
    assert status.failure is not None
    assert status.failure.kind is FailureKind.POD_GONE
    assert pool.stats() == BindingStats(admitted=1, queued=0)


async def test_a_cancelled_wait_for_the_pool_leaves_its_queue() -> None:
    pods = FakePods(Calls())
    the_pod = pod("queued")
    pods.pods[the_pod.uid] = the_pod
    pool = BindingPool(size=1)
    pool.ask(uid="other", namespace="other")
    waiting = asyncio.create_task(admit(ctx=_context(pods, the_pod), pool=pool))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pool.stats() == BindingStats(admitted=1, queued=0)
