"""The filters' node snapshot: its indexes and memos give the verdicts the plain computation gives.

A snapshot of the nodes (``PlacedPodCache.nodes``) is shared by every evaluation until a node
changes; it answers "which nodes does this requirement exclude" with set operations on a per-key
value index, and memoizes per Deployment the nodes its node constraints allow and each spread
constraint's domains. NodeCheck asks only whether the chosen node is excluded. These tests hold all
of that to the straightforward answers: every effect's excluded nodes to the generic node-affinity
matcher run over every node, the candidates to the pod's own node constraints run over every node,
a verdict from the shared snapshot to one from a fresh list of the same nodes, and the one-node
check to the whole verdict, over random nodes, placed pods and pods while pods and nodes change.
"""

from __future__ import annotations

import random
from typing import Any

from bindery.adapters.placed import PlacedPodCache
from bindery.constraints import (
    matches_node_selector,
    matches_required_affinity,
    matches_term,
    untolerated_taints,
)
from bindery.podrules.filters import ANTI_AFFINITY, SPREAD, evaluate
from bindery.scheduling.nodecheck import check_rules, rules_problem
from bindery.scheduling.placementrules import _incoming, rules_refusing, rules_verdict
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.test_podrules import HOST, ZONE, body, term, zone_spread

APPS = ("web", "db", "cache")
TAINT = {"key": "dedicated", "value": "batch", "effect": "NoSchedule"}
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}


def random_node(rng: random.Random, name: str) -> NodeProjection:
    labels = {HOST: name}
    if rng.random() < 0.9:
        labels[ZONE] = rng.choice(("a", "b", "c", "d", ""))  # "" is a value too
    if rng.random() < 0.5:
        labels["tier"] = rng.choice(("gold", "silver"))
    taints = (dict(TAINT),) if rng.random() < 0.2 else ()
    return NodeProjection(name=name, labels=labels, taints=taints)


def random_pod(rng: random.Random, *, node_name: str | None = None) -> dict[str, Any]:
    app = rng.choice(APPS)
    spread = []
    if rng.random() < 0.6:
        extra: dict[str, Any] = {"labelSelector": {"matchLabels": {"app": app}}}
        if rng.random() < 0.3:
            extra["nodeAffinityPolicy"] = "Ignore"
        if rng.random() < 0.3:
            extra["nodeTaintsPolicy"] = "Honor"
        if rng.random() < 0.2:
            extra["minDomains"] = rng.choice((2, 5))
        spread.append(zone_spread(rng.choice((1, 2)), **extra))
    if rng.random() < 0.3:
        spread.append({**zone_spread(1, labelSelector={"matchLabels": {"app": app}}), "topologyKey": HOST})
    anti = [term(rng.choice((HOST, ZONE)), app=rng.choice(APPS))] if rng.random() < 0.4 else []
    affinity = [term(ZONE, app=rng.choice(APPS))] if rng.random() < 0.1 else []
    ports = [{"containerPort": 80, "hostPort": 8080}] if rng.random() < 0.1 else []
    pod = body(
        namespace=rng.choice(("ns-a", "ns-b")),
        labels={"app": app},
        spread=spread,
        anti=anti,
        affinity=affinity,
        ports=ports,
        node_name=node_name,
        node_selector={"tier": "gold"} if rng.random() < 0.2 else None,
        tolerations=[dict(TOLERATION)] if rng.random() < 0.3 else (),
        deleting=rng.random() < 0.05,
    )
    if rng.random() < 0.2:
        pod["spec"].setdefault("affinity", {})["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ZONE, "operator": "In", "values": rng.sample("abcd", 2)}]}
                ]
            }
        }
    return pod


def anti_affinity_excluded(
    pod: PodInfo, cache: PlacedPodCache, nodes: list[NodeProjection]
) -> frozenset[str]:
    """Pod anti-affinity, straight from upstream's two checks, pod by pod and node by node."""
    by_name = {n.name: n for n in nodes}
    forbidden: set[tuple[str, str]] = set()
    for namespace in list(cache.namespaces()):
        for other in cache.in_namespace(namespace):
            node = by_name.get(other.node)
            if node is None or other.uid == pod.uid:
                continue
            mine = [(t, other.namespace, other.labels, pod.namespace) for t in pod.rules.anti_affinity]
            theirs = [(t, pod.namespace, pod.labels, other.namespace) for t in other.anti_affinity]
            for t, namespace_, labels, owner in mine + theirs:
                selects = t.matches(
                    namespace=namespace_,
                    labels=labels,
                    owner_namespace=owner,
                    namespace_labels=cache.namespace_labels,
                )
                if selects and t.topology_key in node.labels:
                    forbidden.add((t.topology_key, node.labels[t.topology_key]))
    return frozenset(n.name for n in nodes if any(n.labels.get(k) == v for k, v in forbidden))


