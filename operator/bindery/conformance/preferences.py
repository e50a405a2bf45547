"""Conformance check of contract v1.2's ``node-preferences`` feature.

Why it matters: Bindery sends a pod's preferred node affinity only to an RM that lists the feature,
and from then on trusts it to weigh them; an RM that lists it and ignores the field would silently
place pods as if they preferred nothing (a Deployment's pods bunched where spreading was asked).
An RM that does not list it must never see the field (a v1.1 RM answers ``400`` to unknown
fields), so the check sends nothing to such an RM.

The kit knows nothing of the pool's labels, so it names nodes by ``metadata.name`` (``matchFields``),
which every RM that honours node-selector terms evaluates; it learns the names by filling the pool.
"""

from __future__ import annotations

from typing import Any

from bindery.conformance.clusters import _info
from bindery.conformance.groups import expect_group
from bindery.conformance.harness import Harness, expect_problem, expect_reservation, expect_status, require
from bindery.rm.errors import ProblemType

NODE_PREFERENCES_FEATURE = "node-preferences"


def _preferring(body: dict[str, Any], node: str, *, weight: int = 100) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    placement = {**body["placement"], "preferredNodeAffinity": [{"weight": weight, "preference": term}]}
    return {**body, "placement": placement}


async def _nodes_if_preferences(h: Harness) -> list[str] | None:
    """The RM's nodes, learned by filling every slot and releasing them all; None for an RM that
    does not list node-preferences (optional: it is never sent preferredNodeAffinity)."""
    features = (await _info(h)).get("features") or []
    if NODE_PREFERENCES_FEATURE not in features:
        return None
    held = [
        expect_reservation(await h.reserve(h.request_body()), 201, f"reserve slot {i + 1} to learn the nodes")
        for i in range(h.config.capacity)
    ]
    for reservation in held:
        await h.release(reservation["id"])
    return sorted({str(reservation["node"]) for reservation in held})


async def check_node_preferences(h: Harness) -> None:
    """An RM listing node-preferences puts a pod on the feasible node its only preferred term names."""
    nodes = await _nodes_if_preferences(h)
    if nodes is None:
        return
    for node in nodes:  # every node had a free slot a moment ago, and now has them all again
        placed = expect_reservation(
            await h.reserve(_preferring(h.request_body(), node)), 201, f"reserve preferring node {node}"
        )
        require(
            placed.get("node") == node,
            f"a pod whose only preferred term (weight 100) names node {node}, which has room, was placed "
            f"on {placed.get('node')!r}: an RM listing {NODE_PREFERENCES_FEATURE!r} must prefer a "
            "feasible node that matches over nodes that match nothing",
        )
        await h.release(placed["id"])
    nowhere = f"{h.run_id}-no-such-node"
    expect_reservation(
        await h.reserve(_preferring(h.request_body(), nowhere)),
        201,
        "reserve preferring a node that does not exist (a preference is soft: it never refuses)",
    )
    for weight in (0, 101):
        expect_problem(
            await h.reserve(_preferring(h.request_body(), nodes[0], weight=weight)),
            400,
            ProblemType.INVALID_REQUEST,
            f"reserve with a preferred term of weight {weight} (1 to 100)",
        )


async def check_group_node_preferences(h: Harness) -> None:
    """An RM listing node-preferences puts each member of a group on the feasible node its only
    preferred term names (the field is per member, as in a single reserve).

    Why: Bindery sends a gang's soft rules (ScheduleAnyway and default spreading, preferred pod
    affinity) per member of the group reserve; an RM that scores them for single pods only would
    place every gang by its policy alone. Each member names a different node, in two different
    orders (the names sorted, then rotated by one), so an RM placing by its policy alone, which
    places both groups alike, cannot meet both by chance.
    """
    nodes = await _nodes_if_preferences(h)
    if nodes is None:
        return
    if len(nodes) < 2:
        return  # one node: every member lands on it whatever it prefers
    for wanted in (nodes, nodes[1:] + nodes[:1]):
        body = h.group_body(len(wanted))
        body["members"] = [
            _preferring(member, node) for member, node in zip(body["members"], wanted, strict=True)
        ]
        group = expect_group(
            await h.reserve_group(body), 201, "reserve a group whose members prefer a node each", body
        )
        placed = [member.get("node") for member in group["members"]]
        require(
            placed == wanted,
            f"a group whose members each prefer (one term, weight 100) a different node with room, {wanted}, "
            f"was placed on {placed}: an RM listing {NODE_PREFERENCES_FEATURE!r} must score each member's "
            "preferredNodeAffinity in a group reserve as in a single reserve",
        )
        expect_status(await h.release_group(group["id"]), 204, "release the group")
