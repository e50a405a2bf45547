"""Conformance checks for reservation groups (contract v1.1): all members or none.

What they prove on the wire: a group that does not fit leaves nothing behind, even when several
groups race for the same pool; one idempotency key replays the group; topology keeps every member
within one value of the label; members are ordinary reservations (committed and released one by
one, listed with ``groupId``); the group is released and renewed as a whole.

An RM certified at ``--contract-version 1.0`` has no groups: the kit then only checks that the path
answers 404 not-found and reserves nothing (``groups-path``), which is how Bindery tells such an RM
apart.  A 404 at 1.1 fails every group check with that advice.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import httpx

from bindery.conformance.harness import (
    ConformanceFailure,
    Harness,
    expect_problem,
    expect_reservation,
    expect_status,
    instant,
    is_json,
    require,
)
from bindery.rm.errors import ProblemType

__all__ = [
    "check_group_all_or_nothing",
    "check_group_bad_requests",
    "check_group_concurrent",
    "check_group_members",
    "check_group_renew_and_expiry",
    "check_group_replay",
    "check_group_topology",
    "check_groups_path",
    "expect_group",
]

ACTIVE = ("reserved", "committed")


def _no_groups(response: httpx.Response, what: str) -> None:
    if response.status_code == 404:
        raise ConformanceFailure(
            f"{what}: HTTP 404 on /v1/reservation-groups: the RM has no reservation groups (contract v1.1); "
            "if it implements only v1.0, certify it with --contract-version 1.0"
        )


def expect_group(
    response: httpx.Response, status: int | tuple[int, ...], what: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The answer is a reservation group; with the request ``body``, the one asked for: one member
    per pod in the order asked, each an ordinary reservation carrying the group's id."""
    _no_groups(response, what)
    expect_status(response, status, what)
    if not is_json(response):
        raise ConformanceFailure(
            f"{what}: expected application/json, got {response.headers.get('content-type')}"
        )
    group = response.json()
    if not isinstance(group, dict) or not isinstance(group.get("id"), str) or not group["id"]:
        raise ConformanceFailure(f"{what}: the group lacks a string id: {str(group)[:300]}")
    members = group.get("members")
    if not isinstance(members, list) or not members:
        raise ConformanceFailure(f"{what}: the group has no members list: {str(group)[:300]}")
    for member in members:
        for key in ("id", "node", "state", "podUid", "schedulerName"):
            require(
                isinstance(member.get(key), str) and bool(member[key]),
                f"{what}: a member lacks a string {key!r}: {member}",
            )
        require(
            member.get("groupId") == group["id"],
            f"{what}: member {member['id']} has groupId {member.get('groupId')!r}, "
            f"not the group's {group['id']}",
        )
    if body is not None:
        asked = [m["pod"]["uid"] for m in body["members"]]
        answered = [m["podUid"] for m in members]
        require(answered == asked, f"{what}: the members are pods {answered}, expected {asked} in that order")
    return dict(group)


async def _mine(h: Harness) -> list[dict[str, Any]]:
    """This run's active reservations."""
    items = await h.list_all(schedulerName=h.scheduler_name)
    return [item for item in items if item.get("state") in ACTIVE]


async def check_groups_path(h: Harness) -> None:
    """POST /v1/reservation-groups reserves a group (v1.1); an RM certified at 1.0 may answer 404."""
    body = h.group_body(1)
    response = await h.reserve_group(body)
    if response.status_code == 404 and h.contract_version == "1.0":
        expect_problem(response, 404, ProblemType.NOT_FOUND, "reserve a group on a v1.0 RM")
        require(not await _mine(h), "a v1.0 RM answered 404 to a group yet reserved something")
        return
    group = expect_group(response, 201, "reserve a group of one", body)
    expect_status(await h.release_group(group["id"]), 204, "release the group")


