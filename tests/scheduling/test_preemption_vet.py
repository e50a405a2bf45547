"""The pure vetting of an RM's preemption plan (bindery.scheduling.preemption), issue 21.

Why: the RM's view of the pods may be a moment old. Evicting a pod that was recreated under the
victim's name, moved, or raised in priority would evict a pod for nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from bindery.rm.models import PreemptionPlan
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from bindery.scheduling.preemption import (
    PlanScope,
    Refusal,
    VictimScope,
    budgets_exceeded,
    disruption_condition,
    preempted_note,
)
from bindery.scheduling.preemption import vet as vet_plan

#: A reserve that asked for a plan, from an RM whose plans may name any pod, on known nodes: what
#: these tests judge is the cluster having moved on (tests/scheduling/test_preemption_scope.py
#: judges the rest).
ANY = PlanScope(rm_name="rm", victims=VictimScope.ANY)


def vet(plan: PreemptionPlan, **kwargs: Any) -> Refusal | None:
    return vet_plan(
        plan, asked="PreemptLowerPriority", scope=ANY, nodes=lambda name: NodeProjection(name=name), **kwargs
    )


PREEMPTOR = PodInfo(uid="u-high", namespace="ns", name="high", scheduler_name="bindery", priority=100)
PLAN = PreemptionPlan.model_validate(
    {
        "planId": "pln-1",
        "node": "a",
        "podUid": "u-high",
        "leaseSeconds": 60,
        "victims": [{"pod": {"namespace": "ns", "name": "low", "uid": "u-low"}, "frees": {"cpu": "2"}}],
    }
)


def _victim(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"uid": "u-low"},
        "spec": {
            "nodeName": "a",
            "priority": 10,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}],
        },
    }
    for key, value in changes.items():
        section = "metadata" if key == "uid" else "spec"
        body[section][key] = value
    return body


def test_a_plan_whose_victims_are_as_the_rm_saw_them_may_be_carried_out() -> None:
    assert vet(PLAN, preemptor=PREEMPTOR, victims={"ns/low": _victim()}) is None


@pytest.mark.parametrize(
    ("victims", "preemptor", "why"),
    [
        ({"ns/low": None}, PREEMPTOR, "victim ns/low is gone"),
        ({"ns/low": _victim(uid="u-other")}, PREEMPTOR, "was recreated"),
        ({"ns/low": _victim(nodeName="b")}, PREEMPTOR, "is not on node a but on b"),
        ({"ns/low": _victim(priority=100)}, PREEMPTOR, "not lower than"),
        (
            {"ns/low": _victim()},
            dataclasses.replace(PREEMPTOR, preemption_policy="Never"),
            "preemptionPolicy Never",
        ),
        (
            {"ns/low": _victim()},
            PodInfo(uid="u-else", namespace="ns", name="high", scheduler_name="bindery", priority=100),
            "the plan is for pod uid u-high",
        ),
    ],
)
def test_a_plan_is_refused_when_the_cluster_moved_on(
    victims: dict[str, dict[str, Any] | None], preemptor: PodInfo, why: str
) -> None:
    refusal = vet(PLAN, preemptor=preemptor, victims=victims)
    assert refusal is not None
    assert why in str(refusal)


def test_what_the_victims_are_told_is_what_kube_scheduler_tells_them() -> None:
    condition = disruption_condition(
        now=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), scheduler_name="s"
    )
    assert condition["type"] == "DisruptionTarget"
    assert condition["reason"] == "PreemptionByScheduler"
    assert condition["status"] == "True"
    assert condition["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert preempted_note(preemptor=PREEMPTOR, node="a") == "Preempted by pod u-high on node a"


def test_a_plan_naming_a_victim_a_budget_protects_is_refused_whole() -> None:
    plan = PLAN.model_copy(
        update={"victims": [PLAN.victims[0].model_copy(update={"violated_budgets": ["keep-low"]})]}
    )
    why = vet(plan, preemptor=PREEMPTOR, victims={"ns/low": _victim()})
    assert why is not None
    assert "PodDisruptionBudget ns/keep-low" in str(why)


def test_a_plan_evicting_part_of_a_pod_group_is_refused() -> None:
    """Issue 21: Bindery refuses victim sets that would break a gang; a whole group may go."""
    member = _victim(schedulingGroup={"podGroupName": "gang"})
    member["metadata"]["namespace"] = "ns"
    part = vet(
        PLAN, preemptor=PREEMPTOR, victims={"ns/low": member}, group_members={"ns/gang": {"u-low", "u-2"}}
    )
    assert part is not None
    assert "part of pod group ns/gang" in str(part)
    assert (
        vet(PLAN, preemptor=PREEMPTOR, victims={"ns/low": member}, group_members={"ns/gang": {"u-low"}})
        is None
    )


def _running(
    name: str, *, labels: dict[str, str], phase: str = "Running", namespace: str = "ns"
) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels}, "status": {"phase": phase}}


def _pdb(
    name: str, *, selector: dict[str, Any] | None, allowed: int, namespace: str = "ns"
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {} if selector is None else {"selector": selector},
        "status": {"disruptionsAllowed": allowed},
    }


def test_two_victims_under_a_budget_allowing_one_disruption_exceed_it() -> None:
    victims = [_running("a", labels={"app": "db"}), _running("b", labels={"app": "db"})]
    why = budgets_exceeded(victims, [_pdb("one", selector={"matchLabels": {"app": "db"}}, allowed=1)])
    assert why is not None
    assert "ns/one" in why
    assert "ns/a, ns/b" in why
    assert "allows 1" in why


def test_victims_within_their_budgets_exceed_nothing() -> None:
    victims = [_running("a", labels={"app": "db"}), _running("b", labels={"app": "web"})]
    budgets = [
        _pdb("db", selector={"matchLabels": {"app": "db"}}, allowed=1),
        _pdb("web", selector={"matchLabels": {"app": "web"}}, allowed=1),
        _pdb("both", selector={"matchExpressions": [{"key": "app", "operator": "Exists"}]}, allowed=2),
    ]
    assert budgets_exceeded(victims, budgets) is None


def test_only_running_victims_of_the_budgets_namespace_that_it_selects_count() -> None:
    budget = _pdb("one", selector={"matchLabels": {"app": "db"}}, allowed=1)
    assert (
        budgets_exceeded(
            [_running("a", labels={"app": "db"}), _running("b", labels={"app": "db"}, phase="Pending")],
            [budget],
        )
        is None
    )
    assert (
        budgets_exceeded(
            [_running("a", labels={"app": "db"}), _running("b", labels={"app": "db"}, namespace="other")],
            [budget],
        )
        is None
    )
    assert (
        budgets_exceeded(
            [_running("a", labels={"app": "db"}), _running("b", labels={"app": "web"})], [budget]
        )
        is None
    )


def test_an_empty_selector_covers_every_pod_and_an_absent_one_none() -> None:
    victims = [_running("a", labels={"app": "db"}), _running("b", labels={})]
    assert budgets_exceeded(victims, [_pdb("all", selector={}, allowed=1)]) is not None
    assert budgets_exceeded(victims, [_pdb("none", selector=None, allowed=0)]) is None
