"""The store's batch (contract v1.1 ``POST /v1/batch``): one SQLite transaction for many operations,
each answering what its single call answers, and a failed batch leaving nothing behind."""

from __future__ import annotations

import pathlib
import sqlite3
from decimal import Decimal
from typing import Any

import pytest

from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.store import (
    NotActive,
    NotFound,
    Placed,
    PodMismatch,
    ReservationStore,
    StoredReservation,
    Unschedulable,
)
from bindery.reference_rm.stores import Store
from bindery.rm.models import BatchOperation, ReservationRequest, ReservationState
from tests.rm.conftest import StoreFactory

NODES = [InventoryNode(name="n1", allocatable={"cpu": Decimal(2)})]


def body(uid: str, cpu: str = "1") -> dict[str, Any]:
    return {
        "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "s"},
        "resources": {"cpu": cpu},
        "idempotencyKey": uid,
        "ttlSeconds": 30,
    }


def reserve(uid: str, cpu: str = "1") -> BatchOperation:
    return BatchOperation.model_validate({"reserve": body(uid, cpu)})


def commit(reservation_id: str, pod_uid: str | None = None) -> BatchOperation:
    return BatchOperation.model_validate({"commit": {"reservationId": reservation_id, "podUid": pod_uid}})


def release(reservation_id: str, pod_uid: str | None = None) -> BatchOperation:
    return BatchOperation.model_validate({"release": {"reservationId": reservation_id, "podUid": pod_uid}})


def placed(store: Store, uid: str, cpu: str = "1") -> StoredReservation:
    outcome = store.reserve(
        ReservationRequest.model_validate(body(uid, cpu)), nodes=NODES, policy=Policy.BINPACK
    )
    assert isinstance(outcome, Placed)
    return outcome.reservation


def statements(store: ReservationStore) -> list[str]:
    """Every SQL statement the store's connection runs from now on (SQLite's trace callback)."""
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    return seen


def test_many_operations_are_one_transaction_each_answering_as_its_single_call(
    tmp_path: pathlib.Path,
) -> None:
    now = [1000.0]
    store = ReservationStore(tmp_path / "db", clock=lambda: now[0])
    kept = placed(store, "kept")  # 1 cpu of 2
    dropped = placed(store, "dropped")  # the other
    trace = statements(store)
    outcomes = store.batch(
        [
            commit(kept.id, pod_uid="kept"),
            commit(dropped.id, pod_uid="another-pod"),
            release(dropped.id, pod_uid="dropped"),
            commit(dropped.id),
            reserve("a"),  # fits in the cpu the release freed
            reserve("a"),  # a replay inside the batch: the reservation the line above made
            reserve("a", cpu="500m"),  # the same key, another request
            reserve("b"),  # the node is full again: no sharing with "a"
            release("no-such-id"),
            commit("no-such-id"),
        ],
        nodes=NODES,
        policy=Policy.BINPACK,
    )
    committed, mismatch, released, not_active, made, replay, reused, full, nothing, unknown = outcomes
    assert isinstance(committed, StoredReservation)
    assert committed.state is ReservationState.COMMITTED
    assert isinstance(mismatch, PodMismatch)
    assert isinstance(released, StoredReservation)
    assert released.id == dropped.id
    assert isinstance(not_active, NotActive)
    assert isinstance(made, Placed)
    assert made.created
    assert isinstance(replay, Placed)
    assert not replay.created
    assert replay.reservation == made.reservation
    assert type(reused).__name__ == "Conflict"
    assert isinstance(full, Unschedulable)
    assert nothing is None
    assert isinstance(unknown, NotFound)
    # One transaction (one fsync) for the ten operations, and no write outside it.
    assert transactions(trace) == 1
    begins = [i for i, sql in enumerate(trace) if sql.startswith("BEGIN")]
    commits = [i for i, sql in enumerate(trace) if sql == "COMMIT"]
    assert len(begins) == 1
    assert len(commits) == 1
    writes = [i for i, sql in enumerate(trace) if sql.split()[0] in ("INSERT", "UPDATE", "DELETE")]
    assert writes
    assert all(begins[0] < i < commits[0] for i in writes), trace
    assert store.usage() == {"n1": {"cpu": Decimal(2)}}
    store.close()
    reopened = ReservationStore(tmp_path / "db", clock=lambda: now[0])  # everything was durable
    assert reopened.usage() == {"n1": {"cpu": Decimal(2)}}
    assert [reopened.get(r.id).state for r in (kept, dropped, made.reservation)] == [  # type: ignore[union-attr]
        ReservationState.COMMITTED,
        ReservationState.RELEASED,
        ReservationState.RESERVED,
    ]
    reopened.close()


