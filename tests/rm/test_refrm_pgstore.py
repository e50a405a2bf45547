"""What only the PostgreSQL store has: a schema versioned, migrated once by whichever replica starts
first, a database migrated by a newer RM refused with the reason; the database's clock; and the
foreign usage a replica keeps per node, dropped when another replica changes that node."""

from __future__ import annotations

import concurrent.futures
import pathlib
import subprocess
import time
from decimal import Decimal

import psycopg
import pytest

from bindery.devcluster.postgres import PostgresServer
from bindery.reference_rm.accounting import BoundPod, ClusterPods
from bindery.reference_rm.cli import serve_command
from bindery.reference_rm.pgstore import SCHEMA_VERSION, PostgresReservationStore
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.store import Placed, Unschedulable
from bindery.reference_rm.storeerrors import SchemaTooNew
from bindery.rm.models import ReservationRequest, ReservationState


def test_replicas_starting_together_migrate_once(postgres_db: str) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        stores = list(pool.map(lambda _: PostgresReservationStore(postgres_db), range(8)))
    for store in stores:
        store.close()
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT version FROM bindery_schema").fetchall() == [(SCHEMA_VERSION,)]
        history = conn.execute("SELECT version FROM bindery_schema_history ORDER BY version").fetchall()
    assert history == [(version,) for version in range(1, SCHEMA_VERSION + 1)]


def test_a_database_of_a_newer_rm_is_refused_with_the_reason(
    postgres: PostgresServer, postgres_db: str, tmp_path: pathlib.Path, token_file: pathlib.Path
) -> None:
    PostgresReservationStore(postgres_db).close()
    with psycopg.connect(postgres_db) as conn:
        conn.execute("UPDATE bindery_schema SET version = version + 1")
    with pytest.raises(SchemaTooNew, match=f"version {SCHEMA_VERSION + 1}, written by a newer"):
        PostgresReservationStore(postgres_db)
    # The command says so and exits 2, without a traceback.
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes:\n  - {name: a, allocatable: {cpu: '1'}}\n")
    done = subprocess.run(
        serve_command(db=postgres_db, token_file=token_file, options=["--inventory", str(inventory)]),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert b"written by a newer reference RM" in done.stderr
    assert b"Traceback" not in done.stderr


def test_an_unreachable_database_is_a_reason_not_a_traceback(
    postgres: PostgresServer, tmp_path: pathlib.Path, token_file: pathlib.Path
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes:\n  - {name: a, allocatable: {cpu: '1'}}\n")
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    done = subprocess.run(
        serve_command(
            db=postgres.url("postgres"),
            token_file=token_file,
            options=["--inventory", str(inventory), "--db-password-file", str(wrong)],
        ),
        capture_output=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2, done.stderr
    assert b"password authentication failed" in done.stderr
    assert b"Traceback" not in done.stderr


def test_a_version_1_database_gains_the_usage_table_filled_from_its_active_rows(postgres_db: str) -> None:
    """Version 2 keeps the usage per node in a table; a database of version 1 (usage summed from
    the rows at every reserve) is migrated with the usage of the reservations it holds."""
    nodes = [InventoryNode(name="n1", allocatable={"cpu": Decimal(4)})]
    store = PostgresReservationStore(postgres_db, clock=lambda: 0.0)
    kept = store.reserve(request("kept", "1500m"), nodes=nodes, policy=Policy.BINPACK)
    ended = store.reserve(request("ended", "1"), nodes=nodes, policy=Policy.BINPACK)
    assert isinstance(kept, Placed)
    assert isinstance(ended, Placed)
    assert store.release(ended.reservation.id) is not None
    store.close()
    with psycopg.connect(postgres_db) as conn:  # back to what version 1 left
        conn.execute("DROP TABLE node_usage")
        conn.execute("DROP TABLE node_changes")
        conn.execute("UPDATE bindery_schema SET version = 1")
        conn.execute("DELETE FROM bindery_schema_history WHERE version >= 2")
    reopened = PostgresReservationStore(postgres_db, clock=lambda: 0.0)
    assert reopened.usage() == {"n1": {"cpu": Decimal("1.5")}}
    full = reopened.reserve(request("more", "2600m"), nodes=nodes, policy=Policy.BINPACK)
    assert isinstance(full, Unschedulable)  # 1.5 + 2.6 > 4: the migrated usage is what placement sees
    reopened.close()
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT version FROM bindery_schema_history ORDER BY version").fetchall() == [
            (version,) for version in range(1, SCHEMA_VERSION + 1)
        ]


def request(uid: str, cpu: str) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "s"},
            "resources": {"cpu": cpu},
            "idempotencyKey": uid,
            "ttlSeconds": 10,
        }
    )


