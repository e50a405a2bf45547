"""PodDisruptionBudgets indexed by namespace for victim choice (reference RM, feature `preemption`).

Why: the chooser tested every budget of the cluster against every candidate inside the store's
placement lock, so one tenant's thousands of budgets slowed every tenant's preemption. The index
reads only a victim's own namespace's budgets and is kept by the mirror as events arrive. These
tests show the victims chosen are those of the unindexed reference on random inputs, and that the
mirror, on the real control plane, rebuilds only the namespace an event concerns.
"""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client

from bindery.reference_rm.accounting import BoundPod, ClusterPods
from bindery.reference_rm.groups import MemberAsk
from bindery.reference_rm.mirror import BudgetMirror
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.preemption import (
    Budget,
    BudgetIndex,
    budget_from,
    choose_group_victims,
    choose_rule_victims,
    choose_victims,
)

NAMESPACES = ("a", "b", "c")
NODES = ("n1", "n2", "n3")
_NO_CONSTRAINTS: dict[str, Any] = {"node_selector": {}, "affinity_terms": [], "tolerations": []}


class Unindexed(BudgetIndex):
    """The reference: every budget of the cluster asked of every candidate, as before the index
    (each budget's own namespace check still decides whether it covers the pod)."""

    def __init__(self, budgets: list[Budget]) -> None:
        super().__init__({"": tuple(budgets)})
        self._all = tuple(budgets)

    def in_namespace(self, namespace: str) -> tuple[Budget, ...]:
        return self._all


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[BoundPod], list[Budget]]:
    pods = []
    for index in range(draw(st.integers(min_value=1, max_value=12))):
        group = draw(st.sampled_from([None, "a/g1", "b/g2"]))
        namespace = group.split("/")[0] if group else draw(st.sampled_from(NAMESPACES))
        pods.append(
            BoundPod(
                uid=f"u{index}",
                key=f"{namespace}/p{index}",
                node=draw(st.sampled_from(NODES)),
                usage={"cpu": Decimal(draw(st.integers(min_value=1, max_value=3))), "pods": Decimal(1)},
                priority=draw(st.integers(min_value=0, max_value=4)),
                labels=tuple(sorted({"app": draw(st.sampled_from("xyz"))}.items())),
                group=group,
            )
        )
    budgets = []
    for index in range(draw(st.integers(min_value=0, max_value=10))):
        selector = draw(
            st.sampled_from(
                [
                    None,
                    {},
                    {"matchLabels": {"app": "x"}},
                    {"matchLabels": {"app": "y"}},
                    {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x", "z"]}]},
                    {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
                ]
            )
        )
        disrupted = draw(st.lists(st.sampled_from([f"p{i}" for i in range(12)]), max_size=2))
        budgets.append(
            budget_from(
                {
                    "metadata": {"namespace": draw(st.sampled_from(NAMESPACES)), "name": f"pdb{index}"},
                    "spec": {} if selector is None else {"selector": selector},
                    "status": {
                        "disruptionsAllowed": draw(st.integers(min_value=0, max_value=2)),
                        "disruptedPods": {name: "2026-01-01T00:00:00Z" for name in disrupted},
                    },
                }
            )
        )
    return pods, budgets


def _nodes() -> list[InventoryNode]:
    return [InventoryNode(name=name, allocatable={"cpu": Decimal(6), "pods": Decimal(110)}) for name in NODES]


def _used(pods: list[BoundPod]) -> dict[str, dict[str, Decimal]]:
    used: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        for name, amount in pod.usage.items():
            used.setdefault(pod.node, {})[name] = used.get(pod.node, {}).get(name, Decimal(0)) + amount
    return used


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), cpu=st.integers(min_value=1, max_value=6))
def test_indexed_budgets_choose_the_victims_of_the_unindexed_reference(
    cluster: tuple[list[BoundPod], list[Budget]], cpu: int
) -> None:
    pods, budgets = cluster
    common: dict[str, Any] = {
        "nodes": _nodes(),
        "requests": {"cpu": Decimal(cpu)},
        "priority": 5,
        "used_by_node": _used(pods),
        "pods": ClusterPods.of(pods),
    }
    index = BudgetIndex.of(budgets)
    assert len(index) == len(budgets)
    reference = Unindexed(budgets)
    assert choose_victims(placement=_NO_CONSTRAINTS, budgets=index, **common) == choose_victims(
        placement=_NO_CONSTRAINTS, budgets=reference, **common
    )
    required = {pods[0].node: frozenset({pods[0].uid})}
    assert choose_rule_victims(tolerations=[], required=required, budgets=index, **common) == (
        choose_rule_victims(tolerations=[], required=required, budgets=reference, **common)
    )
    group: dict[str, Any] = {
        "members": [MemberAsk(label=f"g/m{i}", requests={"cpu": Decimal(cpu)}) for i in range(2)],
        "topology_keys": [],
        "nodes": common["nodes"],
        "priority": 5,
        "used_by_node": common["used_by_node"],
        "pods": common["pods"],
        "policy": Policy.BINPACK,
    }
    assert choose_group_victims(budgets=index, **group) == choose_group_victims(budgets=reference, **group)


