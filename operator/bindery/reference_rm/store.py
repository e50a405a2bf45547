"""Durable reservation state of the reference RM, in SQLite.

Why this shape: the one invariant that matters is "never overcommit a node", under concurrent
reserve calls and across restarts.  So every operation is a single function run on ONE thread
(the server funnels calls through a single-worker executor), each one a SQLite transaction with
``synchronous=FULL``: the placement decision and the insert happen with no other write in between,
and a reservation the caller was told about is on disk.  The capacity in use is also kept in memory
for speed; it is rebuilt from the table at start-up and only changed after a transaction commits.

Since contract v1.1 a commit, release or renew may name the pod it acts for; a reservation of
another pod is then refused (``PodMismatch``) before anything changes, and renew moves a reserved
lease's end.

Since contract v1.1 a reservation group places every member or none in ONE transaction: the group
row and one ordinary reservation per member (``group_id`` set, their order in ``group_index``) are
written together or not at all, and only then counted in memory.  The members share the group's
idempotency key (deduplicated on the group) and its lease (one ``expires_at``); afterwards they are
ordinary reservations, committed and released one by one, or released together while reserved.

Since contract v1.1 a batch (``POST /v1/batch``) carries many reserve, commit and release
operations out in order in ONE transaction: one fsync for the lot, each operation seeing the effects
of those before it (two reserves of one batch never share capacity).  The memory kept for speed is
changed as each operation goes, as for a single call, and rebuilt from the table if the transaction
rolls back, so it never counts what is not on disk.

Since contract v1.2 preemption plans are rows of ``preemption_plans`` (see
:mod:`bindery.reference_rm.preemption`): every placement takes the rooms confirmed plans hold out
of the nodes it places on, reading them in the same transaction, and the preemptor's own reserve
ends its plan in the transaction that creates its reservation.

Expiry is lazy: every operation first marks reservations whose lease ran out as ``expired``, so the
answer never depends on a background timer having run.  Released and expired rows are kept for
``retention`` seconds so late releases, lists and commits get a precise answer, then deleted.

The storage a tenant can make the RM hold is bounded (issue 20, scenario 6: a tenant filled the
disk).  A row keeps a digest of the canonical request, not its text (up to 64 KiB of labels,
tolerations and affinity): the text was only ever compared, to tell a replay from a conflict, and
the contract returns the reservation, never the request.  At most ``max_released_rows`` released
and expired rows are kept, the most recently ended ones, whatever the retention; the sweep that
deletes them runs every minute and also as soon as a tenth of the cap was ended since the last one.
:meth:`ReservationStore.check_writable` is the probe ``/readyz`` runs while writes fail.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import pathlib
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from bindery.quantity import format_quantity, parse_quantity
from bindery.reference_rm.accounting import ClusterPods, Foreign, NodePods, foreign_usage
from bindery.reference_rm.devices import (
    Allocated,
    AllocationError,
    DeviceAllocator,
    DeviceInUse,
    claim_answer,
)
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
    held_by_node,
    new_plan_row,
    plan_from_row,
    victim_uids,
    without_held,
)
from bindery.reference_rm.writerlock import WriterLock
from bindery.rm.models import (
    BatchOperation,
    ClaimAllocation,
    Reservation,
    ReservationGroup,
    ReservationGroupRequest,
    ReservationRequest,
    ReservationState,
)

__all__ = [
    "DEFAULT_MAX_RELEASED_ROWS",
    "PLAN_COLUMNS",
    "BatchOutcome",
    "CommitOutcome",
    "Conflict",
    "GroupConflict",
    "GroupPlaced",
    "LivePlans",
    "NotActive",
    "NotFound",
    "Placed",
    "PodMismatch",
    "ReleaseOutcome",
    "ReservationStore",
    "ReserveOutcome",
    "StoredGroup",
    "StoredReservation",
    "Unschedulable",
    "plan_row",
    "revocation_shown",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reservations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
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
    created_at REAL NOT NULL,
    expires_at REAL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS reservations_key ON reservations (idempotency_key, state);
CREATE INDEX IF NOT EXISTS reservations_state ON reservations (state, expires_at);
CREATE TABLE IF NOT EXISTS reservation_groups (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT,
    scheduler_name TEXT NOT NULL,
    topology_value TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS reservation_groups_key ON reservation_groups (idempotency_key);
CREATE TABLE IF NOT EXISTS deactivations (id INTEGER PRIMARY KEY CHECK (id = 0), count INTEGER NOT NULL);
INSERT OR IGNORE INTO deactivations (id, count) VALUES (0, 0);
CREATE TRIGGER IF NOT EXISTS reservations_deactivated AFTER UPDATE OF state ON reservations
    WHEN OLD.state IN ('reserved', 'committed') AND NEW.state NOT IN ('reserved', 'committed')
    BEGIN UPDATE deactivations SET count = count + 1 WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS reservations_deleted_active AFTER DELETE ON reservations
    WHEN OLD.state IN ('reserved', 'committed')
    BEGIN UPDATE deactivations SET count = count + 1 WHERE id = 0; END;
CREATE TABLE IF NOT EXISTS preemption_plans (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    pod_uid TEXT NOT NULL,
    node TEXT NOT NULL,
    victims TEXT NOT NULL,
    hold TEXT NOT NULL,
    lease_seconds INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS preemption_plans_active_pod ON preemption_plans (pod_uid)
    WHERE state IN ('proposed', 'confirmed');
CREATE INDEX IF NOT EXISTS preemption_plans_state ON preemption_plans (state, expires_at);
"""
#: Columns added by contract v1.1 groups and v1.2 cluster ids; a database of an older RM gains them
#: when it is opened (its rows are in no group and of no cluster).
_GROUP_COLUMNS = {"group_id": "TEXT", "group_index": "INTEGER"}
#: Bounded storage: the ended rows in the order the cap deletes them (partial: active rows are not
#: in it), and a table the writability probe writes to.  Added by :meth:`ReservationStore._bound`.
_BOUNDED_SCHEMA = """
CREATE INDEX IF NOT EXISTS reservations_ended ON reservations (updated_at, seq)
    WHERE state NOT IN ('reserved', 'committed');
CREATE TABLE IF NOT EXISTS write_probe (id INTEGER PRIMARY KEY CHECK (id = 0), payload BLOB NOT NULL);
"""
#: What the probe writes: as much as the largest request body, so a pass means a reserve fits.
_PROBE_BYTES = 64 * 1024
#: The longest retry hint of an unschedulable answer while pods this RM did not place hold room:
#: they can end without a release anyone hears of (see :meth:`ReservationStore._retry_hint`).
FOREIGN_RETRY_SECONDS = 30.0
#: The default cap of released and expired rows (a row is a few hundred bytes).
DEFAULT_MAX_RELEASED_ROWS = 100_000
_DIGEST = "sha256:"
_CLUSTER_COLUMNS = {"cluster_id": "TEXT"}
#: v1.2 revocation: why and when the RM took a reservation back (state ``revoked``).
_REVOKED_COLUMNS = {"revoked_reason": "TEXT", "revoked_at": "REAL"}
#: v1.3 devices: the contract's ``Reservation.devices`` (JSON), which also says which devices an
#: active reservation holds: releasing, expiring or revoking it frees them with no other write.
_DEVICE_COLUMNS = {"devices": "TEXT"}
_ACTIVE = (ReservationState.RESERVED.value, ReservationState.COMMITTED.value)
_COLUMNS = (
    "seq, id, idempotency_key, fingerprint, pod_uid, namespace, name, scheduler_name, node, resources, "
    "state, created_at, expires_at, group_id, cluster_id, revoked_reason, revoked_at, devices"
)
_GROUP_ROW = (
    "id, idempotency_key, fingerprint, namespace, name, uid, scheduler_name, topology_value, created_at"
)
#: A preemption plan's row, in :func:`plan_row`'s order.
PLAN_COLUMNS = "id, pod_uid, node, victims, hold, lease_seconds, state, expires_at"


