"""Durable reservation state of the reference RM in PostgreSQL, shared by several active replicas.

Why this shape: the SQLite store (:mod:`bindery.reference_rm.store`) is right for one process, and
its speed comes from what that process remembers (the capacity in use, the next lease to expire).
With several replicas on one database, memory is exactly what must not be trusted: another replica
may have placed, released or expired anything since.  So here nothing about reservations is kept
in memory between operations: each operation is ONE database transaction that reads what it needs
(the usage per node from ``node_usage``, which every transaction that activates or ends a
reservation changes with it) and writes its outcome.

Concurrency (issue 22, "active-active"), chosen and why:

* **Placement is serialized on one lock row.** Every operation that places (a reserve, a group, a
  batch) first takes ``SELECT ... FROM bindery_placement_lock WHERE id = 0 FOR UPDATE``, then reads
  usage and idempotency keys.  Under READ COMMITTED each later statement sees every transaction
  that committed before it, so a placement sees all earlier placements of every replica: no node is
  overcommitted and a key is answered once.  One row, not one per scheduler name: capacity is shared
  by all scheduler names, so two names placing on one node at once would overcommit.  SERIALIZABLE
  with retries was the alternative; it aborts most concurrent reserves under load (they all read
  the same usage) and retries them, where the lock row just queues them.
* **Everything else takes row locks only.** A commit, release or renew locks its reservation row
  (``FOR UPDATE``) and decides on the row as locked; releases and expiries only free capacity, so a
  placement that ran beside them counted too much, never too little.
* **Preemption plans** (contract v1.2) are rows too, so a confirm may reach any replica. A plan is
  proposed under the placement lock (it reads usage, the other plans' holds and victims), every
  placement reads the confirmed plans' holds after taking the lock, and a confirm or cancel locks
  the plan's row only: a confirm and the preemptor's reserve (which ends the plan) are ordered on
  that row. A plan's lease is judged by the database's clock, like a reservation's.
* **All or nothing** is the transaction: a group's members, a batch's operations.
* **Idempotency** holds across replicas through the lock row, and a partial unique index on the
  active keys makes a second active row for a key impossible whatever the code does.
* **Time is the database's**: its clock (``clock_timestamp()``, read once per transaction after the
  lock) judges lease expiry and stamps leases, so replicas with skewed clocks agree.  Tests may
  inject a clock instead.

The SQL is what PostgreSQL-compatible distributed engines accept as well (CockroachDB, YugabyteDB):
no triggers, no LISTEN/NOTIFY, no advisory locks, no SQLite or PostgreSQL-only functions;
``SELECT ... FOR UPDATE``, ``ON CONFLICT DO NOTHING``, ``RETURNING``, partial indexes and
``ANY(array)`` only.  Only PostgreSQL 15 is tested.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.errors

from bindery.quantity import format_quantity, parse_quantity
from bindery.reference_rm.accounting import ClusterPods, Foreign, NodePods, foreign_usage
from bindery.reference_rm.groups import MemberAsk, place_group
from bindery.reference_rm.placement import (
    InventoryNode,
    Policy,
    add_usage,
    check_percentage,
    choose_node,
    effective_usage,
    placeable,
    subtract_usage,
)
from bindery.reference_rm.preemption import (
    ACTIVE_PLAN_STATES,
    NEW_PLAN_COLUMNS,
    Chooser,
    Plan,
    as_of,
    group_plan_key,
    new_plan_row,
    victim_uids,
)
from bindery.reference_rm.store import (
    DEFAULT_MAX_RELEASED_ROWS,
    FOREIGN_RETRY_SECONDS,
    PLAN_COLUMNS,
    BatchOutcome,
    CommitOutcome,
    Conflict,
    GroupConflict,
    GroupPlaced,
    LivePlans,
    NotActive,
    NotFound,
    Placed,
    PodMismatch,
    ReleaseOutcome,
    ReserveOutcome,
    StoredGroup,
    StoredReservation,
    Unschedulable,
    _digest,
    _mismatch,
    plan_row,
)
from bindery.reference_rm.storeerrors import SchemaTooNew
from bindery.rm.models import (
    BatchOperation,
    ReservationGroupRequest,
    ReservationRequest,
    ReservationState,
)

__all__ = [
    "SCHEMA_VERSION",
    "SESSION_SETTINGS",
    "TCP_SETTINGS",
    "PostgresReservationStore",
    "session_kwargs",
    "tls_warning",
]

#: The schema version this code writes and reads; one migration per version in ``_MIGRATIONS``.
SCHEMA_VERSION = 5
#: Created before any migration, idempotently, by whichever replica comes first.
_BOOTSTRAP = (
    "CREATE TABLE IF NOT EXISTS bindery_schema (id INT PRIMARY KEY, version INT NOT NULL)",
    "INSERT INTO bindery_schema (id, version) VALUES (0, 0) ON CONFLICT (id) DO NOTHING",
    "CREATE TABLE IF NOT EXISTS bindery_schema_history "
    "(version INT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)",
)
_SCHEMA_V1 = (
    "CREATE TABLE IF NOT EXISTS bindery_placement_lock (id INT PRIMARY KEY, placements BIGINT NOT NULL)",
    "INSERT INTO bindery_placement_lock (id, placements) VALUES (0, 0) ON CONFLICT (id) DO NOTHING",
    """CREATE TABLE IF NOT EXISTS reservations (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        idempotency_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        pod_uid TEXT NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        scheduler_name TEXT NOT NULL,
        node TEXT NOT NULL,
        resources TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        updated_at DOUBLE PRECISION NOT NULL,
        group_id TEXT,
        group_index INT,
        cluster_id TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS reservations_key ON reservations (idempotency_key, state)",
    "CREATE INDEX IF NOT EXISTS reservations_state ON reservations (state, expires_at)",
    "CREATE INDEX IF NOT EXISTS reservations_group ON reservations (group_id, group_index)",
    "CREATE INDEX IF NOT EXISTS reservations_cluster ON reservations (cluster_id, seq)",
    "CREATE INDEX IF NOT EXISTS reservations_ended ON reservations (updated_at, seq) "
    "WHERE state NOT IN ('reserved', 'committed')",
    # At most one active reservation per key, whichever replica writes it.
    "CREATE UNIQUE INDEX IF NOT EXISTS reservations_active_key ON reservations (idempotency_key) "
    "WHERE state IN ('reserved', 'committed')",
    """CREATE TABLE IF NOT EXISTS reservation_groups (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        idempotency_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        uid TEXT,
        scheduler_name TEXT NOT NULL,
        topology_value TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS reservation_groups_key ON reservation_groups (idempotency_key)",
    "CREATE TABLE IF NOT EXISTS write_probe (id INT PRIMARY KEY, payload BYTEA NOT NULL)",
)


Conn = psycopg.Connection[tuple[Any, ...]]
log = logging.getLogger(__name__)


#: Session limits each connection sets unless the --db URL sets them (``options=-c ...`` or libpq's
#: keepalive and tcp_user_timeout parameters). Why: without them a black-holed link hung the
#: replica's one writer for hours, and a dead replica's open transaction held the placement-lock
#: row for every other replica. A limit reached is an OperationalError: the call answers 503.
SESSION_SETTINGS = {
    "statement_timeout": "30s",  # one statement of a call, the lock row's wait included
    "lock_timeout": "10s",  # waiting for a row another replica holds (the placement lock)
    "idle_in_transaction_session_timeout": "30s",  # a replica stopped mid-transaction lets go
}
#: libpq's TCP parameters: a peer that stops answering is given up in about 30 s, not the
#: kernel's two hours of keepalive or fifteen minutes of retransmissions.
TCP_SETTINGS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",  # milliseconds
}


def session_kwargs(url: str) -> dict[str, str]:
    """The connect parameters :data:`SESSION_SETTINGS` and :data:`TCP_SETTINGS` add to ``url``:
    none that the URL sets itself (its ``options`` are kept, and the limits it names win)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return {}
    extra = {name: value for name, value in TCP_SETTINGS.items() if name not in params}
    options = str(params.get("options") or "")
    limits = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items() if name not in options)
    if limits:
        extra["options"] = f"{options} {limits}".strip()
    return extra


