"""Contract v1.1 on the reference RM: commit and release name their pod, and renew extends a lease.

Why: a pod that copies another pod's ``bindery.dev/reservation-id`` annotation must not be able to
commit or free that pod's reservation (issue 8, scenario 2), so a mismatch is refused with 409
``pod-mismatch`` and changes nothing; and a reserved lease can be extended while its pod's cycle
is still working, without re-reserving.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest

from bindery.reference_rm import RunningServer
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.store import NotActive, NotFound, Placed, PodMismatch
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import ProblemType, RMConflict, RMPodMismatch, RMRejected
from bindery.rm.models import ReservationRequest, ReservationState
from tests.rm.conftest import StoreFactory

from .conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def body(uid: str, *, ttl: int = 60) -> dict[str, Any]:
    return {
        "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "bindery"},
        "resources": {"cpu": "1"},
        "idempotencyKey": uid,
        "ttlSeconds": ttl,
    }


async def reserve(http: httpx.AsyncClient, uid: str, *, ttl: int = 60) -> dict[str, Any]:
    response = await http.post("/v1/reservations", json=body(uid, ttl=ttl))
    assert response.status_code == 201, response.text
    return dict(response.json())


async def read(http: httpx.AsyncClient, rid: str) -> dict[str, Any]:
    response = await http.get(f"/v1/reservations/{rid}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def assert_problem(response: httpx.Response, status: int, kind: str, *words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["type"] == kind
    for word in words:
        assert word in problem["detail"]


@pytest.fixture
async def http(refrm: RunningServer) -> Any:
    async with httpx.AsyncClient(base_url=refrm.url, headers=AUTH) as client:
        yield client


async def test_commit_for_another_pod_is_refused_and_changes_nothing(http: httpx.AsyncClient) -> None:
    victim = await reserve(http, "victim")
    refused = await http.post(f"/v1/reservations/{victim['id']}/commit", params={"podUid": "attacker"})
    assert_problem(refused, 409, ProblemType.POD_MISMATCH, victim["id"], "victim", "attacker")
    assert await read(http, victim["id"]) == victim  # still reserved, same lease
    committed = await http.post(f"/v1/reservations/{victim['id']}/commit", params={"podUid": "victim"})
    assert committed.status_code == 200
    assert committed.json()["state"] == "committed"
    again = await http.post(f"/v1/reservations/{victim['id']}/commit", params={"podUid": "attacker"})
    assert_problem(again, 409, ProblemType.POD_MISMATCH)


async def test_release_for_another_pod_is_refused_and_changes_nothing(http: httpx.AsyncClient) -> None:
    victim = await reserve(http, "victim")
    committed = (
        await http.post(f"/v1/reservations/{victim['id']}/commit", params={"podUid": "victim"})
    ).json()
    refused = await http.delete(f"/v1/reservations/{victim['id']}", params={"podUid": "attacker"})
    assert_problem(refused, 409, ProblemType.POD_MISMATCH, "attacker")
    assert await read(http, victim["id"]) == committed
    assert (
        await http.delete(f"/v1/reservations/{victim['id']}", params={"podUid": "victim"})
    ).status_code == 204
    assert (await read(http, victim["id"]))["state"] == "released"
    # A release of what is no longer active stays a no-op (204), whoever asks.
    assert (
        await http.delete(f"/v1/reservations/{victim['id']}", params={"podUid": "attacker"})
    ).status_code == 204
    assert (await http.delete("/v1/reservations/rsv-unknown", params={"podUid": "x"})).status_code == 204


async def test_commit_and_release_without_pod_uid_behave_as_in_v1_0(http: httpx.AsyncClient) -> None:
    first = await reserve(http, "a")
    assert (await http.post(f"/v1/reservations/{first['id']}/commit")).status_code == 200
    assert (await http.delete(f"/v1/reservations/{first['id']}")).status_code == 204
    assert (await read(http, first["id"]))["state"] == "released"


@pytest.mark.parametrize("uid", ["", "x" * 254])
async def test_pod_uid_parameter_is_validated(http: httpx.AsyncClient, uid: str) -> None:
    first = await reserve(http, "a")
    for response in (
        await http.post(f"/v1/reservations/{first['id']}/commit", params={"podUid": uid}),
        await http.delete(f"/v1/reservations/{first['id']}", params={"podUid": uid}),
    ):
        assert_problem(response, 400, ProblemType.INVALID_REQUEST, "podUid")
    assert await read(http, first["id"]) == first


async def test_renew_extends_a_reserved_lease(http: httpx.AsyncClient) -> None:
    first = await reserve(http, "a", ttl=5)
    renewed = await http.post(
        f"/v1/reservations/{first['id']}/renew", json={"podUid": "a", "ttlSeconds": 600}
    )
    assert renewed.status_code == 200, renewed.text
    extended = renewed.json()
    assert extended["state"] == "reserved"
    assert datetime.fromisoformat(extended["expiresAt"]) > datetime.fromisoformat(first["expiresAt"])
    assert await read(http, first["id"]) == extended
    again = await http.post(f"/v1/reservations/{first['id']}/renew", json={"podUid": "a", "ttlSeconds": 600})
    assert again.status_code == 200  # idempotent: the same call again is fine
    assert again.json()["state"] == "reserved"


async def test_renew_of_a_committed_reservation_is_unchanged(http: httpx.AsyncClient) -> None:
    first = await reserve(http, "a")
    committed = (await http.post(f"/v1/reservations/{first['id']}/commit")).json()
    renewed = await http.post(f"/v1/reservations/{first['id']}/renew", json={"podUid": "a", "ttlSeconds": 30})
    assert renewed.status_code == 200
    assert renewed.json() == committed


async def test_renew_refusals(http: httpx.AsyncClient) -> None:
    first = await reserve(http, "a")
    renew = f"/v1/reservations/{first['id']}/renew"
    mismatch = await http.post(renew, json={"podUid": "b", "ttlSeconds": 30})
    assert_problem(mismatch, 409, ProblemType.POD_MISMATCH, "b")
    assert await read(http, first["id"]) == first
    unknown = await http.post("/v1/reservations/rsv-unknown/renew", json={"podUid": "a", "ttlSeconds": 30})
    assert_problem(unknown, 404, ProblemType.NOT_FOUND, "rsv-unknown")
    assert (await http.delete(f"/v1/reservations/{first['id']}")).status_code == 204
    released = await http.post(renew, json={"podUid": "a", "ttlSeconds": 30})
    assert_problem(released, 409, ProblemType.RESERVATION_NOT_ACTIVE, "released")


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"podUid": "a", "ttlSeconds": 30, "extra": 1}, "extra"),
        ({"podUid": "a", "ttlSeconds": 0}, "ttlSeconds"),
        ({"podUid": "a", "ttlSeconds": 86_401}, "ttlSeconds"),
        ({"podUid": "a", "ttlSeconds": "30"}, "ttlSeconds"),
        ({"ttlSeconds": 30}, "podUid"),
        ({"podUid": "", "ttlSeconds": 30}, "podUid"),
    ],
)
async def test_renew_validates_its_body(http: httpx.AsyncClient, payload: dict[str, Any], words: str) -> None:
    first = await reserve(http, "a")
    response = await http.post(f"/v1/reservations/{first['id']}/renew", json=payload)
    assert_problem(response, 400, ProblemType.INVALID_REQUEST, words)
    assert await read(http, first["id"]) == first


async def test_renew_needs_a_json_body(http: httpx.AsyncClient) -> None:
    first = await reserve(http, "a")
    renew = f"/v1/reservations/{first['id']}/renew"
    assert_problem(
        await http.post(renew, content=b"podUid=a", headers={"Content-Type": "text/plain"}),
        415,
        ProblemType.UNSUPPORTED_MEDIA_TYPE,
    )
    assert_problem(
        await http.post(renew, content=b"{", headers={"Content-Type": "application/json"}),
        400,
        ProblemType.INVALID_REQUEST,
    )


async def test_the_client_speaks_v1_1_with_the_reference_rm(refrm: RunningServer) -> None:
    async with ResourceManagerClient(base_url=refrm.url, token=TOKEN, allow_insecure_http=True) as client:
        made = await client.reserve(ReservationRequest.model_validate(body("a", ttl=5)))
        renewed = await client.renew(made.id, pod_uid="a", ttl_seconds=600)
        assert renewed.expires_at is not None
        assert made.expires_at is not None
        assert renewed.expires_at > made.expires_at
        with pytest.raises(RMPodMismatch):
            await client.commit(made.id, pod_uid="b")
        committed = await client.commit(made.id, pod_uid="a")
        assert committed.state is ReservationState.COMMITTED
        with pytest.raises(RMPodMismatch):
            await client.release(made.id, pod_uid="b")
        with pytest.raises(RMPodMismatch):
            await client.renew(made.id, pod_uid="b", ttl_seconds=30)
        assert (await client.renew(made.id, pod_uid="a", ttl_seconds=30)).state is ReservationState.COMMITTED
        await client.release(made.id, pod_uid="a")
        with pytest.raises(RMConflict):
            await client.renew(made.id, pod_uid="a", ttl_seconds=30)
        with pytest.raises(RMRejected) as unknown:
            await client.renew("rsv-unknown", pod_uid="a", ttl_seconds=30)
        assert unknown.value.status == 404


NODES = [InventoryNode(name="n1", allocatable={"cpu": Decimal(2)})]


def request(uid: str, *, ttl: int) -> ReservationRequest:
    return ReservationRequest.model_validate(body(uid, ttl=ttl))


def test_store_renew_keeps_a_lease_alive_past_its_original_ttl(make_store: StoreFactory) -> None:
    now = [1000.0]
    store = make_store(clock=lambda: now[0], retention=100)
    placed = store.reserve(request("a", ttl=10), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    rid = placed.reservation.id
    now[0] = 1008.0
    renewed = store.renew(rid, pod_uid="a", ttl_seconds=10)
    assert not isinstance(renewed, (NotFound, NotActive, PodMismatch))
    assert renewed.expires_at == 1018.0
    now[0] = 1015.0  # past the original lease (1010), within the renewed one
    alive = store.get(rid)
    assert alive is not None
    assert alive.state is ReservationState.RESERVED
    assert store.usage()["n1"]["cpu"] == 1
    now[0] = 1018.0
    gone = store.get(rid)
    assert gone is not None
    assert gone.state is ReservationState.EXPIRED
    assert store.usage()["n1"]["cpu"] == 0
    assert isinstance(store.renew(rid, pod_uid="a", ttl_seconds=10), NotActive)


def test_store_renew_survives_a_reopen(make_store: StoreFactory) -> None:
    now = [1000.0]
    store = make_store(clock=lambda: now[0])
    placed = store.reserve(request("a", ttl=10), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    store.renew(placed.reservation.id, pod_uid="a", ttl_seconds=100)
    store.close()
    reopened = make_store(clock=lambda: now[0])
    now[0] = 1050.0
    alive = reopened.get(placed.reservation.id)
    assert alive is not None
    assert alive.state is ReservationState.RESERVED


def test_store_mismatch_changes_nothing(make_store: StoreFactory) -> None:
    store = make_store()
    placed = store.reserve(request("a", ttl=10), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    rid = placed.reservation.id
    assert isinstance(store.commit(rid, pod_uid="b"), PodMismatch)
    assert isinstance(store.release(rid, pod_uid="b"), PodMismatch)
    assert isinstance(store.renew(rid, pod_uid="b", ttl_seconds=30), PodMismatch)
    assert store.get(rid) == placed.reservation
    assert store.usage()["n1"]["cpu"] == 1
