"""Contract v1.1 reservation groups: the models and the client, against the fault-injecting server.

The client must send the group in camelCase, check that the answer is the group it asked for (one
reservation per member, in order, each carrying the group's id), tell "this RM has no groups" (404
or 405 on the path) apart from every other answer, and map "the group does not fit" to
``RMUnschedulable`` with the RM's reason.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from bindery.rm import RMConflict, RMGroupsUnsupported, RMProtocolError, RMRejected, RMUnsupported
from bindery.rm.errors import ProblemType, RMUnavailable, RMUnschedulable
from bindery.rm.models import (
    MAX_GROUP_MEMBERS,
    GroupIdentity,
    GroupMemberRequest,
    PodIdentity,
    Reservation,
    ReservationGroup,
    ReservationGroupRequest,
    TopologyConstraint,
)
from tests.rm.test_rm_client import FaultServer, make_client, ok, problem, respond, server

__all__ = ["server"]  # the fixture, used by name


def member(
    uid: str, *, cpu: str = "1", namespace: str = "ns", scheduler: str = "bindery"
) -> GroupMemberRequest:
    return GroupMemberRequest(
        pod=PodIdentity(uid=uid, namespace=namespace, name=f"p-{uid}", scheduler_name=scheduler),
        resources={"cpu": cpu},
    )


def group_request(*uids: str, key: str = "gang-1", topology: tuple[str, ...] = ()) -> ReservationGroupRequest:
    return ReservationGroupRequest(
        group=GroupIdentity(namespace="ns", name="gang", uid="pg-uid", scheduler_name="bindery"),
        members=[member(uid) for uid in uids],
        topology=[TopologyConstraint(key=k) for k in topology],
        idempotency_key=key,
        ttl_seconds=30,
    )


def answer(*uids: str, group_id: str = "grp-1", state: str = "reserved", **extra: Any) -> dict[str, Any]:
    return {
        "id": group_id,
        "members": [
            {
                "id": f"rsv-{uid}",
                "node": "n1",
                "state": state,
                "expiresAt": "2030-01-01T00:00:00Z" if state == "reserved" else None,
                "podUid": uid,
                "schedulerName": "bindery",
                "namespace": "ns",
                "name": f"p-{uid}",
                "resources": {"cpu": "1"},
                "groupId": group_id,
            }
            for uid in uids
        ],
        "expiresAt": "2030-01-01T00:00:00Z",
        **extra,
    }


# -- models ---------------------------------------------------------------------------------------


def test_group_request_is_camel_case_json() -> None:
    request = group_request("u1", "u2", topology=("topology.kubernetes.io/zone",))
    body = request.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert body["group"] == {"namespace": "ns", "name": "gang", "uid": "pg-uid", "schedulerName": "bindery"}
    assert body["topology"] == [{"key": "topology.kubernetes.io/zone"}]
    assert body["idempotencyKey"] == "gang-1"
    assert body["ttlSeconds"] == 30
    assert [m["pod"]["uid"] for m in body["members"]] == ["u1", "u2"]
    assert ReservationGroupRequest.model_validate_json(json.dumps(body)) == request


def test_group_request_rejects_what_is_not_one_group() -> None:
    with pytest.raises(ValidationError, match="appears twice"):
        group_request("u1", "u1")
    with pytest.raises(ValidationError, match="namespace"):
        ReservationGroupRequest(
            group=GroupIdentity(namespace="ns", name="g", scheduler_name="bindery"),
            members=[member("u1", namespace="other")],
            idempotency_key="k",
            ttl_seconds=30,
        )
    with pytest.raises(ValidationError, match="scheduler"):
        ReservationGroupRequest(
            group=GroupIdentity(namespace="ns", name="g", scheduler_name="bindery"),
            members=[member("u1", scheduler="another")],
            idempotency_key="k",
            ttl_seconds=30,
        )
    with pytest.raises(ValidationError, match="at least 1"):
        group_request()
    with pytest.raises(ValidationError, match=f"at most {MAX_GROUP_MEMBERS}"):
        group_request(*(f"u{i}" for i in range(MAX_GROUP_MEMBERS + 1)))
    with pytest.raises(ValidationError, match="twice"):
        group_request("u1", topology=("zone", "zone"))
    with pytest.raises(ValidationError, match="negative"):
        member("u1", cpu="-1")
    with pytest.raises(ValidationError, match="extra"):  # requests forbid unknown fields
        ReservationGroupRequest.model_validate(
            {**group_request("u1").model_dump(by_alias=True), "minMember": 1}
        )


def test_group_fingerprint_compares_quantities_by_value() -> None:
    one = ReservationGroupRequest.model_validate(
        {
            **group_request("u1").model_dump(by_alias=True),
            "members": [member("u1", cpu="1000m").model_dump(by_alias=True)],
        }
    )
    assert one.fingerprint() == group_request("u1").fingerprint()
    assert group_request("u1", "u2").fingerprint() != group_request("u2", "u1").fingerprint()


def test_reservation_reads_its_group_id_and_stays_lenient() -> None:
    group = ReservationGroup.model_validate(answer("u1", topologyValue={"zone": "a"}, futureField=1))
    assert group.members[0].group_id == "grp-1"
    assert group.topology_value == {"zone": "a"}
    plain = Reservation.model_validate(
        {k: v for k, v in answer("u1")["members"][0].items() if k != "groupId"}
    )
    assert plain.group_id is None


# -- client ---------------------------------------------------------------------------------------


async def test_reserve_group_posts_the_group_and_returns_it(server: FaultServer) -> None:
    bodies: list[Any] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        return ok(answer("u1", "u2", topologyValue={"zone": "a"}), status=201)

    server.play(handler)
    async with make_client(server) as client:
        group = await client.reserve_group(group_request("u1", "u2", topology=("zone",)))
    assert (server.seen[0].method, server.seen[0].path) == ("POST", "/v1/reservation-groups")
    assert bodies[0]["members"][1]["pod"]["uid"] == "u2"
    assert bodies[0]["topology"] == [{"key": "zone"}]
    assert [m.pod_uid for m in group.members] == ["u1", "u2"]
    assert group.topology_value == {"zone": "a"}


async def test_reserve_group_is_retried_after_a_500(server: FaultServer) -> None:
    server.play(
        respond(lambda: problem(500, ProblemType.INTERNAL)), respond(lambda: ok(answer("u1"), status=200))
    )
    async with make_client(server) as client:
        group = await client.reserve_group(group_request("u1"))
    assert group.id == "grp-1"
    assert len(server.seen) == 2


@pytest.mark.parametrize("status", [404, 405])
async def test_reserve_group_on_an_rm_without_groups_is_unsupported(server: FaultServer, status: int) -> None:
    server.play(respond(lambda: problem(status, ProblemType.NOT_FOUND, detail="there is no such path")))
    async with make_client(server) as client:
        with pytest.raises(RMGroupsUnsupported, match="no reservation groups") as raised:
            await client.reserve_group(group_request("u1"))
    assert isinstance(raised.value, RMUnsupported)
    assert len(server.seen) == 1  # not retried: the answer is final


async def test_reserve_group_unschedulable_carries_the_groups_reason(server: FaultServer) -> None:
    reason = "group ns/gang needs 8 pods of 1 cpu; the most any value of zone holds is 7"
    server.play(
        respond(
            lambda: problem(409, ProblemType.UNSCHEDULABLE, detail=reason, reason=reason, retryAfterSeconds=4)
        )
    )
    async with make_client(server) as client:
        with pytest.raises(RMUnschedulable) as raised:
            await client.reserve_group(group_request("u1"))
    assert raised.value.reason == reason
    assert raised.value.retry_after == 4


async def test_reserve_group_key_reuse_is_a_conflict(server: FaultServer) -> None:
    server.play(respond(lambda: problem(409, ProblemType.IDEMPOTENCY_KEY_REUSED, detail="key reused")))
    async with make_client(server) as client:
        with pytest.raises(RMConflict, match="key reused"):
            await client.reserve_group(group_request("u1"))


@pytest.mark.parametrize(
    "body",
    [
        answer("u1"),  # a member missing
        answer("u2", "u1"),  # wrong order
        {**answer("u1", "u2"), "members": [{**m, "groupId": "grp-9"} for m in answer("u1", "u2")["members"]]},
        {"members": []},  # not a group at all
    ],
)
async def test_reserve_group_answer_that_is_not_the_group_asked_for(server: FaultServer, body: Any) -> None:
    server.play(respond(lambda: ok(body, status=201)))
    async with make_client(server) as client:
        with pytest.raises(RMProtocolError):
            await client.reserve_group(group_request("u1", "u2"))


async def test_get_group(server: FaultServer) -> None:
    server.play(respond(lambda: ok(answer("u1", state="committed"), status=200)))
    async with make_client(server) as client:
        group = await client.get_group("grp-1")
    assert (server.seen[0].method, server.seen[0].path) == ("GET", "/v1/reservation-groups/grp-1")
    assert group.members[0].state.value == "committed"


async def test_get_unknown_group_is_rejected_404(server: FaultServer) -> None:
    server.play(respond(lambda: problem(404, ProblemType.NOT_FOUND, detail="no group 'grp-9'")))
    async with make_client(server) as client:
        with pytest.raises(RMRejected) as raised:
            await client.get_group("grp-9")
    assert raised.value.status == 404


async def test_get_group_answered_with_another_group_is_a_protocol_error(server: FaultServer) -> None:
    server.play(respond(lambda: ok(answer("u1", group_id="grp-2"), status=200)))
    async with make_client(server) as client:
        with pytest.raises(RMProtocolError):
            await client.get_group("grp-1")


@pytest.mark.parametrize("status", [204, 404, 410])
async def test_release_group_tolerates_unknown(server: FaultServer, status: int) -> None:
    server.play(respond(lambda: web.Response(status=status)))
    async with make_client(server) as client:
        await client.release_group("grp/1")
    assert (server.seen[0].method, server.seen[0].raw_path) == ("DELETE", "/v1/reservation-groups/grp%2F1")


async def test_release_group_is_retried_and_reports_an_outage(server: FaultServer) -> None:
    server.play(respond(lambda: problem(503, ProblemType.UNAVAILABLE)))
    async with make_client(server, max_attempts=2) as client:
        with pytest.raises(RMUnavailable):
            await client.release_group("grp-1")
    assert len(server.seen) == 2


async def test_renew_group_sends_the_ttl(server: FaultServer) -> None:
    bodies: list[Any] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        return ok(answer("u1"), status=200)

    server.play(handler)
    async with make_client(server) as client:
        group = await client.renew_group("grp-1", ttl_seconds=45)
    assert (server.seen[0].method, server.seen[0].path) == ("POST", "/v1/reservation-groups/grp-1/renew")
    assert bodies == [{"ttlSeconds": 45}]
    assert group.id == "grp-1"


async def test_renew_group_without_active_members_is_a_conflict(server: FaultServer) -> None:
    server.play(respond(lambda: problem(409, ProblemType.RESERVATION_NOT_ACTIVE, detail="nothing active")))
    async with make_client(server) as client:
        with pytest.raises(RMConflict):
            await client.renew_group("grp-1", ttl_seconds=30)


async def test_list_reservations_filters_by_group(server: FaultServer) -> None:
    server.play(respond(lambda: ok({"items": answer("u1")["members"]}, status=200)))
    async with make_client(server) as client:
        items = await client.list_reservations(group_id="grp-1")
    assert server.seen[0].query.get("groupId") == "grp-1"
    assert items[0].group_id == "grp-1"
