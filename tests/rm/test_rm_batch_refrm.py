"""The RM client's batches against the real reference RM (contract v1.1), through the fault proxy.

What only the real RM shows: two reserves in one batch never share capacity, each caller gets its
own reservation or its own ``unschedulable``, and a batch replayed after a lost answer reserves
nothing twice (every operation is idempotent).
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from bindery.reference_rm import InventoryNode, RunningServer, serve_reference_rm
from bindery.rm import RMUnschedulable
from bindery.rm.client import ResourceManagerClient
from bindery.rm.models import Placement, PodIdentity, ReservationRequest, ReservationState, Toleration
from tests.rmproxy import rm_fault_proxy

from .conftest import TOKEN, small_inventory

SLOT = "bindery.dev/conformance-slot"  # small_inventory has 4 in all


def request_for(uid: str) -> ReservationRequest:
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="ns", name=uid, scheduler_name="bindery"),
        resources={SLOT: "1"},
        placement=Placement(tolerations=[Toleration(operator="Exists")]),
        idempotency_key=uid,
        ttl_seconds=60,
    )


@pytest.fixture
async def refrm(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token=TOKEN
    ) as server:
        yield server


def client_for(url: str) -> ResourceManagerClient:
    return ResourceManagerClient(
        base_url=url, token=TOKEN, allow_insecure_http=True, backoff_initial=0.01, backoff_max=0.02
    )


async def test_concurrent_calls_batched_at_the_reference_rm(refrm: RunningServer) -> None:
    paths: list[str] = []

    def seen(_: str, path: str) -> bool:
        paths.append(path)
        return False  # no faults: only the paths are recorded

    async with (
        rm_fault_proxy(upstream=refrm.url, seed=1, rate=0.0, applies=seen) as proxy,
        client_for(proxy.url) as client,
    ):
        uids = [f"u{n}" for n in range(5)]
        outcomes = await asyncio.gather(
            *(client.reserve(request_for(uid)) for uid in uids), return_exceptions=True
        )
        reservations = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
        refused = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        assert len(reservations) == 4  # 4 slots: the fifth reserve of the batch sees them taken
        assert [type(error) for error in refused] == [RMUnschedulable]
        for uid, outcome in zip(uids, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                assert outcome.pod_uid == uid  # each caller got its own pod's reservation
        committed = await asyncio.gather(*(client.commit(r.id, pod_uid=r.pod_uid) for r in reservations))
        assert {c.state for c in committed} == {ReservationState.COMMITTED}
        await asyncio.gather(*(client.release(r.id, pod_uid=r.pod_uid) for r in reservations))
        assert await client.list_reservations(state="committed") == []
    assert paths[:3] == ["/v1/batch"] * 3


async def test_a_batch_whose_answer_was_lost_is_replayed_without_reserving_twice(
    refrm: RunningServer,
) -> None:
    lost: list[str] = []

    def first_batch(_: str, path: str) -> bool:
        if path == "/v1/batch" and not lost:
            lost.append(path)
            return True
        return False

    async with (
        rm_fault_proxy(
            upstream=refrm.url, seed=1, rate=1.0, kinds=["lost_answer"], applies=first_batch
        ) as proxy,
        client_for(proxy.url) as client,
    ):
        reservations = await asyncio.gather(*(client.reserve(request_for(f"u{n}")) for n in range(3)))
        assert proxy.faults["lost_answer"] == 1  # applied at the RM, answer never arrived
        active = await client.list_reservations(state="reserved")
    assert sorted(r.id for r in active) == sorted(r.id for r in reservations)
    assert len({r.id for r in reservations}) == 3


async def test_a_batch_answer_past_the_response_cap_still_answers_each_caller(tmp_path: pathlib.Path) -> None:
    """Each result of a batch may be as large as its single call's answer, so the answer to many
    operations can pass the cap that any one answer fits in (here: long unschedulable reasons, one
    untolerated taint per node).  Every caller must still get what its single call gets, and the
    reservations the batch made are neither lost nor held twice."""
    free = InventoryNode(name="node-free", allocatable={"cpu": Decimal(3)})
    tainted = [
        InventoryNode(
            name=f"node-{n:02}",
            allocatable={"cpu": Decimal(64)},
            taints=({"key": "dedicated", "value": f"team-{n:02}", "effect": "NoSchedule"},),
        )
        for n in range(20)
    ]
    paths: list[str] = []

    def seen(_: str, path: str) -> bool:
        paths.append(path)
        return False

    def cpu_request(uid: str) -> ReservationRequest:
        return ReservationRequest(
            pod=PodIdentity(uid=uid, namespace="ns", name=uid, scheduler_name="bindery"),
            resources={"cpu": "1"},
            idempotency_key=uid,
            ttl_seconds=60,
        )

    uids = [f"u{n:02}" for n in range(30)]
    async with (
        serve_reference_rm(db_path=tmp_path / "rm.sqlite", inventory=[free, *tainted], token=TOKEN) as server,
        rm_fault_proxy(upstream=server.url, seed=1, rate=0.0, applies=seen) as proxy,
        ResourceManagerClient(
            base_url=proxy.url,
            token=TOKEN,
            allow_insecure_http=True,
            max_response_bytes=16 * 1024,  # a single answer here is about 2 KiB
            backoff_initial=0.01,
            backoff_max=0.02,
        ) as client,
    ):
        outcomes = await asyncio.gather(
            *(client.reserve(cpu_request(uid)) for uid in uids), return_exceptions=True
        )
        active = await client.list_reservations(state="reserved")
    assert paths[0] == "/v1/batch"
    reservations = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert [r.pod_uid for r in reservations] == uids[:3]  # the free node's 3 CPUs, in order
    assert all(isinstance(error, RMUnschedulable) for error in refused), refused[0]
    assert "untolerated taint {dedicated: team-19}" in str(refused[0])
    assert sorted(r.id for r in active) == sorted(r.id for r in reservations)
