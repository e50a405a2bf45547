"""Unit tests of the pure decisions of reconciliation and of the bound-pod watch's relist diff."""

from __future__ import annotations

from typing import Any

import pytest

from bindery.config import ConfigError, parse_resource_manager
from bindery.config.resourcemanager import reconcile_interval
from bindery.controller.reservations.boundpods import remembered
from bindery.controller.reservations.fate import Settle, reservation_to_release
from bindery.controller.reservations.reconcile import (
    in_scope,
    missing_reservations,
    reconcile_action,
    surplus,
    unscoped_action,
)
from bindery.controller.reservations.restore import restore_refused, restore_request
from bindery.rm.models import Reservation
from bindery.scheduling.framework import RESERVATION_ANNOTATION


def _reservation(state: str = "reserved", **overrides: Any) -> Reservation:
    fields: dict[str, Any] = {
        "id": "r1",
        "node": "n1",
        "state": state,
        "podUid": "u-1",
        "schedulerName": "bindery",
        "namespace": "ns",
        "name": "p",
    }
    fields.update(overrides)
    return Reservation.model_validate(fields)


def _pod(
    uid: str = "u-1",
    node: str | None = "n1",
    phase: str = "Running",
    reservation: str | None = "r1",
    **metadata: Any,
) -> dict[str, Any]:
    annotations = {RESERVATION_ANNOTATION: reservation} if reservation else {}
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": "p", "annotations": annotations, **metadata},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def test_a_pending_pod_keeps_its_reservation_whatever_its_state() -> None:
    pending = _pod(node=None, phase="Pending")
    assert reconcile_action(reservation=_reservation("reserved"), pod=pending) is None
    assert reconcile_action(reservation=_reservation("committed"), pod=pending) is None


def test_a_reserved_reservation_of_a_pod_bound_to_its_node_is_committed_once() -> None:
    assert reconcile_action(reservation=_reservation("reserved"), pod=_pod()) is Settle.COMMIT
    assert reconcile_action(reservation=_reservation("committed"), pod=_pod()) is None


def test_the_reservation_annotation_is_never_a_reason_to_release() -> None:
    """Issue 20, scenario 7: its pod (same UID) runs on its node, whatever the pod's annotation says
    (`kubectl annotate pod p bindery.dev/reservation-id=x --overwrite`, or removed, or another
    reservation's id): a committed reservation is kept, a reserved one committed."""
    for holder in (None, "x", "r0"):
        pod = _pod(reservation=holder)
        assert reconcile_action(reservation=_reservation("reserved"), pod=pod) is Settle.COMMIT
        assert reconcile_action(reservation=_reservation("committed"), pod=pod) is None


def test_gone_replaced_elsewhere_or_finished_pods_release_either_state() -> None:
    for state in ("reserved", "committed"):
        reservation = _reservation(state)
        assert reconcile_action(reservation=reservation, pod=None) is Settle.RELEASE
        assert reconcile_action(reservation=reservation, pod=_pod(uid="u-2")) is Settle.RELEASE
        assert reconcile_action(reservation=reservation, pod=_pod(node="n2")) is Settle.RELEASE
        for phase in ("Succeeded", "Failed"):
            assert reconcile_action(reservation=reservation, pod=_pod(phase=phase)) is Settle.RELEASE


def test_a_namespaced_operator_touches_only_its_namespaces() -> None:
    assert in_scope(reservation=_reservation(), namespaces=())
    assert in_scope(reservation=_reservation(), namespaces=("ns",))
    assert not in_scope(reservation=_reservation(), namespaces=("other",))
    assert not in_scope(reservation=_reservation(namespace=None), namespaces=("ns",))


def test_missing_reservations_are_bound_running_pods_without_one_not_yet_warned() -> None:
    pods = [
        _pod(uid="held"),
        _pod(uid="missing"),
        _pod(uid="warned"),
        _pod(uid="finished", phase="Succeeded"),
        _pod(uid="leaving", deletionTimestamp="2026-01-01T00:00:00Z"),
    ]
    found = missing_reservations(bound_pods=pods, active_pod_uids={"held"}, warned={"warned"})
    assert [p["metadata"]["uid"] for p in found] == ["missing"]


