"""The reference RM's feasible-node sampling (kube-scheduler's ``percentageOfNodesToScore``).

``nodes_to_find`` is checked against kube-scheduler's table of ``numFeasibleNodesToFind``; a
sampled :func:`choose_node` against a plain reference of the same semantics (search from the
start position, round, until that many nodes pass every filter, then the best of them), whose
filters are :mod:`bindery.constraints`' own, not the placement's compiled ones.  With sampling off
the label index must decide as every node asked one by one did.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bindery.constraints import matches_node_selector, matches_required_affinity, untolerated_taints
from bindery.reference_rm.accounting import Foreign, in_use
from bindery.reference_rm.placement import (
    UNSCHEDULABLE_TAINT,
    Decision,
    InventoryNode,
    Policy,
    add_usage,
    choose_node,
    effective_usage,
    nodes_to_find,
)
from bindery.reference_rm.store import Placed
from tests.rm.conftest import StoreFactory
from tests.rm.test_refrm_placement_equivalence import TAINTS, reference_choose_node
from tests.rm.test_refrm_store import request

# (nodes, percentage) -> feasible nodes to find, worked out by hand from schedule_one.go's
# numFeasibleNodesToFind: all below 100 nodes or at >= 100 %; 0 is max(5, 50 - n/125) %; at least 100.
TABLE = [
    (0, 0, 0),
    (1, 0, 1),
    (99, 0, 99),
    (99, 10, 99),
    (100, 0, 100),  # 49 % of 100 is 49: the floor of 100
    (500, 0, 230),  # 46 %
    (1000, 0, 420),  # 42 %
    (2000, 0, 680),  # 34 %
    (4000, 0, 720),  # 18 %
    (5000, 0, 500),  # 10 %
    (6250, 0, 312),  # 5 %
    (20000, 0, 1000),  # 5 %
    (5000, 1, 100),  # 50 nodes: the floor
    (5000, 30, 1500),
    (5000, 100, 5000),
    (5000, 150, 5000),
    (300, 50, 150),
]


@pytest.mark.parametrize(("total", "percentage", "expected"), TABLE)
def test_the_sample_size_is_kube_schedulers(total: int, percentage: int, expected: int) -> None:
    assert nodes_to_find(percentage=percentage, total=total) == expected


def test_the_adaptive_percentage_steps_down_one_per_125_nodes() -> None:
    assert nodes_to_find(percentage=0, total=5624) == 5624 * 6 // 100  # 50 - 44
    assert nodes_to_find(percentage=0, total=5625) == 5625 * 5 // 100  # 50 - 45: the 5 % floor
    assert nodes_to_find(percentage=0, total=5875) == 5875 * 5 // 100  # 50 - 47, raised to 5


def independent_fits(
    *,
    node: InventoryNode,
    requests: Mapping[str, Decimal],
    used: Mapping[str, Decimal],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
) -> bool:
    """Every filter, from bindery.constraints and plain arithmetic (not the placement's code)."""
    taints = [*node.taints, *([UNSCHEDULABLE_TAINT] if node.unschedulable else [])]
    if untolerated_taints(taints=taints, tolerations=tolerations):
        return False
    if not matches_node_selector(node_selector=node_selector, labels=node.labels):
        return False
    if not matches_required_affinity(terms=affinity_terms, labels=node.labels, node_name=node.name):
        return False
    wanted = {name: amount for name, amount in requests.items() if amount > 0}
    if "pods" in node.allocatable:
        wanted.setdefault("pods", Decimal(1))
    return all(
        amount <= node.allocatable.get(name, Decimal(0)) - used.get(name, Decimal(0))
        for name, amount in wanted.items()
    )


def reference_sampled(*, percentage: int, start: int, **case: Any) -> Decision:
    """kube-scheduler's search written plainly: from ``start``, round, until enough nodes fit."""
    nodes: Sequence[InventoryNode] = case["nodes"]
    count = len(nodes)
    budget = nodes_to_find(percentage=percentage, total=count)
    start = start % count if count else 0
    total = in_use(case["usage_by_node"], case.get("foreign") or {})
    found: list[InventoryNode] = []
    for step in range(count):
        node = nodes[(start + step) % count]
        if independent_fits(
            node=node,
            requests=case["requests"],
            used=total.get(node.name, {}),
            node_selector=case["node_selector"],
            affinity_terms=case["affinity_terms"],
            tolerations=case["tolerations"],
        ):
            found.append(node)
            if len(found) == budget:
                picked = reference_choose_node(**{**case, "nodes": found})
                return Decision(node=picked.node, next_start=(start + step + 1) % count)
    exact = reference_choose_node(**case)
    return Decision(node=exact.node, reason=exact.reason, next_start=start)


def inventory(rng: random.Random, count: int) -> tuple[InventoryNode, ...]:
    return tuple(
        InventoryNode(
            name=f"node-{i:04d}",
            allocatable={
                "cpu": Decimal(rng.choice(["1", "2", "4"])),
                "pods": Decimal(rng.choice(["2", "110"])),
            },
            labels={
                "kubernetes.io/hostname": f"node-{i:04d}",
                "zone": f"zone-{i % 3}",
                **({"pool": rng.choice("ab")} if rng.random() < 0.8 else {}),
            },
            taints=tuple(t for t in TAINTS if rng.random() < 0.1),
            unschedulable=rng.random() < 0.03,
        )
        for i in range(count)
    )


def ask(rng: random.Random, nodes: Sequence[InventoryNode], usage: Mapping[str, Any]) -> dict[str, Any]:
    terms: list[dict[str, Any]] = []
    shape = rng.randrange(5)
    if shape == 1:  # Bindery's anti-affinity and spread
        taken = rng.sample([node.name for node in nodes], rng.randrange(0, min(300, len(nodes))))
        terms = [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": sorted(taken)},
                    {
                        "key": "zone",
                        "operator": "In",
                        "values": rng.sample(["zone-0", "zone-1", "zone-2"], 2),
                    },
                ]
            }
        ]
    elif shape == 2:  # a label the index cannot answer: every node asked
        terms = [{"matchExpressions": [{"key": "pool", "operator": rng.choice(["Exists", "DoesNotExist"])}]}]
    elif shape == 3:  # two terms (ORed)
        terms = [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["zone-0"]}]},
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]},
        ]
    return {
        "nodes": nodes,
        "requests": {"cpu": Decimal(rng.choice(["0.5", "1", "3"]))},
        "usage_by_node": usage,
        "node_selector": {"pool": rng.choice("ab")} if rng.random() < 0.3 else {},
        "affinity_terms": terms,
        "tolerations": [{"key": "dedicated", "operator": "Exists"}] if rng.random() < 0.3 else [],
        "policy": rng.choice(list(Policy)),
        "preferences": (
            [
                (
                    rng.randrange(1, 101),
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                )
            ]
            if rng.random() < 0.3
            else ()
        ),
        "foreign": (
            {nodes[0].name: Foreign(usage={"cpu": Decimal(1)}, count=1)} if rng.random() < 0.2 else None
        ),
    }


