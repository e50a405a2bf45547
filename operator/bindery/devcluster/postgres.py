"""A real PostgreSQL on loopback in a temporary directory, for the reference RM's tests and benchmarks.

Started and stopped by the project's own code, as :mod:`bindery.devcluster.plane` starts etcd: the
Debian ``postgresql-15`` binaries (``initdb``, ``postgres``), a fresh cluster per server, a free
loopback port, password authentication over TCP (so the RM's password file and libpq environment
are exercised, not a trust shortcut). ``initdb`` refuses to run as root, so as root both run as the
``postgres`` OS user the Debian package creates, on a directory handed to it.

Crash and restart are part of the test bed: :meth:`PostgresServer.kill` takes the whole process
group down at once (SIGKILL: no shutdown checkpoint, the next start replays the WAL; SIGQUIT:
PostgreSQL's immediate shutdown), and :meth:`PostgresServer.restart` starts it again on the same
port and data, so clients that reconnect find their rows.

Tuned for tests: ``fsync=off`` (a killed process loses nothing the kernel already has, and these
tests kill processes, not the machine; ``durable=True`` turns it back on for benchmarks), while
``synchronous_commit`` stays on, so a commit a client was told about survives a SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping

from bindery.devcluster.plane import free_port

__all__ = ["POSTGRES_USER", "PostgresError", "PostgresServer", "find_postgres_bin"]

#: The database role the test bed creates (its superuser) and the URLs name.
POSTGRES_USER = "bindery"
_OS_USER = "postgres"  # who runs initdb and postgres when we are root
_SEARCH = pathlib.Path("/usr/lib/postgresql")
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresError(RuntimeError):
    """The test bed could not start, reach or stop PostgreSQL; the message says why and what to do."""


def find_postgres_bin() -> pathlib.Path:
    """The directory holding ``initdb`` and ``postgres``: ``$BINDERY_POSTGRES_BIN``, else the newest
    ``/usr/lib/postgresql/<major>/bin`` (Debian's layout)."""
    configured = os.environ.get("BINDERY_POSTGRES_BIN")
    candidates = (
        [pathlib.Path(configured)]
        if configured
        else sorted(
            (path for path in _SEARCH.glob("*/bin") if path.name == "bin" and path.parent.name.isdigit()),
            key=lambda path: int(path.parent.name),
            reverse=True,
        )
    )
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "postgres").exists():
            return candidate
    raise PostgresError(
        f"no PostgreSQL server binaries in {configured or _SEARCH / '<major>/bin'}: install Debian's "
        "postgresql-15 (apt-get install postgresql-15) or point BINDERY_POSTGRES_BIN at a directory "
        "holding initdb and postgres"
    )


