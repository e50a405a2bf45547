"""One writer per SQLite database: an exclusive lock on a file beside it.

Why: the store keeps the capacity in use in memory and decides placements from it (see
:mod:`bindery.reference_rm.store`). Two ``bindery rm serve`` processes on one ``--db`` each counted
only their own reservations, so both placed pods on the same free capacity. So the store takes this
lock before it opens the database, and a second process exits at start with who holds it.

Why ``flock`` on ``<db>.lock`` and not the alternatives:

- The kernel drops a ``flock`` when its last file descriptor closes, which a SIGKILL, an OOM kill or
  a crash does too: a restarted RM never finds a stale lock, unlike a pid file created with
  ``O_EXCL``, which outlives its process and must be guessed stale.
- SQLite's ``locking_mode=EXCLUSIVE`` also dies with its process, but in WAL mode it is only taken at
  the first write, the loser sees a bare ``database is locked`` (no holder to name), and it shuts
  out every reader too (``sqlite3`` by hand on a live RM).
- POSIX record locks (``fcntl``/``lockf``, what SQLite itself uses) belong to the process and are
  dropped when *any* descriptor of the file closes in it; a ``flock`` belongs to its open file
  description. It is taken on a separate file, not the database, because on NFS Linux emulates
  ``flock`` with record locks, which would then collide with SQLite's own.

The lock file says who holds it (pid, host, since when), rewritten by each holder; it is never
deleted, since deleting it while another process waits to open it would let two holders lock two
different files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pathlib
import socket
from datetime import UTC, datetime

__all__ = ["DatabaseLocked", "WriterLock", "lock_path"]


class DatabaseLocked(Exception):
    """Another process holds the database's writer lock."""


def lock_path(db_path: pathlib.Path | str) -> pathlib.Path:
    """The lock file of a database: beside it, named after it."""
    return pathlib.Path(f"{db_path}.lock")


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says (it may be mid-write: then say so)."""
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 4096, 0).decode()
        holder = json.loads(text)
        return f"pid {holder['pid']} on host {holder['host']}, since {holder['since']}"
    return "a process that has not written its pid and host yet"


class WriterLock:
    """The exclusive writer lock of one database, held until :meth:`release` (or the process ends)."""

    def __init__(self, fd: int, path: pathlib.Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, db_path: pathlib.Path | str) -> WriterLock:
        """Take the lock without waiting; :class:`DatabaseLocked` says who holds it when another does."""
        path = lock_path(db_path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            holder = _holder(fd)
            os.close(fd)
            raise DatabaseLocked(
                f"the database {db_path} is in use by another reference RM ({holder}; lock file {path}): "
                "two RMs on one database would each count only their own reservations and hand out the "
                "same capacity twice; stop that one first, or give this one a --db of its own"
            ) from None
        since = datetime.now(UTC).isoformat(timespec="seconds")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}).encode()
        # Best effort, in place (no new block on a full disk): the lock holds without the record.
        with contextlib.suppress(OSError):
            os.pwrite(fd, record, 0)
            os.ftruncate(fd, len(record))
        return cls(fd, path)

    def release(self) -> None:
        """Give the lock up (closing the descriptor drops the ``flock``); idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