@dataclass(frozen=True)
class StoredReservation:
    seq: int
    id: str
    idempotency_key: str
    fingerprint: str
    pod_uid: str
    namespace: str
    name: str
    scheduler_name: str
    node: str
    resources: Mapping[str, str]
    state: ReservationState
    created_at: float
    expires_at: float | None
    group_id: str | None = None
    cluster_id: str | None = None  # v1.2: the cluster the reservation was made for
    revoked_reason: str | None = None  # v1.2 revocation: why the RM took it back
    revoked_at: float | None = None
    #: v1.3: the devices chosen, per claim, as the contract answers them (None: none asked)
    devices: tuple[Mapping[str, Any], ...] | None = None

    @classmethod
    def from_row(cls, row: Sequence[object]) -> StoredReservation:
        """A row of ``_COLUMNS``; a store without the ``devices`` column passes one item fewer."""
        devices = row[17] if len(row) > 17 else None
        row = row[:17]
        (
            seq,
            id_,
            key,
            fingerprint,
            uid,
            namespace,
            name,
            scheduler,
            node,
            resources,
            state,
            created,
            expires,
            group,
            cluster,
            revoked_reason,
            revoked_at,
        ) = row
        return cls(
            seq=int(str(seq)),
            id=str(id_),
            idempotency_key=str(key),
            fingerprint=str(fingerprint),
            pod_uid=str(uid),
            namespace=str(namespace),
            name=str(name),
            scheduler_name=str(scheduler),
            node=str(node),
            resources=json.loads(str(resources)),
            state=ReservationState(str(state)),
            created_at=float(str(created)),
            expires_at=None if expires is None else float(str(expires)),
            group_id=None if group is None else str(group),
            cluster_id=None if cluster is None else str(cluster),
            revoked_reason=None if revoked_reason is None else str(revoked_reason),
            revoked_at=None if revoked_at is None else float(str(revoked_at)),
            devices=None if devices is None else tuple(json.loads(str(devices))),
        )

    def usage(self) -> dict[str, Decimal]:
        return {name: parse_quantity(amount) for name, amount in self.resources.items()}

    def to_model(self) -> Reservation:
        """The contract's view; a revoked reservation reads ``released`` (without its reason) unless
        the request being answered asked for revocations (:data:`revocation_shown`)."""
        state, shown = self.state, revocation_shown.get()
        if self.revoked_at is not None and not shown:
            state = ReservationState.RELEASED  # acknowledged or not, a v1.1 caller sees it gone
        return Reservation(
            id=self.id,
            node=self.node,
            state=state,
            expires_at=_timestamp(self.expires_at) if self.state is ReservationState.RESERVED else None,
            pod_uid=self.pod_uid,
            scheduler_name=self.scheduler_name,
            namespace=self.namespace,
            name=self.name,
            resources=dict(self.resources),
            created_at=_timestamp(self.created_at),
            group_id=self.group_id,
            cluster_id=self.cluster_id,
            revoked_reason=self.revoked_reason if shown else None,
            devices=None
            if self.devices is None
            else [ClaimAllocation.model_validate(d) for d in self.devices],
            revoked_at=_timestamp(self.revoked_at) if shown else None,
        )


#: Whether the answer being built may show state ``revoked`` (contract v1.2 feature ``revocation``):
#: set per request by the server from the ``Bindery-Features`` header, so every path that returns a
#: reservation (GET, list, commit, renew, groups, batches) hides it alike from a v1.1 caller.
revocation_shown: contextvars.ContextVar[bool] = contextvars.ContextVar("revocation_shown", default=False)


@dataclass(frozen=True)
class StoredGroup:
    """A reservation group and its members (in request order), as stored."""

    id: str
    idempotency_key: str
    fingerprint: str
    namespace: str
    name: str
    uid: str | None
    scheduler_name: str
    topology_value: Mapping[str, str]
    created_at: float
    members: tuple[StoredReservation, ...]

    @property
    def active(self) -> bool:
        """Whether any member still holds capacity: only then does the group own its key."""
        return any(member.state.active for member in self.members)

    def to_model(self) -> ReservationGroup:
        leases = [m.expires_at for m in self.members if m.state is ReservationState.RESERVED and m.expires_at]
        return ReservationGroup(
            id=self.id,
            members=[member.to_model() for member in self.members],
            expires_at=_timestamp(min(leases)) if leases else None,
            topology_value=dict(self.topology_value),
        )


def _held(resources: str) -> dict[str, Decimal]:
    """A reservation row's ``resources`` (JSON of canonical quantities) as numbers."""
    return {str(name): parse_quantity(value) for name, value in json.loads(resources).items()}


def _digest(fingerprint: str) -> str:
    """What a row keeps of a request's canonical form: equal digests mean the same request."""
    return _DIGEST + hashlib.sha256(fingerprint.encode()).hexdigest()


