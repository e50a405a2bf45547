"""A real reference RM on loopback for the RM tests (no mocks: real HTTP, real SQLite).

Plus what several test files share: the small inventory, the command line that serves the RM as its
own process, the token file, and the per-node usage the overcommit checks add up.
"""

from __future__ import annotations

import pathlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import httpx
import pytest

from bindery.conformance.harness import RevokeHook
from bindery.conformance.kit import DEFAULT_RESOURCE
from bindery.quantity import parse_quantity
from bindery.reference_rm import InventoryNode, RunningServer, serve_reference_rm
from bindery.reference_rm.store import DEFAULT_MAX_RELEASED_ROWS, FOREIGN_RETRY_SECONDS
from bindery.reference_rm.stores import Store, open_store

TOKEN = "test-token-for-the-reference-rm"
#: The reference RM's operator token (bindery rm serve --admin-token-file): revokes reservations.
ADMIN_TOKEN = "test-admin-token-of-the-reference-rm"


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
        db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token=TOKEN, admin_token=ADMIN_TOKEN
    ) as server:
        yield server


def admin_revoke(url: str) -> RevokeHook:
    """The conformance kit's revoke hook for a reference RM served with ``ADMIN_TOKEN``."""

    async def revoke(reservation_id: str, reason: str) -> None:
        async with httpx.AsyncClient(base_url=url) as http:
            answer = await http.post(
                f"/admin/v1/reservations/{reservation_id}/revoke",
                json={"reason": reason},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            )
        assert answer.status_code == 200, answer.text

    return revoke


class StoreFactory:
    """Opens the test's store on ONE database, as often as the test asks (a second call is a reopen,
    or a second replica on PostgreSQL); closes what the test left open."""

    def __init__(self, db: pathlib.Path | str) -> None:
        self.db = db
        self._open: list[Store] = []

    @property
    def backend(self) -> str:
        return "postgres" if str(self.db).startswith("postgresql://") else "sqlite"

    def __call__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        retention: float = 3600.0,
        max_released_rows: int = DEFAULT_MAX_RELEASED_ROWS,
        foreign_retry_seconds: float = FOREIGN_RETRY_SECONDS,
        percentage_of_nodes_to_score: int = 0,
    ) -> Store:
        store = open_store(
            self.db,
            clock=clock,
            retention=retention,
            max_released_rows=max_released_rows,
            foreign_retry_seconds=foreign_retry_seconds,
            percentage_of_nodes_to_score=percentage_of_nodes_to_score,
        )
        closing = store.close

        def close() -> None:
            if store in self._open:
                self._open.remove(store)
                closing()

        store.close = close  # type: ignore[method-assign]
        self._open.append(store)
        return store

    def close_all(self) -> None:
        for store in list(self._open):
            store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[StoreFactory]:
    """The store tests on both backends: SQLite in a file, PostgreSQL in a fresh database."""
    db: pathlib.Path | str = (
        tmp_path / "db" if request.param == "sqlite" else str(request.getfixturevalue("postgres_db"))
    )
    factory = StoreFactory(db)
    yield factory
    factory.close_all()
