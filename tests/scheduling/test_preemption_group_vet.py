"""Vetting a pod group's preemption plan (feature ``group-preemption``; issue 21 item 4).

Why: a group's plan has victims on several nodes and holds a room per member. Bindery must judge
each victim against its own node, judge priorities against the group's LOWEST member (a victim above
any member would be a pod preempted by one of lower priority), refuse the plan when any member says
``Never``, and refuse a plan whose members are not the group's pending pods.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bindery.rm.models import PreemptionPlan
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from bindery.scheduling.preemption import PlanScope, Preemptor, Refusal, VictimScope
from bindery.scheduling.preemption import vet as vet_plan


def vet(plan: PreemptionPlan, **kwargs: Any) -> str | None:
    """The vetting of a plan that was asked for, from an RM whose plans may name any pod."""
    refusal: Refusal | None = vet_plan(
        plan,
        asked="PreemptLowerPriority",
        scope=PlanScope(rm_name="rm", victims=VictimScope.ANY),
        nodes=lambda name: NodeProjection(name=name),
        **kwargs,
    )
    return None if refusal is None else refusal.message


MEMBERS = (
    PodInfo(uid="m0", namespace="ml", name="train-0", scheduler_name="bindery", priority=100),
    PodInfo(uid="m1", namespace="ml", name="train-1", scheduler_name="bindery", priority=50),
)
GROUP = Preemptor.of_group(namespace="ml", name="train", members=MEMBERS)
PLAN = PreemptionPlan.model_validate(
    {
        "planId": "pln-g",
        "node": "a",
        "podUid": "group/ml/train",
        "leaseSeconds": 60,
        "members": [{"podUid": "m0", "node": "a"}, {"podUid": "m1", "node": "b"}],
        "victims": [
            {"node": "a", "pod": {"namespace": "ml", "name": "low-a", "uid": "u-a"}, "frees": {"cpu": "2"}},
            {"node": "b", "pod": {"namespace": "ml", "name": "low-b", "uid": "u-b"}, "frees": {"cpu": "2"}},
        ],
    }
)


def _victims(**priorities: int) -> dict[str, Any]:
    return {
        f"ml/low-{node}": {
            "metadata": {"uid": f"u-{node}"},
            "spec": {
                "nodeName": node,
                "priority": priorities.get(node, 10),
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}],
            },
        }
        for node in "ab"
    }


def test_a_group_plan_whose_victims_are_on_their_own_nodes_may_be_carried_out() -> None:
    assert GROUP.uid == PLAN.pod_uid
    assert vet(PLAN, preemptor=GROUP, victims=_victims()) is None
    assert GROUP.pod_on(PLAN, "b").uid == "m1"  # the Preempted event on b names the member placed there


def test_a_victim_is_judged_on_its_own_node_not_the_plans() -> None:
    moved = _victims()
    moved["ml/low-b"]["spec"]["nodeName"] = "a"
    assert "is not on node b but on a" in (vet(PLAN, preemptor=GROUP, victims=moved) or "")


def test_a_victim_must_be_below_the_lowest_member() -> None:
    why = vet(PLAN, preemptor=GROUP, victims=_victims(b=60))
    assert why is not None
    assert "not lower than pod group ml/train's 50" in why


def test_a_member_with_policy_never_refuses_the_plan() -> None:
    never = Preemptor.of_group(
        namespace="ml",
        name="train",
        members=(MEMBERS[0], dataclasses.replace(MEMBERS[1], preemption_policy="Never")),
    )
    assert "ml/train-1 has preemptionPolicy Never" in (vet(PLAN, preemptor=never, victims=_victims()) or "")


def test_a_plan_for_other_members_or_another_group_is_refused() -> None:
    fewer = Preemptor.of_group(namespace="ml", name="train", members=MEMBERS[:1])
    assert "other pods than the pending members" in (vet(PLAN, preemptor=fewer, victims=_victims()) or "")
    other = Preemptor.of_group(namespace="ml", name="eval", members=MEMBERS)
    assert "the plan is for pod uid group/ml/train" in (vet(PLAN, preemptor=other, victims=_victims()) or "")
    # A pod never carries out a group's plan.
    assert vet(PLAN, preemptor=MEMBERS[0], victims=_victims()) is not None