async def check_group_all_or_nothing(h: Harness) -> None:
    """A group larger than the pool: 409 unschedulable with a reason and nothing reserved; the pool's
    size fits, holds every slot, and is released as a whole."""
    capacity = h.config.capacity
    response = await h.reserve_group(h.group_body(capacity + 1))
    _no_groups(response, "reserve a group larger than the pool")
    problem = expect_problem(response, 409, ProblemType.UNSCHEDULABLE, "reserve a group larger than the pool")
    require(
        isinstance(problem.get("reason"), str) and bool(problem["reason"]), "unschedulable needs a reason"
    )
    left = await _mine(h)
    require(not left, f"a group that did not fit left {len(left)} reservations behind: {left[:3]}")
    body = h.group_body(capacity)
    group = expect_group(await h.reserve_group(body), 201, "reserve a group the size of the pool", body)
    for member in group["members"]:
        require(member["state"] == "reserved", f"a new member is {member['state']!r}, expected 'reserved'")
        require(bool(member.get("expiresAt")), f"a reserved member must say when it expires: {member}")
    expect_problem(
        await h.reserve(h.request_body()),
        409,
        ProblemType.UNSCHEDULABLE,
        "reserve while a group holds the pool",
    )
    again = expect_group(await h.get_group(group["id"]), 200, "GET the group", body)
    require(
        [m["id"] for m in again["members"]] == [m["id"] for m in group["members"]],
        "GET returned other members than the reserve",
    )
    expect_status(await h.release_group(group["id"]), 204, "release the group")
    released = await h.get_group(group["id"])
    if released.status_code == 404:
        expect_problem(released, 404, ProblemType.NOT_FOUND, "GET a released group")
    else:
        states = sorted(
            {m["state"] for m in expect_group(released, 200, "GET the released group")["members"]}
        )
        require(states == ["released"], f"after the group's release its members are {states}")
    expect_reservation(await h.reserve(h.request_body()), 201, "reserve after the group's release")