def test_the_watch_remembers_of_a_bound_pod_what_its_release_needs() -> None:
    pod = _pod(annotations={RESERVATION_ANNOTATION: "r1"})
    kept = remembered(pod)
    assert kept["spec"] == {"nodeName": "n1", "schedulerName": pod["spec"].get("schedulerName")}
    assert "status" not in kept  # running: the phase is kept only once terminal (a late profile's replay)
    assert kept["metadata"]["annotations"] == {RESERVATION_ANNOTATION: "r1"}
    assert kept["metadata"]["uid"] == pod["metadata"]["uid"]
    # The stand-in DELETED of a pod that vanished between two lists releases its reservation.
    assert reservation_to_release(event_type="DELETED", pod=kept) == "r1"
    outside = remembered(_pod(reservation=None))  # bound outside Bindery: its identity only
    assert set(outside) == {"metadata"}
    assert reservation_to_release(event_type="DELETED", pod=outside) is None


def _rm_body(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "rm1", "uid": "u-1", "generation": 1},
        "spec": {"schedulerNames": ["bindery"], "endpoint": "https://rm.example", **spec},
    }


def test_the_reconcile_interval_defaults_to_30s_and_stays_within_half_the_lease() -> None:
    assert parse_resource_manager(body=_rm_body()).reconcile_interval_seconds == 30
    assert parse_resource_manager(body=_rm_body(reconcileIntervalSeconds=7)).reconcile_interval_seconds == 7
    short_lease = _rm_body(reconcileIntervalSeconds=30, reservationTTLSeconds=20)
    assert parse_resource_manager(body=short_lease).reconcile_interval_seconds == 10
    assert reconcile_interval(configured=300, reservation_ttl_seconds=60) == 30
    with pytest.raises(ConfigError, match=r"spec\.reconcileIntervalSeconds"):
        parse_resource_manager(body=_rm_body(reconcileIntervalSeconds=1))


@pytest.mark.parametrize("seen_here", [False, True])
def test_an_unscoped_reservation_is_settled_only_by_its_pods_uid(seen_here: bool) -> None:
    """A reservation made before the cluster-id upgrade may be another cluster's: only a pod of its
    UID here is ours. A pod under its name with another UID, or none, is another cluster's, unless
    an earlier pass found that UID here (then its pod is gone)."""
    reserved, committed = _reservation("reserved"), _reservation("committed")
    gone = Settle.RELEASE if seen_here else None
    assert unscoped_action(reservation=reserved, pod=_pod(), seen_here=seen_here) is Settle.COMMIT
    assert unscoped_action(reservation=committed, pod=_pod(), seen_here=seen_here) is None
    assert unscoped_action(reservation=reserved, pod=_pod(node="n2"), seen_here=seen_here) is Settle.RELEASE
    assert (
        unscoped_action(reservation=committed, pod=_pod(phase="Succeeded"), seen_here=seen_here)
        is Settle.RELEASE
    )
    assert unscoped_action(reservation=reserved, pod=_pod(node=None), seen_here=seen_here) is None
    assert unscoped_action(reservation=committed, pod=_pod(uid="u-2"), seen_here=seen_here) is gone
    assert unscoped_action(reservation=committed, pod=None, seen_here=seen_here) is gone


def test_surplus_keeps_the_committed_then_the_oldest_reservation_of_a_running_pod() -> None:
    """Several active reservations for one running pod on its node: one is kept (committed first,
    then the oldest), the others are surplus. Pending pods, other nodes and single ones are not."""
    pods = {"u-1": _pod(), "u-2": _pod(uid="u-2"), "u-3": _pod(uid="u-3", node=None, phase="Pending")}
    old, new = "2026-12-01T00:00:00Z", "2026-12-01T00:01:00Z"
    one_reserved = _reservation("reserved", id="a", createdAt=old)
    one_committed = _reservation("committed", id="b", createdAt=new)
    one_elsewhere = _reservation("reserved", id="c", node="n2", createdAt=old)
    two_old = _reservation("reserved", id="d", podUid="u-2", createdAt=old)
    two_new = _reservation("reserved", id="e", podUid="u-2", createdAt=new)
    pending = [_reservation("reserved", id=i, podUid="u-3") for i in ("f", "g")]
    found = surplus([one_reserved, one_committed, one_elsewhere, two_new, two_old, *pending], pods)
    assert {extra: kept.id for extra, kept in found.items()} == {"a": "b", "e": "d"}
    assert surplus([one_reserved], pods) == {}


