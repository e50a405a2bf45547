"""Conformance check of contract v1.2's ``preemption`` feature.

Why it matters: Bindery sends ``preemptionPolicy`` only to an RM listing the feature, and then
evicts the pods the RM's plan names. An RM that proposes a victim of equal or higher priority, or
that lets another pod take the room a confirmed plan holds, makes Bindery evict pods for nothing
(kubernetes#72124). The kit cannot create pods, so its victims are pods the RM itself placed (the
contract asks an RM listing the feature to count those, by the priority their reserve carried).
"""

from __future__ import annotations

from typing import Any

from bindery.conformance.clusters import _info
from bindery.conformance.groups import expect_group
from bindery.conformance.harness import Harness, expect_problem, expect_reservation, expect_status, require
from bindery.rm.errors import ProblemType

PREEMPTION_FEATURE = "preemption"
_LOW, _HIGH = 1, 1000


def _with(body: dict[str, Any], *, priority: int, policy: str | None) -> dict[str, Any]:
    changed = {**body, "pod": {**body["pod"], "priority": priority}}
    if policy is not None:
        changed["preemptionPolicy"] = policy
    return changed


async def check_preemption(h: Harness) -> None:
    """A full pool of priority-1 pods; a priority-1000 pod gets a plan naming lower-priority victims;
    once confirmed and the victims gone, the room is the preemptor's and nobody else's."""
    features = (await _info(h)).get("features") or []
    if PREEMPTION_FEATURE not in features:
        return  # optional: an RM without it is never sent preemptionPolicy
    ours: dict[str, str] = {}  # reservation id -> pod uid
    for i in range(h.config.capacity):
        body = _with(h.request_body(), priority=_LOW, policy=None)
        placed = expect_reservation(await h.reserve(body), 201, f"reserve low-priority slot {i + 1}")
        expect_reservation(await h.commit(placed["id"]), 200, "commit")
        ours[placed["id"]] = body["pod"]["uid"]
    never = _with(h.request_body(), priority=_HIGH, policy="Never")
    refused = expect_problem(
        await h.reserve(never), 409, ProblemType.UNSCHEDULABLE, "reserve with policy Never"
    )
    require(refused.get("preemption") is None, "a request with preemptionPolicy Never got a preemption plan")

    preemptor = _with(h.request_body(), priority=_HIGH, policy="PreemptLowerPriority")
    answer = expect_problem(
        await h.reserve(preemptor),
        409,
        ProblemType.UNSCHEDULABLE,
        "reserve a high-priority pod in a full pool",
    )
    plan = answer.get("preemption")
    require(isinstance(plan, dict), "no preemption plan for a priority-1000 pod in a pool of priority-1 pods")
    assert isinstance(plan, dict)
    victims = plan.get("victims") or []
    require(bool(victims), "a plan must name at least one victim")
    require(plan.get("podUid") == preemptor["pod"]["uid"], f"the plan is for pod {plan.get('podUid')!r}")
    for victim in victims:
        require(
            victim.get("reservationId") in ours,
            f"victim {victim} is not one of the priority-1 pods the kit placed",
        )
        budgets = victim.get("violatedBudgets", [])
        require(
            isinstance(budgets, list) and all(isinstance(b, str) and b for b in budgets),
            f"victim {victim}: violatedBudgets must be a list of PodDisruptionBudget names",
        )
    again = expect_problem(await h.reserve(preemptor), 409, ProblemType.UNSCHEDULABLE, "reserve again")
    require(
        (again.get("preemption") or {}).get("planId") == plan["planId"],
        "asked again while the plan is proposed, the RM must answer the same plan",
    )
    plan_path = f"/v1/preemptions/{plan['planId']}"
    confirmed = await h.http.post(f"{plan_path}:confirm", json={}, headers=h.auth)
    expect_status(confirmed, 200, "confirm the plan")
    require(
        confirmed.json().get("state") == "confirmed",
        f"confirm answered state {confirmed.json().get('state')!r}",
    )
    for victim in victims:  # the victims are evicted: their reservations go
        expect_status(await h.release(victim["reservationId"]), 204, "release a victim's reservation")
    intruder = _with(h.request_body(), priority=_HIGH * 10, policy=None)
    expect_problem(
        await h.reserve(intruder),
        409,
        ProblemType.UNSCHEDULABLE,
        "another pod reserving while a confirmed plan holds the freed room (it is the preemptor's only)",
    )
    expect_reservation(await h.reserve(preemptor), 201, "the preemptor reserves the held room")
    expect_problem(
        await h.http.post(f"{plan_path}:confirm", json={}, headers=h.auth),
        409,
        ProblemType.PLAN_NOT_ACTIVE,
        "confirm a plan the preemptor used",
    )
    expect_status(
        await h.http.post(f"{plan_path}:cancel", json={}, headers=h.auth), 200, "cancel (idempotent)"
    )
    expect_problem(
        await h.http.post(f"/v1/preemptions/{h.run_id}-no-such-plan:confirm", json={}, headers=h.auth),
        404,
        ProblemType.NOT_FOUND,
        "confirm an unknown plan",
    )


