"""Pure group placement (``bindery.reference_rm.groups``): every member or none, topology, and the reason
a group does not fit, which must be about the GROUP."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from bindery.reference_rm.accounting import Foreign
from bindery.reference_rm.groups import MemberAsk, _attempt, _size_order, place_group
from bindery.reference_rm.placement import InventoryNode, Policy, add_usage, choose_node, effective_usage

ZONE = "topology.kubernetes.io/zone"


def node(name: str, cpu: str, zone: str | None = None, **labels: str) -> InventoryNode:
    all_labels = {**labels, **({ZONE: zone} if zone else {})}
    return InventoryNode(name=name, allocatable={"cpu": Decimal(cpu)}, labels=all_labels)


def members(count: int, cpu: str = "1") -> list[MemberAsk]:
    return [MemberAsk(label=f"ns/w-{i}", requests={"cpu": Decimal(cpu)}) for i in range(count)]


def test_a_group_that_fits_gets_a_node_per_member_in_request_order() -> None:
    nodes = [node("n1", "4"), node("n2", "4")]
    decision = place_group(
        group="ns/g",
        members=members(8),
        topology_keys=[],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert decision.nodes is not None
    assert sorted(decision.nodes) == ["n1"] * 4 + ["n2"] * 4
    assert decision.topology_value == {}


def test_a_group_one_pod_too_big_gets_no_node_and_the_groups_reason() -> None:
    nodes = [node("n1", "4"), node("n2", "3")]
    decision = place_group(
        group="ns/g",
        members=members(8),
        topology_keys=[],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert decision.nodes is None
    assert decision.reason == (
        "group ns/g needs 8 pods of 1 cpu reserved together; the RM could place only 7 of them, "
        "for member ns/w-7: 0/2 nodes are available: 2 Insufficient cpu."
    )


def test_capacity_in_use_counts() -> None:
    nodes = [node("n1", "4"), node("n2", "4")]
    used = {"n1": {"cpu": Decimal(1)}}
    decision = place_group(
        group="ns/g",
        members=members(8),
        topology_keys=[],
        nodes=nodes,
        usage_by_node=used,
        policy=Policy.SPREAD,
    )
    assert decision.nodes is None
    assert "only 7 of them" in decision.reason


def test_topology_puts_every_member_in_one_value_of_the_key() -> None:
    nodes = [node("a1", "2", "a"), node("a2", "2", "a"), node("b1", "3", "b"), node("b2", "3", "b")]
    decision = place_group(
        group="ns/g",
        members=members(5),
        topology_keys=[ZONE],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.SPREAD,
    )
    assert decision.nodes is not None
    assert set(decision.nodes) <= {"b1", "b2"}  # zone a holds only 4
    assert decision.topology_value == {ZONE: "b"}


def test_binpack_takes_the_domain_left_fullest_and_spread_the_emptiest() -> None:
    nodes = [node("a1", "4", "a"), node("b1", "8", "b")]
    binpack = place_group(
        group="ns/g",
        members=members(4),
        topology_keys=[ZONE],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    spread = place_group(
        group="ns/g",
        members=members(4),
        topology_keys=[ZONE],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.SPREAD,
    )
    assert binpack.topology_value == {ZONE: "a"}
    assert spread.topology_value == {ZONE: "b"}


def test_topology_reason_names_the_most_any_value_holds_and_unlabelled_nodes() -> None:
    nodes = [node("a1", "4", "a"), node("a2", "3", "a"), node("b1", "5", "b"), node("x", "64")]
    decision = place_group(
        group="ns/g",
        members=members(8),
        topology_keys=[ZONE],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert decision.nodes is None
    assert decision.reason == (
        f"group ns/g needs 8 pods of 1 cpu on nodes sharing one value of {ZONE}; the most any value holds "
        f"is 7 ({ZONE}=a; 2 values tried), for member ns/w-7: 0/2 nodes are available: 2 Insufficient cpu. "
        "1 node lacks the label and takes no member."
    )


def test_no_node_with_the_label() -> None:
    decision = place_group(
        group="ns/g",
        members=members(2),
        topology_keys=["rack"],
        nodes=[node("n1", "8")],
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert decision.nodes is None
    assert (
        decision.reason == "group ns/g needs 2 pods of 1 cpu on nodes sharing one value of rack; "
        "none of the 1 nodes has the label rack."
    )


def test_two_keys_make_one_domain_per_combination() -> None:
    nodes = [
        InventoryNode(name="r1", allocatable={"cpu": Decimal(2)}, labels={"zone": "a", "rack": "1"}),
        InventoryNode(name="r2", allocatable={"cpu": Decimal(2)}, labels={"zone": "a", "rack": "2"}),
    ]
    decision = place_group(
        group="ns/g",
        members=members(3),
        topology_keys=["zone", "rack"],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert decision.nodes is None
    assert "the most any value holds is 2 (zone=a, rack=1; 2 values tried)" in decision.reason


def test_largest_members_are_placed_first() -> None:
    """Request order small, small, big on 2+2 cpu: in that order the big one would find no room."""
    asks = [
        MemberAsk(label="ns/s1", requests={"cpu": Decimal(1)}),
        MemberAsk(label="ns/s2", requests={"cpu": Decimal(1)}),
        MemberAsk(label="ns/big", requests={"cpu": Decimal(2)}),
    ]
    decision = place_group(
        group="ns/g",
        members=asks,
        topology_keys=[],
        nodes=[node("n1", "2"), node("n2", "2")],
        usage_by_node={},
        policy=Policy.SPREAD,
    )
    assert decision.nodes is not None
    assert decision.nodes[0] == decision.nodes[1] != decision.nodes[2]


def test_member_constraints_apply_per_member() -> None:
    nodes = [node("n1", "4", gpu="yes"), node("n2", "4")]
    asks = [
        MemberAsk(label="ns/a", requests={"cpu": Decimal(1)}, node_selector={"gpu": "yes"}),
        MemberAsk(label="ns/b", requests={"cpu": Decimal(1)}, node_selector={"gpu": "no"}),
    ]
    decision = place_group(
        group="ns/g", members=asks, topology_keys=[], nodes=nodes, usage_by_node={}, policy=Policy.BINPACK
    )
    assert decision.nodes is None
    assert decision.reason.endswith(
        "for member ns/b: 0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    )
    assert "needs 2 pods of 1 cpu" in decision.reason


def test_pods_the_rm_did_not_place_are_counted_and_named() -> None:
    nodes = [node("n1", "2")]
    foreign = {"n1": Foreign(usage={"cpu": Decimal(1)}, count=1)}
    decision = place_group(
        group="ns/g",
        members=members(2),
        topology_keys=[],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.BINPACK,
        foreign=foreign,
    )
    assert decision.nodes is None
    assert "Pods this RM did not place use node n1: 1 cpu (1 pod)." in decision.reason


def test_mixed_members_are_counted_not_described() -> None:
    asks = [
        MemberAsk(label="ns/a", requests={"cpu": Decimal(1)}),
        MemberAsk(label="ns/b", requests={"cpu": Decimal(9)}),
    ]
    decision = place_group(
        group="ns/g",
        members=asks,
        topology_keys=[],
        nodes=[node("n1", "4")],
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert decision.reason.startswith(
        "group ns/g needs 2 pods reserved together; the RM could place only 1 of them"
    )


def _naive(
    *,
    nodes: list[InventoryNode],
    members: list[MemberAsk],
    used: dict[str, dict[str, Decimal]],
    policy: Policy,
) -> dict[int, str]:
    """The definition the fast path must match: each member, largest first, by choose_node."""
    total = {name: dict(bucket) for name, bucket in used.items()}
    assigned = {}
    for index in _size_order(members, nodes):
        member = members[index]
        decision = choose_node(
            nodes=nodes,
            requests=member.requests,
            usage_by_node=total,
            node_selector=member.node_selector,
            affinity_terms=member.affinity_terms,
            tolerations=member.tolerations,
            policy=policy,
        )
        if decision.node is not None:
            chosen = next(n for n in nodes if n.name == decision.node)
            add_usage(total, chosen.name, effective_usage(member.requests, chosen))
            assigned[index] = decision.node
    return assigned


@pytest.mark.parametrize("seed", range(150))
def test_the_fast_path_places_exactly_as_choose_node_would(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [
        InventoryNode(
            name=f"n{i}",
            allocatable={
                "cpu": Decimal(rng.choice(["1", "2", "4", "7.5"])),
                "memory": Decimal(rng.choice([2, 4, 8])) * 2**30,
                **({"pods": Decimal(rng.randint(1, 6))} if rng.random() < 0.5 else {}),
            },
            labels={"disk": rng.choice(["ssd", "hdd"])},
            taints=({"key": "gpu", "value": "", "effect": "NoSchedule"},) if rng.random() < 0.2 else (),
            unschedulable=rng.random() < 0.1,
        )
        for i in range(rng.randint(1, 12))
    ]
    kinds = [
        MemberAsk(
            label=f"ns/kind-{k}",
            requests={
                "cpu": Decimal(rng.choice(["0.5", "1", "1.5", "3"])),
                "memory": Decimal(rng.choice([0, 1, 3])) * 2**30,
            },
            node_selector={"disk": "ssd"} if rng.random() < 0.3 else {},
            tolerations=[{"operator": "Exists"}] if rng.random() < 0.3 else [],
        )
        for k in range(rng.randint(1, 3))
    ]
    members = [rng.choice(kinds) for _ in range(rng.randint(1, 20))]
    used = {n.name: {"cpu": Decimal(rng.choice(["0", "0.5", "1"]))} for n in nodes if rng.random() < 0.5}
    for policy in Policy:
        fast = _attempt(
            value=(),
            nodes=nodes,
            members=members,
            order=_size_order(members, nodes),
            own=used,
            foreign=None,
            policy=policy,
        )
        assert fast.assigned == _naive(nodes=nodes, members=members, used=used, policy=policy), (seed, policy)
