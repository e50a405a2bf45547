"""Contract v1.3 `devices` on the reference RM's edge: refused while it cannot allocate them.

Why: a reserve that carried devices and was answered with a node but no devices would bind a pod
whose claims are never allocated, so it never starts. An RM that does not list `devices` answers
such a request as a v1.2 RM does (the field is unknown: 400 invalid-request), so the caller learns
at once. Real HTTP against the reference RM over SQLite.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from bindery.reference_rm import RunningServer

from .conftest import TOKEN

DEVICES = [
    {
        "claim": {"namespace": "ns", "name": "pod-gpu", "uid": "claim-uid"},
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}],
    }
]


async def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


async def test_info_does_not_list_devices(refrm: RunningServer) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(refrm.url + "/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}) as answer,
    ):
        assert "devices" not in (await answer.json())["features"]


async def test_a_reserve_with_devices_is_refused_as_a_v1_2_rm_refuses_it(refrm: RunningServer) -> None:
    body = {
        "pod": {"uid": "u1", "namespace": "ns", "name": "p", "schedulerName": "bindery"},
        "resources": {"cpu": "100m"},
        "idempotencyKey": "u1",
        "ttlSeconds": 60,
        "devices": DEVICES,
    }
    status, problem = await _post(refrm.url, "/v1/reservations", body)
    assert status == 400, problem
    assert problem["type"].endswith("invalid-request")
    assert problem["errors"] == [{"location": "devices", "message": "Extra inputs are not permitted"}]


async def test_a_group_member_with_devices_is_refused(refrm: RunningServer) -> None:
    member = {
        "pod": {"uid": "m1", "namespace": "ns", "name": "m1", "schedulerName": "bindery"},
        "resources": {"cpu": "100m"},
        "devices": DEVICES,
    }
    body = {
        "group": {"namespace": "ns", "name": "g", "uid": "g1", "schedulerName": "bindery"},
        "members": [member],
        "idempotencyKey": "g1",
        "ttlSeconds": 60,
    }
    status, problem = await _post(refrm.url, "/v1/reservation-groups", body)
    assert status == 400, problem
    assert problem["errors"] == [
        {"location": "members/0/devices", "message": "Extra inputs are not permitted"}
    ]


async def test_a_batched_reserve_with_devices_gets_its_own_refusal(refrm: RunningServer) -> None:
    reserve = {
        "pod": {"uid": "b1", "namespace": "ns", "name": "b1", "schedulerName": "bindery"},
        "resources": {"cpu": "100m"},
        "idempotencyKey": "b1",
        "ttlSeconds": 60,
    }
    body = {"operations": [{"reserve": {**reserve, "devices": DEVICES}}, {"reserve": reserve}]}
    status, answer = await _post(refrm.url, "/v1/batch", body)
    assert status == 200, answer
    refused, placed = answer["results"]
    assert refused["status"] == 400
    assert refused["problem"]["errors"] == [
        {"location": "operations/0/reserve/devices", "message": "Extra inputs are not permitted"}
    ]
    assert placed["status"] == 201
