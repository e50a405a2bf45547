"""rule_victims: the lower-priority pods an inter-pod rule needs gone from a node it excludes
(contract v1.2.4 ``rulePreemption``), chosen as kube-scheduler's SelectVictimsOnNode chooses them."""

from __future__ import annotations

from typing import Any

from bindery.adapters.placed import PlacedPodCache
from bindery.scheduling.placementrules import rule_preemption, rule_victims, rules_verdict
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection

KEY = "example.com/domain"  # one domain per node, as the e2e test's dedicated key
SPREAD = {
    "maxSkew": 1,
    "topologyKey": KEY,
    "whenUnsatisfiable": "DoNotSchedule",
    "labelSelector": {"matchExpressions": [{"key": "pts", "operator": "Exists"}]},
}


def cache_of(*pods: tuple[str, str, int, dict[str, Any]]) -> PlacedPodCache:
    """Nodes a and b; ``pods``: (name, node, priority, extra metadata), labelled ``pts``."""
    nodes = [NodeProjection(name=n, labels={KEY: n}) for n in ("a", "b")]
    cache = PlacedPodCache(nodes=lambda: nodes)
    for name, node, priority, extra in pods:
        cache.on_event(
            "ADDED",
            {
                "metadata": {
                    "uid": f"uid-{name}",
                    "namespace": "ns",
                    "name": name,
                    "labels": {"pts": ""},
                    **extra,
                },
                "spec": {"nodeName": node, "priority": priority},
                "status": {"phase": "Running"},
            },
        )
    return cache


def medium(*, priority: int = 50, policy: str = "PreemptLowerPriority") -> PodInfo:
    return PodInfo.from_body(
        {
            "metadata": {"name": "medium", "namespace": "ns", "uid": "uid-m", "labels": {"pts": ""}},
            "spec": {
                "schedulerName": "bindery",
                "containers": [{"name": "c"}],
                "priority": priority,
                "preemptionPolicy": policy,
                "topologySpreadConstraints": [SPREAD],
            },
        }
    )


def test_the_e2e_spread_scenario_names_two_of_the_three_low_pods() -> None:
    """Node a: one high pod; node b: three low ones. The spread excludes b until two are gone."""
    cache = cache_of(
        ("high", "a", 1000, {}), ("low-1", "b", 10, {}), ("low-2", "b", 10, {}), ("low-3", "b", 10, {})
    )
    pod = medium()
    verdict = rules_verdict(pod, cache)
    assert verdict is not None
    found = rule_victims(pod, cache, verdict)
    assert list(found) == ["b"]
    assert len(found["b"]) == 2
    assert {p.name for p in found["b"]} < {"low-1", "low-2", "low-3"}
    (entry,) = rule_preemption(found)
    assert entry.node == "b"
    assert [(v.namespace, v.uid) for v in entry.victims] == [("ns", p.uid) for p in found["b"]]


def test_pods_of_equal_or_higher_priority_terminating_ones_and_policy_never_are_never_named() -> None:
    cache = cache_of(
        ("high", "a", 1000, {}),
        ("low-1", "b", 10, {}),
        ("same", "b", 50, {}),
        ("leaving", "b", 10, {"deletionTimestamp": "2026-01-01T00:00:00Z"}),
    )
    pod = medium()
    verdict = rules_verdict(pod, cache)
    assert verdict is not None
    # b counts low-1 and same (the terminating pod no longer counts for spread): one must go, and
    # only low-1 is of lower priority.
    assert [p.name for p in rule_victims(pod, cache, verdict)["b"]] == ["low-1"]
    assert rule_victims(medium(policy="Never"), cache, verdict) == {}
    equal = cache_of(("high", "a", 1000, {}), ("s1", "b", 50, {}), ("s2", "b", 50, {}), ("s3", "b", 50, {}))
    verdict = rules_verdict(medium(), equal)
    assert verdict is not None
    assert rule_victims(medium(), equal, verdict) == {}


