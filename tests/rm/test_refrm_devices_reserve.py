"""The reference RM allocates devices on reserve (contract v1.3, feature `devices`), SQLite store.

Why: a pod's claims must be allocated on the node its reservation names, a device never given to
two reservations, and released devices reusable. Real HTTP, real SQLite, and the real allocator
helper (upstream's structured allocator); the ResourceSlices are what a driver would publish.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Any

import aiohttp
import pytest

from bindery.devcluster import binaries
from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.devices import DeviceAllocator
from bindery.reference_rm.placement import InventoryNode

from .conftest import TOKEN

DRIVER = "gpu.example.com"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
#: Five nodes; devices on two of them (n2: one GPU, n4: one GPU).
NODES = [InventoryNode(name=f"n{i}", allocatable={"cpu": Decimal(8), "pods": Decimal(110)}) for i in range(5)]


def _slice(node: str, device: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": device, "attributes": {"model": {"string": "a100"}}}],
        },
    }


@pytest.fixture
def allocator() -> Iterator[DeviceAllocator]:
    helper = DeviceAllocator(binary=binaries.ensure_devalloc_built(quiet=True))
    helper.update_slices(upserted=[_slice("n2", "gpu-0"), _slice("n4", "gpu-0")])
    yield helper
    helper.close()


@pytest.fixture
async def rm(tmp_path: pathlib.Path, allocator: DeviceAllocator) -> AsyncIterator[RunningServer]:
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=NODES, token=TOKEN, device_allocator=allocator
    ) as server:
        yield server


def _body(uid: str, *, selectors: list[str] | None = None) -> dict[str, Any]:
    return {
        "pod": {"uid": uid, "namespace": "ns", "name": f"pod-{uid}", "schedulerName": "bindery"},
        "resources": {"cpu": "1"},
        "idempotencyKey": uid,
        "ttlSeconds": 600,
        "devices": [
            {
                "claim": {"namespace": "ns", "name": f"pod-{uid}-gpu", "uid": f"claim-{uid}"},
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "classSelectors": [f"device.driver == '{DRIVER}'"],
                            "selectors": selectors or [],
                        },
                    }
                ],
            }
        ],
    }


async def _call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, json=body, headers=HEADERS) as answer,
    ):
        text = await answer.text()
        return answer.status, (await answer.json(content_type=None)) if text else None


def _device(reservation: dict[str, Any]) -> tuple[str, str]:
    (claim,) = reservation["devices"]
    (result,) = claim["results"]
    assert result["driver"] == DRIVER
    assert result["request"] == "gpu"
    assert result["pool"] == reservation["node"]
    return result["pool"], result["device"]


async def test_info_lists_devices(rm: RunningServer) -> None:
    status, info = await _call("GET", rm.url + "/v1/info")
    assert status == 200
    assert info["contractVersion"] == "1.3.0"
    assert "devices" in info["features"]


async def test_devices_on_two_of_five_nodes_more_pods_than_devices(rm: RunningServer) -> None:
    placed = []
    for uid in ("a", "b"):
        status, reservation = await _call("POST", rm.url + "/v1/reservations", _body(uid))
        assert status == 201, reservation
        placed.append(_device(reservation))
    assert sorted(placed) == [("n2", "gpu-0"), ("n4", "gpu-0")]
    status, problem = await _call("POST", rm.url + "/v1/reservations", _body("c"))
    assert status == 409, problem
    assert problem["type"].endswith("unschedulable")
    # Every node fits the cpu; none has a free device (three have none, two have theirs given).
    assert problem["reason"].startswith("0/5 nodes are available: 5 cannot allocate the claims ns/pod-c-gpu")


async def test_concurrent_reserves_never_share_a_device(rm: RunningServer) -> None:
    answers = await asyncio.gather(
        *(_call("POST", rm.url + "/v1/reservations", _body(f"p{i}")) for i in range(6))
    )
    devices = [_device(body) for status, body in answers if status == 201]
    assert sorted(devices) == [("n2", "gpu-0"), ("n4", "gpu-0")]
    assert sorted(status for status, _ in answers) == [201, 201, 409, 409, 409, 409]


async def test_release_frees_the_device(rm: RunningServer) -> None:
    first = [(await _call("POST", rm.url + "/v1/reservations", _body(uid)))[1] for uid in ("a", "b")]
    assert (await _call("POST", rm.url + "/v1/reservations", _body("c")))[0] == 409
    status, _ = await _call("DELETE", f"{rm.url}/v1/reservations/{first[0]['id']}")
    assert status in (200, 204)
    status, reservation = await _call("POST", rm.url + "/v1/reservations", _body("c"))
    assert status == 201, reservation
    assert _device(reservation) == _device(first[0])


async def test_replay_answers_the_same_devices_and_other_devices_reuse_the_key(rm: RunningServer) -> None:
    status, reservation = await _call("POST", rm.url + "/v1/reservations", _body("a"))
    assert status == 201
    status, replayed = await _call("POST", rm.url + "/v1/reservations", _body("a"))
    assert status == 200
    assert replayed["devices"] == reservation["devices"]
    status, fetched = await _call("GET", f"{rm.url}/v1/reservations/{reservation['id']}")
    assert status == 200
    assert fetched["devices"] == reservation["devices"]
    other = _body("a", selectors=["device.attributes['gpu.example.com'].model == 'a100'"])
    status, problem = await _call("POST", rm.url + "/v1/reservations", other)
    assert status == 409, problem
    assert problem["type"].endswith("idempotency-key-reused")


async def test_a_selector_that_fails_to_compile_is_unschedulable_with_the_reason(rm: RunningServer) -> None:
    status, problem = await _call(
        "POST", rm.url + "/v1/reservations", _body("a", selectors=["device.attributes[ =="])
    )
    assert status == 409, problem
    assert problem["type"].endswith("unschedulable")
    assert "cannot evaluate the claims ns/pod-a-gpu" in problem["reason"]
    assert "CEL compile error" in problem["reason"]


async def test_a_group_member_with_devices_is_refused_with_the_reason(rm: RunningServer) -> None:
    member = {key: value for key, value in _body("m").items() if key in ("pod", "resources", "devices")}
    body = {
        "group": {"namespace": "ns", "name": "g", "uid": "g1", "schedulerName": "bindery"},
        "members": [member],
        "idempotencyKey": "g1",
        "ttlSeconds": 60,
    }
    status, problem = await _call("POST", rm.url + "/v1/reservation-groups", body)
    assert status == 409
    assert "does not allocate devices for reservation groups" in problem["reason"]
