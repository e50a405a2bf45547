"""Random operation sequences on the queue: no pod is lost, duplicated or dispatched twice.

The example-based tests in test_queue.py pin down each rule; this explores interleavings of them
(updates while in flight, forget while parked, moves during cycles) against a few invariants.
"""

from __future__ import annotations

import dataclasses

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from bindery.scheduling.decisions import Outcome
from bindery.scheduling.queue import MAX_PARKED_SECONDS, SchedulingQueue
from tests.scheduling.fakes import FakeClock, pod

UIDS = st.sampled_from([f"p{i}" for i in range(6)])
MAX_IN_FLIGHT = 2


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.queue = SchedulingQueue(max_in_flight=MAX_IN_FLIGHT, clock=self.clock)
        self.known: set[str] = set()  # added and not forgotten/finished
        self.flying: set[str] = set()

    @rule(name=UIDS, priority=st.integers(-2, 2), zone=st.sampled_from(["a", "b"]))
    def add(self, name: str, priority: int, zone: str) -> None:
        # A pod's namespace never changes; three of them exercise the namespaces' turns.
        namespace = f"ns{int(name[1:]) % 3}"
        added = pod(name, priority=priority, node_selector={"zone": zone})
        self.queue.add(dataclasses.replace(added, namespace=namespace))
        self.known.add(f"uid-{name}")

    @rule(name=UIDS)
    def bound_elsewhere(self, name: str) -> None:
        self.queue.add(dataclasses.replace(pod(name), node_name="n1"))
        self.known.discard(f"uid-{name}")

    @rule(name=UIDS)
    def forget(self, name: str) -> None:
        self.queue.forget(f"uid-{name}")
        self.known.discard(f"uid-{name}")

    @rule()
    def pop(self) -> None:
        item = self.queue.pop_nowait()
        if item is not None:
            assert item.uid not in self.flying, "a pod was dispatched twice"
            assert item.uid in self.known, "a forgotten pod came back"
            self.flying.add(item.uid)

    @rule(
        data=st.data(),
        outcome=st.sampled_from(list(Outcome)),
        retry_after=st.none() | st.floats(0, 1000),
    )
    def done(self, data: st.DataObject, outcome: Outcome, retry_after: float | None) -> None:
        if not self.flying:
            return
        uid = data.draw(st.sampled_from(sorted(self.flying)))
        self.queue.done(uid, outcome=outcome, retry_after=retry_after)
        self.flying.discard(uid)
        if outcome in (Outcome.BOUND, Outcome.DROPPED):
            self.known.discard(uid)

    @rule()
    def move(self) -> None:
        self.queue.move_all_to_active(reason="test")

    @rule(seconds=st.floats(0, 20))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def counts_add_up(self) -> None:
        stats = self.queue.stats()
        assert stats.in_flight <= MAX_IN_FLIGHT
        assert stats.in_flight == len(self.flying)
        assert stats.pending + stats.in_flight == len(self.queue)
        assert {uid for uid in self.known if uid in self.queue} == self.known

    def teardown(self) -> None:
        """Liveness: finish every cycle, wait out the longest park, and every known pod comes out."""
        for uid in sorted(self.flying):
            self.queue.done(uid, outcome=Outcome.ERROR)
        self.clock.advance(MAX_PARKED_SECONDS + 1)
        seen: set[str] = set()
        while (item := self.queue.pop_nowait()) is not None:
            seen.add(item.uid)
            self.queue.done(item.uid, outcome=Outcome.BOUND)
        assert seen == self.known


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class SharedQueueMachine(QueueMachine):
    """The same with a per-namespace share of one in-flight slot: a namespace never holds two."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = SchedulingQueue(
            max_in_flight=MAX_IN_FLIGHT, max_in_flight_per_namespace=1, clock=self.clock
        )

    @invariant()
    def one_per_namespace(self) -> None:
        namespaces = [f"ns{int(uid.removeprefix('uid-p')) % 3}" for uid in self.flying]
        assert len(namespaces) == len(set(namespaces)), f"two pods of one namespace in flight: {namespaces}"


TestSharedQueueMachine = SharedQueueMachine.TestCase
TestSharedQueueMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