def test_surplus_keeps_the_reservation_the_pod_was_bound_with() -> None:
    """An unconfirmed Binding left r-old; the retry reserved r-new and bound the pod with it (the
    annotation names r-new). Keeping r-old would release the one PostBind is about to commit, and an
    RM that recognises its pods by the annotation would count the pod as foreign and r-old as well:
    the node's room held twice. The reservation the pod names wins over age and commitment."""
    pods = {"u-1": _pod(reservation="r-new")}
    old, new = "2026-12-01T00:00:00Z", "2026-12-01T00:01:00Z"
    stale = _reservation("reserved", id="r-old", createdAt=old)
    bound_with = _reservation("reserved", id="r-new", createdAt=new)
    found = surplus([stale, bound_with], pods)
    assert {extra: kept.id for extra, kept in found.items()} == {"r-old": "r-new"}
    committed_stale = _reservation("committed", id="r-old", createdAt=old)
    found = surplus([committed_stale, bound_with], pods)
    assert {extra: kept.id for extra, kept in found.items()} == {"r-old": "r-new"}


def test_one_reservation_listed_twice_is_never_its_own_surplus() -> None:
    """A pass lists reserved reservations, then committed ones. A pod's PostBind commit landing
    between the two lists shows its one reservation in both, once reserved and once committed.
    Taken as two reservations, the committed copy was kept and the reserved copy released: the same
    id, so the running pod's only reservation was released (chaos apiserver-restart, rehearsal 2:
    `release reserved reservation rsv-78fd… (surplus: the pod runs on committed reservation
    rsv-78fd…)`, then `bound … but … holds no active reservation`)."""
    pods = {"u-1": _pod(reservation="r1")}
    as_reserved = _reservation("reserved", id="r1")
    as_committed = _reservation("committed", id="r1")
    assert surplus([as_reserved, as_committed], pods) == {}
    assert surplus([as_committed, as_reserved], pods) == {}
    # A real second reservation is still surplus, whichever copies of the first are listed.
    other = _reservation("reserved", id="r2")
    assert {k: v.id for k, v in surplus([as_reserved, other, as_committed], pods).items()} == {"r2": "r1"}


def test_a_restore_asks_for_the_pods_room_on_its_node_only_and_never_preempts() -> None:
    """What the reconcile pass sends to give a bound pod its lost reservation back: pinned to the node
    it runs on (its own node selector and affinity dropped: it is there already), tolerations kept, no
    preemption, a key of its own so a retry after a lost answer replays the same reservation."""
    pod = {
        "metadata": {
            "uid": "u-1",
            "namespace": "ns",
            "name": "web-1",
            "annotations": {RESERVATION_ANNOTATION: "r-lost"},
        },
        "spec": {
            "nodeName": "n7",
            "schedulerName": "bindery",
            "nodeSelector": {"zone": "a"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
                    }
                }
            },
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}],
        },
    }
    request = restore_request(pod=pod, lost="r-lost")
    body = request.model_dump(by_alias=True, exclude_none=True)
    assert body["placement"] == {
        "nodeSelector": {},
        "requiredNodeAffinity": [
            {
                "matchExpressions": [],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}],
            }
        ],
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    }
    assert body["resources"] == {"cpu": "500m", "memory": "1Gi"}
    assert body["preemptionPolicy"] == "Never"
    assert body["idempotencyKey"] == "restore:r-lost:u-1"
    assert body["pod"]["uid"] == "u-1"


@pytest.mark.parametrize(
    ("states", "own", "refused"),
    [
        ((), (), False),  # the RM lists nothing of the pod: lost
        (("expired",), (), False),  # slurmctld lost the commit; the job ended unclaimed
        (("released",), (), True),  # released on purpose (Bindery, an administrator)
        (("expired", "revoked"), (), True),  # taken back by the RM
        (("released",), ("r0",), False),  # a failed restore's own release does not count
    ],
)
def test_only_a_reservation_the_rm_lost_or_let_expire_is_restored(
    states: tuple[str, ...], own: tuple[str, ...], refused: bool
) -> None:
    history = [_reservation(state, id=f"r{i}") for i, state in enumerate(states)]
    assert (restore_refused(history, own=own) is not None) is refused
