"""Pure accounting of the pods the reference RM did not place (no I/O).

The arithmetic is kube-scheduler's ``NodeInfo``: init containers, sidecars, overhead, in-place
resize status, terminal pods; plus the rule that a pod bound with one of the RM's own active
reservations counts once, and only when the reservation was made for that very pod on that node.
"""

from __future__ import annotations

import pathlib
import sqlite3
from decimal import Decimal
from typing import Any

import pytest

from bindery.podresources import PodResourcesError, effective_requests
from bindery.reference_rm.accounting import (
    RESERVATION_ANNOTATION,
    BoundPod,
    ClusterPods,
    bound_pod,
    describe_foreign,
    foreign_usage,
)
from bindery.reference_rm.mirror import MirrorGate
from bindery.reference_rm.placement import InventoryNode, Policy, choose_node
from bindery.reference_rm.store import Placed, ReservationStore, Unschedulable
from bindery.rm.models import Placement, PodIdentity, ReservationRequest
from bindery.scheduling.framework import RESERVATION_ANNOTATION as BINDER_ANNOTATION
from tests.rm.conftest import StoreFactory


def container(name: str, *, restart: str | None = None, **requests: str) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "resources": {"requests": dict(requests)}}
    if restart:
        body["restartPolicy"] = restart
    return body


