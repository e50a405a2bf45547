"""What a pod group's reserve asks of preemption (feature ``group-preemption``), without I/O.

Why: on main a group's reserve carried no ``preemptionPolicy``, so the RM never proposed a plan
for a gang however high its priority. It must ask for one as a pod's reserve does, and not when a
member says ``Never`` or while the group backs off after a failed plan (no eviction loops).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, cast

from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.placement import Placement
from bindery.controller.preemption import Preemptions
from bindery.scheduling.podgroups import PodGroupInfo
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.preemption import PlanScope

INFO = PodGroupInfo(namespace="ml", name="train")
MEMBERS = [
    PodInfo(uid=f"m{i}", namespace="ml", name=f"train-{i}", scheduler_name="b", priority=100)
    for i in range(2)
]


def _unused() -> Any:
    raise AssertionError("no I/O expected")


def _placement(preemptions: Preemptions | None) -> Placement:
    return Placement(
        profile=_unused,
        ports=_unused,
        rm=_unused,
        logger=logging.getLogger("test"),
        metrics=Metrics(),
        reporter=cast(Any, None),
        backoff=lambda group: 1.0,
        on_released=lambda: None,
        on_outcome=lambda pod, outcome: None,
        preemptions=preemptions,
    )


def test_a_group_asks_for_a_plan_unless_a_member_says_never_or_it_backs_off() -> None:
    now = [0.0]
    preemptions = Preemptions(
        api=cast(Any, None),
        rm=cast(Any, None),
        logger=logging.getLogger("test"),
        scope=lambda: PlanScope(rm_name="rm"),
        nodes=lambda name: None,
        clock=lambda: now[0],
    )
    placement = _placement(preemptions)
    assert placement._preemption_policy(INFO, MEMBERS) == "PreemptLowerPriority"
    never = [MEMBERS[0], dataclasses.replace(MEMBERS[1], preemption_policy="Never")]
    assert placement._preemption_policy(INFO, never) == "Never"
    preemptions._back_off("group/ml/train", "a budget refused a victim")
    assert placement._preemption_policy(INFO, MEMBERS) == "Never"
    now[0] += 3600.0  # the back-off is over
    assert placement._preemption_policy(INFO, MEMBERS) == "PreemptLowerPriority"
    assert _placement(None)._preemption_policy(INFO, MEMBERS) is None  # no preemption step: no field


def test_each_member_is_nominated_on_the_node_its_room_is_held_on() -> None:
    """kube-scheduler nominates a preemptor on the node it preempted on; a group's members are
    nominated each on its own node of the plan, a pod on the plan's node."""
    from bindery.rm.models import PreemptionPlan
    from bindery.scheduling.preemption import Preemptor

    victim = {"node": "b", "pod": {"namespace": "ml", "name": "low", "uid": "u"}, "frees": {"cpu": "2"}}
    plan = PreemptionPlan.model_validate(
        {
            "planId": "pln-g",
            "node": "a",
            "podUid": "group/ml/train",
            "leaseSeconds": 60,
            "members": [{"podUid": "m0", "node": "a"}, {"podUid": "m1", "node": "b"}],
            "victims": [victim],
        }
    )
    group = Preemptor.of_group(namespace="ml", name="train", members=MEMBERS)
    assert [(pod.name, node) for pod, node in Preemptions._nominations(group, plan)] == [
        ("train-0", "a"),
        ("train-1", "b"),
    ]
    single = plan.model_copy(update={"members": [], "pod_uid": "m0"})
    assert [
        (pod.name, node) for pod, node in Preemptions._nominations(Preemptor.of_pod(MEMBERS[0]), single)
    ] == [("train-0", "a")]
