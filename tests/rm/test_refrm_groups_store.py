"""The store's reservation groups (contract v1.1): one transaction for all members, one key, one
lease, per-member commit and release, expiry, and a database an older RM wrote."""

from __future__ import annotations

import pathlib
import sqlite3
from decimal import Decimal

import pytest

from bindery.reference_rm.accounting import BoundPod, ClusterPods
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.store import (
    GroupConflict,
    GroupPlaced,
    NotActive,
    NotFound,
    Placed,
    ReservationStore,
    StoredGroup,
    Unschedulable,
)
from bindery.reference_rm.stores import Store
from bindery.rm.models import ReservationGroupRequest, ReservationRequest, ReservationState
from tests.rm.conftest import StoreFactory

NODES = [
    InventoryNode(name="a1", allocatable={"cpu": Decimal(2)}, labels={"zone": "a"}),
    InventoryNode(name="b1", allocatable={"cpu": Decimal(3)}, labels={"zone": "b"}),
]


def group(
    key: str, count: int, *, cpu: str = "1", ttl: int = 10, topology: bool = False
) -> ReservationGroupRequest:
    return ReservationGroupRequest.model_validate(
        {
            "group": {"namespace": "ns", "name": key, "schedulerName": "s"},
            "members": [
                {
                    "pod": {
                        "uid": f"{key}-{i}",
                        "namespace": "ns",
                        "name": f"{key}-{i}",
                        "schedulerName": "s",
                    },
                    "resources": {"cpu": cpu},
                }
                for i in range(count)
            ],
            "topology": [{"key": "zone"}] if topology else [],
            "idempotencyKey": key,
            "ttlSeconds": ttl,
        }
    )


def placed(outcome: object) -> StoredGroup:
    assert isinstance(outcome, GroupPlaced), outcome
    return outcome.group


def cpu_in_use(store: Store) -> dict[str, Decimal]:
    return {
        node: bucket.get("cpu", Decimal(0)) for node, bucket in store.usage().items() if bucket.get("cpu")
    }


