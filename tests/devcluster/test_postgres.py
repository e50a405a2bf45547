"""The PostgreSQL test bed: a real server the project's own code starts, crashes and restarts."""

from __future__ import annotations

import signal

import psycopg
import pytest

from bindery.devcluster.postgres import PostgresError, PostgresServer


def test_fresh_database_takes_the_password_not_trust(postgres: PostgresServer, postgres_db: str) -> None:
    with psycopg.connect(postgres_db) as conn:  # PGPASSWORD from the fixture
        (version,) = conn.execute("SHOW server_version_num").fetchone() or (0,)
        assert int(str(version)) >= 150000
        conn.execute("CREATE TABLE t (x int)")
    # Password authentication over TCP: a wrong password is refused, so the RM's password handling is real.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(postgres_db, password="wrong")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGQUIT])
def test_crash_and_restart_keep_committed_rows(
    postgres: PostgresServer, postgres_db: str, sig: signal.Signals
) -> None:
    with psycopg.connect(postgres_db) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1), (2)")
    held = psycopg.connect(postgres_db, autocommit=True)
    try:
        postgres.kill(sig)
        assert not postgres.running
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")  # the crash reached the client: its connection is gone
    finally:
        held.close()
        postgres.restart()
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)


def test_stop_removes_its_directory() -> None:
    server = PostgresServer.start()
    server.stop()
    assert not server.running
    assert not server.workdir.exists()


def test_missing_binaries_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINDERY_POSTGRES_BIN", "/nonexistent/bin")
    with pytest.raises(PostgresError, match="apt-get install postgresql-15"):
        PostgresServer.start()
