"""How Bindery's long-running processes tune CPython's cyclic garbage collector.

Every decoded pod, watch event and HTTP request or answer allocates hundreds of containers. At
CPython's default, a young-generation pass every 700 of them traversed what the cycles in flight
hold, promoted it, and the full passes that followed walked every module, class and schema imported
at start: a large share of the operator's and the reference RM's CPU on a backlog (the figures are
in benchmarks/README.md). What is alive at start (imports, configuration) lives as long as the
process, so it is frozen out of every pass, and the young generation is collected after 50,000 net
allocations, so that few or no passes fall within a backlog. Garbage without cycles
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