def test_leases_are_stamped_and_judged_by_the_database_clock(
    postgres_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas on machines whose clocks disagree must agree on when a lease ends: with this
    machine's clock set 30 years back, a lease still starts at the database's time, and one the
    database's clock says is over is expired."""
    nodes = [InventoryNode(name="n1", allocatable={"cpu": Decimal(4)})]
    store = PostgresReservationStore(postgres_db)  # no clock injected: the database's
    with psycopg.connect(postgres_db) as conn:
        row = conn.execute(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
        ).fetchone()
    assert row is not None
    database_now = float(row[0])
    monkeypatch.setattr(time, "time", lambda: database_now - 30 * 365 * 86400)
    placed = store.reserve(request("a", "1"), nodes=nodes, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    assert abs(placed.reservation.created_at - database_now) < 600
    assert placed.reservation.expires_at == placed.reservation.created_at + 10
    with psycopg.connect(postgres_db) as conn:  # the lease ran out, by the database's clock
        conn.execute(
            "UPDATE reservations SET expires_at = "
            "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION) - 1"
        )
    gone = store.get(placed.reservation.id)
    assert gone is not None
    assert gone.state is ReservationState.EXPIRED
    assert store.usage() == {"n1": {"cpu": Decimal(0)}}
    store.close()


def test_a_replica_resolves_a_node_again_when_another_replica_ends_a_reservation_on_it(
    postgres_db: str,
) -> None:
    """Mirror mode: a pod bound with reservation r is counted by r, not as foreign. When replica B
    releases r (the pod still bound), replica A, which resolved that node before, must count the
    pod as foreign from then on, or it hands out the pod's room twice."""
    nodes = [InventoryNode(name="n1", allocatable={"cpu": Decimal(2)})]
    a = PostgresReservationStore(postgres_db, clock=lambda: 0.0)
    b = PostgresReservationStore(postgres_db, clock=lambda: 0.0)
    held = a.reserve(request("p", "1"), nodes=nodes, policy=Policy.BINPACK)
    assert isinstance(held, Placed)
    a.commit(held.reservation.id)
    bound = ClusterPods.of(
        [
            BoundPod(
                uid="p", key="ns/p", node="n1", usage={"cpu": Decimal(1)}, reservation_id=held.reservation.id
            )
        ]
    )
    beside = a.reserve(request("x", "1"), nodes=nodes, policy=Policy.BINPACK, pods=bound)
    assert isinstance(beside, Placed)  # p counted once, by its reservation: 2 of 2 used
    # A resolves n1 in a transaction that changes nothing on it, so it keeps that resolution.
    assert isinstance(
        a.reserve(request("w", "1"), nodes=nodes, policy=Policy.BINPACK, pods=bound), Unschedulable
    )
    assert b.release(beside.reservation.id) is not None  # 1 of 2 used, by r
    assert b.release(held.reservation.id) is not None  # r ends; p is still bound: foreign now
    # A's resolution of n1 predates both releases: it must not count p as r's any more.
    # (With the node_changes check taken out of _foreign, y is placed: n1 overcommitted.)
    refused = a.reserve(request("y", "1500m"), nodes=nodes, policy=Policy.BINPACK, pods=bound)
    assert isinstance(refused, Unschedulable), refused  # p's 1 + 1.5 > 2
    fits = a.reserve(request("z", "1"), nodes=nodes, policy=Policy.BINPACK, pods=bound)
    assert isinstance(fits, Placed)
    a.close()
    b.close()


def test_an_unverified_link_to_postgresql_is_named_at_start(
    postgres_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """libpq's default sslmode (prefer) checks no certificate and may fall back to plain text:
    the RM said nothing of it."""
    with caplog.at_level("WARNING", logger="bindery.reference_rm.pgstore"):
        PostgresReservationStore(postgres_db).close()
    assert any(
        "is not verified (sslmode=prefer)" in record.getMessage()
        and "sslmode=verify-full" in record.getMessage()
        for record in caplog.records
    ), caplog.text


def test_a_verified_link_or_a_unix_socket_gets_no_tls_warning() -> None:
    from bindery.reference_rm.pgstore import tls_warning

    assert (
        tls_warning("postgresql://rm@db.example:5432/rm?sslmode=verify-full&sslrootcert=/ca.crt", {}) is None
    )
    assert tls_warning("postgresql://rm@db.example/rm", {"PGSSLMODE": "verify-ca"}) is None
    assert tls_warning("postgresql:///rm?host=/run/postgresql", {}) is None
    assert "sslmode=require" in (tls_warning("postgresql://rm@db.example/rm?sslmode=require", {}) or "")


def test_a_replica_stopped_while_it_holds_the_placement_lock_stalls_the_others_for_seconds_not_hours(
    postgres_db: str,
) -> None:
    """A replica that stopped inside a placing transaction (SIGSTOP, a black-holed link) kept the
    lock row, and every other replica's reserve waited on it with no limit. Now the wait ends at
    ``lock_timeout`` with an error the server answers 503 to. The stopped replica is a session
    that took the row and does nothing more."""
    from bindery.reference_rm.stores import UNREACHABLE

    nodes = [InventoryNode(name="n1", allocatable={"cpu": Decimal(4)})]
    store = PostgresReservationStore(postgres_db)
    holder = psycopg.connect(postgres_db)
    try:
        holder.execute("SELECT placements FROM bindery_placement_lock WHERE id = 0 FOR UPDATE")
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            call = pool.submit(
                store.reserve,
                ReservationRequest.model_validate(
                    {
                        "pod": {"uid": "u1", "namespace": "ns", "name": "p1", "schedulerName": "bindery"},
                        "resources": {"cpu": "1"},
                        "idempotencyKey": "k1",
                        "ttlSeconds": 30,
                    }
                ),
                nodes=nodes,
                policy=Policy.BINPACK,
            )
            try:
                error = call.exception(timeout=40)
            finally:
                holder.rollback()  # lets an unbounded wait (the old code) end, so the test ends
        assert isinstance(error, UNREACHABLE), error
        assert "lock timeout" in str(error)
    finally:
        holder.close()
        store.close()
