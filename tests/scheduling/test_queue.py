"""SchedulingQueue: ordering, dedupe, backoff, in-flight bound, unschedulable pool, forget, pop()."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from bindery.backoff import BackoffPolicy
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.queue import QueueClosed, QueuePosition, Requeue, SchedulingQueue
from tests.scheduling.fakes import FakeClock, pod


def make_queue(*, max_in_flight: int = 100, **kwargs: object) -> tuple[SchedulingQueue, FakeClock]:
    clock = FakeClock()
    return SchedulingQueue(max_in_flight=max_in_flight, clock=clock, **kwargs), clock  # type: ignore[arg-type]


def drain(queue: SchedulingQueue) -> list[str]:
    names = []
    while (item := queue.pop_nowait()) is not None:
        names.append(item.name)
    return names


def test_orders_by_priority_then_creation_time() -> None:
    queue, _ = make_queue()
    queue.add(pod("young-low", priority=0, age=10))
    queue.add(pod("old-low", priority=0, age=1))
    queue.add(pod("high", priority=100, age=50))
    queue.add(pod("negative", priority=-5, age=0))
    assert drain(queue) == ["high", "old-low", "young-low", "negative"]


def test_same_uid_is_stored_once_and_updates_replace_the_stored_copy() -> None:
    queue, _ = make_queue()
    queue.add(pod("a", labels={"v": "1"}))
    queue.add(pod("a", labels={"v": "2"}))
    assert len(queue) == 1
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.labels == {"v": "2"}
    assert queue.pop_nowait() is None


def test_priority_update_reorders_an_active_pod() -> None:
    queue, _ = make_queue()
    queue.add(pod("a", age=1))
    queue.add(pod("b", age=2))
    queue.add(pod("b", age=2, priority=10))
    assert drain(queue) == ["b", "a"]


@pytest.mark.parametrize(
    "change",
    [{"node_name": "n1"}, {"deleting": True}, {"gated": True}],
    ids=["bound", "deleting", "gated"],
)
def test_unschedulable_pods_are_not_queued_and_forget_known_ones(change: dict[str, object]) -> None:
    queue, _ = make_queue()
    assert queue.add(dataclasses.replace(pod("new"), **change)) is False  # type: ignore[arg-type]
    queue.add(pod("known"))
    assert queue.add(dataclasses.replace(pod("known"), **change)) is False  # type: ignore[arg-type]
    assert len(queue) == 0
    assert queue.pop_nowait() is None


@pytest.mark.parametrize(
    ("attempts", "delay"), [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (500, 10.0)]
)
def test_backoff_doubles_from_initial_and_is_capped(attempts: int, delay: float) -> None:
    assert BackoffPolicy(initial=1.0, maximum=10.0).delay(attempts=attempts) == delay


def test_failed_pod_waits_for_its_backoff() -> None:
    queue, clock = make_queue(backoff=BackoffPolicy(initial=1.0, maximum=3.0))
    queue.add(pod("a"))
    assert queue.pop_nowait() is not None
    waits = []
    for _ in range(4):
        queue.done("uid-a", outcome=Outcome.ERROR)
        waited = 0.0
        while queue.pop_nowait() is None:
            clock.advance(0.5)
            waited += 0.5
        waits.append(waited)
    assert waits == [1.0, 2.0, 3.0, 3.0]
    assert queue.attempts("uid-a") == 4


def test_retry_after_hint_lengthens_the_wait_up_to_the_flush_limit() -> None:
    queue, clock = make_queue(max_parked_seconds=300.0)
    queue.add(pod("a"))
    queue.add(pod("b"))
    queue.pop_nowait()
    queue.pop_nowait()
    queue.done("uid-a", outcome=Outcome.ERROR, retry_after=30.0)
    queue.done("uid-b", outcome=Outcome.UNSCHEDULABLE, retry_after=10_000.0)
    clock.advance(29.9)
    assert queue.pop_nowait() is None
    clock.advance(0.1)
    assert drain(queue) == ["a"]
    clock.advance(300.0 - 30.0 - 0.1)
    assert queue.pop_nowait() is None
    clock.advance(0.1)
    assert drain(queue) == ["b"]


def test_in_flight_bound_holds_back_pods_until_done() -> None:
    queue, _ = make_queue(max_in_flight=2)
    for i in range(4):
        queue.add(pod(f"p{i}", age=i))
    assert drain(queue) == ["p0", "p1"]
    assert queue.stats().in_flight == 2
    queue.done("uid-p0", outcome=Outcome.BOUND)
    assert drain(queue) == ["p2"]
    queue.done("uid-p1", outcome=Outcome.ERROR)  # a failure frees the slot too
    assert drain(queue) == ["p3"]


def test_a_high_priority_pod_arriving_while_the_budget_is_spent_goes_next() -> None:
    queue, _ = make_queue(max_in_flight=1)
    queue.add(pod("first", age=0))
    queue.add(pod("low", age=1))
    assert drain(queue) == ["first"]
    queue.add(pod("urgent", priority=1000, age=2))
    queue.done("uid-first", outcome=Outcome.BOUND)
    assert drain(queue) == ["urgent"]


def test_an_unschedulable_pod_with_the_rms_hint_is_retried_when_the_hint_says() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.pop_nowait()
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=20.0)
    assert queue.stats().unschedulable == 1
    clock.advance(19.9)
    assert queue.pop_nowait() is None
    clock.advance(0.1)
    assert drain(queue) == ["a"]


def test_a_move_with_a_settling_delay_holds_parked_pods_back_that_long() -> None:
    """A Node event reaches the RM through its own watch: pods retried before it saw the event would
    be refused and parked again, so the move waits for it a moment (and so does a pod in flight)."""
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.add(pod("b", age=1))
    assert drain(queue) == ["a", "b"]
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE)
    clock.advance(5.0)
    assert queue.move_all_to_active(reason="node n1 added", settle=2.0) == 1
    queue.done("uid-b", outcome=Outcome.UNSCHEDULABLE)  # was in flight during the move
    clock.advance(1.9)
    assert queue.pop_nowait() is None
    clock.advance(0.1)
    assert sorted(drain(queue)) == ["a", "b"]


def test_move_all_to_active_retries_parked_pods_early_but_not_before_their_backoff() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.add(pod("b", age=1))
    queue.pop_nowait()
    queue.pop_nowait()
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=60.0)
    queue.done("uid-b", outcome=Outcome.UNSCHEDULABLE, retry_after=60.0)
    clock.advance(0.5)
    assert queue.move_all_to_active(reason="reservation released") == 2
    assert queue.stats().unschedulable == 0
    assert queue.pop_nowait() is None  # still backing off (1 s)
    clock.advance(0.5)
    assert drain(queue) == ["a", "b"]  # at 1 s, not 60 s


def test_move_all_to_active_does_not_touch_pods_backing_off_after_errors() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.pop_nowait()
    queue.done("uid-a", outcome=Outcome.ERROR, retry_after=60.0)
    assert queue.move_all_to_active(reason="pod deleted") == 0
    clock.advance(59.0)
    assert queue.pop_nowait() is None
    clock.advance(1.0)
    assert drain(queue) == ["a"]


def test_a_move_while_in_flight_keeps_the_pod_from_being_parked_past_it() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.pop_nowait()
    queue.move_all_to_active(reason="capacity freed while the RM was answering")
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=60.0)
    assert queue.stats().unschedulable == 0
    clock.advance(1.0)
    assert drain(queue) == ["a"]
    # The move was before this second attempt: the next failure is parked normally.
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=60.0)
    assert queue.stats().unschedulable == 1


def test_placement_update_moves_an_unschedulable_pod_and_a_status_update_does_not() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.pop_nowait()
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=60.0)
    queue.add(pod("a", unschedulable_condition=("Unschedulable", "no room")))
    assert queue.stats().unschedulable == 1
    clock.advance(1.0)
    queue.add(pod("a", tolerations=({"operator": "Exists"},)))
    assert drain(queue) == ["a"]


def test_placement_update_while_in_flight_skips_the_unschedulable_pool() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.pop_nowait()
    queue.add(pod("a", node_selector={"zone": "b"}))
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=60.0)
    assert queue.stats().backoff == 1
    clock.advance(1.0)
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.node_selector == {"zone": "b"}


def test_forget_drops_waiting_pods_and_in_flight_pods_on_done() -> None:
    queue, _ = make_queue()
    queue.add(pod("waiting"))
    queue.add(pod("flying", priority=1))
    assert drain(queue) == ["flying", "waiting"]
    queue.done("uid-waiting", outcome=Outcome.ERROR)
    queue.forget("uid-waiting")
    queue.forget("uid-flying")
    queue.forget("uid-unknown")
    assert "uid-flying" not in queue
    assert queue.stats().in_flight == 1
    queue.done("uid-flying", outcome=Outcome.ERROR)
    assert len(queue) == 0
    assert queue.stats().in_flight == 0


def test_done_without_pop_is_a_bug_reported_loudly() -> None:
    queue, _ = make_queue()
    queue.add(pod("a"))
    with pytest.raises(KeyError, match="not in flight"):
        queue.done("uid-a", outcome=Outcome.BOUND)


def test_bound_and_dropped_pods_leave_the_queue() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.add(pod("b"))
    drain(queue)
    queue.done("uid-a", outcome=Outcome.BOUND)
    queue.done("uid-b", outcome=Outcome.DROPPED)
    clock.advance(1000)
    assert len(queue) == 0
    assert queue.pop_nowait() is None


def test_reconfigure_applies_new_budget_and_backoff() -> None:
    queue, clock = make_queue(max_in_flight=1)
    queue.add(pod("a", age=0))
    queue.add(pod("b", age=1))
    assert drain(queue) == ["a"]
    queue.reconfigure(max_in_flight=2, backoff=BackoffPolicy(initial=5.0, maximum=5.0))
    assert drain(queue) == ["b"]
    queue.done("uid-a", outcome=Outcome.ERROR)
    clock.advance(4.9)
    assert queue.pop_nowait() is None
    clock.advance(0.1)
    assert drain(queue) == ["a"]


def test_stale_heap_items_are_compacted() -> None:
    queue, _ = make_queue()
    queue.add(pod("a"))
    for priority in range(1000):
        queue.add(pod("a", priority=priority))
    assert queue.footprint() <= 64 + 2 + 3  # the compaction is the point of this test
    assert drain(queue) == ["a"]


def test_many_pods_come_out_in_priority_order() -> None:
    queue, _ = make_queue(max_in_flight=10_000)
    pods = [pod(f"p{i}", priority=(i * 7919) % 13, age=(i * 104729) % 1000) for i in range(5000)]
    for item in pods:
        queue.add(item)
    expected = [p.name for p in sorted(pods, key=lambda p: (-p.priority, p.created))]
    assert drain(queue) == expected


async def test_pop_waits_for_a_pod_to_be_added() -> None:
    queue, _ = make_queue()
    waiter = asyncio.create_task(queue.pop())
    await asyncio.sleep(0)
    assert not waiter.done()
    queue.add(pod("a"))
    popped = await asyncio.wait_for(waiter, 5)
    assert popped.name == "a"


async def test_pop_waits_for_the_backoff_on_the_injected_clock() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    await queue.pop()
    queue.done("uid-a", outcome=Outcome.ERROR)
    waiter = asyncio.create_task(queue.pop())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance(1.0)
    assert (await asyncio.wait_for(waiter, 5)).name == "a"


async def test_pop_waits_for_an_in_flight_slot() -> None:
    queue, _ = make_queue(max_in_flight=1)
    queue.add(pod("a", age=0))
    queue.add(pod("b", age=1))
    await queue.pop()
    waiter = asyncio.create_task(queue.pop())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()
    queue.done("uid-a", outcome=Outcome.BOUND)
    assert (await asyncio.wait_for(waiter, 5)).name == "b"


async def test_close_wakes_waiters() -> None:
    queue, _ = make_queue()
    waiter = asyncio.create_task(queue.pop())
    await asyncio.sleep(0)
    queue.close()
    with pytest.raises(QueueClosed):
        await asyncio.wait_for(waiter, 5)


async def test_pop_wakes_for_a_pod_moved_out_of_the_unschedulable_pool() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    await queue.pop()
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=60.0)
    waiter = asyncio.create_task(queue.pop())
    for _ in range(3):
        await asyncio.sleep(0)
    clock.advance(0.5)
    queue.move_all_to_active(reason="reservation released")  # now due at 1 s, not 60 s
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance(0.5)
    assert (await asyncio.wait_for(waiter, 5)).name == "a"


def test_position_says_where_a_pod_waits_and_when_it_is_tried_next() -> None:
    queue, clock = make_queue(backoff=BackoffPolicy(initial=1.0, maximum=10.0))
    queue.add(pod("a"))
    queue.add(pod("b"))
    assert queue.position("uid-a") == QueuePosition(
        queue="active", attempts=0, ready_in=None, waits_for_capacity=False
    )
    queue.pop_nowait()
    queue.pop_nowait()
    assert queue.position("uid-a") == QueuePosition(
        queue="in-flight", attempts=0, ready_in=None, waits_for_capacity=False
    )
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=30.0)  # the RM's hint wins
    queue.done("uid-b", outcome=Outcome.ERROR)
    clock.advance(0.25)
    assert queue.position("uid-a") == QueuePosition(
        queue="unschedulable", attempts=1, ready_in=29.75, waits_for_capacity=True
    )
    assert queue.position("uid-b") == QueuePosition(
        queue="backoff", attempts=1, ready_in=0.75, waits_for_capacity=False
    )
    queue.forget("uid-b")
    assert queue.position("uid-b") is None
    assert queue.position("never-seen") is None


def test_a_pod_moved_out_of_the_unschedulable_pool_early_is_ready_from_the_move() -> None:
    """The trace's queue wait starts when the pod became due: at the move, not its later deadline."""
    queue, clock = make_queue()
    queue.add(pod("a"))
    assert drain(queue) == ["a"]
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, retry_after=60.0)
    clock.advance(5.0)
    assert queue.move_all_to_active(reason="capacity released") == 1
    assert queue.ready_since("uid-a") == clock.now()
    clock.advance(1.0)
    assert drain(queue) == ["a"]
    assert queue.now() - (queue.ready_since("uid-a") or 0.0) == pytest.approx(1.0)


