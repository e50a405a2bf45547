"""Count the apiserver writes Bindery makes, by kind.

Bindery promises two writes per bound pod (Binding + Scheduled event). Counting at the port keeps
that promise checkable by the demo and by tests without scraping apiserver metrics.
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class WriteCounter:
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def add(self, *, kind: str) -> None:
        self.counts[kind] += 1

    def total(self) -> int:
        return sum(self.counts.values())

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)
