"""Contract v1.2: `GET /v1/info`, and `clusterId` on reservations and on the list, negotiated.

Why: clusters sharing one RM and one scheduler name must each list only their own reservations,
or each one's reconciliation releases the other's. The field is negotiated so that an RM of v1.1
(which refuses unknown fields) never sees it: these tests run the client against the reference RM
serving v1.2 and serving as a v1.1 RM (`cluster_ids=False`), over real HTTP and SQLite.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import sqlite3
from collections.abc import AsyncIterator

import pytest

from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.store import ReservationStore
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMRejected
from bindery.rm.models import (
    CONTRACT_VERSION,
    ContractInfo,
    Feature,
    GroupIdentity,
    GroupMemberRequest,
    PodIdentity,
    ReservationGroupRequest,
    ReservationRequest,
)

from .conftest import TOKEN, small_inventory


def _request(uid: str) -> ReservationRequest:
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="ns", name=f"pod-{uid}", scheduler_name="shared"),
        resources={"cpu": "100m"},
        idempotency_key=uid,
        ttl_seconds=60,
    )


def _client(url: str, *, cluster_id: str | None) -> ResourceManagerClient:
    return ResourceManagerClient(base_url=url, token=TOKEN, allow_insecure_http=True, cluster_id=cluster_id)


@pytest.fixture
async def v1_1_rm(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    """The reference RM serving as a contract v1.1 RM: no /v1/info, clusterId refused."""
    async with serve_reference_rm(
        db_path=tmp_path / "old.sqlite", inventory=small_inventory(), token=TOKEN, cluster_ids=False
    ) as server:
        yield server


async def test_info_names_the_version_and_the_features(refrm: RunningServer) -> None:
    async with _client(refrm.url, cluster_id=None) as client:
        info = await client.contract_info()
    assert info.contract_version == CONTRACT_VERSION
    # `devices` (v1.3) is listed only by an RM that can allocate devices (a mirror of the cluster's
    # DeviceClasses and ResourceSlices); this one has none.
    assert {feature.value for feature in Feature if feature is not Feature.DEVICES} <= info.features


async def test_two_clusters_list_only_their_own_reservations(refrm: RunningServer) -> None:
    """A and B reserve with the same scheduler name; each lists only its own, and a client without a
    cluster id (or asking for all clusters) lists both, and a reservation made without a cluster."""
    async with (
        _client(refrm.url, cluster_id="cluster-a") as a,
        _client(refrm.url, cluster_id="cluster-b") as b,
        _client(refrm.url, cluster_id=None) as anyone,
    ):
        in_a = await a.reserve(_request("pa"))
        in_b = await b.reserve(_request("pb"))
        plain = await anyone.reserve(_request("p0"))
        assert (in_a.cluster_id, in_b.cluster_id, plain.cluster_id) == ("cluster-a", "cluster-b", None)
        group = await a.reserve_group(
            ReservationGroupRequest(
                group=GroupIdentity(namespace="ns", name="g", scheduler_name="shared"),
                members=[GroupMemberRequest(pod=_request("ga").pod, resources={"cpu": "100m"})],
                idempotency_key="g",
                ttl_seconds=60,
            )
        )
        assert [m.cluster_id for m in group.members] == ["cluster-a"]
        assert {r.id for r in await a.list_reservations(scheduler_name="shared")} == {
            in_a.id,
            group.members[0].id,
        }
        assert {r.id for r in await b.list_reservations(scheduler_name="shared")} == {in_b.id}
        everything = {in_a.id, in_b.id, plain.id, group.members[0].id}
        assert {r.id for r in await anyone.list_reservations(scheduler_name="shared")} == everything
        assert {
            r.id for r in await a.list_reservations(scheduler_name="shared", all_clusters=True)
        } == everything


async def test_a_v1_1_rm_never_sees_the_field_and_lists_unscoped(
    v1_1_rm: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Against an RM without /v1/info the client sends no clusterId (the RM would answer 400), lists
    every cluster's reservations as before, and warns once that sharing such an RM is unsafe."""
    async with (
        _client(v1_1_rm.url, cluster_id="cluster-a") as a,
        _client(v1_1_rm.url, cluster_id=None) as other,
    ):
        assert await a.contract_info() == ContractInfo.legacy()
        with caplog.at_level(logging.WARNING, logger="bindery.rm.client"):
            mine = await a.reserve(_request("pa"))
            theirs = await other.reserve(_request("pb"))
            listed = {r.id for r in await a.list_reservations(scheduler_name="shared")}
            await a.reserve(_request("pc"))
        assert mine.cluster_id is None
        assert {mine.id, theirs.id} <= listed
        warnings = [r.getMessage() for r in caplog.records if "cluster-id feature" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "Use one RM per cluster until the RM speaks contract v1.2" in warnings[0]


async def test_the_v1_1_verdict_is_remembered(v1_1_rm: RunningServer) -> None:
    """One GET /v1/info per client and period, not one per reserve."""
    async with _client(v1_1_rm.url, cluster_id="cluster-a") as a:
        for index in range(3):
            await a.reserve(_request(f"p{index}"))
        first = a._info_until  # the cached verdict's deadline: a second GET /v1/info would move it
        await a.list_reservations()
        assert a._info_until == first


def test_a_fingerprint_without_cluster_is_the_v1_1_one() -> None:
    """Stored fingerprints of v1.1 requests stay valid: an absent clusterId is not in the JSON."""
    request = _request("u")
    assert "clusterId" not in request.fingerprint()
    assert request.model_copy(update={"cluster_id": "c"}).fingerprint() != request.fingerprint()


def test_a_database_written_before_cluster_ids_is_upgraded_in_place(tmp_path: pathlib.Path) -> None:
    """A v1.1 database gains the column; its rows are of no cluster: listed only without a filter."""
    with sqlite3.connect(tmp_path / "db") as db:
        db.executescript(
            """
            CREATE TABLE reservations (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
                idempotency_key TEXT NOT NULL, fingerprint TEXT NOT NULL, pod_uid TEXT NOT NULL,
                namespace TEXT NOT NULL, name TEXT NOT NULL, scheduler_name TEXT NOT NULL,
                node TEXT NOT NULL, resources TEXT NOT NULL, state TEXT NOT NULL,
                created_at REAL NOT NULL, expires_at REAL, updated_at REAL NOT NULL,
                group_id TEXT, group_index INTEGER
            );
            INSERT INTO reservations VALUES (1, 'rsv-old', 'k', 'f', 'u', 'ns', 'p', 's', 'node-a',
                '{"cpu": "1"}', 'committed', 0, NULL, 0, NULL, NULL);
            """
        )
    store = ReservationStore(tmp_path / "db", clock=lambda: 0.0)
    try:
        old = store.get("rsv-old")
        assert old is not None
        assert old.cluster_id is None
        assert [r.id for r in store.list()[0]] == ["rsv-old"]
        assert store.list(cluster_id="a")[0] == []
    finally:
        store.close()


async def test_an_rm_rolled_back_to_v1_1_is_refused_until_the_operator_restarts(
    tmp_path: pathlib.Path,
) -> None:
    """The client learnt from GET /v1/info that the RM offers cluster-id; then the RM behind the same
    address is rolled back to v1.1. Its 400 makes the client ask again, but a 404 on /v1/info never
    withdraws a feature (it is also what a v1.1 replica answers mid-rollout, where lists without
    clusterId let reconciliation release other clusters' reservations): reserves keep failing,
    nothing goes out unscoped. A new client (an operator restarted after the rollback) sees v1.1."""
    async with contextlib.AsyncExitStack() as clients:
        async with serve_reference_rm(
            db_path=tmp_path / "new.sqlite", inventory=small_inventory(), token=TOKEN
        ) as new:
            port = new.port
            client = await clients.enter_async_context(_client(new.url, cluster_id="cluster-a"))
            assert (await client.reserve(_request("p1"))).cluster_id == "cluster-a"
        async with serve_reference_rm(
            db_path=tmp_path / "old.sqlite",
            inventory=small_inventory(),
            token=TOKEN,
            cluster_ids=False,
            port=port,
        ) as old:
            for _ in range(2):
                with pytest.raises(RMRejected) as refused:
                    await client.reserve(_request("p2"))
                assert refused.value.status == 400
            assert (await client.contract_info()).offers(Feature.CLUSTER_ID)
            restarted = ResourceManagerClient(
                base_url=old.url,
                token=TOKEN,
                allow_insecure_http=True,
                cluster_id="cluster-a",
                legacy_confirm_after=0.0,
            )
            async with restarted:
                assert not await restarted.negotiated()
                assert await restarted.negotiated()
                assert (await restarted.reserve(_request("p2"))).cluster_id is None