def pod(
    uid: str,
    *,
    node: str | None = "n1",
    phase: str = "Running",
    claim: str | None = None,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body_spec = spec or {"containers": [container("app", cpu="1")]}
    if node is not None:
        body_spec = {**body_spec, "nodeName": node}
    return {
        "metadata": {
            "uid": uid,
            "namespace": "ns",
            "name": uid,
            "annotations": {RESERVATION_ANNOTATION: claim} if claim else {},
        },
        "spec": body_spec,
        "status": {"phase": phase, **(status or {})},
    }


def usage(**amounts: str) -> dict[str, Decimal]:
    return {name: Decimal(value) for name, value in amounts.items()}


def test_the_annotation_is_the_one_the_binder_writes() -> None:
    assert RESERVATION_ANNOTATION == BINDER_ANNOTATION


# -- effective requests, as kube-scheduler's NodeInfo counts them --------------------------------


def test_init_containers_run_one_after_another_and_the_peak_wins() -> None:
    spec = {
        "initContainers": [container("migrate", cpu="3"), container("warm", cpu="1")],
        "containers": [container("app", cpu="1"), container("log", cpu="500m")],
    }
    assert effective_requests(spec=spec)["cpu"] == Decimal(3)


def test_sidecars_run_alongside_everything_started_after_them() -> None:
    # sidecar 1 + init 2 = 3 during init; then sidecar 1 + app 1 = 2; the peak is 3.
    spec = {
        "initContainers": [container("proxy", restart="Always", cpu="1"), container("setup", cpu="2")],
        "containers": [container("app", cpu="1")],
    }
    assert effective_requests(spec=spec)["cpu"] == Decimal(3)
    # A sidecar started after the init container does not add to its phase: max(2, 1 + 1) = 2.
    later = {
        "initContainers": [container("setup", cpu="2"), container("proxy", restart="Always", cpu="1")],
        "containers": [container("app", cpu="1")],
    }
    assert effective_requests(spec=later)["cpu"] == Decimal(2)


def test_overhead_is_added_on_top() -> None:
    spec = {"containers": [container("app", cpu="1", memory="1Gi")], "overhead": {"cpu": "250m"}}
    assert effective_requests(spec=spec) == usage(cpu="1.25", memory=str(2**30))


def test_a_pending_resize_counts_the_larger_of_spec_and_what_the_kubelet_reports() -> None:
    spec = {"containers": [container("app", cpu="1")]}
    growing = {"containerStatuses": [{"name": "app", "resources": {"requests": {"cpu": "2"}}}]}
    assert effective_requests(spec=spec, status=growing)["cpu"] == Decimal(2)
    allocated = {"containerStatuses": [{"name": "app", "resources": {}, "allocatedResources": {"cpu": "3"}}]}
    assert effective_requests(spec=spec, status=allocated)["cpu"] == Decimal(3)
    # Infeasible: the spec is not what runs; the actuated/allocated requests are.
    infeasible = {
        "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}],
        "containerStatuses": [{"name": "app", "resources": {"requests": {"cpu": "500m"}}}],
    }
    big = {"containers": [container("app", cpu="8")]}
    assert effective_requests(spec=big, status=infeasible)["cpu"] == Decimal("0.5")
    # No kubelet report: the spec alone (and what the scheduler asks the RM for is unchanged).
    assert effective_requests(spec=spec, status={"phase": "Pending"})["cpu"] == Decimal(1)


def test_an_unparsable_quantity_names_the_container() -> None:
    with pytest.raises(PodResourcesError, match="container 'app' has an invalid quantity for cpu"):
        effective_requests(spec={"containers": [container("app", cpu="lots")]})


def test_a_bound_pod_uses_its_requests_and_one_pod_slot() -> None:
    spec = {
        "initContainers": [container("proxy", restart="Always", cpu="500m")],
        "containers": [container("app", cpu="1", memory="1Gi")],
        "overhead": {"memory": "64Mi"},
    }
    projected = bound_pod(pod("u1", spec=spec))
    assert projected is not None
    assert projected.node == "n1"
    assert projected.usage == usage(cpu="1.5", memory=str(2**30 + 64 * 2**20), pods="1")


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pods_use_nothing(phase: str) -> None:
    assert bound_pod(pod("u1", phase=phase)) is None


def test_unbound_pods_use_nothing_and_terminating_ones_still_do() -> None:
    assert bound_pod(pod("u1", node=None, phase="Pending")) is None
    terminating = pod("u2")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert bound_pod(terminating) is not None


# -- counted once: the RM's own reservation vs. the pod that carries it --------------------------


def claims(*pods: dict[str, Any]) -> ClusterPods:
    projected = [bound_pod(p) for p in pods]
    return ClusterPods.of(p for p in projected if p is not None)


def test_a_pod_bound_with_its_own_active_reservation_counts_once() -> None:
    snapshot = claims(pod("mine", claim="rsv-1"), pod("other"))
    foreign = foreign_usage(snapshot, owners={"rsv-1": ("mine", "n1")})
    assert foreign["n1"].usage == usage(cpu="1", pods="1")
    assert foreign["n1"].count == 1


def test_a_copied_annotation_with_another_uid_counts_as_its_own_pod() -> None:
    snapshot = claims(pod("mine", claim="rsv-1"), pod("tenant", claim="rsv-1"))
    foreign = foreign_usage(snapshot, owners={"rsv-1": ("mine", "n1")})
    assert foreign["n1"].count == 1
    assert foreign["n1"].usage == usage(cpu="1", pods="1")  # the tenant's pod; "mine" is counted once


def test_a_claim_on_another_node_or_of_an_inactive_reservation_counts() -> None:
    # The reservation holds n2, the pod runs on n1: both use capacity, each on its node.
    moved = claims(pod("mine", claim="rsv-1"))
    assert foreign_usage(moved, owners={"rsv-1": ("mine", "n2")})["n1"].count == 1
    # Released or expired (absent from the active owners): the pod is all that remains, it counts.
    assert foreign_usage(moved, owners={})["n1"].count == 1


def test_a_node_whose_pods_are_all_accounted_has_no_foreign_usage() -> None:
    assert foreign_usage(claims(pod("mine", claim="rsv-1")), owners={"rsv-1": ("mine", "n1")}) == {}


def test_with_node_replaces_one_node_and_shares_the_rest() -> None:
    snapshot = claims(pod("a"), pod("b", node="n2"))
    after = snapshot.with_node("n1", [])
    assert set(after.nodes) == {"n2"}
    assert after.nodes["n2"] is snapshot.nodes["n2"]
    assert set(snapshot.nodes) == {"n1", "n2"}  # the published snapshot never changes


# -- placement and its reason -----------------------------------------------------------------


def four_cpu(name: str) -> InventoryNode:
    return InventoryNode(name=name, allocatable=usage(cpu="4", memory=str(8 * 2**30), pods="110"))


def test_scenario_1_in_pure_placement() -> None:
    nodes = [four_cpu("n1"), four_cpu("n2")]
    snapshot = ClusterPods.of(
        [
            BoundPod(uid="x1", key="kube/x1", node="n1", usage=usage(cpu="3", pods="1")),
            BoundPod(uid="x2", key="kube/x2", node="n2", usage=usage(cpu="3", pods="1")),
        ]
    )
    decision = choose_node(
        nodes=nodes,
        requests=usage(cpu="2"),
        usage_by_node={},
        node_selector={},
        affinity_terms=[],
        tolerations=[],
        policy=Policy.BINPACK,
        foreign=foreign_usage(snapshot, owners={}),
    )
    assert decision.node is None
    assert decision.reason == (
        "0/2 nodes are available: 2 Insufficient cpu. Pods this RM did not place use "
        "node n1: 3 cpu (1 pod); node n2: 3 cpu (1 pod)."
    )


def test_the_reason_names_only_nodes_that_lacked_room_and_stays_one_short_line() -> None:
    foreign = foreign_usage(
        ClusterPods.of(
            BoundPod(uid=f"x{i}", key=f"k/x{i}", node=f"n{i}", usage=usage(cpu="1", memory="5", pods="1"))
            for i in range(6)
        ),
        owners={},
    )
    text = describe_foreign(foreign=foreign, short={f"n{i}": ["cpu"] for i in range(1, 6)})
    assert text == (
        "Pods this RM did not place use node n1: 1 cpu (1 pod); node n2: 1 cpu (1 pod); "
        "node n3: 1 cpu (1 pod); and 2 more nodes."
    )
    assert describe_foreign(foreign=foreign, short={"n0": ["nvidia.com/gpu"]}) == ""
    assert describe_foreign(foreign=foreign, short={"n0": ["pods"]}) == (
        "Pods this RM did not place use node n0: 1 pod."
    )


# -- the store resolves claims against its own active reservations, inside the writer ----------


def reservation_request(uid: str, cpu: str) -> ReservationRequest:
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="ns", name=uid, scheduler_name="bindery"),
        resources={"cpu": cpu},
        placement=Placement(),
        idempotency_key=uid,
        ttl_seconds=60,
    )