#: libpq's sslmodes that check the server's certificate; the others encrypt at most.
_VERIFYING = ("verify-ca", "verify-full")


def tls_warning(url: str, environ: Mapping[str, str]) -> str | None:
    """What to tell the operator when the link to PostgreSQL is not verified, or None.

    libpq's default ``sslmode`` is ``prefer``: TLS if the server offers it, without checking its
    certificate, and plain text if not, so anyone on the path can read or change reservations.
    A unix socket is not a network link and gets no warning.
    """
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return None  # psycopg.connect says what is wrong with it
    host = str(params.get("host") or environ.get("PGHOST") or "")
    if not host or host.startswith("/"):
        return None
    mode = str(params.get("sslmode") or environ.get("PGSSLMODE") or "prefer")
    if mode in _VERIFYING:
        return None
    return (
        f"the link to PostgreSQL at {host} is not verified (sslmode={mode}): the server's certificate "
        "is not checked, and with sslmode prefer or allow the link may be plain text; set "
        "sslmode=verify-full&sslrootcert=<CA file> in --db (or PGSSLMODE, PGSSLROOTCERT)"
    )


Usage = dict[str, dict[str, Decimal]]


def _resources(text: str) -> dict[str, Decimal]:
    return {name: parse_quantity(amount) for name, amount in json.loads(text).items()}


def _migrate_v2(conn: Conn) -> None:
    """The capacity in use per node and resource, kept in a table of its own.

    Summing the active rows at every reserve made a reserve cost O(active reservations): 25
    reserves/s at 1,000 where SQLite, whose store keeps the sum in memory, did 242.  Here every
    transaction that changes an active row changes the sum too, so a reserve reads nodes ×
    resources rows.  Filled from the rows already active (the quantities are parsed here, not in
    SQL, which has no notion of ``500m`` or ``1Gi``)."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS node_usage (node TEXT NOT NULL, resource TEXT NOT NULL, "
        "amount NUMERIC NOT NULL, PRIMARY KEY (node, resource))"
    )
    usage: Usage = {}
    for node, resources in conn.execute(
        "SELECT node, resources FROM reservations WHERE state = ANY(%s)", (_ACTIVE,)
    ).fetchall():
        add_usage(usage, str(node), _resources(str(resources)))
    rows = [
        (node, name, amount)
        for node, bucket in sorted(usage.items())
        for name, amount in sorted(bucket.items())
    ]
    if rows:
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO node_usage (node, resource, amount) VALUES (%s, %s, %s)", rows)


#: Version N's migration brings a database of version N-1 to N.  Append; never edit a released one.
_MIGRATIONS: dict[int, tuple[str, ...] | Callable[[Conn], None]] = {
    1: _SCHEMA_V1,
    2: _migrate_v2,
    # Per node, how many transactions changed its active reservations: what lets a replica keep
    # the foreign usage it resolved for a node until another replica changes that node (_foreign).
    3: ("CREATE TABLE IF NOT EXISTS node_changes (node TEXT PRIMARY KEY, changes BIGINT NOT NULL)",),
    # Contract v1.2 revocation: why and when the RM took a reservation back (state revoked).
    4: (
        "ALTER TABLE reservations ADD COLUMN IF NOT EXISTS revoked_reason TEXT",
        "ALTER TABLE reservations ADD COLUMN IF NOT EXISTS revoked_at DOUBLE PRECISION",
    ),
    # Contract v1.2 preemption plans, shared by the replicas: a confirm may reach any of them, and
    # each placement takes out the rooms confirmed plans hold (issue 22). One active plan per
    # preemptor, whichever replica proposes it.
    5: (
        """CREATE TABLE IF NOT EXISTS preemption_plans (
            seq BIGSERIAL PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            pod_uid TEXT NOT NULL,
            node TEXT NOT NULL,
            victims TEXT NOT NULL,
            hold TEXT NOT NULL,
            lease_seconds INT NOT NULL,
            state TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE UNIQUE INDEX IF NOT EXISTS preemption_plans_active_pod ON preemption_plans (pod_uid) "
        "WHERE state IN ('proposed', 'confirmed')",
        "CREATE INDEX IF NOT EXISTS preemption_plans_state ON preemption_plans (state, expires_at)",
    ),
}
_PROBE_BYTES = 64 * 1024
_ACTIVE = [ReservationState.RESERVED.value, ReservationState.COMMITTED.value]
_COLUMNS = (
    "seq, id, idempotency_key, fingerprint, pod_uid, namespace, name, scheduler_name, node, resources, "
    "state, created_at, expires_at, group_id, cluster_id, revoked_reason, revoked_at"
)
_GROUP_ROW = (
    "id, idempotency_key, fingerprint, namespace, name, uid, scheduler_name, topology_value, created_at"
)
#: Two replicas creating the schema at once: the loser of a catalog race tries again.
_SCHEMA_RACES = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DuplicateTable,
    psycopg.errors.DuplicateObject,
)


