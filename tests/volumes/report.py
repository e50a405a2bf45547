"""Outcomes of the volume-binding cases, collected across the session for a side-by-side table.

Each test records one line per case and scheduler; `tests/volumes/conftest.py` prints the table at
the end of the session (the issue's "done" asks for Bindery's and kube-scheduler's outcome side by
side), and every line is also printed when recorded (visible with `-s`).
"""

from __future__ import annotations

import collections

#: (case, scheduler) -> outcome, in the order recorded.
OUTCOMES: dict[tuple[str, str], str] = {}
#: Free-form blocks (the StatefulSet's pod/claim/volume table), printed after the outcomes.
BLOCKS: list[str] = []


def record(case: str, scheduler: str, outcome: str) -> None:
    OUTCOMES[(case, scheduler)] = outcome
    print(f"case={case} scheduler={scheduler} outcome={outcome}")


def block(text: str) -> None:
    BLOCKS.append(text)
    print(text)


def table() -> list[str]:
    """One row per case: the case, then each scheduler's outcome (`-` when that run did not record)."""
    by_case: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for (case, scheduler), outcome in OUTCOMES.items():
        by_case[case][scheduler] = outcome
    schedulers = sorted({scheduler for _, scheduler in OUTCOMES})
    rows = [["case", *schedulers]]
    rows += [[case, *(outcomes.get(s, "-") for s in schedulers)] for case, outcomes in by_case.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
