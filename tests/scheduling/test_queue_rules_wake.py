"""Pods refused by the placement rules wait for a placed-pod change that could lift the refusal
(``SchedulingQueue.wake``), a node event or the 5-minute flush; not for their backoff alone."""

from __future__ import annotations

from bindery.scheduling.decisions import Outcome
from bindery.scheduling.queue import MAX_PARKED_SECONDS, TOUCHES_KEPT, SchedulingQueue, Touch, WakeOn
from tests.scheduling.fakes import FakeClock, pod

#: What a pod of namespace "ns" with required anti-affinity waits for (placementrules.wake_on).
OWN = WakeOn(namespaces=frozenset({"ns"}), tags=frozenset({"anti-affinity"}))


def refused(queue: SchedulingQueue, name: str = "a", wake_on: WakeOn = OWN) -> None:
    queue.add(pod(name))
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.name == name
    queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE, until_event=False, wake_on=wake_on)


def make_queue() -> tuple[SchedulingQueue, FakeClock]:
    clock = FakeClock()
    return SchedulingQueue(clock=clock), clock


def test_a_rules_refusal_parks_the_pod_past_its_backoff_until_the_flush() -> None:
    queue, clock = make_queue()
    refused(queue)
    assert queue.stats().unschedulable == 1
    clock.advance(10.0)  # the longest default backoff: the old code retried it here
    assert queue.pop_nowait() is None
    clock.advance(MAX_PARKED_SECONDS - 10.0)
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.name == "a"


def test_a_placed_pod_change_in_the_rules_scope_wakes_the_pod_once_its_backoff_ends() -> None:
    queue, clock = make_queue()
    refused(queue)
    assert queue.wake(Touch(namespace="ns")) == 1
    assert queue.pop_nowait() is None  # its 1 s backoff first
    clock.advance(1.0)
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.name == "a"
    assert dict(queue.stats().moved) == {"placed-pod": 1}


def test_a_change_out_of_scope_leaves_the_pod_parked_and_a_tagged_one_anywhere_wakes_it() -> None:
    queue, clock = make_queue()
    refused(queue)
    assert queue.wake(Touch(namespace="other")) == 0
    assert queue.wake(Touch(namespace="other", tags=frozenset({"host-ports"}))) == 0
    clock.advance(5.0)
    assert queue.pop_nowait() is None
    assert queue.wake(Touch(namespace="other", tags=frozenset({"anti-affinity"}))) == 1
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.name == "a"


def test_a_namespace_selector_scope_is_woken_by_any_namespace() -> None:
    queue, clock = make_queue()
    refused(queue, wake_on=WakeOn(namespaces=None))
    clock.advance(1.0)
    assert queue.wake(Touch(namespace="elsewhere")) == 1


def test_pods_parked_for_other_reasons_are_not_woken_by_placed_pods() -> None:
    queue, _clock = make_queue()
    queue.add(pod("a"))
    queue.pop_nowait()
    queue.done("uid-a", outcome=Outcome.UNSCHEDULABLE)  # the RM had no room
    assert queue.wake(Touch(namespace="ns", tags=frozenset({"anti-affinity"}))) == 0
    assert queue.stats().unschedulable == 1


def test_a_node_event_moves_rules_refused_pods_too_and_they_leave_the_wake_index() -> None:
    queue, clock = make_queue()
    refused(queue)
    clock.advance(1.0)
    assert queue.move_all_to_active(reason="node n1 changed", event="node") == 1
    assert queue.wake(Touch(namespace="ns")) == 0  # active now: nothing to wake
    assert dict(queue.stats().moved) == {"node": 1}


def test_a_change_in_scope_while_the_pod_was_in_flight_backs_it_off_instead_of_parking() -> None:
    queue, clock = make_queue()
    queue.add(pod("a"))
    popped = queue.pop_nowait()
    assert popped is not None
    queue.wake(Touch(namespace="ns"))  # the blocking pod left while the rules were evaluated
    queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE, until_event=False, wake_on=OWN)
    assert queue.stats().unschedulable == 0
    clock.advance(1.0)
    again = queue.pop_nowait()
    assert again is not None
    assert again.name == "a"
    # A change out of scope while in flight does not: parked until an event.
    queue.wake(Touch(namespace="other"))
    queue.done(again.uid, outcome=Outcome.UNSCHEDULABLE, until_event=False, wake_on=OWN)
    assert queue.stats().unschedulable == 1


def test_too_many_changes_while_in_flight_count_as_one_in_scope() -> None:
    queue, _ = make_queue()
    queue.add(pod("a"))
    popped = queue.pop_nowait()
    assert popped is not None
    for _ in range(TOUCHES_KEPT + 1):
        queue.wake(Touch(namespace="other"))
    queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE, until_event=False, wake_on=OWN)
    assert queue.stats().backoff == 1


def test_a_forgotten_parked_pod_leaves_the_wake_index() -> None:
    queue, _ = make_queue()
    refused(queue)
    queue.forget("uid-a")
    assert queue.wake(Touch(namespace="ns")) == 0
    assert len(queue) == 0


def test_relabelling_the_refused_pod_moves_it() -> None:
    """An existing pod's anti-affinity may select it by a label it no longer has."""
    queue, clock = make_queue()
    refused(queue)
    clock.advance(1.0)
    queue.add(pod("a", labels={"app": "other"}))
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.labels == {"app": "other"}


def test_a_deadline_set_on_a_rules_refused_pod_keeps_its_wake_up() -> None:
    """A preemption back-off (`retry_within`) re-parks the pod: the placed-pod change that lifts its
    rules must still wake it before that deadline (both arrived in one merge)."""
    queue, clock = make_queue()
    refused(queue)
    queue.retry_within("uid-a", 60.0)
    assert queue.wake(Touch(namespace="ns")) == 1
    clock.advance(1.0)
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.name == "a"