def test_an_index_changes_one_namespace_and_keeps_the_order_budgets_came_in() -> None:
    def budget(namespace: str, name: str, allowed: int = 0) -> Budget:
        return budget_from(
            {"metadata": {"namespace": namespace, "name": name}, "status": {"disruptionsAllowed": allowed}}
        )

    index = BudgetIndex.of([budget("a", "one"), budget("b", "two"), budget("a", "three")])
    changed = index.put(budget("a", "one", allowed=1))
    assert [b.name for b in changed.in_namespace("a")] == ["one", "three"]
    assert changed.in_namespace("a")[0].disruptions_allowed == 1
    assert changed.in_namespace("b") is index.in_namespace("b")
    assert index.in_namespace("a")[0].disruptions_allowed == 0  # the old index is unchanged
    removed = changed.remove("a", "one").remove("a", "three")
    assert removed.in_namespace("a") == ()
    assert len(removed) == 1
    assert removed.remove("a", "absent") is removed


@pytest.fixture
def two_namespaces() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"pdb-{tag}-a", f"pdb-{tag}-b"


@pytest.mark.controlplane
async def test_the_budget_mirror_rebuilds_only_the_namespace_an_event_concerns(
    kube_api: client.ApiClient, two_namespaces: tuple[str, str]
) -> None:
    """The mirror hands the RM an index; an event about one namespace's budget leaves every other
    namespace's entry as it was (the same tuple), so a change costs that namespace, not the cluster."""
    first, second = two_namespaces
    core = client.CoreV1Api(kube_api)
    policy = client.PolicyV1Api(kube_api)
    for name in two_namespaces:
        await core.create_namespace(body={"metadata": {"name": name}})

    def pdb(name: str, app: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        }

    await policy.create_namespaced_pod_disruption_budget(first, pdb("keep", "x"))
    await policy.create_namespaced_pod_disruption_budget(second, pdb("other", "y"))
    published: list[BudgetIndex] = []
    mirror = BudgetMirror(api=kube_api, on_change=published.append, max_backoff=0.1)
    task = asyncio.create_task(mirror.run())

    async def until(condition: Any, what: str) -> BudgetIndex:
        try:
            async with asyncio.timeout(30):
                while not (published and condition(published[-1])):
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"timed out waiting until {what}") from None
        return published[-1]

    try:
        before = await until(
            lambda index: index.in_namespace(first) and index.in_namespace(second), "both budgets are known"
        )
        await policy.patch_namespaced_pod_disruption_budget(
            "keep", first, {"spec": {"selector": {"matchLabels": {"app": "z"}}}}
        )
        after = await until(
            lambda index: index.in_namespace(first)[0].selector != before.in_namespace(first)[0].selector,
            "the changed selector is known",
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert after.in_namespace(second) is before.in_namespace(second)
    assert [b.name for b in after.in_namespace(first)] == ["keep"]