def _run_as() -> str | None:
    """The OS user to run PostgreSQL as: ``postgres`` when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(_OS_USER)
    except KeyError:
        raise PostgresError(
            f"running as root, and there is no {_OS_USER!r} OS user to run PostgreSQL as (initdb "
            "refuses root): install Debian's postgresql-15, which creates it, or run as another user"
        ) from None
    return _OS_USER


@dataclasses.dataclass
class PostgresServer:
    """One PostgreSQL cluster: its data directory, port, superuser password and process."""

    bin_dir: pathlib.Path
    workdir: pathlib.Path
    port: int
    password: str
    durable: bool
    _owns_workdir: bool
    _os_user: str | None
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> pathlib.Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> pathlib.Path:
        return self.workdir / "postgres.log"

    @property
    def password_file(self) -> pathlib.Path:
        """The superuser's password alone on one line: what ``bindery rm serve --db-password-file`` reads."""
        return self.workdir / "password"

    @classmethod
    def start(
        cls,
        *,
        workdir: pathlib.Path | None = None,
        port: int | None = None,
        durable: bool = False,
        timeout: float = 60.0,
    ) -> PostgresServer:
        """initdb a fresh cluster into ``workdir`` (a new temporary directory by default) and start it."""
        bin_dir = find_postgres_bin()
        os_user = _run_as()
        owns = workdir is None
        # Not under pytest's tmp_path: that is mode 700 and root's, and the postgres user must enter it.
        base = pathlib.Path(tempfile.mkdtemp(prefix="bindery-pg-")) if workdir is None else workdir
        base.mkdir(parents=True, exist_ok=True)
        server = cls(
            bin_dir=bin_dir,
            workdir=base,
            port=port or free_port(),
            password=os.urandom(16).hex(),
            durable=durable,
            _owns_workdir=owns,
            _os_user=os_user,
        )
        try:
            server._initdb()
            server._launch(timeout=timeout)
        except BaseException:
            server.stop()
            raise
        return server

    # -- lifecycle -----------------------------------------------------------------------------------

    def _chown(self, path: pathlib.Path) -> None:
        if self._os_user is not None:
            shutil.chown(path, user=self._os_user, group=self._os_user)

    def _initdb(self) -> None:
        self._chown(self.workdir)
        self.password_file.write_text(self.password + "\n")
        self.password_file.chmod(0o600)
        self._chown(self.password_file)
        done = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                f"--pgdata={self.data_dir}",
                f"--username={POSTGRES_USER}",
                f"--pwfile={self.password_file}",
                "--auth-host=scram-sha-256",
                "--auth-local=peer",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ],
            capture_output=True,
            user=self._os_user,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            raise PostgresError(
                f"initdb into {self.data_dir} failed (exit {done.returncode}):\n"
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )

    def _launch(self, *, timeout: float) -> None:
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.workdir),  # not /var/run/postgresql: not ours
            "max_connections": "300",
            "shared_buffers": "32MB",
            "fsync": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
            "log_min_messages": "warning",
        }
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        with self.log_path.open("ab") as out:
            self._chown(self.log_path)
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                user=self._os_user,
                start_new_session=True,  # its own process group: kill() takes every backend with it
            )
        self._wait_ready(timeout=timeout)

    def _wait_ready(self, *, timeout: float) -> None:
        import psycopg  # the optional `postgres` extra

        deadline = time.monotonic() + timeout
        last = "no attempt"
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise PostgresError(
                    f"postgres exited with {self._proc.returncode} while starting on port {self.port}:\n"
                    f"{self.tail()}"
                )
            try:
                with psycopg.connect(self.url("postgres"), password=self.password, connect_timeout=2):
                    return
            except psycopg.OperationalError as error:
                last = str(error).strip()
            time.sleep(0.1)
        raise PostgresError(
            f"postgres did not accept connections on port {self.port} in {timeout:.0f} s: "
            f"{last}\n{self.tail()}"
        )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Crash it: ``sig`` to the postmaster and every backend at once, then wait for them."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
        # Backends of the group outlive a killed postmaster briefly; a restart waits them out.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self._proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        self._proc = None

    def restart(self, *, timeout: float = 60.0) -> None:
        """Start it again on the same port and data (after :meth:`kill`, it replays its WAL)."""
        if self.running:
            self.kill(signal.SIGINT)
        self._launch(timeout=timeout)

    def stop(self) -> None:
        """Shut down (SIGINT: a fast shutdown; SIGKILL if it hangs), remove what start created."""
        self.kill(signal.SIGINT)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text[-lines:]) or "(empty log)"

    # -- clients -------------------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """A libpq URL without the password (it is in :attr:`password_file` and :meth:`env`)."""
        return f"postgresql://{POSTGRES_USER}@127.0.0.1:{self.port}/{database}"

    def env(self) -> Mapping[str, str]:
        """The libpq environment a client process needs to log in (``PGPASSWORD``)."""
        return {"PGPASSWORD": self.password}

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        if not _NAME.match(name):
            raise ValueError(f"database name {name!r}: use lower-case letters, digits and _")
        with psycopg.connect(self.url("postgres"), password=self.password, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting whoever is still on it."""
        import psycopg

        if not _NAME.match(name):
            raise ValueError(f"database name {name!r}: use lower-case letters, digits and _")
        with psycopg.connect(self.url("postgres"), password=self.password, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    @contextlib.contextmanager
    def database(self, name: str) -> Iterator[str]:
        """A fresh database for the ``with`` block's length."""
        url = self.create_database(name)
        try:
            yield url
        finally:
            self.drop_database(name)
