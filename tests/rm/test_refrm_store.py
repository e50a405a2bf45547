"""The SQLite store: lazy expiry with an injected clock, idempotency, and state across reopen."""

from __future__ import annotations

from decimal import Decimal

from bindery.reference_rm.accounting import BoundPod, ClusterPods
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.store import (
    FOREIGN_RETRY_SECONDS,
    Conflict,
    NotActive,
    NotFound,
    Placed,
    StoredReservation,
    Unschedulable,
)
from bindery.rm.models import ReservationRequest, ReservationState
from tests.rm.conftest import StoreFactory

NODES = [InventoryNode(name="n1", allocatable={"cpu": Decimal(2)})]


def request(uid: str, cpu: str = "1", ttl: int = 10) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "s"},
            "resources": {"cpu": cpu},
            "idempotencyKey": uid,
            "ttlSeconds": ttl,
        }
    )


def test_expiry_frees_capacity_and_key(make_store: StoreFactory) -> None:
    now = [1000.0]
    store = make_store(clock=lambda: now[0], retention=100)
    first = store.reserve(request("a", "2", ttl=10), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(first, Placed)
    assert first.created
    blocked = store.reserve(request("b"), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(blocked, Unschedulable)
    assert blocked.retry_after == 10  # the lease of "a" ends in 10 s
    now[0] = 1009.9
    assert isinstance(store.reserve(request("b"), nodes=NODES, policy=Policy.BINPACK), Unschedulable)
    now[0] = 1010.0
    assert store.usage()["n1"]["cpu"] == 0
    gone = store.get(first.reservation.id)
    assert gone is not None
    assert gone.state is ReservationState.EXPIRED
    assert isinstance(store.commit(first.reservation.id), NotActive)
    # The key is free again: the same request creates a new reservation.
    again = store.reserve(request("a", "2", ttl=10), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(again, Placed)
    assert again.created
    assert again.reservation.id != first.reservation.id
    # Terminal rows are forgotten after the retention period.
    now[0] = 1200.0
    assert store.get(first.reservation.id) is None
    store.close()


def test_idempotency_and_reopen(make_store: StoreFactory) -> None:
    now = [0.0]
    store = make_store(clock=lambda: now[0])
    placed = store.reserve(request("a"), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    replay = store.reserve(request("a"), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(replay, Placed)
    assert not replay.created
    assert replay.reservation == placed.reservation
    assert isinstance(store.reserve(request("a", "500m"), nodes=NODES, policy=Policy.BINPACK), Conflict)
    committed = store.commit(placed.reservation.id)
    assert isinstance(committed, StoredReservation)
    assert committed.state is ReservationState.COMMITTED
    assert isinstance(store.commit("nope"), NotFound)
    store.close()
    now[0] = 10**6  # long after the lease: committed reservations do not expire
    reopened = make_store(clock=lambda: now[0])
    assert reopened.usage()["n1"]["cpu"] == 1
    assert reopened.release(placed.reservation.id) is not None
    assert reopened.release(placed.reservation.id) is None
    assert reopened.usage()["n1"]["cpu"] == 0
    items, cursor = reopened.list(state=ReservationState.RELEASED, limit=10)
    assert [item.id for item in items] == [placed.reservation.id]
    assert cursor is None
    reopened.close()


def test_a_refusal_while_pods_it_did_not_place_hold_room_says_when_to_ask_again(
    make_store: StoreFactory,
) -> None:
    """Mirror mode: a pod this RM did not place (kube-scheduler's, say) fills the node. It can end
    without any release the caller hears of, so the refusal carries a retry hint even with no lease
    pending; without pods of others it carries none, as before."""
    store = make_store(clock=lambda: 1000.0)
    theirs = BoundPod(uid="u-x", key="other/x", node="n1", usage={"cpu": Decimal(2)})
    refused = store.reserve(request("b"), nodes=NODES, policy=Policy.BINPACK, pods=ClusterPods.of([theirs]))
    assert isinstance(refused, Unschedulable)
    assert refused.retry_after == FOREIGN_RETRY_SECONDS
    alone = store.reserve(request("c", "3"), nodes=NODES, policy=Policy.BINPACK, pods=ClusterPods())
    assert isinstance(alone, Unschedulable)
    assert alone.retry_after is None


def test_the_hint_for_pods_it_did_not_place_follows_the_configured_seconds(
    make_store: StoreFactory,
) -> None:
    """`bindery rm serve --foreign-retry-seconds`: a cluster whose other pods come and go often may
    want refused pods retried sooner than the default; a pending lease that ends sooner still wins."""
    now = 1000.0
    store = make_store(clock=lambda: now, foreign_retry_seconds=4)
    theirs = BoundPod(uid="u-x", key="other/x", node="n1", usage={"cpu": Decimal(1)})
    pods = ClusterPods.of([theirs])
    refused = store.reserve(request("b", "2"), nodes=NODES, policy=Policy.BINPACK, pods=pods)
    assert isinstance(refused, Unschedulable)
    assert refused.retry_after == 4
    placed = store.reserve(request("a", ttl=2), nodes=NODES, policy=Policy.BINPACK, pods=pods)
    assert isinstance(placed, Placed)
    sooner = store.reserve(request("c"), nodes=NODES, policy=Policy.BINPACK, pods=pods)
    assert isinstance(sooner, Unschedulable)
    assert sooner.retry_after == 2  # the lease of "a" ends first


def test_a_revoked_reservation_frees_its_capacity_and_is_acknowledged_by_its_release(
    make_store: StoreFactory,
) -> None:
    """Contract v1.2 revocation: the RM takes a committed reservation back; the capacity returns at
    once, the row reads revoked (with why and when) across a reopen until its pod's release
    acknowledges it, and a release naming another pod acknowledges nothing."""
    now = [1000.0]
    store = make_store(clock=lambda: now[0])
    placed = store.reserve(request("a", "2"), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    rid = placed.reservation.id
    assert isinstance(store.commit(rid), StoredReservation)
    assert isinstance(store.revoke("nope", reason="x"), NotFound)
    now[0] = 1005.0
    revoked = store.revoke(rid, reason="scancel by root")
    assert isinstance(revoked, StoredReservation)
    assert (revoked.state, revoked.revoked_reason, revoked.revoked_at) == (
        ReservationState.REVOKED,
        "scancel by root",
        1005.0,
    )
    assert store.usage()["n1"]["cpu"] == 0
    assert store.revoke(rid, reason="again") == revoked  # idempotent: the first reason stays
    assert isinstance(store.commit(rid), NotActive)
    assert isinstance(store.reserve(request("b", "2"), nodes=NODES, policy=Policy.BINPACK), Placed)
    store.close()
    reopened = make_store(clock=lambda: now[0])
    items, _ = reopened.list(state=ReservationState.REVOKED, limit=10)
    assert [item.id for item in items] == [rid]
    assert reopened.release(rid, pod_uid="someone-else") is None
    assert [item.id for item in reopened.list(state=ReservationState.REVOKED, limit=10)[0]] == [rid]
    assert reopened.release(rid, pod_uid="a") is None  # nothing held: 204 either way
    assert reopened.list(state=ReservationState.REVOKED, limit=10)[0] == []
    acknowledged = reopened.get(rid)
    assert acknowledged is not None
    assert (acknowledged.state, acknowledged.revoked_reason) == (ReservationState.RELEASED, "scancel by root")
    both, _ = reopened.list(state=(ReservationState.RELEASED, ReservationState.REVOKED), limit=10)
    assert [item.id for item in both] == [rid]
    assert isinstance(reopened.revoke(rid, reason="late"), NotActive)
    reopened.close()