@pytest.mark.parametrize("seed", range(3))
def test_a_sampled_search_picks_as_kube_scheduler_does_and_only_feasible_nodes(seed: int) -> None:
    """A backlog placed one pod after another on 400 nodes, each pod's start where the last
    search stopped: the same node and the same next start as the plain reference, and every
    chosen node passes every filter by bindery.constraints' own predicates."""
    rng = random.Random(seed)
    nodes = inventory(rng, 400)
    by_name = {node.name: node for node in nodes}
    usage: dict[str, dict[str, Decimal]] = {}
    start = 0
    placed = 0
    for index in range(600):
        case = ask(rng, nodes, usage)
        percentage = rng.choice([0, 5, 10, 30])
        expected = reference_sampled(percentage=percentage, start=start, **case)
        decision = choose_node(**case, percentage_of_nodes_to_score=percentage, start=start)
        assert decision == expected, index
        if decision.node is None:
            continue
        node = by_name[decision.node]
        used = in_use(usage, case["foreign"] or {}).get(node.name, {})
        assert independent_fits(
            node=node,
            requests=case["requests"],
            used=used,
            node_selector=case["node_selector"],
            affinity_terms=case["affinity_terms"],
            tolerations=case["tolerations"],
        )
        add_usage(usage, node.name, effective_usage(case["requests"], node))
        start = decision.next_start
        placed += 1
    assert 100 < placed < 600  # some placed, some refused once the nodes fill


def test_the_rotation_moves_pods_across_the_inventory() -> None:
    """Bin-packing empty nodes with a 100-node window: the second pod's search starts after the
    first window, so it lands on the first node of the next one (kube-scheduler's behaviour)."""
    nodes = tuple(InventoryNode(name=f"node-{i:04d}", allocatable={"cpu": Decimal(4)}) for i in range(1000))
    case: dict[str, Any] = {
        "nodes": nodes,
        "requests": {"cpu": Decimal(1)},
        "usage_by_node": {},
        "node_selector": {},
        "affinity_terms": [],
        "tolerations": [],
        "policy": Policy.BINPACK,
    }
    first = choose_node(**case, percentage_of_nodes_to_score=10, start=0)
    assert (first.node, first.next_start) == ("node-0000", 100)
    second = choose_node(**case, percentage_of_nodes_to_score=10, start=first.next_start)
    assert (second.node, second.next_start) == ("node-0100", 200)
    everything = choose_node(**case, percentage_of_nodes_to_score=100, start=700)
    assert (everything.node, everything.next_start) == ("node-0000", 700)