def test_all_members_or_none_and_the_key_replays(make_store: StoreFactory) -> None:
    store = make_store(clock=lambda: 0.0)
    too_big = store.reserve_group(group("g1", 6), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(too_big, Unschedulable)
    assert "only 5 of them" in too_big.reason
    assert cpu_in_use(store) == {}
    assert store.list()[0] == []
    made = placed(store.reserve_group(group("g2", 5), nodes=NODES, policy=Policy.BINPACK))
    assert [m.pod_uid for m in made.members] == [f"g2-{i}" for i in range(5)]
    assert {m.group_id for m in made.members} == {made.id}
    assert cpu_in_use(store) == {"a1": 2, "b1": 3}
    replay = store.reserve_group(group("g2", 5), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(replay, GroupPlaced)
    assert not replay.created
    assert replay.group == made
    assert isinstance(store.reserve_group(group("g2", 4), nodes=NODES, policy=Policy.BINPACK), GroupConflict)
    assert cpu_in_use(store) == {"a1": 2, "b1": 3}  # neither replay nor conflict took more
    store.close()


def test_topology_keeps_the_group_in_one_zone(make_store: StoreFactory) -> None:
    store = make_store(clock=lambda: 0.0)
    three = placed(store.reserve_group(group("g", 3, topology=True), nodes=NODES, policy=Policy.BINPACK))
    assert {m.node for m in three.members} == {"b1"}
    assert three.topology_value == {"zone": "b"}
    assert three.to_model().topology_value == {"zone": "b"}
    refused = store.reserve_group(group("h", 3, topology=True), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(refused, Unschedulable)
    assert "the most any value holds is 2 (zone=a; 2 values tried)" in refused.reason
    store.close()


def test_one_lease_renewed_and_expired_together(make_store: StoreFactory) -> None:
    now = [1000.0]
    store = make_store(clock=lambda: now[0], retention=100)
    made = placed(store.reserve_group(group("g", 3, ttl=10), nodes=NODES, policy=Policy.BINPACK))
    assert {m.expires_at for m in made.members} == {1010.0}
    now[0] = 1005.0
    renewed = store.renew_group(made.id, ttl_seconds=20)
    assert isinstance(renewed, StoredGroup)
    assert {m.expires_at for m in renewed.members} == {1025.0}
    model = renewed.to_model()
    assert model.expires_at is not None
    assert model.expires_at.timestamp() == 1025.0
    now[0] = 1025.0
    expired = store.get_group(made.id)
    assert expired is not None
    assert {m.state for m in expired.members} == {ReservationState.EXPIRED}
    assert expired.to_model().expires_at is None
    assert cpu_in_use(store) == {}
    assert isinstance(store.renew_group(made.id, ttl_seconds=20), NotActive)
    assert isinstance(store.renew_group("grp-unknown", ttl_seconds=20), NotFound)
    # The key is free again once no member is active: the same request makes a new group.
    again = placed(store.reserve_group(group("g", 3, ttl=10), nodes=NODES, policy=Policy.BINPACK))
    assert again.id != made.id
    # After the retention the ended group and its members are forgotten.
    now[0] = 1200.0
    assert store.get_group(made.id) is None
    store.close()


def test_members_commit_and_release_one_by_one_and_the_group_releases_the_rest(
    make_store: StoreFactory,
) -> None:
    store = make_store(clock=lambda: 0.0)
    made = placed(store.reserve_group(group("g", 4), nodes=NODES, policy=Policy.SPREAD))
    first, second, *_ = made.members
    assert store.commit(first.id, pod_uid=first.pod_uid) is not None
    released = store.release(second.id, pod_uid=second.pod_uid)
    assert released is not None
    renewed = store.renew_group(made.id, ttl_seconds=30)
    assert isinstance(renewed, StoredGroup)
    assert [m.expires_at for m in renewed.members] == [None, made.members[1].expires_at, 30.0, 30.0]
    after = store.release_group(made.id)
    assert after is not None
    assert [m.state for m in after.members] == [
        ReservationState.COMMITTED,
        ReservationState.RELEASED,
        ReservationState.RELEASED,
        ReservationState.RELEASED,
    ]
    assert sum(cpu_in_use(store).values()) == 1  # only the committed member holds capacity
    assert store.release_group(made.id) is not None  # idempotent
    assert store.release_group("grp-unknown") is None
    assert [r.id for r in store.list(group_id=made.id)[0]] == [m.id for m in made.members]
    store.close()


def test_a_failure_mid_transaction_leaves_nothing(tmp_path: pathlib.Path) -> None:
    """A real SQLite failure on the third member's insert: no group, no member, no capacity held."""
    store = ReservationStore(tmp_path / "db", clock=lambda: 0.0)
    with sqlite3.connect(tmp_path / "db") as db:
        db.execute(
            "CREATE TRIGGER fail_third BEFORE INSERT ON reservations WHEN NEW.group_index = 2 "
            "BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
        )
    with pytest.raises(sqlite3.IntegrityError, match="disk on fire"):
        store.reserve_group(group("g", 4), nodes=NODES, policy=Policy.BINPACK)
    assert store.list()[0] == []
    assert cpu_in_use(store) == {}
    with sqlite3.connect(tmp_path / "db") as db:
        assert db.execute("SELECT COUNT(*) FROM reservation_groups").fetchone() == (0,)
        db.execute("DROP TRIGGER fail_third")
    assert placed(store.reserve_group(group("g", 4), nodes=NODES, policy=Policy.BINPACK)).members
    store.close()


def test_reopen_keeps_groups_and_their_capacity(make_store: StoreFactory) -> None:
    store = make_store(clock=lambda: 0.0)
    made = placed(store.reserve_group(group("g", 5, ttl=600), nodes=NODES, policy=Policy.BINPACK))
    store.commit(made.members[0].id)
    store.close()
    reopened = make_store(clock=lambda: 1.0)
    assert cpu_in_use(reopened) == {"a1": 2, "b1": 3}
    again = reopened.get_group(made.id)
    assert again is not None
    assert again.members[0].state is ReservationState.COMMITTED
    replay = reopened.reserve_group(group("g", 5, ttl=600), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(replay, GroupPlaced)
    assert replay.group.id == made.id
    assert isinstance(
        reopened.reserve_group(group("h", 1), nodes=NODES, policy=Policy.BINPACK), Unschedulable
    )
    reopened.close()


OLD_SCHEMA = """
CREATE TABLE reservations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, idempotency_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL, pod_uid TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
    scheduler_name TEXT NOT NULL, node TEXT NOT NULL, resources TEXT NOT NULL, state TEXT NOT NULL,
    created_at REAL NOT NULL, expires_at REAL, updated_at REAL NOT NULL
);
INSERT INTO reservations VALUES (1, 'rsv-old', 'k', 'f', 'u', 'ns', 'p', 's', 'a1', '{"cpu": "2"}',
    'committed', 0, NULL, 0);
"""


def test_a_database_written_before_groups_is_upgraded_in_place(tmp_path: pathlib.Path) -> None:
    with sqlite3.connect(tmp_path / "db") as db:
        db.executescript(OLD_SCHEMA)
    store = ReservationStore(tmp_path / "db", clock=lambda: 0.0)
    old = store.get("rsv-old")
    assert old is not None
    assert old.group_id is None
    assert cpu_in_use(store) == {"a1": 2}
    single = store.reserve(
        ReservationRequest.model_validate(
            {
                "pod": {"uid": "x", "namespace": "ns", "name": "x", "schedulerName": "s"},
                "resources": {"cpu": "1"},
                "idempotencyKey": "x",
                "ttlSeconds": 10,
            }
        ),
        nodes=NODES,
        policy=Policy.BINPACK,
    )
    assert isinstance(single, Placed)
    assert single.reservation.group_id is None
    made = placed(store.reserve_group(group("g", 2), nodes=NODES, policy=Policy.BINPACK))
    assert {m.node for m in made.members} == {"b1"}
    store.close()


def test_mirror_mode_counts_foreign_pods_once_and_members_claimed_by_their_pods_once(
    tmp_path: pathlib.Path,
) -> None:
    """On shared nodes a group counts the pods the RM did not place; a pod bound with a member's
    reservation is that member, not a second consumer."""
    node = [InventoryNode(name="n1", allocatable={"cpu": Decimal(3)})]
    store = ReservationStore(tmp_path / "db", clock=lambda: 0.0)
    foreign = ClusterPods.of([BoundPod(uid="x", key="other/x", node="n1", usage={"cpu": Decimal(2)})])
    refused = store.reserve_group(group("g", 2), nodes=node, policy=Policy.BINPACK, pods=foreign)
    assert isinstance(refused, Unschedulable)
    assert "Pods this RM did not place use node n1: 2 cpu (1 pod)." in refused.reason
    made = placed(store.reserve_group(group("g", 2), nodes=node, policy=Policy.BINPACK))
    first = made.members[0]
    bound = ClusterPods.of(
        [
            BoundPod(
                uid=first.pod_uid,
                key=f"ns/{first.name}",
                node="n1",
                usage={"cpu": Decimal(1)},
                reservation_id=first.id,
            )
        ]
    )
    assert placed(store.reserve_group(group("h", 1), nodes=node, policy=Policy.BINPACK, pods=bound)).members
    store.close()
