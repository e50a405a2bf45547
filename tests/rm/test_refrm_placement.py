"""Pure placement of the reference RM: fit across all resources, constraints, policies, reasons."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bindery.reference_rm.inventory import InventoryError, node_from_object, parse_inventory
from bindery.reference_rm.placement import (
    InventoryNode,
    Policy,
    add_usage,
    choose_node,
    effective_usage,
    format_reason,
    normalize,
)


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    taints: tuple[dict[str, Any], ...] = (),
    unschedulable: bool = False,
    **allocatable: str,
) -> InventoryNode:
    return InventoryNode(
        name=name,
        allocatable={key.replace("__", "/").replace("_", "."): Decimal(v) for key, v in allocatable.items()},
        labels=labels or {},
        taints=taints,
        unschedulable=unschedulable,
    )


def choose(
    nodes: list[InventoryNode],
    requests: dict[str, str],
    *,
    used: dict[str, dict[str, str]] | None = None,
    policy: Policy = Policy.BINPACK,
    **placement: Any,
) -> tuple[str | None, str]:
    decision = choose_node(
        nodes=nodes,
        requests={k: Decimal(v) for k, v in requests.items()},
        usage_by_node={n: {k: Decimal(v) for k, v in u.items()} for n, u in (used or {}).items()},
        node_selector=placement.get("node_selector", {}),
        affinity_terms=placement.get("affinity_terms", []),
        tolerations=placement.get("tolerations", []),
        policy=policy,
        preferences=placement.get("preferences", ()),
    )
    return decision.node, decision.reason


def test_fits_across_all_resources_including_extended() -> None:
    nodes = [node("a", cpu="4", nvidia_com__gpu="0"), node("b", cpu="1", nvidia_com__gpu="2")]
    assert choose(nodes, {"cpu": "1", "nvidia.com/gpu": "1"})[0] == "b"
    assert choose(nodes, {"cpu": "2", "nvidia.com/gpu": "1"}) == (
        None,
        "0/2 nodes are available: 1 Insufficient cpu, 1 Insufficient nvidia.com/gpu.",
    )


def test_unknown_resource_fits_nowhere_and_zero_requests_are_ignored() -> None:
    nodes = [node("a", cpu="4")]
    assert (
        choose(nodes, {"example.com/foo": "1"})[1]
        == "0/1 nodes are available: 1 Insufficient example.com/foo."
    )
    assert choose(nodes, {"example.com/foo": "0", "cpu": "4"})[0] == "a"


def test_used_capacity_counts_and_pods_slot_is_implicit() -> None:
    nodes = [node("a", cpu="4", pods="1")]
    assert choose(nodes, {"cpu": "1"}, used={"a": {"cpu": "3.5"}})[1].endswith("1 Insufficient cpu.")
    assert choose(nodes, {"cpu": "1"}, used={"a": {"pods": "1"}})[1].endswith("1 Too many pods.")
    assert choose(nodes, {"cpu": "0.5"}, used={"a": {"cpu": "3.5"}})[0] == "a"


def test_binpack_and_spread() -> None:
    nodes = [node("a", cpu="4"), node("b", cpu="4"), node("c", cpu="4")]
    used = {"b": {"cpu": "2"}, "c": {"cpu": "1"}}
    assert choose(nodes, {"cpu": "1"}, used=used, policy=Policy.BINPACK)[0] == "b"
    assert choose(nodes, {"cpu": "1"}, used=used, policy=Policy.SPREAD)[0] == "a"
    # Ties go to the first name.
    assert choose(nodes, {"cpu": "1"}, policy=Policy.SPREAD)[0] == "a"
    assert choose(nodes, {}, policy=Policy.BINPACK)[0] == "a"


def test_constraints_and_reason_in_kube_scheduler_style() -> None:
    gpu_taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    nodes = [
        node("a", cpu="1"),
        node("b", cpu="8", taints=(gpu_taint,)),
        node("c", cpu="8", labels={"zone": "x"}),
        node("d", cpu="8", unschedulable=True),
        node("e", cpu="8", taints=({"key": "soft", "effect": "PreferNoSchedule"},), labels={"zone": "y"}),
    ]
    selector = {"zone": "y"}
    assert choose(nodes, {"cpu": "2"}, node_selector=selector)[0] == "e"
    _, reason = choose(nodes, {"cpu": "2"}, node_selector={"zone": "z"})
    assert reason == (
        "0/5 nodes are available: 1 node(s) had untolerated taint {k: v}, "
        "1 node(s) were unschedulable, 3 node(s) didn't match Pod's node affinity/selector."
    )
    tolerate_all = [{"operator": "Exists"}]
    assert choose(nodes[1:2], {"cpu": "2"}, tolerations=tolerate_all)[0] == "b"
    assert choose(nodes[3:4], {"cpu": "2"}, tolerations=tolerate_all)[0] == "d"
    affinity = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["x"]}]}]
    assert choose(nodes, {"cpu": "2"}, affinity_terms=affinity)[0] == "c"


def test_reason_with_no_nodes() -> None:
    assert "no nodes" in format_reason(total_nodes=0, failures={})


def test_inventory_file_parsing() -> None:
    nodes = parse_inventory(
        {
            "nodes": [
                {"name": "b", "allocatable": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 2}},
                {
                    "name": "a",
                    "allocatable": {"cpu": "500m"},
                    "labels": {"zone": "x"},
                    "taints": [{"key": "k", "effect": "NoSchedule"}],
                    "unschedulable": True,
                },
            ]
        }
    )
    assert [n.name for n in nodes] == ["a", "b"]
    assert nodes[1].allocatable["memory"] == 8 * 1024**3
    assert nodes[0].taints == ({"key": "k", "value": "", "effect": "NoSchedule"},)


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({}, "'nodes' list"),
        ({"nodes": [{"name": "a"}]}, "allocatable"),
        ({"nodes": [{"name": "a", "allocatable": {"cpu": "-1"}}]}, "negative"),
        ({"nodes": [{"name": "a", "allocatable": {"Bad Name": "1"}}]}, "not a valid resource name"),
        ({"nodes": [{"name": "a", "allocatable": {"cpu": "1"}, "colour": 1}]}, "unknown keys"),
        ({"nodes": [{"name": "a", "allocatable": {"cpu": "1"}}] * 2}, "appears twice"),
        ({"nodes": [{"name": "a", "allocatable": {"cpu": "1"}, "taints": [{"key": "k"}]}]}, "effect"),
        ({"nodes": [{"name": "a", "allocatable": {"cpu": "1"}, "labels": {"a": 1}}]}, "strings"),
    ],
)
def test_inventory_errors(document: Any, fragment: str) -> None:
    with pytest.raises(InventoryError, match=fragment):
        parse_inventory(document)


def test_node_objects_mirror_ready_non_deleted_nodes() -> None:
    ready: dict[str, Any] = {
        "metadata": {"name": "n1", "labels": {"pool": "gpu"}},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": True},
        "status": {
            "allocatable": {"cpu": "3900m", "memory": "16Gi", "bad": "x"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    mirrored = node_from_object(ready)
    assert mirrored is not None
    assert mirrored.allocatable == {"cpu": Decimal("3.9"), "memory": 16 * 1024**3}
    assert mirrored.unschedulable
    assert mirrored.taints == ({"key": "k", "value": "", "effect": "NoSchedule"},)
    not_ready = {**ready, "status": {**ready["status"], "conditions": [{"type": "Ready", "status": "False"}]}}
    assert node_from_object(not_ready) is None
    deleting = {**ready, "metadata": {**ready["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert node_from_object(deleting) is None


resource_names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/x"])
amounts = st.integers(min_value=0, max_value=8).map(Decimal)
inventories = st.lists(
    st.builds(
        lambda index, allocatable, zone, tainted: InventoryNode(
            name=f"n{index}",
            allocatable=allocatable,
            labels={"zone": zone},
            taints=({"key": "t", "value": "", "effect": "NoSchedule"},) if tainted else (),
        ),
        st.integers(0, 10_000),
        st.dictionaries(resource_names, amounts, max_size=4),
        st.sampled_from(["a", "b"]),
        st.booleans(),
    ),
    min_size=0,
    max_size=5,
    unique_by=lambda node: node.name,
)
pod_requests = st.lists(
    st.tuples(
        st.dictionaries(resource_names, amounts, max_size=3),
        st.sampled_from([{}, {"zone": "a"}]),
        st.booleans(),
    ),
    max_size=12,
)


def brute_force_fits(
    node: InventoryNode,
    usage: dict[str, dict[str, Decimal]],
    requests: dict[str, Decimal],
    selector: dict[str, str],
    tolerate: bool,
) -> bool:
    """The obvious definition of "fits", to compare the real filter chain against."""
    used = usage.get(node.name, {})
    return (
        (tolerate or not node.taints)
        and all(node.labels.get(k) == v for k, v in selector.items())
        and all(
            amount <= node.allocatable.get(name, Decimal(0)) - used.get(name, Decimal(0))
            for name, amount in requests.items()
            if amount > 0
        )
    )


@given(inventories, pod_requests, st.sampled_from(list(Policy)))
def test_placement_never_overcommits_and_finds_a_fit_when_one_exists(
    nodes: list[InventoryNode], pods: list[tuple[dict[str, Decimal], dict[str, str], bool]], policy: Policy
) -> None:
    usage: dict[str, dict[str, Decimal]] = {}
    for requests, selector, tolerate in pods:
        tolerations = [{"operator": "Exists"}] if tolerate else []

        decision = choose_node(
            nodes=nodes,
            requests=requests,
            usage_by_node=usage,
            node_selector=selector,
            affinity_terms=[],
            tolerations=tolerations,
            policy=policy,
        )
        feasible = [node for node in nodes if brute_force_fits(node, usage, requests, selector, tolerate)]
        if decision.node is None:
            assert not feasible, f"{feasible[0].name if feasible else ''} fits but none was chosen"
            assert decision.reason.startswith(f"0/{len(nodes)} nodes are available")
            continue
        chosen = next(node for node in nodes if node.name == decision.node)
        assert chosen in feasible
        add_usage(usage, chosen.name, effective_usage(requests, chosen))
    for node in nodes:
        for name, amount in usage.get(node.name, {}).items():
            assert amount <= node.allocatable.get(name, Decimal(0))


def _zone(zone: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "zone", "operator": "In", "values": [zone]}]}


@pytest.mark.parametrize("policy", list(Policy))
def test_any_matched_preference_outweighs_the_policy(policy: Policy) -> None:
    """kube-scheduler's weights: NodeAffinity (2 x 0..100, normalized to the best feasible node) beats
    the resource score (1 x 0..100), so even a weight-1 preference wins over binpack or spread."""
    nodes = [node(n, labels={"zone": z}, cpu="4") for n, z in (("a", "x"), ("b", "y"), ("c", "x"))]
    used = {"a": {"cpu": "3"}, "c": {"cpu": "0"}}  # binpack alone: a; spread alone: b (then c)
    assert choose(nodes, {"cpu": "1"}, used=used, policy=policy, preferences=[(1, _zone("y"))])[0] == "b"


def test_the_policy_breaks_ties_between_equally_preferred_nodes() -> None:
    nodes = [node(n, labels={"zone": z}, cpu="4") for n, z in (("a", "x"), ("b", "y"), ("c", "y"))]
    used = {"b": {"cpu": "1"}, "c": {"cpu": "2"}}
    prefer_y = [(50, _zone("y"))]
    assert choose(nodes, {"cpu": "1"}, used=used, policy=Policy.BINPACK, preferences=prefer_y)[0] == "c"
    assert choose(nodes, {"cpu": "1"}, used=used, policy=Policy.SPREAD, preferences=prefer_y)[0] == "b"


def test_weights_add_up_and_taints_weigh_more_than_affinity() -> None:
    """Raw NodeAffinity is the sum of matched weights; TaintToleration (weight 3) beats NodeAffinity
    (weight 2) at equal normalized scores, as in kube-scheduler's default profile."""
    soft = ({"key": "drain", "value": "", "effect": "PreferNoSchedule"},)
    nodes = [
        node("a", labels={"zone": "x", "disk": "ssd"}, cpu="4"),
        node("b", labels={"zone": "x"}, cpu="4"),
        node("c", labels={"zone": "y", "disk": "ssd"}, cpu="4", taints=soft),
    ]
    ssd = {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}
    both = [(30, _zone("x")), (20, ssd)]
    assert choose(nodes, {"cpu": "1"}, preferences=both)[0] == "a"  # 50 > 30 (b) > 20 (c)
    only_ssd = [(100, ssd)]
    # a: 2*100 + 3*100; c: 2*100 + 3*0 (its PreferNoSchedule taint); b: 0 + 3*100
    assert choose(nodes, {"cpu": "1"}, preferences=only_ssd)[0] == "a"
    prefer_c = [(100, _zone("y"))]  # c: 2*100 + 0 = 200 < a, b: 0 + 300
    assert choose(nodes, {"cpu": "1"}, preferences=prefer_c)[0] == "a"
    tolerant = [{"key": "drain", "operator": "Exists", "effect": "PreferNoSchedule"}]
    assert choose(nodes, {"cpu": "1"}, preferences=prefer_c, tolerations=tolerant)[0] == "c"


def test_normalize_is_default_normalize_score() -> None:
    assert [normalize(raw, 30, reverse=False) for raw in (0, 10, 29, 30)] == [0, 33, 96, 100]
    assert [normalize(raw, 3, reverse=True) for raw in (0, 1, 3)] == [100, 67, 0]
    assert (normalize(0, 0, reverse=False), normalize(0, 0, reverse=True)) == (0, 100)
