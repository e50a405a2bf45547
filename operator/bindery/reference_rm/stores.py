"""The store the reference RM's server uses, and how ``--db`` chooses one.

Two implementations of one interface: :class:`~bindery.reference_rm.store.ReservationStore`
(SQLite, the embedded default: one process, a file) and
:class:`~bindery.reference_rm.pgstore.PostgresReservationStore` (PostgreSQL: several replicas on
one database).  Both pass the same store tests and the conformance kit.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Protocol

from bindery.reference_rm.accounting import ClusterPods
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.preemption import Chooser, Plan
from bindery.reference_rm.store import (
    DEFAULT_MAX_RELEASED_ROWS,
    FOREIGN_RETRY_SECONDS,
    BatchOutcome,
    CommitOutcome,
    GroupConflict,
    GroupPlaced,
    NotActive,
    NotFound,
    PodMismatch,
    ReleaseOutcome,
    ReservationStore,
    ReserveOutcome,
    StoredGroup,
    StoredReservation,
    Unschedulable,
)
from bindery.rm.models import BatchOperation, ReservationGroupRequest, ReservationRequest, ReservationState

__all__ = ["UNREACHABLE", "Store", "is_postgres_url", "open_store"]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def _unreachable() -> tuple[type[Exception], ...]:
    """PostgreSQL's errors that mean "ask again": the database down, restarting or unreachable, a
    dropped connection, a deadlock or serialization failure; not a refused statement.  Empty without
    the driver installed (then no store raises them)."""
    try:
        import psycopg
    except ImportError:
        return ()
    return (psycopg.OperationalError,)


#: Errors a store raises when its database cannot be reached: the call may be asked again.
UNREACHABLE = _unreachable()


class Store(Protocol):
    """What the server asks of its store.  Every call is one transaction; calls come from one thread."""

    def close(self) -> None: ...

    def usage(self) -> dict[str, dict[str, Decimal]]: ...

    def check_writable(self) -> None: ...

    def get(self, reservation_id: str) -> StoredReservation | None: ...

    def reserve(
        self,
        request: ReservationRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> ReserveOutcome: ...

    def commit(self, reservation_id: str, *, pod_uid: str | None = None) -> CommitOutcome: ...

    def release(self, reservation_id: str, *, pod_uid: str | None = None) -> ReleaseOutcome: ...

    def renew(
        self, reservation_id: str, *, pod_uid: str, ttl_seconds: int
    ) -> StoredReservation | NotFound | NotActive | PodMismatch: ...

    def revoke(self, reservation_id: str, *, reason: str) -> StoredReservation | NotFound | NotActive: ...

    def batch(
        self,
        operations: Sequence[BatchOperation],
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> list[BatchOutcome]: ...

    def list(
        self,
        *,
        scheduler_name: str | None = None,
        state: ReservationState | tuple[ReservationState, ...] | None = None,
        pod_uid: str | None = None,
        group_id: str | None = None,
        cluster_id: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> tuple[list[StoredReservation], int | None]: ...

    def get_group(self, group_id: str) -> StoredGroup | None: ...

    def reserve_group(
        self,
        request: ReservationGroupRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> GroupPlaced | GroupConflict | Unschedulable: ...

    def release_group(self, group_id: str) -> StoredGroup | None: ...

    def renew_group(self, group_id: str, *, ttl_seconds: int) -> StoredGroup | NotFound | NotActive: ...

    # Preemption plans (contract v1.2): stored, so any replica answers a confirm or cancel and every
    # placement takes out the rooms confirmed plans hold (reserve, batch and group alike).

    def get_plan(self, plan_id: str) -> Plan | None: ...

    def active_plan(self, pod_uid: str) -> Plan | None: ...

    def propose_plan(self, pod_uid: str, choose: Chooser, *, lease_seconds: int) -> Plan | None: ...

    def confirm_plan(self, plan_id: str) -> Plan | None: ...

    def cancel_plan(self, plan_id: str) -> Plan | None: ...


def is_postgres_url(db: pathlib.Path | str) -> bool:
    return str(db).startswith(_POSTGRES_SCHEMES)


def open_store(
    db: pathlib.Path | str,
    *,
    clock: Callable[[], float] | None = None,
    retention: float = 3600.0,
    max_released_rows: int = DEFAULT_MAX_RELEASED_ROWS,
    password_file: pathlib.Path | None = None,
    foreign_retry_seconds: float = FOREIGN_RETRY_SECONDS,
    percentage_of_nodes_to_score: int = 0,
) -> Store:
    """SQLite for a path (or ``:memory:``), PostgreSQL for a ``postgresql://`` URL.

    PostgreSQL's password comes from ``password_file`` or libpq's own sources (``PGPASSWORD``,
    ``PGPASSFILE``, ``~/.pgpass``); TLS is set with libpq's names in the URL or environment
    (``sslmode=verify-full&sslrootcert=...``, ``PGSSLMODE``).  Without a ``clock`` PostgreSQL's
    own clock judges leases; SQLite uses this machine's.
    """
    if not is_postgres_url(db):
        if password_file is not None:
            raise ValueError(
                f"a password file goes with a postgresql:// URL, and --db is the SQLite file {db}"
            )
        return ReservationStore(
            db,
            clock=clock or _wall_clock,
            retention=retention,
            max_released_rows=max_released_rows,
            foreign_retry_seconds=foreign_retry_seconds,
            percentage_of_nodes_to_score=percentage_of_nodes_to_score,
        )
    try:
        from bindery.reference_rm.pgstore import PostgresReservationStore, read_password_file
    except ImportError as error:
        raise RuntimeError(
            f"--db {_redacted(str(db))} needs the PostgreSQL driver ({error.name} is not installed): "
            "pip install 'kube-bindery[rm,postgres]'"
        ) from error
    return PostgresReservationStore(
        str(db),
        password=None if password_file is None else read_password_file(password_file),
        clock=clock,
        retention=retention,
        max_released_rows=max_released_rows,
        foreign_retry_seconds=foreign_retry_seconds,
        percentage_of_nodes_to_score=percentage_of_nodes_to_score,
    )


def _wall_clock() -> float:
    import time

    return time.time()


def _redacted(url: str) -> str:
    """The URL without a password, if it carries one (for messages and logs)."""
    scheme, _, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"
