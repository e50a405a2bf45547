"""The optimized :func:`choose_node` decides exactly what the straightforward one decided.

``reference_choose_node`` is the placement as it was before the hot loop was optimized (every
filter and :func:`score` evaluated per node, per call), with the v1.2 preferences scored the plain
way (every feasible node's raw NodeAffinity and TaintToleration scores, normalized, weighted, summed):
the same node, or the same reason, over randomized inventories where ties, full nodes, taints,
selectors, preferences and foreign pods are common.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from bindery.reference_rm.accounting import Foreign, describe_foreign, in_use
from bindery.reference_rm.placement import (
    AFFINITY_WEIGHT,
    MAX_NODE_SCORE,
    TAINT_WEIGHT,
    Decision,
    InventoryNode,
    Policy,
    _short,
    add_usage,
    choose_node,
    effective_usage,
    format_reason,
    node_failures,
    normalize,
    preference_scores,
    score,
    subtract_usage,
)


def reference_choose_node(
    *,
    nodes: Sequence[InventoryNode],
    requests: Mapping[str, Decimal],
    usage_by_node: Mapping[str, Mapping[str, Decimal]],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    policy: Policy,
    foreign: Mapping[str, Foreign] | None = None,
    preferences: Sequence[tuple[int, Mapping[str, Any]]] = (),
) -> Decision:
    if foreign:
        usage_by_node = in_use(usage_by_node, foreign)
    failures: Counter[str] = Counter()
    candidates: list[tuple[Decimal, str, int, int]] = []
    short: dict[str, list[str]] = {}
    for node in nodes:
        used = usage_by_node.get(node.name, {})
        reasons = node_failures(
            node=node,
            requests=requests,
            used=used,
            node_selector=node_selector,
            affinity_terms=affinity_terms,
            tolerations=tolerations,
        )
        if reasons:
            failures.update(reasons)
            if foreign and node.name in foreign:
                short[node.name] = _short(node, requests, used)
            continue
        fill = score(node, effective_usage(requests, node), used)
        affinity, taints = preference_scores(node=node, preferences=preferences, tolerations=tolerations)
        candidates.append((fill if policy is Policy.BINPACK else 1 - fill, node.name, affinity, taints))
    if not candidates:
        reason = format_reason(total_nodes=len(nodes), failures=failures)
        explained = describe_foreign(foreign=foreign or {}, short=short)
        return Decision(node=None, reason=f"{reason} {explained}" if explained else reason)
    top_affinity = max(c[2] for c in candidates)
    top_taints = max(c[3] for c in candidates)
    totals = [
        (
            -(
                AFFINITY_WEIGHT * normalize(affinity, top_affinity, reverse=False)
                + TAINT_WEIGHT * normalize(taints, top_taints, reverse=True)
                + MAX_NODE_SCORE * policy_score
            ),
            name,
        )
        for policy_score, name, affinity, taints in candidates
    ]
    return Decision(node=min(totals)[1])


AMOUNTS = ["0", "0.5", "1", "2", "3", "4", "0.001", "1.5"]
RESOURCES = ["cpu", "memory", "nvidia.com/gpu", "pods"]
TAINTS = [
    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    {"key": "spot", "value": "", "effect": "NoExecute"},
    {"key": "soft", "value": "x", "effect": "PreferNoSchedule"},
]


def random_case(rng: random.Random) -> dict[str, Any]:
    count = rng.randrange(0, 12)
    nodes = []
    for index in range(count):
        allocatable = {
            name: Decimal(rng.choice([*AMOUNTS[1:], "8", "110"]))
            for name in RESOURCES
            if rng.random() < (0.9 if name == "cpu" else 0.6)
        }
        if rng.random() < 0.1:
            allocatable["cpu"] = Decimal(0)
        nodes.append(
            InventoryNode(
                name=f"n{rng.randrange(100):02d}-{index}",
                allocatable=allocatable,
                labels={"zone": rng.choice("ab")} if rng.random() < 0.8 else {},
                taints=tuple(t for t in TAINTS if rng.random() < 0.2),
                unschedulable=rng.random() < 0.1,
            )
        )
    if nodes and rng.random() < 0.1:  # two nodes of one name (no inventory has that; still the same answer)
        nodes.append(InventoryNode(name=nodes[0].name, allocatable={"cpu": Decimal(rng.choice(AMOUNTS))}))
    usage = {
        node.name: {name: Decimal(rng.choice(AMOUNTS)) for name in RESOURCES if rng.random() < 0.5}
        for node in nodes
        if rng.random() < 0.7
    }
    foreign = {
        node.name: Foreign(
            usage={name: Decimal(rng.choice(AMOUNTS)) for name in RESOURCES if rng.random() < 0.5},
            count=rng.randrange(1, 4),
        )
        for node in nodes
        if rng.random() < 0.3
    }
    requests = {name: Decimal(rng.choice(AMOUNTS)) for name in RESOURCES if rng.random() < 0.5}
    return {
        "nodes": tuple(nodes) if rng.random() < 0.7 else nodes,
        "requests": requests,
        "usage_by_node": usage,
        "node_selector": {"zone": rng.choice("ab")} if rng.random() < 0.3 else {},
        "affinity_terms": (
            [
                {
                    "matchExpressions": [
                        {"key": "zone", "operator": rng.choice(["In", "NotIn"]), "values": [rng.choice("ab")]}
                    ]
                }
            ]
            if rng.random() < 0.2
            else []
        ),
        "tolerations": [{"key": "dedicated", "operator": "Exists"}] if rng.random() < 0.3 else [],
        "preferences": [
            (
                rng.randrange(1, 101),
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": [zone]}]},
            )
            for zone in "ab"
            if rng.random() < 0.3
        ],
        "policy": rng.choice(list(Policy)),
        "foreign": foreign if rng.random() < 0.5 else None,
    }


@pytest.mark.parametrize("seed", range(8))
def test_same_decision_as_the_reference_over_random_inventories(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        case = random_case(rng)
        expected = reference_choose_node(**case)
        assert choose_node(**case) == expected, case
        assert choose_node(**case) == expected, case  # the second call answers from the static cache


def test_a_new_inventory_tuple_is_evaluated_afresh() -> None:
    """The static filters are remembered by the inventory tuple's identity: a new tuple (the
    mirror saw a node change) is evaluated again, even for the same kind of pod."""
    tainted = (InventoryNode(name="a", allocatable={"cpu": Decimal(4)}, taints=(TAINTS[0],)),)
    untainted = (InventoryNode(name="a", allocatable={"cpu": Decimal(4)}),)
    ask: dict[str, Any] = {
        "requests": {"cpu": Decimal(1)},
        "usage_by_node": {},
        "node_selector": {},
        "affinity_terms": [],
        "tolerations": [],
        "policy": Policy.BINPACK,
    }
    assert choose_node(nodes=tainted, **ask).node is None
    assert choose_node(nodes=untainted, **ask).node == "a"
    assert choose_node(nodes=tainted, **ask).node is None
    assert (
        choose_node(
            nodes=tainted, **{**ask, "tolerations": [{"key": "dedicated", "operator": "Exists"}]}
        ).node
        == "a"
    )


def test_binpack_and_spread_pick_among_many_nodes_as_the_reference_does() -> None:
    """The scale of the benchmark: 500 nodes with varied usage, both policies."""
    rng = random.Random(42)
    nodes = tuple(
        InventoryNode(
            name=f"node-{i:04d}",
            allocatable={"cpu": Decimal(64), "memory": Decimal(2**38), "pods": Decimal(110)},
        )
        for i in range(500)
    )
    usage = {
        node.name: {
            "cpu": Decimal(rng.randrange(0, 640)) / 10,
            "memory": Decimal(rng.randrange(0, 2**38)),
            "pods": Decimal(rng.randrange(0, 111)),
        }
        for node in nodes
    }
    for policy in Policy:
        for cpu in ("0.1", "0.25", "0.5", "8"):
            case: dict[str, Any] = {
                "nodes": nodes,
                "requests": {"cpu": Decimal(cpu), "memory": Decimal(2**26)},
                "usage_by_node": usage,
                "node_selector": {},
                "affinity_terms": [],
                "tolerations": [],
                "policy": policy,
            }
            assert choose_node(**case) == reference_choose_node(**case)


@pytest.mark.parametrize("seed", range(4))
def test_same_decisions_along_reserves_and_releases_that_change_usage_in_place(seed: int) -> None:
    """As the store drives it: one inventory tuple, the usage dicts changed in place after every
    decision (a reserve adds, a release subtracts), the foreign entries replaced now and then.
    Every decision must see the latest usage, not what it remembered for a node."""
    rng = random.Random(seed)
    case = random_case(rng)
    while len(case["nodes"]) < 4:
        case = random_case(rng)
    nodes = tuple(case["nodes"])
    by_name = {node.name: node for node in nodes}
    usage: dict[str, dict[str, Decimal]] = {
        name: dict(bucket) for name, bucket in case["usage_by_node"].items()
    }
    foreign: dict[str, Foreign] = dict(case["foreign"] or {})
    placed: list[tuple[str, dict[str, Decimal]]] = []
    sizes = [
        {"cpu": Decimal("0.5")},
        {"cpu": Decimal(1), "memory": Decimal(1)},
        {"nvidia.com/gpu": Decimal(1)},
    ]
    for _ in range(300):
        requests = rng.choice(sizes)
        ask: dict[str, Any] = {
            "nodes": nodes,
            "requests": requests,
            "usage_by_node": usage,
            "node_selector": case["node_selector"],
            "affinity_terms": case["affinity_terms"],
            "tolerations": case["tolerations"],
            "policy": case["policy"],
            "foreign": foreign,
        }
        expected = reference_choose_node(**ask)
        assert choose_node(**ask) == expected
        if expected.node is not None and rng.random() < 0.7:
            amount = effective_usage(requests, by_name[expected.node])
            add_usage(usage, expected.node, amount)
            placed.append((expected.node, amount))
        if placed and rng.random() < 0.3:
            node, amount = placed.pop(rng.randrange(len(placed)))
            subtract_usage(usage, node, amount)
        if rng.random() < 0.1:
            name = rng.choice(nodes).name
            foreign[name] = Foreign(usage={"cpu": Decimal(rng.choice(AMOUNTS))}, count=1)
        if foreign and rng.random() < 0.05:
            del foreign[rng.choice(sorted(foreign))]


@pytest.mark.parametrize("seed", range(2))
def test_same_decisions_for_a_rules_backlog_whose_every_pod_has_other_affinity(seed: int) -> None:
    """Bindery's hard spread and anti-affinity reach the RM as ``hostname NotIn`` (the group's
    nodes so far, split at 256) and ``zone In``: every pod's constraints are new, so its affinity
    is evaluated afresh while the taint filters and the nodes' fits are shared with the pods
    before it. Placed pods change usage in place; now and then the tolerations, a nodeSelector or
    preferences change too; every decision must still be the reference's."""
    rng = random.Random(seed)
    nodes = tuple(
        InventoryNode(
            name=f"node-{i:03d}",
            allocatable={"cpu": Decimal(rng.choice(["2", "4"])), "pods": Decimal(rng.choice(["3", "110"]))},
            labels={
                "kubernetes.io/hostname": f"node-{i:03d}",
                "zone": f"zone-{i % 3}",
                **({"pool": "a"} if rng.random() < 0.5 else {}),
            },
            taints=tuple(t for t in TAINTS if rng.random() < 0.15),
            unschedulable=rng.random() < 0.05,
        )
        for i in range(300)
    )
    by_name = {node.name: node for node in nodes}
    usage: dict[str, dict[str, Decimal]] = {}
    taken: dict[str, list[str]] = {}  # group -> nodes with one of its pods
    zones: dict[str, Counter[str]] = {}
    decided = 0
    for index in range(700):  # two groups of 350 on 300 nodes: the NotIn splits, the last are refused
        group = f"g{index % 2}"
        names = sorted(taken.get(group, []))
        counts = zones.setdefault(group, Counter({f"zone-{z}": 0 for z in range(3)}))
        low = min(counts.values())
        expressions: list[dict[str, Any]] = [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": names[i : i + 256]}
            for i in range(0, len(names), 256)
        ]
        expressions.append(
            {"key": "zone", "operator": "In", "values": sorted(z for z, c in counts.items() if c <= low)}
        )
        if rng.random() < 0.1:  # not only In and NotIn: every node asked, not the label index
            expressions.append({"key": "pool", "operator": "Exists"})
        requests = {"cpu": Decimal(rng.choice(["0.5", "1"]))}
        ask: dict[str, Any] = {
            "nodes": nodes,
            "requests": requests,
            "usage_by_node": usage,
            "node_selector": {"pool": "a"} if rng.random() < 0.1 else {},
            "affinity_terms": [{"matchExpressions": expressions}],
            "tolerations": [{"key": "dedicated", "operator": "Exists"}] if rng.random() < 0.3 else [],
            "policy": Policy.BINPACK if seed % 2 else Policy.SPREAD,
            "preferences": (
                [(10, {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]})]
                if rng.random() < 0.2
                else ()
            ),
        }
        expected = reference_choose_node(**ask)
        assert choose_node(**ask) == expected, index
        if expected.node is not None:
            decided += 1
            add_usage(usage, expected.node, effective_usage(requests, by_name[expected.node]))
            taken.setdefault(group, []).append(expected.node)
            counts[by_name[expected.node].labels["zone"]] += 1
    assert 50 < decided < 700  # some placed, some refused: both kinds of answer compared