async def test_a_pod_added_wakes_one_idle_worker_not_all_of_them() -> None:
    """Bindery runs maxInFlight workers (256 by default), all idle in pop() at low load: a pod
    added must not wake every one of them to find the queue empty again (each wake-up is a task
    switch and a heap look-up, 256 of them per event)."""
    queue, _ = make_queue()
    looks = 0
    pop_nowait = queue.pop_nowait

    def counted() -> PodInfo | None:
        nonlocal looks
        looks += 1
        return pop_nowait()

    queue.pop_nowait = counted  # type: ignore[method-assign]
    workers = [asyncio.create_task(queue.pop()) for _ in range(64)]
    for _ in range(5):
        await asyncio.sleep(0)
    before = looks
    queue.add(pod("a"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert sum(worker.done() for worker in workers) == 1
    assert looks - before <= 2, f"{looks - before} workers looked at the queue for one pod"
    queue.add(pod("b"))
    queue.add(pod("c"))
    for _ in range(10):
        await asyncio.sleep(0)
    assert sorted(w.result().name for w in workers if w.done()) == ["a", "b", "c"]
    queue.close()
    results = await asyncio.gather(*workers, return_exceptions=True)
    assert sum(isinstance(r, QueueClosed) for r in results) == 61


def in_namespace(namespace: str, name: str, **kwargs: Any) -> PodInfo:
    return dataclasses.replace(pod(name, **kwargs), namespace=namespace)


def test_a_pod_of_another_namespace_is_not_starved_by_a_backlog_of_older_pods() -> None:
    """Issue 20, scenario 3: thousands of older pods of one tenant at equal priority must not keep a
    newer pod of another tenant from ever being tried (the key had no namespace: oldest first)."""
    queue, _ = make_queue(max_in_flight=10_000)
    for i in range(5000):
        queue.add(in_namespace("team-a", f"a{i}", age=i))
    queue.add(in_namespace("team-b", "b", age=10_000))
    first = [queue.pop_nowait() for _ in range(3)]
    assert "b" in [p.name for p in first if p is not None]


def test_namespaces_take_turns_at_equal_priority_and_priority_still_comes_first() -> None:
    queue, _ = make_queue()
    for i in range(3):
        queue.add(in_namespace("a", f"a{i}", age=i))
    for i in range(2):
        queue.add(in_namespace("b", f"b{i}", age=10 + i))
    queue.add(in_namespace("c", "c-urgent", priority=100, age=20))
    queue.add(in_namespace("a", "a-urgent", priority=100, age=21))
    names = drain(queue)
    # Priority first, whatever the namespace; at each priority the namespaces take turns, in the
    # order they joined (a, b, c) and then by when they were last served: "a" used its turn on
    # "a-urgent", so "b" goes before it at priority 0.
    assert names == ["a-urgent", "c-urgent", "b0", "a0", "b1", "a1", "a2"]


def test_an_unschedulable_pod_stays_parked_until_an_event_or_the_five_minute_flush() -> None:
    """kube-scheduler parks an unschedulable pod until an event that could make it fit, or
    podMaxInUnschedulablePodsDuration (5 min): retrying on the 1-10 s backoff timer forever makes every
    never-fitting pod cost an RM call every 10 s."""
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.pop_nowait()
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE)
    for _ in range(299):
        clock.advance(1.0)
        assert queue.pop_nowait() is None, f"retried after {clock.now() - 1000.0:.0f} s without an event"
    clock.advance(1.0)
    assert drain(queue) == ["a"]


def test_a_refusal_whose_events_are_not_followed_comes_back_on_its_backoff() -> None:
    """A plugin's Unschedulable (VolumeBinding: a claim not created yet) hangs on objects Bindery does
    not watch; parked for 5 minutes, a pod created just before its claim would wait that long."""
    queue, clock = make_queue()
    queue.add(pod("a"))
    queue.pop_nowait()
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE, until_event=False)
    assert queue.position("uid-a") == QueuePosition(
        queue="unschedulable", attempts=1, ready_in=1.0, waits_for_capacity=True
    )
    clock.advance(1.0)
    assert drain(queue) == ["a"]