GROUP_PREEMPTION_FEATURE = "group-preemption"


async def check_group_preemption(h: Harness) -> None:
    """A full pool of priority-1 pods; a group of two priority-1000 members gets ONE plan for the
    whole group (its key ``group/<namespace>/<name>``, each member with the node its room is held
    on, each victim with its node); once confirmed and the victims gone, a single pod and another
    group are refused the held room, and the group's reserve gets it (the plan is then used)."""
    features = (await _info(h)).get("features") or []
    if GROUP_PREEMPTION_FEATURE not in features:
        return  # optional: an RM without it is never sent a group's preemptionPolicy
    ours: dict[str, str] = {}  # reservation id -> pod uid
    for i in range(h.config.capacity):
        body = _with(h.request_body(), priority=_LOW, policy=None)
        placed = expect_reservation(await h.reserve(body), 201, f"reserve low-priority slot {i + 1}")
        expect_reservation(await h.commit(placed["id"]), 200, "commit")
        ours[placed["id"]] = body["pod"]["uid"]
    group = h.group_body(2)
    for member in group["members"]:
        member["pod"]["priority"] = _HIGH
    never = expect_problem(
        await h.reserve_group({**group, "preemptionPolicy": "Never"}),
        409,
        ProblemType.UNSCHEDULABLE,
        "reserve a group with policy Never",
    )
    require(never.get("preemption") is None, "a group with preemptionPolicy Never got a preemption plan")
    group["preemptionPolicy"] = "PreemptLowerPriority"
    answer = expect_problem(
        await h.reserve_group(group),
        409,
        ProblemType.UNSCHEDULABLE,
        "reserve a high-priority group in a full pool",
    )
    plan = answer.get("preemption")
    require(
        isinstance(plan, dict), "no preemption plan for a priority-1000 group in a pool of priority-1 pods"
    )
    assert isinstance(plan, dict)
    key = f"group/{group['group']['namespace']}/{group['group']['name']}"
    require(plan.get("podUid") == key, f"a group's plan has podUid {plan.get('podUid')!r}, expected {key!r}")
    members = plan.get("members") or []
    asked = sorted(member["pod"]["uid"] for member in group["members"])
    require(
        sorted(str(m.get("podUid")) for m in members) == asked and all(m.get("node") for m in members),
        f"a group's plan must name each member once with its node; got {members}",
    )
    victims = plan.get("victims") or []
    require(
        len(victims) >= 2, f"two members of one slot each need two victims; the plan names {len(victims)}"
    )
    for victim in victims:
        require(
            victim.get("reservationId") in ours and bool(victim.get("node")),
            f"victim {victim} is not one of the priority-1 pods the kit placed, with its node",
        )
    again = expect_problem(
        await h.reserve_group(group), 409, ProblemType.UNSCHEDULABLE, "reserve the group again"
    )
    require(
        (again.get("preemption") or {}).get("planId") == plan["planId"],
        "asked again while the plan is proposed, the RM must answer the same plan",
    )
    plan_path = f"/v1/preemptions/{plan['planId']}"
    expect_status(await h.http.post(f"{plan_path}:confirm", json={}, headers=h.auth), 200, "confirm the plan")
    for victim in victims:
        expect_status(await h.release(victim["reservationId"]), 204, "release a victim's reservation")
    intruder = _with(h.request_body(), priority=_HIGH * 10, policy=None)
    expect_problem(
        await h.reserve(intruder),
        409,
        ProblemType.UNSCHEDULABLE,
        "a pod reserving while a confirmed group plan holds the freed room (it is the group's only)",
    )
    expect_problem(
        await h.reserve_group(h.group_body(1)),
        409,
        ProblemType.UNSCHEDULABLE,
        "another group reserving while a confirmed group plan holds the freed room",
    )
    expect_group(await h.reserve_group(group), 201, "the group reserves the held room", group)
    expect_problem(
        await h.http.post(f"{plan_path}:confirm", json={}, headers=h.auth),
        409,
        ProblemType.PLAN_NOT_ACTIVE,
        "confirm a plan the group used",
    )
