"""A real reference RM on loopback for the RM tests (no mocks: real HTTP, real SQLite)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from bindery.conformance.kit import DEFAULT_RESOURCE
from bindery.refrm import InventoryNode, RunningServer, serve_reference_rm

TOKEN = "test-token-for-the-reference-rm"


def small_inventory() -> list[InventoryNode]:
    """Three nodes; 4 conformance slots in total, as the conformance kit expects by default."""
    return [
        InventoryNode(
            name="node-a",
            allocatable={
                "cpu": Decimal(4),
                "memory": Decimal(8 * 2**30),
                "pods": Decimal(110),
                DEFAULT_RESOURCE: Decimal(2),
            },
            labels={"zone": "a"},
        ),
        InventoryNode(
            name="node-b",
            allocatable={
                "cpu": Decimal(2),
                "memory": Decimal(4 * 2**30),
                "pods": Decimal(110),
                DEFAULT_RESOURCE: Decimal(1),
                "nvidia.com/gpu": Decimal(2),
            },
            labels={"zone": "b"},
            taints=({"key": "gpu", "value": "true", "effect": "NoSchedule"},),
        ),
        InventoryNode(
            name="node-c",
            allocatable={
                "cpu": Decimal("1.5"),
                "memory": Decimal(2 * 2**30),
                "pods": Decimal(3),
                DEFAULT_RESOURCE: Decimal(1),
            },
            labels={"zone": "c"},
        ),
    ]


@pytest.fixture
async def refrm(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token=TOKEN
    ) as server:
        yield server
