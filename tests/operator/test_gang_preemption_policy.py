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
        api=cast(Any, None), rm=cast(Any, None), logger=logging.getLogger("test"), clock=lambda: now[0]
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
