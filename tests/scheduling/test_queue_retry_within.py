"""`SchedulingQueue.retry_within`: a preemptor backing off is tried again when its back-off ends,
even if no event wakes it (an unschedulable pod otherwise waits up to the 5-minute flush)."""

from __future__ import annotations

from bindery.backoff import BackoffPolicy
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.queue import SchedulingQueue
from tests.scheduling.fakes import FakeClock, pod


def test_a_parked_pod_is_tried_again_when_told_and_never_later_than_it_was_due() -> None:
    clock = FakeClock()
    queue = SchedulingQueue(max_in_flight=10, clock=clock, max_parked_seconds=300.0)
    for name in ("a", "b"):
        queue.add(pod(name))
        assert queue.pop_nowait() is not None
        queue.done(f"uid-{name}", outcome=Outcome.UNSCHEDULABLE)  # parked until an event or the flush
    queue.retry_within("uid-a", 10.0)
    queue.retry_within("uid-b", 400.0)  # later than its flush: the flush stays
    queue.retry_within("uid-unknown", 1.0)  # nothing to do
    clock.advance(9.9)
    assert queue.pop_nowait() is None
    clock.advance(0.1)
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.name == "a"
    assert queue.pop_nowait() is None
    clock.advance(290.0)
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.name == "b"


def test_a_retry_never_comes_before_the_pods_backoff() -> None:
    clock = FakeClock()
    queue = SchedulingQueue(max_in_flight=10, clock=clock, backoff=BackoffPolicy(initial=4.0, maximum=4.0))
    queue.add(pod("a"))
    assert queue.pop_nowait() is not None
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE)
    queue.retry_within("uid-a", 0.0)
    clock.advance(3.9)
    assert queue.pop_nowait() is None
    clock.advance(0.1)
    assert queue.pop_nowait() is not None
