"""Print how fast the scheduling queue adds, pops and requeues pods (a figure, not a test).

Run: ``.venv/bin/python -m tests.scheduling.bench_queue [pods]``.  The queue's pop is on the hot
path of every cycle; this shows it stays O(log n) as the backlog grows.
"""

from __future__ import annotations

import sys
import time

from bindery.scheduling.decisions import Outcome
from bindery.scheduling.queue import SchedulingQueue
from tests.scheduling.fakes import FakeClock, pod


def bench(count: int) -> None:
    clock = FakeClock()
    queue = SchedulingQueue(max_in_flight=count, clock=clock)
    pods = [pod(f"p{i}", priority=i % 7, age=i % 997) for i in range(count)]
    start = time.perf_counter()
    for item in pods:
        queue.add(item)
    added = time.perf_counter()
    popped = [queue.pop_nowait() for _ in range(count)]
    drained = time.perf_counter()
    for done in popped:
        assert done is not None
        queue.done(done.uid, outcome=Outcome.UNSCHEDULABLE)
    queue.move_all_to_active(reason="bench")
    clock.advance(1.0)
    again = [queue.pop_nowait() for _ in range(count)]
    retried = time.perf_counter()
    assert all(item is not None for item in again)
    print(
        f"{count:>8} pods: add {count / (added - start):>10,.0f}/s  "
        f"pop {count / (drained - added):>10,.0f}/s  "
        f"fail+move+pop {count / (retried - drained):>10,.0f}/s"
    )


if __name__ == "__main__":
    for size in [int(arg) for arg in sys.argv[1:]] or [1_000, 10_000, 100_000]:
        bench(size)
