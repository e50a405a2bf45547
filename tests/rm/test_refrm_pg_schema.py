"""The PostgreSQL store's schema: versioned, migrated once by whichever replica starts first, and a
database migrated by a newer RM refused with the reason."""

from __future__ import annotations

import concurrent.futures
import pathlib
import subprocess

import psycopg
import pytest

from bindery.devcluster.postgres import PostgresServer
from bindery.reference_rm.cli import serve_command
from bindery.reference_rm.pgstore import SCHEMA_VERSION, PostgresReservationStore
from bindery.reference_rm.storeerrors import SchemaTooNew


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