def spread_excluded(pod: PodInfo, cache: PlacedPodCache, nodes: list[NodeProjection]) -> list[frozenset[str]]:
    """Each hard spread constraint's excluded nodes, computed node by node as upstream's Filter."""
    found = []
    for c in pod.rules.spread:
        key = c.topology_key
        eligible = {
            n.name: n.labels[key]
            for n in nodes
            if all(other.topology_key in n.labels for other in pod.rules.spread)
            and (not c.honor_node_affinity or fits(pod, n))
            and not (c.honor_taints and untolerated_taints(taints=n.taints, tolerations=pod.tolerations))
        }
        counts = dict.fromkeys(eligible.values(), 0)
        for other in cache.in_namespace(pod.namespace):
            if c.selector.empty or not c.selector.matches(other.labels):
                continue
            if not other.terminating and other.uid != pod.uid and other.node in eligible:
                counts[eligible[other.node]] += 1
        minimum = min(counts.values(), default=0) if len(counts) >= c.min_domains else 0
        self_match = 1 if c.selector.matches(pod.labels) else 0
        found.append(
            frozenset(
                n.name
                for n in nodes
                if key not in n.labels or counts.get(n.labels[key], 0) + self_match - minimum > c.max_skew
            )
        )
    return found


def fits(pod: PodInfo, n: NodeProjection) -> bool:
    return matches_node_selector(
        node_selector=pod.node_selector, labels=n.labels
    ) and matches_required_affinity(terms=pod.affinity_terms, labels=n.labels, node_name=n.name)


def test_verdicts_from_the_shared_snapshot_are_the_plain_computation_while_pods_and_nodes_change() -> None:
    rng = random.Random(19)
    nodes = [random_node(rng, f"n{i:02d}") for i in range(30)]
    cache = PlacedPodCache(nodes=lambda: nodes)
    placed = []
    for _ in range(60):
        placed.append(random_pod(rng, node_name=rng.choice([n.name for n in nodes] + ["gone"])))
        cache.on_event("ADDED", placed[-1])
    refused_nodes = refusals = 0
    for step in range(400):
        if step % 25 == 24:  # a node changes its labels or taints: the snapshot must follow
            index = rng.randrange(len(nodes))
            nodes[index] = random_node(rng, nodes[index].name)
        if step % 7 == 6:  # a placed pod leaves and another arrives: counts are never memoized
            cache.on_event("DELETED", placed.pop(rng.randrange(len(placed))))
            placed.append(random_pod(rng, node_name=rng.choice(nodes).name))
            cache.on_event("ADDED", placed[-1])
        pod = PodInfo.from_body(random_pod(rng))
        verdict = rules_verdict(pod, cache)
        if verdict is None:
            assert rules_refusing(pod, cache, nodes[0].name) == ()
            continue
        fresh = evaluate(
            pod=_incoming(pod), placed=cache, nodes=list(nodes), namespace_labels=cache.namespace_labels
        )
        assert verdict == fresh
        assert verdict.candidates == tuple(sorted(n.name for n in nodes if fits(pod, n)))
        anti = anti_affinity_excluded(pod, cache, nodes)
        assert [e.excluded for e in verdict.effects if e.rule == ANTI_AFFINITY] == ([anti] if anti else [])
        assert [e.excluded for e in verdict.effects if e.rule == SPREAD] == spread_excluded(pod, cache, nodes)
        for effect in verdict.effects:
            term_ = effect.term()
            refused = [
                n.name for n in nodes if not matches_term(term=term_, labels=n.labels, node_name=n.name)
            ]
            assert effect.excluded == frozenset(refused), effect
        for name in [n.name for n in nodes] + ["unknown"]:
            expected = tuple(effect.rule for effect in verdict.effects if name in effect.excluded)
            assert rules_refusing(pod, cache, name) == expected, (name, verdict)
            assert rules_problem(expected, node_name=name, rm_name="rm") == check_rules(
                verdict, node_name=name, rm_name="rm"
            )
            refused_nodes += bool(expected)
        left = set(verdict.candidates) - {name for effect in verdict.effects for name in effect.excluded}
        expected_none = not verdict.effects or not verdict.candidates or bool(left)
        assert (verdict.refusal() is None) == expected_none
        refusals += verdict.refusal() is not None
    # Not vacuous: nodes were refused, and some pods had no node left.
    assert refused_nodes > 500
    assert refusals > 0