class PostgresReservationStore:
    """Reservations in PostgreSQL.  Each call is one transaction; several replicas may share the database.

    Like the SQLite store it is called from one thread (the server's writer), on one connection,
    opened again after it broke: a PostgreSQL restart costs the calls in flight, not the replica.
    """

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        clock: Callable[[], float] | None = None,
        retention: float = 3600.0,
        max_released_rows: int = DEFAULT_MAX_RELEASED_ROWS,
        connect_timeout: float = 10.0,
        foreign_retry_seconds: float = FOREIGN_RETRY_SECONDS,
        percentage_of_nodes_to_score: int = 0,
    ) -> None:
        self._clock = clock
        self._retention = retention
        self._max_ended = max_released_rows
        self._foreign_retry = foreign_retry_seconds
        # Feasible-node sampling (placement.nodes_to_find) and where this replica's next search
        # starts (each replica rotates on its own, as each kube-scheduler does).
        self._percentage = check_percentage(percentage_of_nodes_to_score)
        self._next_start = 0
        self._ended_since_gc = 0
        self._next_gc = 0.0
        self._url = url
        if (warning := tls_warning(url, os.environ)) is not None:
            log.warning("%s", warning)
        self._connect_kwargs: dict[str, Any] = {
            "connect_timeout": max(1, int(connect_timeout)),
            **session_kwargs(url),
        }
        if password is not None:
            self._connect_kwargs["password"] = password
        self._conn: Conn | None = None
        # Changes of node_usage in the current transaction, written at its end (see _flush_usage).
        self._deltas: dict[tuple[str, str], Decimal] = {}
        # Nodes whose active reservations the current transaction changed (node_changes, at the end).
        self._touched: set[str] = set()
        # Foreign usage as last resolved per node: (the snapshot entry, node_changes then, result).
        self._foreign_by_node: dict[str, tuple[NodePods, int, Foreign | None]] = {}
        try:
            self._create_schema()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> Conn:
        """The one connection, opened again if the last one broke (a restart, a dropped link).

        Not a pool: calls come from one thread, so one connection is all a replica uses, and a
        pool's background reconnection backs off (1 s, 2 s, 4 s, ...) while the database is down,
        which kept a replica unready for up to a minute after PostgreSQL came back.  Here the next
        call after a failure connects at once, and fails at once while the database is down.
        """
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            self._conn = psycopg.connect(self._url, autocommit=True, **self._connect_kwargs)
        return self._conn

    def _create_schema(self) -> None:
        """Bring the database to :data:`SCHEMA_VERSION`, once, whoever else starts beside us.

        The version row is locked (``FOR UPDATE``) for the migration's transaction: a second
        replica starting at the same moment waits, then finds the version current and does
        nothing.  A row lock rather than an advisory lock: the distributed engines honour
        ``SELECT ... FOR UPDATE``, not all of them advisory locks.  A database a newer RM migrated
        is refused (:class:`SchemaTooNew`): this code would not know its columns' meaning.
        """
        for attempt in range(5):  # two replicas creating the bootstrap tables at once: one retries
            try:
                with self._tx(expire=False) as (conn, _):
                    for statement in _BOOTSTRAP:
                        conn.execute(statement)
                break
            except _SCHEMA_RACES:
                if attempt == 4:
                    raise
                time.sleep(0.1 * (attempt + 1))
        with self._tx(expire=False) as (conn, now):
            row = conn.execute("SELECT version FROM bindery_schema WHERE id = 0 FOR UPDATE").fetchone()
            assert row is not None
            version = int(row[0])
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"the database's reservation schema is version {version}, written by a newer "
                    f"reference RM; this one knows versions up to {SCHEMA_VERSION} and would misread it: "
                    "run the newer version on every replica (a database is never migrated back)"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                migration = _MIGRATIONS[target]
                if callable(migration):
                    migration(conn)
                else:
                    for statement in migration:
                        conn.execute(statement)
                conn.execute(
                    "INSERT INTO bindery_schema_history (version, applied_at) VALUES (%s, %s)", (target, now)
                )
            if version < SCHEMA_VERSION:
                conn.execute("UPDATE bindery_schema SET version = %s WHERE id = 0", (SCHEMA_VERSION,))

    # -- transactions ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self, *, place: bool = False, expire: bool = True) -> Iterator[tuple[Conn, float]]:
        """One transaction and its moment; with ``place``, holding the placement lock row.

        Any error rolls the transaction back; the database's own errors are raised as they are
        (the server answers 503 for those that mean it did not answer: :data:`stores.UNREACHABLE`).
        """
        conn = self._connection()
        self._deltas, self._touched = {}, set()
        try:
            with conn.transaction():
                now = self._now(conn, place=place)
                if expire:
                    self._expire(conn, now)
                yield conn, now
                self._flush_usage(conn)
        except BaseException:
            self._foreign_by_node.clear()  # resolved inside a transaction that did not commit
            raise

    def _count(self, node: str, amounts: Mapping[str, Decimal], sign: int) -> None:
        """Note a change of the capacity in use; written by :meth:`_flush_usage` at the end."""
        self._touched.add(node)
        for name, amount in amounts.items():
            key = (node, name)
            self._deltas[key] = self._deltas.get(key, Decimal(0)) + sign * amount

    def _flush_usage(self, conn: Conn) -> None:
        """Write the transaction's changes of ``node_usage`` last, in (node, resource) order.

        Last: a transaction holding these row locks then waits for nothing but its COMMIT, so
        these locks are never part of a wait cycle with reservation rows.  In one order: two
        transactions changing the same nodes queue instead of deadlocking."""
        rows = [(node, name, amount) for (node, name), amount in sorted(self._deltas.items()) if amount]
        touched = sorted(self._touched)  # even where amounts cancel out: the active set changed
        self._deltas, self._touched = {}, set()
        if rows:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO node_usage (node, resource, amount) VALUES (%s, %s, %s) "
                    "ON CONFLICT (node, resource) DO UPDATE SET amount = node_usage.amount + EXCLUDED.amount",
                    rows,
                )
        if touched:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO node_changes (node, changes) VALUES (%s, 1) "
                    "ON CONFLICT (node) DO UPDATE SET changes = node_changes.changes + 1",
                    [(node,) for node in touched],
                )

    def _now(self, conn: Conn, *, place: bool) -> float:
        """The transaction's moment; with ``place``, first the placement lock (one round trip)."""
        # The database's clock, read once the lock is granted: a lease starts when it is written.
        clock = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
        if place:
            row = conn.execute(
                f"SELECT {clock} FROM bindery_placement_lock WHERE id = 0 FOR UPDATE"
            ).fetchone()
        elif self._clock is None:
            row = conn.execute(f"SELECT {clock}").fetchone()
        else:
            row = None
        if self._clock is not None:
            return self._clock()
        assert row is not None
        return float(row[0])

    def _expire(self, conn: Conn, now: float) -> None:
        """Mark due leases expired (every call: another replica may have made them), and delete
        ended rows past the retention or the cap now and then, as the SQLite store does."""
        expired = conn.execute(
            "UPDATE reservations SET state = %s, updated_at = %s WHERE state = %s AND expires_at <= %s "
            "RETURNING node, resources",
            (ReservationState.EXPIRED.value, now, ReservationState.RESERVED.value, now),
        ).fetchall()
        for node, resources in expired:
            self._count(str(node), _resources(str(resources)), -1)
        self._ended_since_gc += len(expired)
        if now < self._next_gc and self._ended_since_gc <= self._max_ended // 10:
            return
        conn.execute(
            "DELETE FROM reservations WHERE state NOT IN ('reserved', 'committed') AND updated_at < %s",
            (now - self._retention,),
        )
        conn.execute(
            "DELETE FROM reservations WHERE seq IN (SELECT seq FROM reservations "
            "WHERE state NOT IN ('reserved', 'committed') ORDER BY updated_at DESC, seq DESC OFFSET %s)",
            (self._max_ended,),
        )
        conn.execute(
            "DELETE FROM reservation_groups WHERE NOT EXISTS "
            "(SELECT 1 FROM reservations WHERE group_id = reservation_groups.id)"
        )
        self._next_gc = now + min(60.0, self._retention)
        self._ended_since_gc = 0

    def _active_usage(self, conn: Conn) -> Usage:
        """The capacity in use per node as every replica left it, and this transaction's changes."""
        usage: Usage = {}
        for node, name, amount in conn.execute("SELECT node, resource, amount FROM node_usage"):
            usage.setdefault(str(node), {})[str(name)] = Decimal(amount)
        for (node, name), delta in self._deltas.items():
            bucket = usage.setdefault(node, {})
            bucket[name] = bucket.get(name, Decimal(0)) + delta
        return usage

    def _retry_hint(self, conn: Conn, now: float, *, foreign: bool) -> float | None:
        row = conn.execute(
            "SELECT MIN(expires_at) FROM reservations WHERE state = %s", (ReservationState.RESERVED.value,)
        ).fetchone()
        earliest = None if row is None or row[0] is None else float(row[0])
        lease = None if earliest is None else max(1.0, round(earliest - now, 1))
        if not foreign:
            return lease
        return self._foreign_retry if lease is None else min(lease, self._foreign_retry)

    def _foreign(self, conn: Conn, pods: ClusterPods) -> dict[str, Foreign]:
        """The bound pods no active reservation counts, per node; resolved again only for the nodes
        whose pods changed (a new snapshot entry) or whose reservations any replica changed since.

        Resolving every bound pod at every reserve cost 55.6 ms per reserve next to 2,000 bound
        pods (SQLite's store, which caches the same way, 4.0 ms).  A node's result depends on its
        entry and on which reservations its pods name are active on it; every transaction that
        activates or ends a reservation bumps its node's row of ``node_changes``.  The counters
        are read before the reservations: a change committed between the two reads makes the
        next call resolve the node again, never keeps a stale result.
        """
        changes = {
            str(node): int(count) for node, count in conn.execute("SELECT node, changes FROM node_changes")
        }
        resolved = self._foreign_by_node
        stale = {
            node: entry
            for node, entry in pods.nodes.items()
            if (known := resolved.get(node)) is None
            or known[0] is not entry
            or known[1] != changes.get(node, 0)
            or node in self._touched  # this transaction's own changes, not counted yet
        }
        if stale:
            fresh = self._resolve_foreign(conn, ClusterPods(nodes=stale))
            for node, entry in stale.items():
                # A node this transaction changed is resolved again next time: it may roll back.
                seen = -1 if node in self._touched else changes.get(node, 0)
                resolved[node] = (entry, seen, fresh.get(node))
        if len(resolved) > len(pods.nodes):  # nodes that lost all their pods
            for node in [n for n in resolved if n not in pods.nodes]:
                del resolved[node]
        return {node: foreign for node in pods.nodes if (foreign := resolved[node][2]) is not None}

    def _resolve_foreign(self, conn: Conn, pods: ClusterPods) -> dict[str, Foreign]:
        """``pods`` resolved against the reservations their pods name, as they are now."""
        claimed = [pod.reservation_id for entry in pods.nodes.values() for pod in entry.claims]
        claimed_ids = [claim for claim in claimed if claim is not None]
        rows = (
            conn.execute(
                "SELECT id, pod_uid, node, resources FROM reservations "
                "WHERE id = ANY(%s) AND state = ANY(%s)",
                (claimed_ids, _ACTIVE),
            ).fetchall()
            if claimed_ids
            else []
        )
        owners = {str(id_): (str(uid), str(node)) for id_, uid, node, _ in rows}
        # What each holds: a pod resized in place counts what it grew past it (as store.py does).
        held = {str(id_): _resources(str(resources)) for id_, _, _, resources in rows}
        return foreign_usage(pods, owners=owners, held=held)

    def _get(self, conn: Conn, reservation_id: str, *, lock: bool = False) -> StoredReservation | None:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM reservations WHERE id = %s{' FOR UPDATE' if lock else ''}",
            (reservation_id,),
        ).fetchone()
        return None if row is None else StoredReservation.from_row(row)

    # -- single reservations --------------------------------------------------------------------

    def get(self, reservation_id: str) -> StoredReservation | None:
        with self._tx() as (conn, _):
            return self._get(conn, reservation_id)

    def usage(self) -> Usage:
        """The capacity in use per node (a zero where all that used it ended, as in the SQLite
        store's memory)."""
        with self._tx() as (conn, _):
            return self._active_usage(conn)

    def check_writable(self) -> None:
        """Raise the database's error unless the cleanup and a write of a request's size commit now."""
        self._next_gc = 0.0
        with self._tx() as (conn, _):
            conn.execute(
                "INSERT INTO write_probe (id, payload) VALUES (0, %s) "
                "ON CONFLICT (id) DO UPDATE SET payload = EXCLUDED.payload",
                (bytes(_PROBE_BYTES),),
            )
            conn.execute("DELETE FROM write_probe")

    def reserve(
        self,
        request: ReservationRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> ReserveOutcome:
        """Place under the placement lock, next to the rooms confirmed plans hold for other pods as
        every replica left them; the preemptor's own reserve ends its plan in the same transaction."""
        with self._tx(place=True) as (conn, now):
            live = self._live_plans(conn, now)
            uid = request.pod.uid
            outcome = self._reserve(
                conn,
                now,
                self._active_usage(conn),
                request,
                nodes=live.nodes(nodes, except_pods=frozenset({uid})),
                policy=policy,
                pods=pods,
            )
            if isinstance(outcome, Placed) and live.of(uid):
                self._use_plan(conn, now, uid)
            return outcome

    def _reserve(
        self,
        conn: Conn,
        now: float,
        usage: Usage,
        request: ReservationRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None,
    ) -> ReserveOutcome:
        """Place under the placement lock; ``usage`` is the transaction's running total (updated)."""
        fingerprint = _digest(request.fingerprint())
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM reservations WHERE idempotency_key = %s AND state = ANY(%s)",
            (request.idempotency_key, _ACTIVE),
        ).fetchone()
        if row is not None:
            existing = StoredReservation.from_row(row)
            return (
                Placed(existing, created=False) if existing.fingerprint == fingerprint else Conflict(existing)
            )
        requests = request.requested()
        foreign = None if pods is None else self._foreign(conn, pods)
        decision = choose_node(
            nodes=placeable(nodes, request),
            requests=requests,
            usage_by_node=usage,
            node_selector=request.placement.node_selector,
            affinity_terms=request.placement.affinity_terms(),
            tolerations=request.placement.toleration_dicts(),
            policy=policy,
            foreign=foreign,
            preferences=request.placement.preference_dicts(),
            percentage_of_nodes_to_score=self._percentage,
            start=self._next_start,
        )
        self._next_start = decision.next_start
        if decision.node is None:
            return Unschedulable(
                decision.reason, retry_after=self._retry_hint(conn, now, foreign=bool(foreign))
            )
        node = next(n for n in nodes if n.name == decision.node)
        amounts = effective_usage(requests, node)
        values = (
            f"rsv-{uuid.uuid4().hex}",
            request.idempotency_key,
            fingerprint,
            request.pod.uid,
            request.pod.namespace,
            request.pod.name,
            request.pod.scheduler_name,
            node.name,
            json.dumps({name: format_quantity(amount) for name, amount in sorted(amounts.items())}),
            ReservationState.RESERVED.value,
            now,
            now + request.ttl_seconds,
            now,
            request.cluster_id,
        )
        inserted = conn.execute(
            "INSERT INTO reservations (id, idempotency_key, fingerprint, pod_uid, namespace, name, "
            "scheduler_name, node, resources, state, created_at, expires_at, updated_at, cluster_id) "
            f"VALUES ({', '.join(['%s'] * len(values))}) RETURNING {_COLUMNS}",
            values,
        ).fetchone()
        assert inserted is not None
        add_usage(usage, node.name, amounts)
        self._count(node.name, amounts, +1)
        return Placed(StoredReservation.from_row(inserted), created=True)

    def commit(self, reservation_id: str, *, pod_uid: str | None = None) -> CommitOutcome:
        with self._tx() as (conn, now):
            return self._commit(conn, now, reservation_id, pod_uid)

    def _commit(self, conn: Conn, now: float, reservation_id: str, pod_uid: str | None) -> CommitOutcome:
        current = self._get(conn, reservation_id, lock=True)
        if current is None:
            return NotFound()
        if (mismatch := _mismatch(current, pod_uid)) is not None:
            return mismatch
        if current.state is ReservationState.COMMITTED:
            return current
        if current.state is not ReservationState.RESERVED:
            return NotActive(current)
        row = conn.execute(
            f"UPDATE reservations SET state = %s, expires_at = NULL, updated_at = %s WHERE id = %s "
            f"RETURNING {_COLUMNS}",
            (ReservationState.COMMITTED.value, now, reservation_id),
        ).fetchone()
        assert row is not None
        return StoredReservation.from_row(row)

    def release(self, reservation_id: str, *, pod_uid: str | None = None) -> ReleaseOutcome:
        with self._tx() as (conn, now):
            return self._release(conn, now, None, reservation_id, pod_uid)

    def _release(
        self, conn: Conn, now: float, usage: Usage | None, reservation_id: str, pod_uid: str | None
    ) -> ReleaseOutcome:
        current = self._get(conn, reservation_id, lock=True)
        if current is not None and current.state is ReservationState.REVOKED:
            if pod_uid is None or pod_uid == current.pod_uid:  # acknowledged: no longer listed as revoked
                conn.execute(
                    "UPDATE reservations SET state = %s, updated_at = %s WHERE id = %s",
                    (ReservationState.RELEASED.value, now, reservation_id),
                )
            return None
        if current is None or not current.state.active:
            return None
        if (mismatch := _mismatch(current, pod_uid)) is not None:
            return mismatch
        conn.execute(
            "UPDATE reservations SET state = %s, updated_at = %s WHERE id = %s",
            (ReservationState.RELEASED.value, now, reservation_id),
        )
        if usage is not None:  # inside a batch: later reserves of it may use what this freed
            subtract_usage(usage, current.node, current.usage())
        self._count(current.node, current.usage(), -1)
        self._ended_since_gc += 1
        return current

    def revoke(self, reservation_id: str, *, reason: str) -> StoredReservation | NotFound | NotActive:
        """As :meth:`ReservationStore.revoke`: the capacity returns at once, the row reads revoked."""
        with self._tx() as (conn, now):
            current = self._get(conn, reservation_id, lock=True)
            if current is None:
                return NotFound()
            if current.state is ReservationState.REVOKED:
                return current
            if not current.state.active:
                return NotActive(current)
            row = conn.execute(
                "UPDATE reservations SET state = %s, expires_at = NULL, updated_at = %s, "
                f"revoked_reason = %s, revoked_at = %s WHERE id = %s RETURNING {_COLUMNS}",
                (ReservationState.REVOKED.value, now, reason, now, reservation_id),
            ).fetchone()
            assert row is not None
            self._count(current.node, current.usage(), -1)
            self._ended_since_gc += 1
            return StoredReservation.from_row(row)

    def renew(
        self, reservation_id: str, *, pod_uid: str, ttl_seconds: int
    ) -> StoredReservation | NotFound | NotActive | PodMismatch:
        with self._tx() as (conn, now):
            current = self._get(conn, reservation_id, lock=True)
            if current is None:
                return NotFound()
            if (mismatch := _mismatch(current, pod_uid)) is not None:
                return mismatch
            if current.state is ReservationState.COMMITTED:
                return current
            if current.state is not ReservationState.RESERVED:
                return NotActive(current)
            row = conn.execute(
                f"UPDATE reservations SET expires_at = %s, updated_at = %s WHERE id = %s "
                f"RETURNING {_COLUMNS}",
                (now + ttl_seconds, now, reservation_id),
            ).fetchone()
            assert row is not None
            return StoredReservation.from_row(row)

    def batch(
        self,
        operations: Sequence[BatchOperation],
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> list[BatchOutcome]:
        """Every operation in order in ONE transaction under the placement lock, each answering what
        its single call would; an error of the database undoes all of them (nothing is in memory)."""
        with self._tx(place=True) as (conn, now):
            usage = self._active_usage(conn)
            live = self._live_plans(conn, now)
            # As a single reserve would: each reserve sees its own held room only, never that of
            # another preemptor in the batch; a plan this batch ended holds no more.
            ended: set[str] = set()
            outcomes: list[BatchOutcome] = []
            for operation in operations:
                if operation.reserve is not None:
                    uid = operation.reserve.pod.uid
                    held = live.nodes(nodes, except_pods=frozenset({uid, *ended}))
                    placed = self._reserve(
                        conn, now, usage, operation.reserve, nodes=held, policy=policy, pods=pods
                    )
                    if isinstance(placed, Placed) and live.of(uid):
                        self._use_plan(conn, now, uid)
                        ended.add(uid)
                    outcomes.append(placed)
                elif operation.commit is not None:
                    ref = operation.commit
                    outcomes.append(self._commit(conn, now, ref.reservation_id, ref.pod_uid))
                else:
                    assert operation.release is not None  # BatchOperation names exactly one
                    ref = operation.release
                    outcomes.append(self._release(conn, now, usage, ref.reservation_id, ref.pod_uid))
            return outcomes

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
    ) -> tuple[list[StoredReservation], int | None]:
        """One page in creation order, and the sequence number to continue after (None at the end)."""
        clauses: list[str] = ["seq > %s"]
        args: list[object] = [after]
        if isinstance(state, tuple):
            clauses.append("state = ANY(%s)")
            args.append([s.value for s in state])
            state = None
        filters = (
            ("scheduler_name", scheduler_name),
            ("state", None if state is None else ReservationState(state).value),
            ("pod_uid", pod_uid),
            ("group_id", group_id),
            ("cluster_id", cluster_id),
        )
        for column, value in filters:
            if value is not None:
                clauses.append(f"{column} = %s")
                args.append(value)
        with self._tx() as (conn, _):
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM reservations WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT %s",
                (*args, limit + 1),
            ).fetchall()
        items = [StoredReservation.from_row(row) for row in rows[:limit]]
        return items, (items[-1].seq if len(rows) > limit else None)

    # -- reservation groups (contract v1.1) -----------------------------------------------------

    def _group(self, conn: Conn, row: Sequence[object]) -> StoredGroup:
        id_, key, fingerprint, namespace, name, uid, scheduler, topology, created = row
        members = conn.execute(
            f"SELECT {_COLUMNS} FROM reservations WHERE group_id = %s ORDER BY group_index", (id_,)
        ).fetchall()
        return StoredGroup(
            id=str(id_),
            idempotency_key=str(key),
            fingerprint=str(fingerprint),
            namespace=str(namespace),
            name=str(name),
            uid=None if uid is None else str(uid),
            scheduler_name=str(scheduler),
            topology_value=json.loads(str(topology)),
            created_at=float(str(created)),
            members=tuple(StoredReservation.from_row(member) for member in members),
        )

    def _get_group(self, conn: Conn, group_id: str) -> StoredGroup | None:
        row = conn.execute(
            f"SELECT {_GROUP_ROW} FROM reservation_groups WHERE id = %s", (group_id,)
        ).fetchone()
        return None if row is None else self._group(conn, row)

    def get_group(self, group_id: str) -> StoredGroup | None:
        with self._tx() as (conn, _):
            return self._get_group(conn, group_id)

    def reserve_group(
        self,
        request: ReservationGroupRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> GroupPlaced | GroupConflict | Unschedulable:
        """Every member or none, in one transaction under the placement lock."""
        with self._tx(place=True) as (conn, now):
            fingerprint = _digest(request.fingerprint())
            row = conn.execute(
                f"SELECT {_GROUP_ROW} FROM reservation_groups g WHERE idempotency_key = %s AND EXISTS "
                "(SELECT 1 FROM reservations r WHERE r.group_id = g.id AND r.state = ANY(%s)) "
                "ORDER BY seq DESC LIMIT 1",
                (request.idempotency_key, _ACTIVE),
            ).fetchone()
            if row is not None:
                existing = self._group(conn, row)
                if existing.fingerprint == fingerprint:
                    return GroupPlaced(existing, created=False)
                return GroupConflict(existing)
            asks = [
                MemberAsk(
                    label=f"{member.pod.namespace}/{member.pod.name}",
                    requests=member.requested(),
                    node_selector=member.placement.node_selector,
                    affinity_terms=member.placement.affinity_terms(),
                    tolerations=member.placement.toleration_dicts(),
                    preferences=member.placement.preference_dicts(),
                )
                for member in request.members
            ]
            foreign = None if pods is None else self._foreign(conn, pods)
            # The rooms held for other preemptors are out of reach; the group's own plan's are its own.
            own = group_plan_key(request.group.namespace, request.group.name)
            live = self._live_plans(conn, now)
            nodes = live.nodes(nodes, except_pods=frozenset({own}))
            decision = place_group(
                group=f"{request.group.namespace}/{request.group.name}",
                members=asks,
                topology_keys=[constraint.key for constraint in request.topology],
                nodes=nodes,
                usage_by_node=self._active_usage(conn),
                policy=policy,
                foreign=foreign,
            )
            if decision.nodes is None:
                return Unschedulable(
                    decision.reason, retry_after=self._retry_hint(conn, now, foreign=bool(foreign))
                )
            by_name = {node.name: node for node in nodes}
            usages = [
                effective_usage(ask.requests, by_name[node])
                for ask, node in zip(asks, decision.nodes, strict=True)
            ]
            group_id = f"grp-{uuid.uuid4().hex}"
            conn.execute(
                "INSERT INTO reservation_groups (id, idempotency_key, fingerprint, namespace, name, uid, "
                "scheduler_name, topology_value, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    group_id,
                    request.idempotency_key,
                    fingerprint,
                    request.group.namespace,
                    request.group.name,
                    request.group.uid,
                    request.group.scheduler_name,
                    json.dumps(dict(decision.topology_value)),
                    now,
                ),
            )
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO reservations (id, idempotency_key, fingerprint, pod_uid, namespace, name, "
                    "scheduler_name, node, resources, state, created_at, expires_at, updated_at, group_id, "
                    "group_index, cluster_id) VALUES "
                    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [
                        (
                            f"rsv-{uuid.uuid4().hex}",
                            f"{group_id}/{index}",  # the group owns the caller's key (see store.py)
                            group_id,
                            member.pod.uid,
                            member.pod.namespace,
                            member.pod.name,
                            member.pod.scheduler_name,
                            node,
                            json.dumps(
                                {name: format_quantity(amount) for name, amount in sorted(usage.items())}
                            ),
                            ReservationState.RESERVED.value,
                            now,
                            now + request.ttl_seconds,
                            now,
                            group_id,
                            index,
                            request.cluster_id,
                        )
                        for index, (member, node, usage) in enumerate(
                            zip(request.members, decision.nodes, usages, strict=True)
                        )
                    ],
                )
            if live.of(own):
                self._use_plan(conn, now, own)  # the group's plan held this room: the group's now
            for node, usage in zip(decision.nodes, usages, strict=True):
                self._count(node, usage, +1)
            group = self._get_group(conn, group_id)
            assert group is not None
            return GroupPlaced(group, created=True)

    def release_group(self, group_id: str) -> StoredGroup | None:
        """Release every member still ``reserved`` (one statement); committed members stay."""
        with self._tx() as (conn, now):
            if self._get_group(conn, group_id) is None:
                return None
            released = conn.execute(
                "UPDATE reservations SET state = %s, updated_at = %s WHERE group_id = %s AND state = %s "
                "RETURNING node, resources",
                (ReservationState.RELEASED.value, now, group_id, ReservationState.RESERVED.value),
            ).fetchall()
            for node, resources in released:
                self._count(str(node), _resources(str(resources)), -1)
            self._ended_since_gc += len(released)
            return self._get_group(conn, group_id)

    def renew_group(self, group_id: str, *, ttl_seconds: int) -> StoredGroup | NotFound | NotActive:
        with self._tx() as (conn, now):
            current = self._get_group(conn, group_id)
            if current is None:
                return NotFound()
            if not current.active:
                return NotActive(current.members[0])
            conn.execute(
                "UPDATE reservations SET expires_at = %s, updated_at = %s WHERE group_id = %s AND state = %s",
                (now + ttl_seconds, now, group_id, ReservationState.RESERVED.value),
            )
            renewed = self._get_group(conn, group_id)
            assert renewed is not None
            return renewed

    # -- preemption plans (contract v1.2) -------------------------------------------------------
    #
    # Shared by the replicas. A plan is proposed under the placement lock (so two replicas never
    # name one victim twice nor both miss a hold), read by every placement under that lock, and
    # confirmed or cancelled under its row lock alone. Leases are judged by the database's clock.

    def _live_plans(self, conn: Conn, now: float) -> LivePlans:
        rows = conn.execute(
            "SELECT pod_uid, node, hold, state FROM preemption_plans "
            "WHERE state = ANY(%s) AND expires_at > %s",
            (list(ACTIVE_PLAN_STATES), now),
        ).fetchall()
        return LivePlans(
            rows=[(str(uid), str(node), str(hold), str(state)) for uid, node, hold, state in rows]
        )

    def _use_plan(self, conn: Conn, now: float, pod_uid: str) -> None:
        conn.execute(
            "UPDATE preemption_plans SET state = 'used', updated_at = %s "
            "WHERE pod_uid = %s AND state = ANY(%s) AND expires_at > %s",
            (now, pod_uid, list(ACTIVE_PLAN_STATES), now),
        )

    def _plan_now(self, conn: Conn, plan_id: str, now: float, *, lock: bool = False) -> Plan | None:
        row = conn.execute(
            f"SELECT {PLAN_COLUMNS} FROM preemption_plans WHERE id = %s{' FOR UPDATE' if lock else ''}",
            (plan_id,),
        ).fetchone()
        return None if row is None else as_of(plan_row(row), now)

    def get_plan(self, plan_id: str) -> Plan | None:
        with self._tx(expire=False) as (conn, now):
            return self._plan_now(conn, plan_id, now)

    def _active_plan(self, conn: Conn, now: float, pod_uid: str) -> Plan | None:
        row = conn.execute(
            f"SELECT {PLAN_COLUMNS} FROM preemption_plans "
            "WHERE pod_uid = %s AND state = ANY(%s) AND expires_at > %s",
            (pod_uid, list(ACTIVE_PLAN_STATES), now),
        ).fetchone()
        return None if row is None else plan_row(row)

    def active_plan(self, pod_uid: str) -> Plan | None:
        with self._tx(expire=False) as (conn, now):
            return self._active_plan(conn, now, pod_uid)

    def propose_plan(self, pod_uid: str, choose: Chooser, *, lease_seconds: int) -> Plan | None:
        """As :meth:`ReservationStore.propose_plan`, under the placement lock."""
        with self._tx(place=True) as (conn, now):
            conn.execute(
                "UPDATE preemption_plans SET state = 'expired', updated_at = %s "
                "WHERE state = ANY(%s) AND expires_at <= %s",
                (now, list(ACTIVE_PLAN_STATES), now),
            )
            conn.execute(
                "DELETE FROM preemption_plans "
                "WHERE NOT (state = ANY(%s)) "
                # CockroachDB adds no INT to a DOUBLE PRECISION (inexact): the cast says which.
                "AND expires_at + CAST(lease_seconds AS DOUBLE PRECISION) <= %s",
                (list(ACTIVE_PLAN_STATES), now),
            )
            existing = self._active_plan(conn, now, pod_uid)
            if existing is not None:
                return existing
            live = self._live_plans(conn, now)
            used = self._active_usage(conn)
            for node, held in live.held(except_pods=frozenset({pod_uid})).items():
                add_usage(used, node, held)
            spoken_for = frozenset(
                uid
                for (victims,) in conn.execute(
                    "SELECT victims FROM preemption_plans WHERE state = ANY(%s) AND expires_at > %s",
                    (list(ACTIVE_PLAN_STATES), now),
                ).fetchall()
                for uid in victim_uids(str(victims))
            )
            proposal = choose(used, spoken_for)
            if proposal is None:
                return None
            row = conn.execute(
                f"INSERT INTO preemption_plans ({NEW_PLAN_COLUMNS}) VALUES ({', '.join(['%s'] * 10)}) "
                f"RETURNING {PLAN_COLUMNS}",
                new_plan_row(pod_uid, proposal, lease_seconds=lease_seconds, now=now),
            ).fetchone()
            assert row is not None
            return plan_row(row)

    def confirm_plan(self, plan_id: str) -> Plan | None:
        """As :meth:`ReservationStore.confirm_plan`, under the plan's row lock: a concurrent reserve
        of the preemptor (which ends the plan) and this confirm are ordered, never both applied."""
        with self._tx(expire=False) as (conn, now):
            plan = self._plan_now(conn, plan_id, now, lock=True)
            if plan is None or not plan.active:
                return plan
            row = conn.execute(
                "UPDATE preemption_plans SET state = 'confirmed', expires_at = %s, updated_at = %s "
                f"WHERE id = %s RETURNING {PLAN_COLUMNS}",
                (now + plan.lease_seconds, now, plan_id),
            ).fetchone()
            assert row is not None
            return plan_row(row)

    def cancel_plan(self, plan_id: str) -> Plan | None:
        with self._tx(expire=False) as (conn, now):
            plan = self._plan_now(conn, plan_id, now, lock=True)
            if plan is None or not plan.active:
                return plan
            row = conn.execute(
                "UPDATE preemption_plans SET state = 'cancelled', updated_at = %s WHERE id = %s "
                f"RETURNING {PLAN_COLUMNS}",
                (now, plan_id),
            ).fetchone()
            assert row is not None
            return plan_row(row)


def read_password_file(path: pathlib.Path) -> str:
    """The password alone in a file (a mounted Secret): its first line, without the line end."""
    text = path.read_text()
    return text.splitlines()[0] if text else ""