def test_a_namespace_share_of_the_in_flight_budget_leaves_slots_to_the_others() -> None:
    """With maxInFlightPerNamespace, one namespace's backlog cannot hold every in-flight slot while
    its cycles wait on a slow RM or a volume: the others' pods still get slots."""
    queue, _ = make_queue(max_in_flight=4, max_in_flight_per_namespace=2)
    for i in range(10):
        queue.add(in_namespace("a", f"a{i}", age=i))
    assert drain(queue) == ["a0", "a1"]  # its share is spent; two slots stay free
    queue.add(in_namespace("b", "b0", age=20))
    queue.add(in_namespace("b", "b1", age=21))
    queue.add(in_namespace("b", "b2", age=22))
    assert drain(queue) == ["b0", "b1"]
    queue.done("uid-a0", outcome=Outcome.BOUND)
    assert drain(queue) == ["a2"]
    queue.reconfigure(max_in_flight=4, max_in_flight_per_namespace=None, backoff=BackoffPolicy())
    queue.done("uid-a1", outcome=Outcome.BOUND)
    assert drain(queue) == ["b2"]  # b's turn: a was served last


def test_the_rm_serving_again_tries_the_pods_it_refused_as_unavailable_at_once() -> None:
    """Pods the RM refused as unavailable (a 503 while it starts) wait for it to serve, not out
    their backoff; a pod backing off after another error keeps its backoff."""
    queue, clock = make_queue(backoff=BackoffPolicy(initial=120.0, maximum=120.0))
    for name in ("a", "b"):
        queue.add(pod(name))
    popped = [queue.pop_nowait(), queue.pop_nowait()]
    assert [p.name for p in popped if p is not None] == ["a", "b"]
    queue.settle("uid-a", outcome=Outcome.ERROR, retry_after=1.0, requeue=Requeue.rm_ready())
    queue.settle("uid-b", outcome=Outcome.ERROR)
    assert queue.waiting_for_rm() == 1
    clock.advance(5.0)
    assert queue.pop_nowait() is None
    assert queue.rm_ready() == 1
    assert drain(queue) == ["a"]
    assert queue.waiting_for_rm() == 0
    assert queue.rm_ready() == 0