def test_the_snapshot_lives_until_a_node_changes() -> None:
    nodes = [
        NodeProjection(name="n1", labels={HOST: "n1", ZONE: "a"}),
        NodeProjection(name="n2", labels={HOST: "n2", ZONE: "b"}),
    ]
    cache = PlacedPodCache(nodes=lambda: list(nodes))  # a fresh list per call, as the node index gives
    first = cache.nodes()
    assert cache.nodes() is first
    nodes[0] = NodeProjection(name="n1", labels={HOST: "n1", ZONE: "a"})  # equal: a status-only event
    assert cache.nodes() is first
    nodes[0] = NodeProjection(name="n1", labels={HOST: "n1", ZONE: "c"})
    relabelled = cache.nodes()
    assert relabelled is not first
    assert [n.labels[ZONE] for n in relabelled] == ["c", "b"]
    nodes[1] = NodeProjection(name="n2", labels={HOST: "n2", ZONE: "b"}, taints=(dict(TAINT),))
    tainted = cache.nodes()
    assert tainted is not relabelled
    assert tainted[1].taints == (TAINT,)
    nodes.append(NodeProjection(name="n3", labels={HOST: "n3", ZONE: "a"}))
    assert [n.name for n in cache.nodes()] == ["n1", "n2", "n3"]
    del nodes[0]
    assert [n.name for n in cache.nodes()] == ["n2", "n3"]


def test_a_spread_verdict_follows_a_node_that_changes_zone_or_taints() -> None:
    nodes = [
        NodeProjection(name="n1", labels={HOST: "n1", ZONE: "a"}),
        NodeProjection(name="n2", labels={HOST: "n2", ZONE: "b"}),
    ]
    cache = PlacedPodCache(nodes=lambda: list(nodes))
    cache.on_event("ADDED", body(labels={"app": "web"}, node_name="n1"))
    pod = PodInfo.from_body(body(labels={"app": "web"}, spread=[zone_spread(nodeTaintsPolicy="Honor")]))
    verdict = rules_verdict(pod, cache)
    assert verdict is not None
    assert verdict.effects[0].excluded == {"n1"}  # zone a holds the one web pod
    nodes[1] = NodeProjection(name="n2", labels={HOST: "n2", ZONE: "a"})
    verdict = rules_verdict(pod, cache)
    assert verdict is not None
    assert verdict.effects[0].excluded == frozenset()  # one zone left: no skew
    # n2 moves back to zone b and is tainted: nodeTaintsPolicy Honor drops zone b from the domains,
    # so zone a (one pod, the only domain) is the minimum and allowed again.
    nodes[1] = NodeProjection(name="n2", labels={HOST: "n2", ZONE: "b"}, taints=(dict(TAINT),))
    verdict = rules_verdict(pod, cache)
    assert verdict is not None
    assert verdict.effects[0].excluded == frozenset()
    assert rules_refusing(pod, cache, "n1") == ()
    nodes[1] = NodeProjection(name="n2", labels={HOST: "n2", ZONE: "b"})
    assert rules_refusing(pod, cache, "n1") == ("topology spread",)


def test_frozen_keys_are_equal_exactly_for_equal_values_in_any_key_order() -> None:
    # frozen() remembers a tuple's key by identity and by repr; neither may make two different
    # values share a key, nor two orderings of the same mappings differ.
    from bindery.podrules.nodes import frozen

    rng = random.Random(5)
    fields = {
        "key": ["a", "b"],
        "operator": ["Exists", "Equal"],
        "value": ["", "x"],
        "effect": ["NoSchedule"],
    }
    for _ in range(300):
        tolerations = [
            {k: rng.choice(v) for k, v in fields.items() if rng.random() < 0.8}
            | ({"tolerationSeconds": rng.choice([300, 600])} if rng.random() < 0.3 else {})
            for _ in range(rng.randint(1, 3))
        ]
        shuffled = tuple(dict(rng.sample(list(t.items()), len(t))) for t in tolerations)
        same = tuple(dict(t) for t in tolerations)
        assert frozen(same) == frozen(shuffled) == frozen(same)
        other = (*(dict(t) for t in tolerations[:-1]), {**tolerations[-1], "key": "c"})
        assert frozen(other) != frozen(same)
        assert hash(frozen(same)) == hash(frozen(shuffled))