def _timestamp(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


@dataclass(frozen=True)
class Placed:
    reservation: StoredReservation
    created: bool  # False: an idempotent replay of an existing reservation


@dataclass(frozen=True)
class Conflict:
    existing: StoredReservation


@dataclass(frozen=True)
class GroupPlaced:
    group: StoredGroup
    created: bool  # False: an idempotent replay of an existing group


@dataclass(frozen=True)
class GroupConflict:
    existing: StoredGroup


@dataclass(frozen=True)
class Unschedulable:
    reason: str
    retry_after: float | None = None  # when the next uncommitted lease expires, if any


@dataclass(frozen=True)
class NotFound:
    pass


@dataclass(frozen=True)
class NotActive:
    reservation: StoredReservation


@dataclass(frozen=True)
class PodMismatch:
    """Contract v1.1: the caller named a pod UID, and the reservation belongs to another pod."""

    reservation: StoredReservation
    pod_uid: str


ReserveOutcome = Placed | Conflict | Unschedulable
CommitOutcome = StoredReservation | NotFound | NotActive | PodMismatch
#: What a release did: the reservation released, a refusal, or None when there was nothing to release.
ReleaseOutcome = StoredReservation | PodMismatch | None
#: One batched operation's outcome: that of the store call its single HTTP call makes.
BatchOutcome = ReserveOutcome | CommitOutcome | ReleaseOutcome


def _mismatch(current: StoredReservation, pod_uid: str | None) -> PodMismatch | None:
    """Checked before anything else changes: a mismatch is refused with no state change at all."""
    if pod_uid is None or current.pod_uid == pod_uid:
        return None
    return PodMismatch(current, pod_uid)


def plan_row(row: Sequence[object]) -> Plan:
    """A plan from a row of :data:`PLAN_COLUMNS`."""
    plan_id, pod_uid, node, victims, hold, lease_seconds, state, expires_at = row
    return plan_from_row(
        plan_id=str(plan_id),
        pod_uid=str(pod_uid),
        node=str(node),
        victims=str(victims),
        hold=str(hold),
        lease_seconds=int(str(lease_seconds)),
        state=str(state),
        expires_at=float(str(expires_at)),
    )


@dataclass(frozen=True)
class LivePlans:
    """The preemption plans whose lease runs at one moment, as a placement sees them.

    Both stores read them inside the transaction that places, so two replicas never give a room a
    confirmed plan holds to another pod: the hold is read where the usage is."""

    #: (preemptor pod UID, node, hold column, state) of each active plan not yet past its lease.
    rows: Sequence[tuple[str, str, str, str]]

    def held(self, *, except_pods: frozenset[str] = frozenset()) -> dict[str, dict[str, Decimal]]:
        """Per node, the room confirmed plans hold for preemptors other than ``except_pods``."""
        confirmed = [(uid, node, hold) for uid, node, hold, state in self.rows if state == "confirmed"]
        return held_by_node(confirmed, except_pods=except_pods)

    def nodes(
        self, nodes: Sequence[InventoryNode], *, except_pods: frozenset[str]
    ) -> Sequence[InventoryNode]:
        """``nodes`` with the held room taken out of each node's allocatable (the same sequence when
        nothing is held)."""
        return without_held(nodes, self.held(except_pods=except_pods)) if self.rows else nodes

    def of(self, pod_uid: str) -> bool:
        """Whether ``pod_uid`` has an active plan: its reserve ends it (``used``)."""
        return any(uid == pod_uid for uid, _, _, _ in self.rows)


class ReservationStore:
    """SQLite-backed reservations.  NOT thread-safe by design: call it from one thread only."""

    def __init__(
        self,
        path: pathlib.Path | str,
        *,
        clock: Callable[[], float] = time.time,
        retention: float = 3600.0,
        max_released_rows: int = DEFAULT_MAX_RELEASED_ROWS,
        foreign_retry_seconds: float = FOREIGN_RETRY_SECONDS,
        percentage_of_nodes_to_score: int = 0,
    ) -> None:
        self._clock = clock
        self._retention = retention
        self._max_ended = max_released_rows
        self._foreign_retry = foreign_retry_seconds
        # Feasible-node sampling (placement.nodes_to_find) and where the next search starts.
        self._percentage = check_percentage(percentage_of_nodes_to_score)
        self._next_start = 0
        #: v1.3: the device allocator (set by the server); None: a reserve with claims is refused.
        self.devices: DeviceAllocator | None = None
        #: v1.3: the devices allocated in the cluster's ResourceClaims (the claim mirror's view).
        self.cluster_devices: tuple[DeviceInUse, ...] = ()
        # Rows ended since the last sweep; a tenth of the cap makes the next operation sweep.
        self._ended_since_gc = 0
        # Before anything is read: a second writer would count only its own reservations.
        self._lock = None if str(path) == ":memory:" else WriterLock.acquire(path)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        self._migrate()
        self._bound()
        self._usage = self._load_usage()
        # The foreign usage of each node as last resolved: (the snapshot's entry it was resolved
        # from, the result). See `_foreign`.
        self._foreign_by_node: dict[str, tuple[NodePods, Foreign | None]] = {}
        self._foreign_deactivations = -1
        # The last answer whole, with the snapshot and count it came from: the reserves of a batch
        # (or between two mirror events) share it, where each one walked every node's entry.
        self._foreign_last: tuple[ClusterPods, int, dict[str, Foreign]] | None = None
        # Sweeping costs a write transaction (an fsync); skip it until something can be due.
        self._next_expiry = self._earliest_expiry()
        self._next_gc = 0.0

    def close(self) -> None:
        self._db.close()
        if self._lock is not None:
            self._lock.release()

    def _load_usage(self) -> dict[str, dict[str, Decimal]]:
        """The capacity in use per node, from the table: at start-up and after a rolled-back batch."""
        usage: dict[str, dict[str, Decimal]] = {}
        for row in self._db.execute(f"SELECT {_COLUMNS} FROM reservations WHERE state IN (?, ?)", _ACTIVE):
            stored = StoredReservation.from_row(row)
            add_usage(usage, stored.node, stored.usage())
        return usage

    def _migrate(self) -> None:
        """Add the v1.1 group and v1.2 cluster columns to a table an older RM created (its rows are
        in no group and of no cluster: listed only when a list names no cluster)."""
        present = {str(row[1]) for row in self._db.execute("PRAGMA table_info(reservations)")}
        for column, kind in (_GROUP_COLUMNS | _CLUSTER_COLUMNS | _REVOKED_COLUMNS | _DEVICE_COLUMNS).items():
            if column not in present:
                self._db.execute(f"ALTER TABLE reservations ADD COLUMN {column} {kind}")
        self._db.execute(
            "CREATE INDEX IF NOT EXISTS reservations_group ON reservations (group_id, group_index)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS reservations_cluster ON reservations (cluster_id, seq)")

    def _bound(self) -> None:
        """Bounded storage's schema, and the rows of an older RM (which kept each request's text)
        reduced to digests; a replay of such a request still matches its reservation."""
        self._db.executescript(_BOUNDED_SCHEMA)
        self._db.execute("PRAGMA journal_size_limit=16777216")  # the WAL shrinks back after a burst
        self._db.create_function("bindery_digest", 1, _digest, deterministic=True)
        for table in ("reservations", "reservation_groups"):
            self._db.execute(
                f"UPDATE {table} SET fingerprint = bindery_digest(fingerprint) WHERE fingerprint LIKE '{{%'"
            )

    def check_writable(self) -> None:
        """Raise the database's error unless the cleanup and a write of a request's size commit now.

        ``/readyz`` calls this while writes fail (a full disk, an I/O error), so the RM turns ready
        again by itself once space is back, whether or not anyone sends it a write meanwhile.
        """
        self._next_gc = 0.0  # the cleanup is part of what must work again
        self._expire()
        self._db.execute(
            "INSERT OR REPLACE INTO write_probe (id, payload) VALUES (0, zeroblob(?))", (_PROBE_BYTES,)
        )
        self._db.execute("DELETE FROM write_probe")

    def usage(self) -> dict[str, dict[str, Decimal]]:
        """A copy of the capacity in use per node (after expiring what is due)."""
        self._expire()
        return {node: dict(bucket) for node, bucket in self._usage.items()}

    # -- transactions ---------------------------------------------------------------------------

    def _earliest_expiry(self) -> float:
        row = self._db.execute(
            "SELECT MIN(expires_at) FROM reservations WHERE state = ?", (ReservationState.RESERVED.value,)
        ).fetchone()
        return float("inf") if row is None or row[0] is None else float(row[0])

    def _expire(self) -> None:
        now = self._clock()
        if now < self._next_expiry and now < self._next_gc and self._ended_since_gc <= self._max_ended // 10:
            return
        if self._db.in_transaction:
            # Inside a batch: it swept when it began, and its operations happen at that moment.
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            rows = self._db.execute(
                "UPDATE reservations SET state = ?, updated_at = ? WHERE state = ? AND expires_at <= ? "
                "RETURNING node, resources",
                (ReservationState.EXPIRED.value, now, ReservationState.RESERVED.value, now),
            ).fetchall()
            # The literal states let SQLite use the partial index of ended rows.
            self._db.execute(
                "DELETE FROM reservations WHERE state NOT IN ('reserved', 'committed') AND updated_at < ?",
                (now - self._retention,),
            )
            self._db.execute(
                "DELETE FROM reservations WHERE seq IN (SELECT seq FROM reservations "
                "WHERE state NOT IN ('reserved', 'committed') ORDER BY updated_at DESC, seq DESC "
                "LIMIT -1 OFFSET ?)",
                (self._max_ended,),
            )
            # Its members all deleted (by age or by the cap): nothing refers to the group any more.
            self._db.execute(
                "DELETE FROM reservation_groups WHERE NOT EXISTS "
                "(SELECT 1 FROM reservations WHERE group_id = reservation_groups.id)"
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        for node, resources in rows:
            subtract_usage(
                self._usage, node, {k: parse_quantity(v) for k, v in json.loads(resources).items()}
            )
        self._next_expiry = self._earliest_expiry()
        self._next_gc = now + min(60.0, self._retention)
        self._ended_since_gc = 0

    def _active_for_key(self, key: str) -> StoredReservation | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM reservations WHERE idempotency_key = ? AND state IN (?, ?)",
            (key, *_ACTIVE),
        ).fetchone()
        return None if row is None else StoredReservation.from_row(row)

    def _retry_hint(self, *, foreign: bool = False) -> float | None:
        """Seconds until the next uncommitted lease expires: the earliest moment capacity may free up
        without anyone releasing.  None when nothing is leased.

        With ``foreign`` (pods this RM did not place hold room: mirror mode), at most
        ``foreign_retry_seconds`` (:data:`FOREIGN_RETRY_SECONDS` by default, ``--foreign-retry-seconds``):
        such a pod can end, and free its room, with no release the caller hears of, and a caller that
        parks refused pods until an event (Bindery waits up to 5 minutes, as kube-scheduler does)
        would otherwise leave them parked past it.
        """
        lease = (
            None
            if self._next_expiry == float("inf")
            else max(1.0, round(self._next_expiry - self._clock(), 1))
        )
        if not foreign:
            return lease
        return self._foreign_retry if lease is None else min(lease, self._foreign_retry)

    def get(self, reservation_id: str) -> StoredReservation | None:
        self._expire()
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM reservations WHERE id = ?", (reservation_id,)
        ).fetchone()
        return None if row is None else StoredReservation.from_row(row)

    def _foreign(self, pods: ClusterPods) -> dict[str, Foreign]:
        """What the bound pods that no active reservation of this RM counts use, per node, now.

        Resolved again only for the nodes whose pods changed, not for every bound pod at every
        reserve: resolving all of them made each reserve cost O(bound pods), a backlog O(pods²)
        (5,000 pods on 500 nodes: 16 ms of RM CPU per pod, 58% of it here). A node's result
        depends on its snapshot entry (immutable; the mirror replaces the entry of a node whose
        pods changed and shares the others) and on whether the reservations its pods name are
        active with that pod's UID on that node. A reservation's id, pod UID and node never change,
        and a pod can only name an id the RM created before, so what can change a resolved node is
        a reservation ceasing to be active: the ``deactivations`` trigger counts every such change,
        whatever code path writes it, and a new count drops every resolved node.
        """
        (deactivations,) = self._db.execute("SELECT count FROM deactivations WHERE id = 0").fetchone()
        last = self._foreign_last
        if last is not None and last[0] is pods and last[1] == deactivations:
            return last[2]
        if deactivations != self._foreign_deactivations:
            self._foreign_by_node.clear()
            self._foreign_deactivations = deactivations
        resolved = self._foreign_by_node
        stale = {
            node: entry
            for node, entry in pods.nodes.items()
            if (known := resolved.get(node)) is None or known[0] is not entry
        }
        if stale:
            claimed = [pod.reservation_id for entry in stale.values() for pod in entry.claims]
            rows = (
                # By id (the unique index); `+state` keeps SQLite from choosing the state index,
                # which scanned every active reservation at every reserve (3.4 ms at 5,000).
                self._db.execute(
                    "SELECT id, pod_uid, node, resources FROM reservations "
                    "WHERE id IN (SELECT value FROM json_each(?)) AND +state IN (?, ?)",
                    (json.dumps(claimed), *_ACTIVE),
                ).fetchall()
                if claimed
                else []
            )
            owners = {str(id_): (str(uid), str(node)) for id_, uid, node, _ in rows}
            held = {str(id_): _held(resources) for id_, _, _, resources in rows}
            fresh = foreign_usage(ClusterPods(nodes=stale), owners=owners, held=held)
            for node, entry in stale.items():
                resolved[node] = (entry, fresh.get(node))
        if len(resolved) > len(pods.nodes):  # nodes that lost all their pods
            for node in [n for n in resolved if n not in pods.nodes]:
                del resolved[node]
        answer = {node: foreign for node in pods.nodes if (foreign := resolved[node][1]) is not None}
        self._foreign_last = (pods, deactivations, answer)
        return answer

    def reserve(
        self,
        request: ReservationRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> ReserveOutcome:
        """Place ``request`` if a node has room for it next to this RM's active reservations, the
        rooms confirmed preemption plans hold for other pods, and ``pods``, the pods bound to the
        nodes (mirror mode; see :mod:`bindery.reference_rm.accounting`).

        The preemptor's own reserve ends its plan (``used``) in the same transaction: its room is
        its reservation from then on."""
        self._expire()
        live = self._live_plans(self._clock())
        uid = request.pod.uid
        held = live.nodes(nodes, except_pods=frozenset({uid}))
        if not live.of(uid):
            return self._reserve(request, nodes=held, policy=policy, pods=pods)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            outcome = self._reserve(request, nodes=held, policy=policy, pods=pods)
            if isinstance(outcome, Placed):
                self._use_plan(uid)
            self._db.execute("COMMIT")
        except BaseException:
            self._rolled_back()
            raise
        return outcome

    def _reserve(
        self,
        request: ReservationRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None,
    ) -> ReserveOutcome:
        """Place on ``nodes`` (the held rooms already taken out); expiry is the caller's."""
        fingerprint = _digest(request.fingerprint())
        existing = self._active_for_key(request.idempotency_key)
        if existing is not None:
            return (
                Placed(existing, created=False) if existing.fingerprint == fingerprint else Conflict(existing)
            )
        requests = request.requested()
        foreign = None if pods is None else self._foreign(pods)
        if request.devices is not None:
            return self._reserve_with_devices(request, nodes=nodes, policy=policy, foreign=foreign)
        decision = choose_node(
            nodes=placeable(nodes, request),
            requests=requests,
            usage_by_node=self._usage,
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
            return Unschedulable(decision.reason, retry_after=self._retry_hint(foreign=bool(foreign)))
        node = next(n for n in nodes if n.name == decision.node)
        return self._insert(request, node=node, fingerprint=fingerprint, devices=None)

    def _insert(
        self,
        request: ReservationRequest,
        *,
        node: InventoryNode,
        fingerprint: str,
        devices: Sequence[Mapping[str, Any]] | None,
    ) -> Placed:
        """Write the reservation of ``request`` on ``node`` (with the devices chosen, if any)."""
        requests = request.requested()
        usage = effective_usage(requests, node)
        now = self._clock()
        values = (
            f"rsv-{uuid.uuid4().hex}",
            request.idempotency_key,
            fingerprint,
            request.pod.uid,
            request.pod.namespace,
            request.pod.name,
            request.pod.scheduler_name,
            node.name,
            json.dumps({name: format_quantity(amount) for name, amount in sorted(usage.items())}),
            ReservationState.RESERVED.value,
            now,
            now + request.ttl_seconds,
            now,
            request.cluster_id,
            None if devices is None else json.dumps(list(devices), separators=(",", ":")),
        )
        row = self._db.execute(
            "INSERT INTO reservations (id, idempotency_key, fingerprint, pod_uid, namespace, name, "
            "scheduler_name, node, resources, state, created_at, expires_at, updated_at, cluster_id, "
            "devices) "
            f"VALUES ({', '.join('?' * len(values))}) RETURNING {_COLUMNS}",
            values,
        ).fetchone()
        # Autocommit: the row is durable now (in a batch, memory is rebuilt if the batch rolls back).
        add_usage(self._usage, node.name, usage)
        self._next_expiry = min(self._next_expiry, now + request.ttl_seconds)
        return Placed(StoredReservation.from_row(row), created=True)

    def devices_in_use(self) -> list[DeviceInUse]:
        """The devices active reservations hold (an ended reservation holds none)."""
        used: list[DeviceInUse] = []
        rows = self._db.execute(
            "SELECT devices FROM reservations WHERE devices IS NOT NULL AND state IN (?, ?)", _ACTIVE
        )
        for (text,) in rows:
            for claim in json.loads(str(text)):
                for result in claim.get("results") or ():
                    used.append(
                        DeviceInUse(
                            driver=result["driver"],
                            pool=result["pool"],
                            device=result["device"],
                            share_id=result.get("shareID"),
                            consumed_capacity=result.get("consumedCapacity"),
                        )
                    )
        return used

    def _reserve_with_devices(
        self,
        request: ReservationRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        foreign: Mapping[str, Foreign] | None,
    ) -> ReserveOutcome:
        """Place a pod with claims: the first node, in this RM's order of preference, where the
        resources fit AND every claim allocates (upstream's allocator decides the latter).

        Nodes are taken in the order :func:`choose_node` prefers them, one at a time, so the pod goes
        where it would go without claims whenever its devices are there too.
        """
        claims = request.devices or []
        if self.devices is None:
            return Unschedulable("this RM does not allocate devices (it does not list the feature `devices`)")
        fingerprint = _digest(request.fingerprint())
        requests = request.requested()
        remaining = list(placeable(nodes, request))
        # Held by reservations, or allocated in claims (Bindery's own among them): one entry each.
        used = list(
            {
                (d.driver, d.pool, d.device, d.share_id): d
                for d in (*self.devices_in_use(), *self.cluster_devices)
            }.values()
        )
        names = ", ".join(f"{c.claim.namespace}/{c.claim.name}" for c in claims)
        failed: dict[str, str] = {}
        while True:
            decision = choose_node(
                nodes=remaining,
                requests=requests,
                usage_by_node=self._usage,
                node_selector=request.placement.node_selector,
                affinity_terms=request.placement.affinity_terms(),
                tolerations=request.placement.toleration_dicts(),
                policy=policy,
                foreign=foreign,
                preferences=request.placement.preference_dicts(),
            )
            if decision.node is None:
                break
            node = next(n for n in remaining if n.name == decision.node)
            node_object = {"metadata": {"name": node.name, "labels": dict(node.labels)}}
            try:
                outcome = self.devices.allocate(claims=claims, used=used, nodes=[node_object])
            except AllocationError as error:
                return Unschedulable(f"the RM cannot evaluate the claims {names}: {error}")
            if isinstance(outcome, Allocated):
                answers = [
                    claim_answer(claim, allocation)
                    for claim, allocation in zip(claims, outcome.allocations, strict=True)
                ]
                return self._insert(request, node=node, fingerprint=fingerprint, devices=answers)
            failed[node.name] = outcome.reasons.get(node.name, "cannot allocate the claims")
            remaining = [n for n in remaining if n.name != node.name]
        total = len(nodes)
        parts = []
        if failed:
            sample = next(iter(failed.values()))
            parts.append(f"{len(failed)} cannot allocate the claims {names} ({sample})")
        others = total - len(failed)
        if others:
            parts.append(f"{others} do not fit the pod's resources or placement")
        return Unschedulable(f"0/{total} nodes are available: {', '.join(parts)}.")

    def commit(self, reservation_id: str, *, pod_uid: str | None = None) -> CommitOutcome:
        current = self.get(reservation_id)
        if current is None:
            return NotFound()
        if (mismatch := _mismatch(current, pod_uid)) is not None:
            return mismatch
        if current.state is ReservationState.COMMITTED:
            return current
        if current.state is not ReservationState.RESERVED:
            return NotActive(current)
        row = self._db.execute(
            f"UPDATE reservations SET state = ?, expires_at = NULL, updated_at = ? WHERE id = ? "
            f"RETURNING {_COLUMNS}",
            (ReservationState.COMMITTED.value, self._clock(), reservation_id),
        ).fetchone()
        return StoredReservation.from_row(row)

    def release(self, reservation_id: str, *, pod_uid: str | None = None) -> ReleaseOutcome:
        """Release if active; returns what was released (None when there was nothing to release).

        Releasing what is not active is a no-op whoever asks, so only an active reservation of
        another pod is a mismatch.
        """
        current = self.get(reservation_id)
        if current is not None and current.state is ReservationState.REVOKED:
            if pod_uid is None or pod_uid == current.pod_uid:  # acknowledged: no longer listed as revoked
                self._db.execute(
                    "UPDATE reservations SET state = ?, updated_at = ? WHERE id = ?",
                    (ReservationState.RELEASED.value, self._clock(), reservation_id),
                )
            return None
        if current is None or not current.state.active:
            return None
        if (mismatch := _mismatch(current, pod_uid)) is not None:
            return mismatch
        self._db.execute(
            "UPDATE reservations SET state = ?, updated_at = ? WHERE id = ?",
            (ReservationState.RELEASED.value, self._clock(), reservation_id),
        )
        subtract_usage(self._usage, current.node, current.usage())
        self._ended_since_gc += 1
        return current

    def revoke(self, reservation_id: str, *, reason: str) -> StoredReservation | NotFound | NotActive:
        """Take an active reservation back (an administrator's call; contract v1.2 ``revocation``).

        Its capacity returns to the pool at once; it stays listed as ``revoked`` until its caller
        releases it (the acknowledgement) or the retention ends. Revoking it again answers it
        unchanged; a released or expired one is ``NotActive``.
        """
        self._expire()
        current = self.get(reservation_id)
        if current is None:
            return NotFound()
        if current.state is ReservationState.REVOKED:
            return current
        if not current.state.active:
            return NotActive(current)
        now = self._clock()
        row = self._db.execute(
            "UPDATE reservations SET state = ?, expires_at = NULL, updated_at = ?, revoked_reason = ?, "
            f"revoked_at = ? WHERE id = ? RETURNING {_COLUMNS}",
            (ReservationState.REVOKED.value, now, reason, now, reservation_id),
        ).fetchone()
        subtract_usage(self._usage, current.node, current.usage())
        self._ended_since_gc += 1
        return StoredReservation.from_row(row)

    def renew(
        self, reservation_id: str, *, pod_uid: str, ttl_seconds: int
    ) -> StoredReservation | NotFound | NotActive | PodMismatch:
        """Contract v1.1: a reserved lease now ends ``ttl_seconds`` from now; committed is unchanged.

        Idempotent: renewing twice sets the same kind of deadline.  The expiry sweep may then run
        once for nothing (its next due time was the old deadline), which is harmless.
        """
        current = self.get(reservation_id)
        if current is None:
            return NotFound()
        if (mismatch := _mismatch(current, pod_uid)) is not None:
            return mismatch
        if current.state is ReservationState.COMMITTED:
            return current
        if current.state is not ReservationState.RESERVED:
            return NotActive(current)
        now = self._clock()
        row = self._db.execute(
            f"UPDATE reservations SET expires_at = ?, updated_at = ? WHERE id = ? RETURNING {_COLUMNS}",
            (now + ttl_seconds, now, reservation_id),
        ).fetchone()
        self._next_expiry = min(self._next_expiry, now + ttl_seconds)
        return StoredReservation.from_row(row)

    def batch(
        self,
        operations: Sequence[BatchOperation],
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> list[BatchOutcome]:
        """Carry out ``operations`` in order in ONE transaction; one outcome each, in the same order.

        Each operation is exactly its single call (:meth:`reserve`, :meth:`commit`, :meth:`release`):
        inside the transaction their statements see each other's writes, so a later reserve finds
        the capacity and the idempotency keys of the earlier ones.  Not atomic as a group is: an
        operation refused (unschedulable, not found, ...) changes nothing and the others go on.
        Only an error of the store itself (a failed write or COMMIT) undoes the whole batch; the
        memory is then rebuilt from the table and the error raised, so nothing is half-counted.
        """
        self._expire()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            live = self._live_plans(self._clock())
            # As a single reserve would: each reserve sees its own held room only, never that of
            # another preemptor in the batch; a plan this batch ended holds no more (its room is a
            # reservation now).
            ended: set[str] = set()
            outcomes: list[BatchOutcome] = []
            for operation in operations:
                if operation.reserve is not None:
                    uid = operation.reserve.pod.uid
                    held = live.nodes(nodes, except_pods=frozenset({uid, *ended}))
                    placed = self._reserve(operation.reserve, nodes=held, policy=policy, pods=pods)
                    if isinstance(placed, Placed) and live.of(uid):
                        self._use_plan(uid)
                        ended.add(uid)
                    outcomes.append(placed)
                elif operation.commit is not None:
                    ref = operation.commit
                    outcomes.append(self.commit(ref.reservation_id, pod_uid=ref.pod_uid))
                else:
                    assert operation.release is not None  # BatchOperation names exactly one
                    ref = operation.release
                    outcomes.append(self.release(ref.reservation_id, pod_uid=ref.pod_uid))
            self._db.execute("COMMIT")
        except BaseException:
            self._rolled_back()
            raise
        return outcomes

    def _rolled_back(self) -> None:
        """Undo a failed batch: roll the transaction back and rebuild what memory holds of it."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        self._usage = self._load_usage()
        self._next_expiry = self._earliest_expiry()
        # Resolved foreign usage may rest on rows that are gone now: resolve again.
        self._foreign_by_node.clear()
        self._foreign_deactivations = -1
        self._foreign_last = None

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
        """One page in creation order, and the sequence number to continue after (None at the end).

        ``state`` may name several states (a v1.1 caller's ``released`` also means revoked)."""
        self._expire()
        clauses: list[str] = ["seq > ?"]
        args: list[object] = [after]
        if isinstance(state, tuple):
            clauses.append(f"state IN ({', '.join('?' * len(state))})")
            args.extend(s.value for s in state)
            state = None
        filters = (
            ("scheduler_name", scheduler_name),
            ("state", state),
            ("pod_uid", pod_uid),
            ("group_id", group_id),
            ("cluster_id", cluster_id),  # v1.2: rows without a cluster never match a cluster id
        )
        for column, value in filters:
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM reservations WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?",
            (*args, limit + 1),
        ).fetchall()
        items = [StoredReservation.from_row(row) for row in rows[:limit]]
        return items, (items[-1].seq if len(rows) > limit else None)

    # -- reservation groups (contract v1.1) -----------------------------------------------------

    def _group(self, row: Sequence[object]) -> StoredGroup:
        id_, key, fingerprint, namespace, name, uid, scheduler, topology, created = row
        members = self._db.execute(
            f"SELECT {_COLUMNS} FROM reservations WHERE group_id = ? ORDER BY group_index", (id_,)
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

    def get_group(self, group_id: str) -> StoredGroup | None:
        self._expire()
        row = self._db.execute(
            f"SELECT {_GROUP_ROW} FROM reservation_groups WHERE id = ?", (group_id,)
        ).fetchone()
        return None if row is None else self._group(row)

    def _active_group_for_key(self, key: str) -> StoredGroup | None:
        row = self._db.execute(
            f"SELECT {_GROUP_ROW} FROM reservation_groups g WHERE idempotency_key = ? AND EXISTS "
            "(SELECT 1 FROM reservations r WHERE r.group_id = g.id AND r.state IN (?, ?)) "
            "ORDER BY seq DESC LIMIT 1",
            (key, *_ACTIVE),
        ).fetchone()
        return None if row is None else self._group(row)

    def reserve_group(
        self,
        request: ReservationGroupRequest,
        *,
        nodes: Sequence[InventoryNode],
        policy: Policy,
        pods: ClusterPods | None = None,
    ) -> GroupPlaced | GroupConflict | Unschedulable:
        """Place every member, or none (:func:`bindery.reference_rm.groups.place_group`), and store the
        group and its members in one transaction.

        The key belongs to the group while any member is active: the same request then replays the
        group (members in their current states), a different one is a conflict.
        """
        self._expire()
        fingerprint = _digest(request.fingerprint())
        existing = self._active_group_for_key(request.idempotency_key)
        if existing is not None:
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
        foreign = None if pods is None else self._foreign(pods)
        # The rooms held for other preemptors are out of reach; the group's own plan's are its own.
        own = group_plan_key(request.group.namespace, request.group.name)
        live = self._live_plans(self._clock())
        nodes = live.nodes(nodes, except_pods=frozenset({own}))
        decision = place_group(
            group=f"{request.group.namespace}/{request.group.name}",
            members=asks,
            topology_keys=[constraint.key for constraint in request.topology],
            nodes=nodes,
            usage_by_node=self._usage,
            policy=policy,
            foreign=foreign,
        )
        if decision.nodes is None:
            return Unschedulable(decision.reason, retry_after=self._retry_hint(foreign=bool(foreign)))
        by_name = {node.name: node for node in nodes}
        usages = [
            effective_usage(ask.requests, by_name[node])
            for ask, node in zip(asks, decision.nodes, strict=True)
        ]
        now = self._clock()
        group_id = f"grp-{uuid.uuid4().hex}"
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute(
                "INSERT INTO reservation_groups (id, idempotency_key, fingerprint, namespace, name, uid, "
                "scheduler_name, topology_value, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            self._db.executemany(
                "INSERT INTO reservations (id, idempotency_key, fingerprint, pod_uid, namespace, name, "
                "scheduler_name, node, resources, state, created_at, expires_at, updated_at, group_id, "
                "group_index, cluster_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        f"rsv-{uuid.uuid4().hex}",
                        # The group owns the key; a member's own key only has to be unique and
                        # never match a caller's key while it is active, which the group id ensures.
                        f"{group_id}/{index}",
                        group_id,  # the fingerprint is the group's (one copy, not one per member)
                        member.pod.uid,
                        member.pod.namespace,
                        member.pod.name,
                        member.pod.scheduler_name,
                        node,
                        json.dumps({name: format_quantity(amount) for name, amount in sorted(usage.items())}),
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
                self._use_plan(own)  # the group's plan held this room: it is the group's now
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        for node, usage in zip(decision.nodes, usages, strict=True):
            add_usage(self._usage, node, usage)  # committed: every member is durable now
        self._next_expiry = min(self._next_expiry, now + request.ttl_seconds)
        group = self.get_group(group_id)
        assert group is not None
        return GroupPlaced(group, created=True)

    def release_group(self, group_id: str) -> StoredGroup | None:
        """Release every member still ``reserved`` (one statement: all of them or none); committed
        members stay, they belong to bound pods.  None when the group is unknown."""
        if self.get_group(group_id) is None:
            return None
        rows = self._db.execute(
            "UPDATE reservations SET state = ?, updated_at = ? WHERE group_id = ? AND state = ? "
            "RETURNING node, resources",
            (ReservationState.RELEASED.value, self._clock(), group_id, ReservationState.RESERVED.value),
        ).fetchall()
        for node, resources in rows:
            subtract_usage(
                self._usage, node, {k: parse_quantity(v) for k, v in json.loads(resources).items()}
            )
        self._ended_since_gc += len(rows)
        return self.get_group(group_id)

    def renew_group(self, group_id: str, *, ttl_seconds: int) -> StoredGroup | NotFound | NotActive:
        """The group's one lease: every ``reserved`` member now expires ``ttl_seconds`` from now.

        A group whose members are all committed comes back unchanged; one with no active member
        is ``NotActive`` (carrying its first member), like a single released reservation.
        """
        current = self.get_group(group_id)
        if current is None:
            return NotFound()
        if not current.active:
            return NotActive(current.members[0])
        now = self._clock()
        self._db.execute(
            "UPDATE reservations SET expires_at = ?, updated_at = ? WHERE group_id = ? AND state = ?",
            (now + ttl_seconds, now, group_id, ReservationState.RESERVED.value),
        )
        self._next_expiry = min(self._next_expiry, now + ttl_seconds)
        renewed = self.get_group(group_id)
        assert renewed is not None
        return renewed

    # -- preemption plans (contract v1.2) -------------------------------------------------------

    def _live_plans(self, now: float) -> LivePlans:
        rows = self._db.execute(
            "SELECT pod_uid, node, hold, state FROM preemption_plans "
            "WHERE state IN (?, ?) AND expires_at > ?",
            (*ACTIVE_PLAN_STATES, now),
        ).fetchall()
        return LivePlans(
            rows=[(str(uid), str(node), str(hold), str(state)) for uid, node, hold, state in rows]
        )

    def _use_plan(self, pod_uid: str) -> None:
        now = self._clock()
        self._db.execute(
            "UPDATE preemption_plans SET state = 'used', updated_at = ? "
            "WHERE pod_uid = ? AND state IN (?, ?) AND expires_at > ?",
            (now, pod_uid, *ACTIVE_PLAN_STATES, now),
        )

    def _plan_now(self, plan_id: str, now: float) -> Plan | None:
        """The plan as its lease says now (:func:`~bindery.reference_rm.preemption.as_of`)."""
        row = self._db.execute(
            f"SELECT {PLAN_COLUMNS} FROM preemption_plans WHERE id = ?", (plan_id,)
        ).fetchone()
        return None if row is None else as_of(plan_row(row), now)

    def get_plan(self, plan_id: str) -> Plan | None:
        return self._plan_now(plan_id, self._clock())

    def active_plan(self, pod_uid: str) -> Plan | None:
        """The preemptor's plan still proposed or confirmed, if any."""
        now = self._clock()
        row = self._db.execute(
            f"SELECT {PLAN_COLUMNS} FROM preemption_plans "
            "WHERE pod_uid = ? AND state IN (?, ?) AND expires_at > ?",
            (pod_uid, *ACTIVE_PLAN_STATES, now),
        ).fetchone()
        return None if row is None else plan_row(row)

    def propose_plan(self, pod_uid: str, choose: Chooser, *, lease_seconds: int) -> Plan | None:
        """The preemptor's active plan if it has one (asked again, the RM answers it again instead
        of proposing more victims while the first ones terminate), else the plan ``choose`` finds
        next to the capacity in use, the rooms other plans hold and the victims they name, stored
        as ``proposed`` for ``lease_seconds``; None when ``choose`` finds none."""
        self._expire()
        now = self._clock()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._settle_plans(now)
            existing = self.active_plan(pod_uid)
            if existing is not None:
                self._db.execute("COMMIT")
                return existing
            live = self._live_plans(now)
            used = {node: dict(bucket) for node, bucket in self._usage.items()}
            for node, held in live.held(except_pods=frozenset({pod_uid})).items():
                add_usage(used, node, held)
            spoken_for = frozenset(
                uid
                for (victims,) in self._db.execute(
                    "SELECT victims FROM preemption_plans WHERE state IN (?, ?) AND expires_at > ?",
                    (*ACTIVE_PLAN_STATES, now),
                )
                for uid in victim_uids(str(victims))
            )
            proposal = choose(used, spoken_for)
            if proposal is None:
                self._db.execute("COMMIT")
                return None
            row = self._db.execute(
                f"INSERT INTO preemption_plans ({NEW_PLAN_COLUMNS}) VALUES ({', '.join(['?'] * 10)}) "
                f"RETURNING {PLAN_COLUMNS}",
                new_plan_row(pod_uid, proposal, lease_seconds=lease_seconds, now=now),
            ).fetchone()
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        return plan_row(row)

    def _settle_plans(self, now: float) -> None:
        """Mark active plans past their lease expired; delete ended ones remembered a lease more."""
        self._db.execute(
            "UPDATE preemption_plans SET state = 'expired', updated_at = ? "
            "WHERE state IN (?, ?) AND expires_at <= ?",
            (now, *ACTIVE_PLAN_STATES, now),
        )
        self._db.execute(
            "DELETE FROM preemption_plans WHERE state NOT IN (?, ?) AND expires_at + lease_seconds <= ?",
            (*ACTIVE_PLAN_STATES, now),
        )

    def confirm_plan(self, plan_id: str) -> Plan | None:
        """Confirm (idempotent): the lease restarts from now and the plan's room is held. None when
        unknown; the plan in its state otherwise (the caller answers 409 unless it is confirmed)."""
        now = self._clock()
        plan = self._plan_now(plan_id, now)
        if plan is None or not plan.active:
            return plan
        row = self._db.execute(
            "UPDATE preemption_plans SET state = 'confirmed', expires_at = ?, updated_at = ? WHERE id = ? "
            f"RETURNING {PLAN_COLUMNS}",
            (now + plan.lease_seconds, now, plan_id),
        ).fetchone()
        return plan_row(row)

    def cancel_plan(self, plan_id: str) -> Plan | None:
        """Cancel (idempotent): an active plan stops holding; others keep their final state."""
        now = self._clock()
        plan = self._plan_now(plan_id, now)
        if plan is None or not plan.active:
            return plan
        row = self._db.execute(
            "UPDATE preemption_plans SET state = 'cancelled', updated_at = ? WHERE id = ? "
            f"RETURNING {PLAN_COLUMNS}",
            (now, plan_id),
        ).fetchone()
        return plan_row(row)
