"""What a released reservation wakes: the pods refused for room (their refusal declared
``ClusterEvent.RELEASE``) and no other, and a burst of releases wakes them once, then at most once
per window (``WakeWindow``), with no wake lost."""

from __future__ import annotations

import itertools

from bindery.scheduling.decisions import Outcome
from bindery.scheduling.events import (
    NO_ROOM,
    RELEASE_WAKE_WINDOW_SECONDS,
    ClusterEvent,
    Requeue,
    WakeOn,
    WakeWindow,
)
from bindery.scheduling.queue import SchedulingQueue
from tests.scheduling.fakes import FakeClock, pod

#: what PodPlacementRules declares for an anti-affinity refusal
RULES = Requeue(
    events=frozenset({ClusterEvent.NODE_ADDED, ClusterEvent.NODE_CHANGED, ClusterEvent.PLACED_POD}),
    placed=WakeOn(namespaces=frozenset({"ns"})),
)


def refused(queue: SchedulingQueue, name: str, requeue: Requeue | None) -> str:
    queue.add(pod(name))
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.name == name
    queue.settle(popped.uid, outcome=Outcome.UNSCHEDULABLE, requeue=requeue)
    return popped.uid


def test_a_release_wakes_the_pods_refused_for_room_and_no_other() -> None:
    queue = SchedulingQueue(clock=FakeClock())
    room = refused(queue, "room", NO_ROOM)
    rules = refused(queue, "rules", RULES)
    undeclared = refused(queue, "undeclared", None)
    assert queue.stats().unschedulable == 3

    assert queue.released(reason="a reservation was released") == 1
    assert dict(queue.stats().moved) == {"released": 1}
    positions = {uid: queue.position(uid) for uid in (room, rules, undeclared)}
    assert {uid: p.queue for uid, p in positions.items() if p is not None} == {
        room: "backoff",  # its 1 s backoff first, then active
        rules: "unschedulable",
        undeclared: "unschedulable",
    }
    # A Node changed may still lift any refusal (the rules read node labels): the coarse move.
    assert queue.move_all_to_active(reason="node n1 changed", event="node") == 2


def test_a_pod_refused_for_room_again_after_a_release_is_woken_by_the_next() -> None:
    clock = FakeClock()
    queue = SchedulingQueue(clock=clock)
    uid = refused(queue, "room", NO_ROOM)
    assert queue.released(reason="released") == 1
    clock.advance(1.0)
    popped = queue.pop_nowait()
    assert popped is not None
    assert popped.uid == uid
    queue.settle(uid, outcome=Outcome.UNSCHEDULABLE, requeue=NO_ROOM)  # no release meanwhile
    position = queue.position(uid)
    assert position is not None
    assert position.queue == "unschedulable"
    assert queue.released(reason="released") == 1


def test_a_burst_of_releases_wakes_once_at_once_and_once_at_the_end_of_the_window() -> None:
    window = WakeWindow()
    start = 100.0
    assert window.request(now=start) == 0.0  # the first release: at once
    owed = window.request(now=start + 0.1)
    assert owed is not None
    assert abs(owed - (RELEASE_WAKE_WINDOW_SECONDS - 0.1)) < 1e-9
    for k in range(2, 50):  # the rest of the burst: covered by the owed wake
        assert window.request(now=start + 0.1 + k * 0.01) is None
    window.fired(now=start + RELEASE_WAKE_WINDOW_SECONDS)
    # A release right after the owed wake waits for the next window; after a quiet one, at once.
    later = window.request(now=start + RELEASE_WAKE_WINDOW_SECONDS + 0.5)
    assert later is not None
    assert abs(later - 0.5) < 1e-9
    window.fired(now=start + 2 * RELEASE_WAKE_WINDOW_SECONDS)
    assert window.request(now=start + 10.0) == 0.0


def test_wakes_per_window_are_bounded_whatever_the_release_rate() -> None:
    """A release every 10 ms for 10 s: at most one wake per window (plus the first), none lost."""
    window = WakeWindow()
    wakes: list[float] = []
    owed_at: float | None = None
    t = 0.0
    while t < 10.0:
        if owed_at is not None and t >= owed_at:
            window.fired(now=t)
            wakes.append(t)
            owed_at = None
        delay = window.request(now=t)
        if delay == 0.0:
            wakes.append(t)
        elif delay is not None:
            owed_at = t + delay
        t = round(t + 0.01, 2)
    assert owed_at is not None or wakes[-1] >= 9.0, "the last releases' wake was lost"
    assert len(wakes) <= 10.0 / RELEASE_WAKE_WINDOW_SECONDS + 1
    assert all(b - a >= RELEASE_WAKE_WINDOW_SECONDS - 1e-9 for a, b in itertools.pairwise(wakes))