def test_a_node_needing_more_victims_than_the_contract_carries_is_left_out() -> None:
    """``rulePreemption`` names at most 100 victims per node (contract v1.2.4). Node b holds 101
    low pods, and the spread accepts the pod there only once all are gone: b is no candidate for a
    rule's preemption, and the reserve's field is still valid (before, building it raised a
    ValidationError in PreFilter, and the pod, which fits on node a, was never scheduled)."""
    low: list[tuple[str, str, int, dict[str, Any]]] = [(f"low-{i}", "b", 10, {}) for i in range(101)]
    cache = cache_of(*low)
    pod = medium()
    verdict = rules_verdict(pod, cache)
    assert verdict is not None
    assert verdict.refusal() is None  # node a is open
    found = rule_victims(pod, cache, verdict)
    assert found == {}
    assert rule_preemption(found) == []
    fits = cache_of(*low[:100])
    verdict = rules_verdict(pod, fits)
    assert verdict is not None
    (entry,) = rule_preemption(rule_victims(pod, fits, verdict))
    assert (entry.node, len(entry.victims)) == ("b", 100)


class _RuleClient:
    """An RM client that takes rulePreemption and node preferences (PreFilter asks only these)."""

    def takes_rule_preemption(self) -> bool:
        return True

    def takes_node_preferences(self) -> bool:
        return True


async def test_the_nodes_a_rule_preemption_may_plan_on_are_required_one_term_each() -> None:
    """Both nodes hold a low pod the preemptor's anti-affinity excludes: PreFilter restricts the
    reserve to those two nodes. ``metadata.name`` takes one value per requirement (Kubernetes, and
    the RM's matching in bindery.constraints), so each node needs its own term; before, one
    ``In [a, b]`` term matched no node at all."""
    from typing import cast

    from bindery.constraints import matches_required_affinity
    from bindery.scheduling.framework import CycleContext, Ports, Profile, ReservationClient
    from bindery.scheduling.placementrules import RULE_PREEMPTION, PodPlacementRules

    cache = cache_of(("low-a", "a", 10, {}), ("low-b", "b", 10, {}))
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchExpressions": [{"key": "pts", "operator": "Exists"}]},
                    "topologyKey": KEY,
                }
            ]
        }
    }
    pod = PodInfo.from_body(
        {
            "metadata": {"name": "medium", "namespace": "ns", "uid": "uid-m"},
            "spec": {
                "schedulerName": "bindery",
                "containers": [{"name": "c"}],
                "priority": 50,
                "affinity": anti,
            },
        }
    )
    none = cast(Any, None)
    ctx = CycleContext(
        pod=pod,
        profile=Profile(
            name="pool", scheduler_names=frozenset({"bindery"}), client=cast(ReservationClient, _RuleClient())
        ),
        ports=Ports(nodes=none, pods=none, binder=none, events=none, conditions=none, placed=cache),
    )
    status = await PodPlacementRules(wait_seconds=0).pre_filter(ctx=ctx)
    assert status.ok, status
    assert [entry.node for entry in ctx.state[RULE_PREEMPTION]] == ["a", "b"]  # type: ignore[attr-defined]
    terms = ctx.required_node_terms()
    for node in ("a", "b"):
        assert matches_required_affinity(terms=terms, labels={KEY: node}, node_name=node), (node, terms)
    assert not matches_required_affinity(terms=terms, labels={KEY: "c"}, node_name="c"), terms