def transactions(trace: list[str]) -> int:
    """How many transactions (each one fsync) the traced statements committed: an explicit
    BEGIN ... COMMIT is one, and so is every write outside one (autocommit)."""
    count, inside = 0, False
    # SQLite reports a statement again for each trigger or RETURNING step it runs: count it once.
    distinct = [sql for index, sql in enumerate(trace) if index == 0 or trace[index - 1] != sql]
    for sql in distinct:
        if sql.startswith("BEGIN"):
            inside = True
        elif sql == "COMMIT":
            inside, count = False, count + 1
        elif not inside and sql.split()[0] in ("INSERT", "UPDATE", "DELETE"):
            count += 1
    return count


def test_singles_commit_one_transaction_each(tmp_path: pathlib.Path) -> None:
    """The baseline a batch saves on: the same writes one call at a time are one transaction each,
    the batch's one transaction for all of them."""
    store = ReservationStore(tmp_path / "db", clock=lambda: 1000.0)
    placed(store, "warm-up")  # the first call sweeps expired leases (a transaction of its own)
    trace = statements(store)
    made = placed(store, "a")
    store.commit(made.id)
    store.release(made.id)
    assert transactions(trace) == 3
    trace.clear()
    outcomes = store.batch([reserve("b"), release("warm-up")], nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(outcomes[0], Placed)
    store.batch(
        [commit(outcomes[0].reservation.id), release(outcomes[0].reservation.id)],
        nodes=NODES,
        policy=Policy.BINPACK,
    )
    assert transactions(trace) == 2
    store.close()


def test_a_failed_batch_rolls_back_and_leaves_memory_as_it_was(tmp_path: pathlib.Path) -> None:
    """A write that fails halfway (here a SQLite trigger refusing one pod, as a full disk would) undoes
    the operations before it, on disk and in the usage kept in memory, and the store goes on."""
    store = ReservationStore(tmp_path / "db", clock=lambda: 1000.0)
    held = placed(store, "held")
    sabotage = sqlite3.connect(tmp_path / "db")
    sabotage.execute(
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON reservations WHEN NEW.pod_uid = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'disk full (simulated)'); END"
    )
    sabotage.commit()
    sabotage.close()
    usage_before = store.usage()
    rows_before = store.list(limit=100)[0]
    with pytest.raises(sqlite3.IntegrityError, match="disk full"):
        store.batch(
            [release(held.id), reserve("a", cpu="2"), reserve("poison", cpu="0"), reserve("never")],
            nodes=NODES,
            policy=Policy.BINPACK,
        )
    assert not store._db.in_transaction
    assert store.usage() == usage_before == {"n1": {"cpu": Decimal(1)}}
    assert store.list(limit=100)[0] == rows_before  # the release and the reserve of "a" are undone
    # The store still works, and counts right: one cpu left.
    after = store.batch([reserve("a"), reserve("b")], nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(after[0], Placed)
    assert isinstance(after[1], Unschedulable)
    assert store.usage() == {"n1": {"cpu": Decimal(2)}}
    store.close()


def test_a_batch_expires_due_leases_first(make_store: StoreFactory) -> None:
    """The lazy expiry runs before the transaction, as it does before a single call."""
    now = [1000.0]
    store = make_store(clock=lambda: now[0])
    old = placed(store, "old", cpu="2")
    now[0] = 1031.0  # its 30 s lease ran out
    outcomes = store.batch([commit(old.id), reserve("new", cpu="2")], nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(outcomes[0], NotActive)
    assert isinstance(outcomes[1], Placed)
    store.close()