def test_an_unschedulable_pod_counts_every_node_even_when_sampling() -> None:
    nodes = tuple(InventoryNode(name=f"n{i:03d}", allocatable={"cpu": Decimal(1)}) for i in range(300))
    decision = choose_node(
        nodes=nodes,
        requests={"cpu": Decimal(2)},
        usage_by_node={},
        node_selector={},
        affinity_terms=[],
        tolerations=[],
        policy=Policy.SPREAD,
        percentage_of_nodes_to_score=5,
        start=42,
    )
    assert decision == Decision(
        node=None, reason="0/300 nodes are available: 300 Insufficient cpu.", next_start=42
    )


LABELS = st.dictionaries(
    st.sampled_from(["zone", "pool", "rack"]), st.sampled_from(["a", "b", "c", ""]), max_size=3
)
REQUIREMENT = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["zone", "pool", "rack", "kubernetes.io/hostname"]),
        "operator": st.sampled_from(["In", "NotIn"]),
        "values": st.lists(st.sampled_from(["a", "b", "c", "", "n1", "n7"]), min_size=1, max_size=3),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    labels=st.lists(LABELS, min_size=1, max_size=40),
    selector=st.dictionaries(st.sampled_from(["zone", "pool"]), st.sampled_from(["a", "b", ""]), max_size=2),
    requirements=st.lists(REQUIREMENT, max_size=3),
    used=st.lists(st.sampled_from(["0", "1", "2"]), min_size=40, max_size=40),
    policy=st.sampled_from(list(Policy)),
)
def test_the_label_index_decides_as_asking_every_node(
    labels: list[dict[str, str]],
    selector: dict[str, str],
    requirements: list[dict[str, Any]],
    used: list[str],
    policy: Policy,
) -> None:
    """With sampling off, a nodeSelector and In/NotIn requirements answered from the label index
    (the nodes having a wanted value only) pick what every node asked one by one picks."""
    nodes = tuple(
        InventoryNode(
            name=f"n{i}",
            allocatable={"cpu": Decimal(2)},
            labels={**node_labels, "kubernetes.io/hostname": f"n{i}"},
        )
        for i, node_labels in enumerate(labels)
    )
    case: dict[str, Any] = {
        "nodes": nodes,
        "requests": {"cpu": Decimal(1)},
        "usage_by_node": {
            node.name: {"cpu": Decimal(amount)} for node, amount in zip(nodes, used, strict=False)
        },
        "node_selector": selector,
        "affinity_terms": [{"matchExpressions": requirements}] if requirements else [],
        "tolerations": [],
        "policy": policy,
    }
    expected = reference_choose_node(**case)
    assert choose_node(**case, percentage_of_nodes_to_score=100) == expected
    assert choose_node(**case) == expected  # the default is every node


@pytest.mark.parametrize(
    ("percentage", "expected"),
    [
        (10, ["node-0000", "node-0100", "node-0200"]),  # 100 of 1,000 nodes: the floor
        # adaptive: 42 % of 1,000; the third search wraps round to the fuller node-0000
        (0, ["node-0000", "node-0420", "node-0000"]),
        (100, ["node-0000", "node-0000", "node-0000"]),  # every node: bin-packing is exact
    ],
)
def test_each_store_searches_on_from_where_its_last_reserve_stopped(
    make_store: StoreFactory, percentage: int, expected: list[str]
) -> None:
    """`bindery rm serve --percentage-of-nodes-to-score`: the store keeps the search's start
    between reserves, on SQLite and on PostgreSQL alike."""
    nodes = tuple(InventoryNode(name=f"node-{i:04d}", allocatable={"cpu": Decimal(4)}) for i in range(1000))
    store = make_store(percentage_of_nodes_to_score=percentage)
    chosen = []
    for uid in ("a", "b", "c"):
        outcome = store.reserve(request(uid), nodes=nodes, policy=Policy.BINPACK)
        assert isinstance(outcome, Placed)
        chosen.append(outcome.reservation.node)
    assert chosen == expected


@pytest.mark.parametrize("percentage", [-1, 101, True])
def test_a_percentage_out_of_range_is_refused(make_store: StoreFactory, percentage: int) -> None:
    with pytest.raises(ValueError, match="from 0 to 100"):
        make_store(percentage_of_nodes_to_score=percentage)
