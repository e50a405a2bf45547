"""broken_after_preemption: the preemptor's inter-pod rules on the plan's node, with exactly the
plan's victims gone (kube-scheduler's SelectVictimsOnNode asks its filters the same question)."""

from __future__ import annotations

from typing import Any

from bindery.adapters.placed import PlacedPodCache
from bindery.scheduling.placementrules import broken_after_preemption
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection

HOST = "kubernetes.io/hostname"
KEY = "example.com/domain"  # the e2e test's dedicated topology key: one domain per node


def cache_of(*pods: tuple[str, str, dict[str, str]], extra: dict[str, Any] | None = None) -> PlacedPodCache:
    """Two nodes a and b; ``pods``: (name, node, labels), every one in namespace ns."""
    nodes = [NodeProjection(name=n, labels={HOST: n, KEY: n}) for n in ("a", "b")]
    cache = PlacedPodCache(nodes=lambda: nodes)
    for name, node, labels in pods:
        cache.on_event(
            "ADDED",
            {
                "metadata": {"uid": f"uid-{name}", "namespace": "ns", "name": name, "labels": labels},
                "spec": {"nodeName": node, **(extra or {}).get(name, {})},
                "status": {"phase": "Running"},
            },
        )
    return cache


def preemptor(**spec: Any) -> PodInfo:
    return PodInfo.from_body(
        {
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "labels": {"app": "x"}},
            "spec": {"schedulerName": "bindery", "containers": [{"name": "c"}], "priority": 100, **spec},
        }
    )


def affinity(kind: str, app: str) -> dict[str, Any]:
    term = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": app}}}
    return {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


SPREAD = {
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": KEY,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
        }
    ]
}


def test_evicting_the_pod_a_required_affinity_needs_breaks_it_naming_the_rule_and_victims() -> None:
    cache = cache_of(("anchor", "a", {"app": "anchor"}), ("filler", "a", {}))
    pod = preemptor(**affinity("podAffinity", "anchor"))
    why = broken_after_preemption(pod, cache, node="a", victims=["uid-anchor"], names=["ns/anchor"])
    assert why is not None
    for part in ("ns/anchor", "node a", "pod affinity"):
        assert part in why, why
    assert broken_after_preemption(pod, cache, node="a", victims=["uid-filler"]) is None


def test_the_e2e_spread_case_one_resource_victim_is_not_enough_two_are() -> None:
    """Kubernetes' e2e "PodTopologySpread Preemption": a holds the high pod, b three low ones.
    Evicting one low pod from b (what the resources need) leaves b at 2 against a's 1: the spread
    (maxSkew 1) still refuses b; evicting two makes it 1 against 1."""
    cache = cache_of(
        ("high", "a", {"app": "x"}),
        ("low-1", "b", {"app": "x"}),
        ("low-2", "b", {"app": "x"}),
        ("low-3", "b", {"app": "x"}),
    )
    pod = preemptor(**SPREAD)
    why = broken_after_preemption(pod, cache, node="b", victims=["uid-low-1"])
    assert why is not None
    assert "spread" in why, why
    assert broken_after_preemption(pod, cache, node="b", victims=["uid-low-1", "uid-low-2"]) is None


def test_anti_affinity_is_satisfied_only_when_the_pod_in_the_way_is_a_victim() -> None:
    cache = cache_of(("rival", "a", {"app": "x"}), ("other", "a", {}))
    pod = preemptor(**affinity("podAntiAffinity", "x"))
    assert broken_after_preemption(pod, cache, node="a", victims=["uid-rival"]) is None
    why = broken_after_preemption(pod, cache, node="a", victims=["uid-other"])
    assert why is not None
    assert "anti-affinity" in why, why


def test_an_existing_pods_anti_affinity_toward_the_preemptor_counts_too() -> None:
    """The symmetry: a pod on a refuses app=x pods beside it; the preemptor has no rules of its own."""
    term = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "x"}}}
    cache = cache_of(
        ("loner", "a", {}),
        ("low", "a", {}),
        extra={
            "loner": {
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
            }
        },
    )
    pod = preemptor()
    assert broken_after_preemption(pod, cache, node="a", victims=["uid-low"]) is not None
    assert broken_after_preemption(pod, cache, node="a", victims=["uid-loner", "uid-low"]) is None


def test_no_rules_or_a_node_the_cache_does_not_know_judge_nothing() -> None:
    cache = cache_of(("anchor", "a", {"app": "anchor"}))
    assert broken_after_preemption(preemptor(), cache, node="a", victims=["uid-anchor"]) is None
    pod = preemptor(**affinity("podAffinity", "anchor"))
    assert broken_after_preemption(pod, cache, node="elsewhere", victims=["uid-anchor"]) is None