async def test_the_per_node_terms_stay_within_the_contracts_term_cap() -> None:
    """A pod with 33 required node affinity terms of its own: ANDed with one term per listed node,
    two nodes would make 66 terms, beyond the 64 ``requiredNodeAffinity`` carries. The reserve is
    limited to the nodes that fit the cap (here one), and lists only those in ``rulePreemption``."""
    from typing import cast

    from bindery.rm.models import Placement
    from bindery.scheduling.framework import CycleContext, Ports, Profile, ReservationClient
    from bindery.scheduling.placementrules import RULE_PREEMPTION, PodPlacementRules

    cache = cache_of(("low-a", "a", 10, {}), ("low-b", "b", 10, {}))
    anti = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["a", "b", f"x{i}"]}]}
                    for i in range(33)
                ]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchExpressions": [{"key": "pts", "operator": "Exists"}]},
                    "topologyKey": KEY,
                }
            ]
        },
    }
    pod = PodInfo.from_body(
        {
            "metadata": {"name": "medium", "namespace": "ns", "uid": "uid-m"},
            "spec": {
                "schedulerName": "bindery",
                "containers": [{"name": "c"}],
                "priority": 50,
                "affinity": anti,
            },
        }
    )
    none = cast(Any, None)
    ctx = CycleContext(
        pod=pod,
        profile=Profile(
            name="pool", scheduler_names=frozenset({"bindery"}), client=cast(ReservationClient, _RuleClient())
        ),
        ports=Ports(nodes=none, pods=none, binder=none, events=none, conditions=none, placed=cache),
    )
    status = await PodPlacementRules(wait_seconds=0).pre_filter(ctx=ctx)
    assert status.ok, status
    Placement.model_validate({"requiredNodeAffinity": ctx.required_node_terms()})
    assert [entry.node for entry in ctx.state[RULE_PREEMPTION]] == ["a"]  # type: ignore[attr-defined]


def test_the_by_node_and_priority_indexes_follow_every_change() -> None:
    """rule_victims reads the pods of a few nodes and the lowest priority, not every placed pod: the
    indexes must follow additions, a watched copy naming another node than the assumed one, priority
    changes and removals (checked against the pods the cache holds, after each of 600 random events)."""
    import random

    from bindery.podrules.model import PlacedPod

    rng = random.Random(7)
    cache = PlacedPodCache()
    for _ in range(600):
        name = f"p{rng.randrange(30)}"
        roll = rng.random()
        if roll < 0.2:
            node = rng.choice("abc")
            cache.assume(PlacedPod(uid=f"uid-{name}", namespace="ns", node=node, assumed=True))
        elif roll < 0.35:
            cache.forget(f"uid-{name}")
        else:
            cache.on_event(
                "DELETED" if roll < 0.5 else "MODIFIED",
                {
                    "metadata": {
                        "uid": f"uid-{name}",
                        "namespace": rng.choice(["ns", "other"]),
                        "name": name,
                    },
                    "spec": {"nodeName": rng.choice("abc"), "priority": rng.choice([0, 10, 50])},
                    "status": {"phase": rng.choice(["Running", "Running", "Succeeded"])},
                },
            )
        held = [pod for namespace in cache.namespaces() for pod in cache.in_namespace(namespace)]
        for node in "abcd":
            assert sorted(p.uid for p in cache.on_node(node)) == sorted(p.uid for p in held if p.node == node)
        assert cache.lowest_priority() == min((p.priority for p in held), default=None)


def test_a_preemptor_with_no_lower_priority_pod_anywhere_finds_no_victims() -> None:
    """The common case (one priority for every pod) answers before any node is searched; the answer
    follows a pod's priority as the watch reports it."""
    cache = cache_of(("high", "a", 1000, {}), ("same", "b", 50, {}), ("low", "b", 10, {}))
    pod = medium()
    verdict = rules_verdict(pod, cache)
    assert verdict is not None
    assert {node: [p.name for p in pods] for node, pods in rule_victims(pod, cache, verdict).items()} == {
        "b": ["low"]
    }
    cache.on_event(
        "MODIFIED",
        {
            "metadata": {"uid": "uid-low", "namespace": "ns", "name": "low", "labels": {"pts": ""}},
            "spec": {"nodeName": "b", "priority": 50},
            "status": {"phase": "Running"},
        },
    )
    verdict = rules_verdict(pod, cache)
    assert verdict is not None
    assert "b" in verdict.effects[0].excluded
    assert rule_victims(pod, cache, verdict) == {}