def test_store_counts_foreign_pods_once_and_a_released_reservation_leaves_its_pod_counted(
    tmp_path: pathlib.Path,
) -> None:
    store = ReservationStore(tmp_path / "rm.sqlite")
    nodes = [four_cpu("n1")]
    placed = store.reserve(reservation_request("mine", "2"), nodes=nodes, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    rsv = placed.reservation.id
    spec = {"containers": [container("app", cpu="2")]}
    bound = claims(
        pod("mine", claim=rsv, spec=spec),  # the pod of that reservation: counted once
        pod("copy", claim=rsv, spec={"containers": [container("app", cpu="1")]}),  # a copy: counts
    )
    # In use: 2 (reservation) + 1 (copy) = 3 of 4.
    fits = store.reserve(reservation_request("one", "1"), nodes=nodes, policy=Policy.BINPACK, pods=bound)
    assert isinstance(fits, Placed)
    full = store.reserve(reservation_request("more", "1"), nodes=nodes, policy=Policy.BINPACK, pods=bound)
    assert isinstance(full, Unschedulable)
    assert full.reason == (
        "0/1 nodes are available: 1 Insufficient cpu. Pods this RM did not place use node n1: 1 cpu (1 pod)."
    )
    # Released (say, by reconciliation) while its pod still runs: the pod now counts instead.
    store.release(rsv)
    still_full = store.reserve(
        reservation_request("again", "1"), nodes=nodes, policy=Policy.BINPACK, pods=bound
    )
    assert isinstance(still_full, Unschedulable)
    assert "node n1: 3 cpu (2 pods)" in still_full.reason
    store.close()


def test_a_reservation_that_expires_leaves_its_pod_counted_with_the_same_snapshot(
    tmp_path: pathlib.Path,
) -> None:
    now = [1000.0]
    store = ReservationStore(tmp_path / "rm.sqlite", clock=lambda: now[0])
    nodes = [four_cpu("n1")]
    placed = store.reserve(reservation_request("mine", "2"), nodes=nodes, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    bound = claims(pod("mine", claim=placed.reservation.id, spec={"containers": [container("a", cpu="2")]}))
    first = store.reserve(reservation_request("one", "2"), nodes=nodes, policy=Policy.BINPACK, pods=bound)
    assert isinstance(first, Placed)  # 2 + 2 of 4: the pod is its reservation, counted once
    store.release(first.reservation.id)
    now[0] += 120  # "mine" was never committed: its lease runs out, its pod still runs
    again = store.reserve(reservation_request("two", "3"), nodes=nodes, policy=Policy.BINPACK, pods=bound)
    assert isinstance(again, Unschedulable)
    assert "node n1: 2 cpu (1 pod)" in again.reason
    store.close()


def test_a_reservation_deactivated_by_any_write_leaves_its_pod_counted(tmp_path: pathlib.Path) -> None:
    """The store must not trust a node it resolved before once a reservation stops being active,
    even through a write it did not make itself (another code path, an operator's SQL)."""
    store = ReservationStore(tmp_path / "rm.sqlite")
    nodes = [four_cpu("n1")]
    placed = store.reserve(reservation_request("mine", "2"), nodes=nodes, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    bound = claims(pod("mine", claim=placed.reservation.id, spec={"containers": [container("a", cpu="2")]}))
    assert isinstance(
        store.reserve(reservation_request("probe", "1"), nodes=nodes, policy=Policy.BINPACK, pods=bound),
        Placed,
    )
    with sqlite3.connect(tmp_path / "rm.sqlite") as other:
        other.execute("UPDATE reservations SET state = 'released' WHERE id = ?", (placed.reservation.id,))
    # In use now: the probe's 1 + the pod's 2 (its reservation no longer holds it) = 3 of 4.
    full = store.reserve(reservation_request("more", "2"), nodes=nodes, policy=Policy.BINPACK, pods=bound)
    assert isinstance(full, Unschedulable)
    assert "node n1: 2 cpu (1 pod)" in full.reason
    store.close()


def test_a_reserve_resolves_only_the_claims_of_nodes_whose_pods_changed(tmp_path: pathlib.Path) -> None:
    """Resolving every bound pod's claim at every reserve made a backlog cost O(pods²) in the RM."""
    store = ReservationStore(tmp_path / "rm.sqlite")
    nodes = [four_cpu(f"n{i}") for i in range(1, 11)]
    bound: list[dict[str, Any]] = []
    for i in range(10):
        placed = store.reserve(reservation_request(f"p{i}", "100m"), nodes=nodes, policy=Policy.BINPACK)
        assert isinstance(placed, Placed)
        bound.append(pod(f"p{i}", node=f"n{i + 1}", claim=placed.reservation.id))
    snapshot = claims(*bound)
    assert isinstance(
        store.reserve(reservation_request("warm", "100m"), nodes=nodes, policy=Policy.BINPACK, pods=snapshot),
        Placed,
    )
    looked_up: list[str] = []
    store._db.set_trace_callback(lambda sql: looked_up.append(sql) if "json_each" in sql else None)
    one_more = pod("late", node="n3", claim="rsv-nobody")
    changed = snapshot.with_node("n3", [p for p in (bound_pod(bound[2]), bound_pod(one_more)) if p])
    placed = store.reserve(
        reservation_request("next", "100m"), nodes=nodes, policy=Policy.BINPACK, pods=changed
    )
    assert isinstance(placed, Placed)
    assert len(looked_up) == 1
    assert "rsv-nobody" in looked_up[0]
    assert bound[0]["metadata"]["annotations"][RESERVATION_ANNOTATION] not in looked_up[0]  # n1 unchanged
    store.close()


# -- readiness: the inventory reaches the server only once the pods are known ----------------------


def test_the_gate_holds_the_nodes_until_the_first_pod_list() -> None:
    published: list[tuple[str, object]] = []
    gate = MirrorGate(
        set_inventory=lambda nodes: published.append(("nodes", tuple(nodes))),
        set_bound_pods=lambda pods: published.append(("pods", pods)),
    )
    first, second = (four_cpu("n1"),), (four_cpu("n1"), four_cpu("n2"))
    gate.nodes(first)
    gate.nodes(second)
    assert published == []  # not ready: nothing is known about the pods on these nodes
    empty = ClusterPods()
    gate.pods(empty)
    assert published == [("pods", empty), ("nodes", second)]  # pods first: never nodes without pods
    gate.nodes(first)
    assert published[-1] == ("nodes", first)


def test_a_pod_resized_in_place_counts_what_it_grew_past_its_reservation(make_store: StoreFactory) -> None:
    """Issue 19: a Bindery-placed pod resized in place from 1 to 3 CPUs was still counted at 1 (its
    reservation's size), so the RM sold the 2 CPUs it had grown into. Its reservation counts the 1,
    and the growth counts on top; a pod that shrank keeps its reservation's size until released.
    On both stores (SQLite and PostgreSQL)."""
    store = make_store()
    nodes = [four_cpu("n1")]
    placed = store.reserve(reservation_request("mine", "1"), nodes=nodes, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    rsv = placed.reservation.id
    grown = {"containers": [container("app", cpu="3")]}
    resized = claims(pod("mine", claim=rsv, spec=grown))
    full = store.reserve(reservation_request("next", "2"), nodes=nodes, policy=Policy.BINPACK, pods=resized)
    assert isinstance(full, Unschedulable)  # 3 of 4 in use: before, 1 + 2 fitted
    assert "Insufficient cpu" in full.reason
    fits = store.reserve(reservation_request("small", "1"), nodes=nodes, policy=Policy.BINPACK, pods=resized)
    assert isinstance(fits, Placed)  # exactly the 1 left: the pod is not counted twice either
    store.release(fits.reservation.id)
    shrunk = claims(pod("mine", claim=rsv, spec={"containers": [container("app", cpu="500m")]}))
    still = store.reserve(reservation_request("more", "3.5"), nodes=nodes, policy=Policy.BINPACK, pods=shrunk)
    assert isinstance(still, Unschedulable)  # the reservation still holds 1
    store.close()
