"""One 404 on `GET /v1/info` in front of an RM two clusters share releases nothing of the other's.

Why: the RM client used to take a 404 on `/v1/info` (a v1.1 replica behind the RM's Service
mid-rollout, a rollback, a proxy) for an RM of contract v1.1 for five minutes. Its lists then went
out without `clusterId`, the reconcile pass saw the other cluster's reservations, found none of
their pods here and released them; the other cluster's RM then sold that room again.

The reference RM runs as its own process behind `tests/rmproxy.py`, which answers `/v1/info` 404
once, as such a replica would. Cluster A is the shared plane with the operator of the `bindery`
fixture. Cluster B is what B's operator leaves at the RM: a committed reservation with B's cluster
id for a pod of a namespace A does not have, made here by a client with B's cluster id (a second
plane would only add its start-up; `test_shared_rm_clusters.py` runs B's operator on one).
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes_asyncio import client

from bindery.controller.reservations.reconcile import ContractUnknown, Reconciler
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnavailable, RMUnschedulable
from bindery.rm.models import PodIdentity, Reservation, ReservationRequest
from tests.operator.conftest import Bindery, delete_rm, eventually, now
from tests.realrm import RMProcess, serve_with
from tests.rmproxy import RMFaultProxy, rm_fault_proxy

log = logging.getLogger(__name__)
POOL_LABEL = "bindery.dev/test-pool"
CLUSTER_B = "cluster-b"


@pytest.fixture
async def shared_rm(
    controlplane: ControlPlane, kube_api: client.ApiClient, uniq: Callable[[str], str], tmp_path: pathlib.Path
) -> AsyncIterator[tuple[RMProcess, RMFaultProxy]]:
    """The reference RM as a process mirroring one fresh node of its own pool, behind the proxy."""
    pool = uniq("pool")
    await create_node(
        kube_api,
        name=uniq("shared"),
        capacity={"cpu": "8", "memory": "16Gi", "pods": "110"},
        labels={POOL_LABEL: pool},
    )
    async with (
        RMProcess(
            kubeconfig=controlplane.kubeconfig,
            directory=tmp_path / "rm",
            node_selector=f"{POOL_LABEL}={pool}",
        ) as rm,
        rm_fault_proxy(upstream=rm.url, seed=1, rate=0.0) as proxy,
    ):
        yield rm, proxy


async def _reserve(rm: ResourceManagerClient, *, scheduler: str, namespace: str) -> Reservation:
    """What B's operator does for a pod of B: reserve (once the RM mirrors the node) and commit."""
    uid = str(uuid.uuid4())
    request = ReservationRequest(
        pod=PodIdentity(uid=uid, namespace=namespace, name="runs-in-b", scheduler_name=scheduler),
        resources={"cpu": "100m"},
        idempotency_key=uid,
        ttl_seconds=600,
    )
    async with asyncio.timeout(60):
        while True:
            try:
                held = await rm.reserve(request)
                break
            except (RMUnavailable, RMUnschedulable):
                await asyncio.sleep(0.2)
    return await rm.commit(held.id, pod_uid=uid)


async def _state(rm: RMProcess, reservation_id: str) -> str:
    return {r.id: r.state.value for r in await rm.reservations(active=False)}[reservation_id]


async def test_one_404_on_info_leaves_the_other_clusters_committed_reservation_alone(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    bindery: Bindery,
    shared_rm: tuple[RMProcess, RMFaultProxy],
) -> None:
    """A's operator meets the RM through the proxy, whose first `/v1/info` answer is 404. A's
    reconcile passes (the first ones while the contract is unknown, then scoped ones) leave B's
    committed reservation committed."""
    rm, proxy = shared_rm
    scheduler, name = uniq("sched"), uniq("rm-a")
    async with rm.client(cluster_id=CLUSTER_B) as in_b:
        theirs = await _reserve(in_b, scheduler=scheduler, namespace=f"b-{uuid.uuid4().hex[:8]}")
    assert theirs.cluster_id == CLUSTER_B

    def passes() -> int:
        supervisor = bindery.runtime.supervisors.get(name)
        return supervisor.reconciled if supervisor is not None else 0

    proxy.answer("/v1/info", 404, 1)
    try:
        await serve_with(
            kube_api,
            rm=rm,
            name=name,
            scheduler_names=[scheduler],
            namespace=namespace,
            endpoint=proxy.url,
            reconcileIntervalSeconds=5,
        )
        await eventually(
            lambda: now(proxy.scripted("/v1/info") == 0), within=60, what="A met the 404 on /v1/info"
        )
        await eventually(lambda: now(passes() >= 2), within=90, what="two reconcile passes in A")
        assert await _state(rm, theirs.id) == "committed", (
            f"A's reconciliation changed B's reservation {theirs.id} after one 404 on /v1/info"
        )
    finally:
        await delete_rm(kube_api, name=name)


async def test_a_pass_settles_no_reservation_of_another_cluster_even_from_an_unscoped_list(
    *,
    operator_api: client.ApiClient,
    uniq: Callable[[str], str],
    shared_rm: tuple[RMProcess, RMFaultProxy],
) -> None:
    """Defence in depth: whatever a list holds (here a client that asks for every cluster's, as a
    v1.1 verdict would), a pass of cluster A never releases a reservation of cluster B."""
    rm, _ = shared_rm
    scheduler = uniq("sched")
    async with rm.client(cluster_id=CLUSTER_B) as in_b, rm.client() as unscoped:
        theirs = await _reserve(in_b, scheduler=scheduler, namespace=f"b-{uuid.uuid4().hex[:8]}")
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: unscoped,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            cluster_id="cluster-a",
        )
        report = await reconciler.run_once(reason="start")
        assert report.actions == {}, report
        assert await _state(rm, theirs.id) == "committed"


async def test_a_pass_decides_nothing_while_the_contract_is_unknown(
    *,
    operator_api: client.ApiClient,
    uniq: Callable[[str], str],
    shared_rm: tuple[RMProcess, RMFaultProxy],
) -> None:
    """A first 404 on `/v1/info` leaves the contract unknown: the pass raises ContractUnknown (the
    supervisor retries it with its backoff) before it lists anything, and says why."""
    rm, proxy = shared_rm
    scheduler = uniq("sched")
    async with rm.client(cluster_id=CLUSTER_B) as in_b:
        theirs = await _reserve(in_b, scheduler=scheduler, namespace=f"b-{uuid.uuid4().hex[:8]}")
    proxy.answer("/v1/info", 404, 1)
    async with ResourceManagerClient(
        base_url=proxy.url, token_file=rm.token_file, allow_insecure_http=True, cluster_id="cluster-a"
    ) as a:
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: a,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            cluster_id="cluster-a",
        )
        requests = proxy.requests
        with pytest.raises(ContractUnknown, match="GET /v1/info"):
            await reconciler.run_once(reason="start")
        assert proxy.requests == requests + 1, "the pass called more than GET /v1/info"
    assert await _state(rm, theirs.id) == "committed"
