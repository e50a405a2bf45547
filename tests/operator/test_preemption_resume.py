"""Which victims of a plan are already dealt with when a process meets the plan again (issue 21).

Why: a restarted operator (or a new leader) finds the plan its predecessor confirmed in the RM's
answer while the victims terminate. Evicting them again posts a second ``Preempted`` event; calling
a confirmed plan's gone victims "gone, refuse" cancels the held room after they were evicted.
The process test is tests/operator/test_preemption_crash.py; this pins the rule case by case.
"""

from __future__ import annotations

from typing import Any

import pytest

from bindery.controller.preemption import _resumed
from bindery.rm.models import PlanState, PreemptionPlan


def _plan(state: PlanState) -> PreemptionPlan:
    return PreemptionPlan.model_validate(
        {
            "planId": "pln-1",
            "node": "a",
            "podUid": "u-high",
            "leaseSeconds": 60,
            "state": state.value,
            "victims": [{"pod": {"namespace": "ns", "name": "low", "uid": "u-low"}, "frees": {"cpu": "2"}}],
        }
    )


RUNNING: dict[str, Any] = {"metadata": {"uid": "u-low"}, "spec": {"nodeName": "a"}}
TERMINATING: dict[str, Any] = {"metadata": {"uid": "u-low", "deletionTimestamp": "2026-12-04T00:00:00Z"}}
RECREATED: dict[str, Any] = {"metadata": {"uid": "u-other"}, "spec": {"nodeName": "b"}}


@pytest.mark.parametrize(
    ("state", "body", "gone", "terminating"),
    [
        (PlanState.CONFIRMED, RUNNING, 0, 0),  # killed before evicting: evict it now
        (PlanState.CONFIRMED, TERMINATING, 0, 1),  # evicted, not gone yet: never again
        (PlanState.CONFIRMED, None, 1, 0),  # evicted and gone: done
        (PlanState.CONFIRMED, RECREATED, 1, 0),  # evicted, then recreated by its StatefulSet: done
        (PlanState.PROPOSED, TERMINATING, 0, 1),  # someone else deletes it: no eviction on top
        (PlanState.PROPOSED, None, 0, 0),  # the RM's view was old: vet refuses the plan
        (PlanState.PROPOSED, RECREATED, 0, 0),  # another pod under that name: vet refuses
    ],
)
def test_a_plan_met_again_evicts_only_the_victims_still_running(
    state: PlanState, body: dict[str, Any] | None, gone: int, terminating: int
) -> None:
    found = _resumed(_plan(state), {"ns/low": body})
    assert (len(found.gone), len(found.terminating)) == (gone, terminating)
