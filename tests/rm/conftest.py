"""A real reference RM on loopback for the RM tests (no mocks: real HTTP, real SQLite).

Plus what several test files share: the small inventory, the command line that serves the RM as its
own process, the token file, and the per-node usage the overcommit checks add up.
"""

from __future__ import annotations

import pathlib
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from decimal import Decimal
from typing import Any

import pytest

from bindery.conformance.kit import DEFAULT_RESOURCE
from bindery.quantity import parse_quantity
from bindery.reference_rm import InventoryNode, RunningServer, serve_reference_rm

TOKEN = "test-token-for-the-reference-rm"


def _node(
    name: str,
    *,
    cpu: str,
    memory_gib: int,
    pods: int,
    slots: int,
    extra: dict[str, Decimal] | None = None,
    taints: tuple[dict[str, str], ...] = (),
) -> InventoryNode:
    allocatable = {
        "cpu": Decimal(cpu),
        "memory": Decimal(memory_gib * 2**30),
        "pods": Decimal(pods),
        DEFAULT_RESOURCE: Decimal(slots),
        **(extra or {}),
    }
    return InventoryNode(name=f"node-{name}", allocatable=allocatable, labels={"zone": name}, taints=taints)


def small_inventory() -> list[InventoryNode]:
    """Three nodes; 4 conformance slots in total, as the conformance kit expects by default."""
    return [
        _node("a", cpu="4", memory_gib=8, pods=110, slots=2),
        _node(
            "b",
            cpu="2",
            memory_gib=4,
            pods=110,
            slots=1,
            extra={"nvidia.com/gpu": Decimal(2)},
            taints=({"key": "gpu", "value": "true", "effect": "NoSchedule"},),
        ),
        _node("c", cpu="1.5", memory_gib=2, pods=3, slots=1),
    ]


def usage_by_node(reservations: Sequence[dict[str, Any]]) -> dict[str, dict[str, Decimal]]:
    """What the listed reservations hold on each node, per resource name."""
    used: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for item in reservations:
        for name, amount in item["resources"].items():
            used[item["node"]][name] += parse_quantity(amount)
    return used


@pytest.fixture
def token_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    return path


@pytest.fixture
async def refrm(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token=TOKEN
    ) as server:
        yield server
