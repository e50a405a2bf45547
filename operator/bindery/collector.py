"""How Bindery's long-running processes tune CPython's cyclic garbage collector.

Every decoded pod, watch event and HTTP request or answer allocates hundreds of containers. At
CPython's default, a young-generation pass every 700 of them traversed what the cycles in flight
hold, promoted it, and the full passes that followed walked every module, class and schema imported
at start: 1.0-1.3 s of a 3,000-pod backlog's 7-8 s of operator CPU (benchmarks/README.md, issue
19's plain-pod budget), and a seventh of the reference RM's CPU on the rules backlog. What is alive
at start (imports, configuration) lives as long as the process, so it is frozen out of every pass,
and the young generation is collected after 50,000 net allocations: on the rules backlog (1,500
pods) no pass fell within the backlog, where at 10,000 eight young passes and one middle one took
88 ms of the operator's CPU, and the RM's default passes 74 ms of its own. Garbage without cycles
is freed by reference counting as before; only cyclic garbage waits longer, and since the threshold
counts objects, not bytes, what such garbage holds waits with it (the 50,000-bound-pods memory run
in benchmarks/README.md is the measure).
"""

from __future__ import annotations

import gc

__all__ = ["COLLECTOR_THRESHOLDS", "tune_collector"]

#: The cyclic collector's thresholds for Bindery's processes (CPython's default is (700, 10, 10)).
COLLECTOR_THRESHOLDS = (50_000, 10, 10)


def tune_collector() -> None:
    """Freeze what is alive now out of the collector's passes and collect the young less often.

    Call it once start-up is done (imports, configuration), just before the process's loop."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
