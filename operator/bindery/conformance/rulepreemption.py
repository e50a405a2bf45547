"""Conformance check of contract v1.2.4's ``rule-preemption`` feature.

Why it matters: Bindery lists in ``rulePreemption`` the nodes its inter-pod rules exclude only
because of named lower-priority pods. An RM that places the pod on such a node breaks the rule (a
spread or an anti-affinity) the caller was keeping; an RM that plans there without the named pods
evicts pods for nothing, since the rule still excludes the node afterwards. The kit's victims are
pods the RM itself placed and that were committed (the RM counts those by their reserve's priority).
"""

from __future__ import annotations

from typing import Any

from bindery.conformance.clusters import _info
from bindery.conformance.harness import Harness, expect_problem, expect_reservation, expect_status, require
from bindery.conformance.preemption import PREEMPTION_FEATURE
from bindery.rm.errors import ProblemType

RULE_PREEMPTION_FEATURE = "rule-preemption"
_LOW, _HIGH = 1, 1000


def _on(body: dict[str, Any], node: str, *, priority: int, victim: dict[str, Any]) -> dict[str, Any]:
    """``body`` as a preemptor that may go only to ``node`` and names ``victim`` for its rules there."""
    return {
        **body,
        "pod": {**body["pod"], "priority": priority},
        "placement": {
            **body["placement"],
            "requiredNodeAffinity": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ],
        },
        "preemptionPolicy": "PreemptLowerPriority",
        "rulePreemption": [
            {
                "node": node,
                "victims": [{k: victim[k] for k in ("namespace", "name", "uid")}],
            }
        ],
    }


async def check_rule_preemption(h: Harness) -> None:
    """A low-priority pod on node N; a high-priority pod that may go only to N and names it for a
    rule there: it is never placed on N, even with room, and the plan (if any) is on N and names
    it. A preemptor naming a pod of its own priority gets no plan naming it."""
    features = (await _info(h)).get("features") or []
    if RULE_PREEMPTION_FEATURE not in features or PREEMPTION_FEATURE not in features:
        return  # optional: an RM without it is never sent rulePreemption
    low = {**h.request_body(), "pod": {**h.request_body()["pod"]}}
    low["pod"]["priority"] = _LOW
    placed = expect_reservation(await h.reserve(low), 201, "reserve a low-priority pod")
    expect_reservation(await h.commit(placed["id"]), 200, "commit it")
    node = str(placed["node"])
    preemptor = _on(h.request_body(), node, priority=_HIGH, victim=low["pod"])
    answer = expect_problem(
        await h.reserve(preemptor),
        409,
        ProblemType.UNSCHEDULABLE,
        f"reserve a pod whose rulePreemption lists node {node}, the only node its placement allows "
        "(it must never be placed there, room or not)",
    )
    plan = answer.get("preemption")
    if plan is not None:
        require(
            plan.get("node") == node, f"the plan is on node {plan.get('node')!r}; only {node} was allowed"
        )
        uids = {str((v.get("pod") or {}).get("uid")) for v in plan.get("victims") or ()}
        require(
            low["pod"]["uid"] in uids,
            f"a plan on node {node} must name the pod rulePreemption lists there; it names {sorted(uids)}",
        )
        expect_status(
            await h.http.post(f"/v1/preemptions/{plan['planId']}:cancel", json={}, headers=h.auth),
            200,
            "cancel the plan",
        )
    equal = _on(h.request_body(), node, priority=_LOW, victim=low["pod"])
    refused = expect_problem(
        await h.reserve(equal), 409, ProblemType.UNSCHEDULABLE, "reserve naming a pod of equal priority"
    )
    named = {(v.get("pod") or {}).get("uid") for v in (refused.get("preemption") or {}).get("victims") or ()}
    require(
        low["pod"]["uid"] not in named,
        "a plan named a pod of the preemptor's own priority: only pods of strictly lower priority "
        "are victims",
    )
    expect_status(await h.release(placed["id"]), 204, "release the low-priority pod")