async def check_group_concurrent(h: Harness) -> None:
    """Concurrent groups that fit alone but not together: exactly one wins, whole; then pairs race
    for the pool: each group has all its members or none, and the pool is never overcommitted."""
    capacity = h.config.capacity
    size = capacity // 2 + 1  # two of these never fit together
    bodies = [h.group_body(size) for _ in range(4)]
    responses = await asyncio.gather(*(h.reserve_group(body) for body in bodies))
    for response in responses:
        _no_groups(response, "reserve concurrent groups")
    won = [
        expect_group(r, 201, "a concurrent group that won", b)
        for r, b in zip(responses, bodies, strict=True)
        if r.status_code == 201
    ]
    for response in responses:
        if response.status_code != 201:
            expect_problem(response, 409, ProblemType.UNSCHEDULABLE, "a concurrent group that did not fit")
    require(len(won) == 1, f"{len(won)} groups of {size} won a pool of {capacity}; exactly one fits")
    held = await _mine(h)
    require(
        sorted(item["id"] for item in held) == sorted(m["id"] for m in won[0]["members"]),
        f"the pool holds {len(held)} reservations, expected only the {size} members of the group that won",
    )
    expect_status(await h.release_group(won[0]["id"]), 204, "release the group that won")
    pairs = [h.group_body(2) for _ in range(capacity)]
    answers = await asyncio.gather(*(h.reserve_group(body) for body in pairs))
    for response in answers:
        if response.status_code != 201:
            expect_problem(response, 409, ProblemType.UNSCHEDULABLE, "a pair that did not fit")
    winners = [
        expect_group(r, 201, "a pair that won", b)
        for r, b in zip(answers, pairs, strict=True)
        if r.status_code == 201
    ]
    require(len(winners) == capacity // 2, f"{len(winners)} pairs won a pool of {capacity} slots")
    held = await _mine(h)
    by_group = collections.Counter(item.get("groupId") for item in held)
    require(len(held) <= capacity, f"{len(held)} one-slot reservations are active in a pool of {capacity}")
    require(
        all(count == 2 for count in by_group.values()) and len(by_group) == len(winners),
        f"active members per group: {dict(by_group)}; every group must hold both members or none",
    )


async def check_group_replay(h: Harness) -> None:
    """The same key and request replays the group (200, same members, quantities by value); the same
    key with another request is 409 idempotency-key-reused and changes nothing."""
    body = h.group_body(2)
    first = expect_group(await h.reserve_group(body), 201, "reserve a group", body)
    replay = expect_group(await h.reserve_group(body), 200, "replay the group", body)
    require(
        replay["id"] == first["id"]
        and [m["id"] for m in replay["members"]] == [m["id"] for m in first["members"]],
        "the replay returned another group",
    )
    respelled = {
        **body,
        "members": [{**m, "resources": {h.config.resource: "1000m"}} for m in body["members"]],
    }
    same = expect_group(await h.reserve_group(respelled), 200, "replay with quantities spelled 1000m", body)
    require(same["id"] == first["id"], "quantities must be compared by value: 1000m is the same request as 1")
    different = h.group_body(3, key=body["idempotencyKey"])
    expect_problem(
        await h.reserve_group(different),
        409,
        ProblemType.IDEMPOTENCY_KEY_REUSED,
        "reserve a group reusing a key",
    )
    held = await _mine(h)
    require(
        len(held) == 2, f"after replays and a refused reuse {len(held)} reservations are active, expected 2"
    )


async def check_group_topology(h: Harness) -> None:
    """Topology: a key no node has is 409 unschedulable; with --topology-key (one value per node)
    every member lands on one node, and a group larger than the largest node does not fit."""
    missing = f"conformance.bindery.dev/no-such-label-{h.run_id}"
    response = await h.reserve_group(h.group_body(1, topology=[missing]))
    _no_groups(response, "reserve a group with a topology key no node has")
    expect_problem(
        response, 409, ProblemType.UNSCHEDULABLE, "reserve a group with a topology key no node has"
    )
    require(not await _mine(h), "a group refused for its topology reserved something")
    key = h.config.topology_key
    if key is None:
        return
    capacity = h.config.capacity
    # Fill the pool without topology: the members per node are each node's share of the slots.
    whole = expect_group(await h.reserve_group(h.group_body(capacity)), 201, "reserve the whole pool")
    share = collections.Counter(member["node"] for member in whole["members"])
    expect_status(await h.release_group(whole["id"]), 204, "release the whole pool")
    largest = max(share.values())
    body = h.group_body(largest, topology=[key])
    group = expect_group(await h.reserve_group(body), 201, f"reserve {largest} members on one {key}", body)
    nodes = {member["node"] for member in group["members"]}
    require(len(nodes) == 1, f"a group with topology {key} (one value per node) spans nodes {sorted(nodes)}")
    value = group.get("topologyValue")
    require(
        isinstance(value, dict) and isinstance(value.get(key), str),
        f"the group must say which value of {key} it landed on (topologyValue), got {value!r}",
    )
    expect_status(await h.release_group(group["id"]), 204, "release the group")
    if len(share) > 1:
        too_big = await h.reserve_group(h.group_body(largest + 1, topology=[key]))
        expect_problem(
            too_big,
            409,
            ProblemType.UNSCHEDULABLE,
            f"reserve {largest + 1} members on one {key} (at most {largest} fit)",
        )
        require(not await _mine(h), "a group refused for its topology reserved something")


async def check_group_members(h: Harness) -> None:
    """Members are ordinary reservations: listed with groupId, committed and released one by one;
    releasing the group keeps committed members; unknown groups are 404."""
    body = h.group_body(3)
    group = expect_group(await h.reserve_group(body), 201, "reserve a group", body)
    first, second, third = group["members"]
    committed = expect_reservation(
        await h.commit(first["id"], pod_uid=first["podUid"]), 200, "commit a member"
    )
    require(committed["state"] == "committed", f"a committed member is {committed['state']!r}")
    require(committed.get("groupId") == group["id"], "a committed member lost its groupId")
    expect_status(await h.release(second["id"], pod_uid=second["podUid"]), 204, "release one member")
    listed = await h.list_all(podUid=third["podUid"])
    require(
        [item.get("groupId") for item in listed] == [group["id"]],
        f"GET /v1/reservations must show the member's groupId, got {listed}",
    )
    now = expect_group(await h.get_group(group["id"]), 200, "GET the group", body)
    states = [m["state"] for m in now["members"]]
    require(states == ["committed", "released", "reserved"], f"the members' states are {states}")
    expect_status(await h.release_group(group["id"]), 204, "release the group")
    after = expect_group(await h.get_group(group["id"]), 200, "GET the group after its release", body)
    states = [m["state"] for m in after["members"]]
    require(
        states == ["committed", "released", "released"],
        "releasing the group must release only reserved members (committed ones belong to bound pods): "
        f"{states}",
    )
    expect_status(await h.release_group(group["id"]), 204, "release the group again")
    # The committed member still holds its slot: the rest of the pool fits, one more does not.
    rest = [
        expect_reservation(await h.reserve(h.request_body()), 201, "reserve the rest of the pool")
        for _ in range(h.config.capacity - 1)
    ]
    expect_problem(
        await h.reserve(h.request_body()),
        409,
        ProblemType.UNSCHEDULABLE,
        "reserve while a committed member holds a slot",
    )
    expect_status(await h.release(first["id"], pod_uid=first["podUid"]), 204, "release the committed member")
    expect_reservation(await h.reserve(h.request_body()), 201, "reserve the slot the member freed")
    for item in rest:
        expect_status(await h.release(item["id"]), 204, "release")
    unknown = f"no-such-group-{h.run_id}"
    expect_problem(await h.get_group(unknown), 404, ProblemType.NOT_FOUND, "GET an unknown group")
    expect_problem(await h.release_group(unknown), 404, ProblemType.NOT_FOUND, "release an unknown group")
    expect_problem(await h.renew_group(unknown, ttl=60), 404, ProblemType.NOT_FOUND, "renew an unknown group")


async def check_group_renew_and_expiry(h: Harness) -> None:
    """One lease per group: renew moves every reserved member's expiresAt; an unrenewed group's
    members expire together and free their slots; a group with no active member cannot be renewed."""
    ttl = h.config.ttl_seconds
    kept_body = h.group_body(1, ttl=ttl)
    kept = expect_group(await h.reserve_group(kept_body), 201, "reserve a group", kept_body)
    lapsing_body = h.group_body(h.config.capacity - 1, ttl=ttl)
    lapsing = expect_group(await h.reserve_group(lapsing_body), 201, "reserve a second group", lapsing_body)
    renewed = expect_group(await h.renew_group(kept["id"], ttl=ttl + 60), 200, "renew the group", kept_body)
    for before, after in zip(kept["members"], renewed["members"], strict=True):
        require(after["state"] == "reserved", f"after renew a member is {after['state']!r}")
        require(
            instant(after.get("expiresAt"), "a renewed member's expiresAt")
            > instant(before.get("expiresAt"), "a member's expiresAt"),
            f"renew did not move member {after['id']}'s expiresAt later",
        )
    await asyncio.sleep(ttl + 1.5)
    alive = expect_group(await h.get_group(kept["id"]), 200, "GET the renewed group after its first lease")
    states = [m["state"] for m in alive["members"]]
    require(states == ["reserved"], f"a renewed group's member is {states} after the first lease")
    gone = await h.get_group(lapsing["id"])
    if gone.status_code == 200:
        states = sorted({m["state"] for m in expect_group(gone, 200, "GET the lapsed group")["members"]})
        require(states == ["expired"], f"after its lease the lapsed group's members are {states}")
        expect_problem(
            await h.renew_group(lapsing["id"], ttl=60),
            409,
            ProblemType.RESERVATION_NOT_ACTIVE,
            "renew a group whose members expired",
        )
    else:
        expect_problem(gone, 404, ProblemType.NOT_FOUND, "GET a lapsed group")
    for _ in lapsing["members"]:
        expect_reservation(await h.reserve(h.request_body()), 201, "reserve a slot the lapsed group held")
    member = alive["members"][0]
    expect_reservation(await h.commit(member["id"], pod_uid=member["podUid"]), 200, "commit a renewed member")


async def check_group_bad_requests(h: Harness) -> None:
    """Invalid groups (a pod twice, no members, an unknown field, a bad ttl) are 400 and reserve nothing."""
    twice = h.group_body(2)
    twice["members"][1] = twice["members"][0]
    none = h.group_body(1)
    none["members"] = []
    unknown = {**h.group_body(1), "minMember": 1}
    ttl = {**h.group_body(1), "ttlSeconds": 0}
    for what, body in (
        ("a pod twice", twice),
        ("no members", none),
        ("an unknown field", unknown),
        ("ttlSeconds: 0", ttl),
    ):
        response = await h.reserve_group(body)
        _no_groups(response, f"reserve a group with {what}")
        expect_problem(response, 400, ProblemType.INVALID_REQUEST, f"reserve a group with {what}")
    require(not await _mine(h), "rejected group requests reserved something")
    body = h.group_body(1)
    group = expect_group(await h.reserve_group(body), 201, "reserve a valid group after the bad ones", body)
    bad_renew = await h.http.post(
        f"/v1/reservation-groups/{group['id']}/renew", json={"ttlSeconds": 0}, headers=h.auth
    )
    expect_problem(bad_renew, 400, ProblemType.INVALID_REQUEST, "renew a group with ttlSeconds: 0")
