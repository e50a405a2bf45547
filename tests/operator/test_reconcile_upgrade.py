"""Reservations a reconcile pass used to leave alone after an upgrade: unscoped ones, duplicates.

After an upgrade to contract v1.2 the operator lists only its own cluster's reservations. Those made
before it (by a v1.1 operator, or by an old replica during a rolling upgrade) carry no cluster id and
fell out of every pass: one whose Binding landed while its commit was lost stayed `reserved` until
its lease expired under a running pod, and the pod was warned about as having no reservation.
And since the pod's annotation is no longer authority (issue 20, scenario 7), two active
reservations for one running pod on its node were both kept (and committed) while it ran.
Here the reference RM runs as its own process; the unscoped reservations are made by a client
without a cluster id, as a v1.1 operator would.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes_asyncio import client

from bindery.controller.reservations.reconcile import Reconciler
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnavailable, RMUnschedulable
from bindery.rm.models import PodIdentity, Reservation, ReservationRequest
from tests.operator.conftest import bind_pod, create_pod, pod_body
from tests.realrm import RMProcess

log = logging.getLogger(__name__)
POOL_LABEL = "bindery.dev/test-pool"
CLUSTER = "cluster-under-test"


@pytest.fixture
async def pool_rm(
    controlplane: ControlPlane, kube_api: client.ApiClient, uniq: Callable[[str], str], tmp_path: pathlib.Path
) -> AsyncIterator[tuple[RMProcess, str]]:
    """The reference RM as a process mirroring one fresh 8-CPU node of its own pool: (rm, node)."""
    pool, node = uniq("pool"), uniq("unscoped")
    await create_node(
        kube_api, name=node, capacity={"cpu": "8", "memory": "16Gi", "pods": "110"}, labels={POOL_LABEL: pool}
    )
    async with RMProcess(
        kubeconfig=controlplane.kubeconfig, directory=tmp_path / "rm", node_selector=f"{POOL_LABEL}={pool}"
    ) as rm:
        yield rm, node


async def _reserve(
    rm: ResourceManagerClient, *, uid: str, namespace: str, name: str, scheduler: str, key: str = ""
) -> Reservation:
    """Reserve for that pod identity as a cycle would (retrying until the RM mirrors the node)."""
    request = ReservationRequest(
        pod=PodIdentity(uid=uid, namespace=namespace, name=name, scheduler_name=scheduler),
        resources={"cpu": "100m"},
        idempotency_key=key or uid,
        ttl_seconds=600,
    )
    async with asyncio.timeout(60):
        while True:
            try:
                return await rm.reserve(request)
            except (RMUnavailable, RMUnschedulable):
                await asyncio.sleep(0.2)


async def _states(rm: ResourceManagerClient) -> dict[str, str]:
    return {r.id: r.state.value for r in await rm.list_reservations(all_clusters=True)}


async def test_a_pass_settles_unscoped_reservations_of_its_own_pods_by_uid_and_leaves_the_rest(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """Of five reservations made without a cluster id, a pass of a cluster-scoped operator commits
    the one whose pod (same UID) runs on its node, releases the one whose pod runs elsewhere, leaves
    the pending pod's, and never touches the two whose UID is not a pod of this cluster (another
    cluster's pods: one under a name that exists here with another UID). A later pass releases the
    committed one once its pod is gone, because an earlier pass saw that UID here."""
    process, node = pool_rm
    scheduler = uniq("sched")
    elsewhere = uniq("elsewhere")
    await create_node(kube_api, name=elsewhere, capacity={"cpu": "8", "memory": "16Gi", "pods": "110"})
    pods = {
        name: await create_pod(
            kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler)
        )
        for name in ("landed", "moved", "pending", "same-name")
    }
    async with process.client() as old, process.client(cluster_id=CLUSTER) as scoped:
        held = {
            name: await _reserve(
                old,
                uid=pod["metadata"]["uid"],
                namespace=namespace,
                name=name,
                scheduler=scheduler,
            )
            for name, pod in pods.items()
            if name != "same-name"
        }
        # Another cluster's pods: one named like a pod of this cluster, one under a name unknown here.
        held["same-name"] = await _reserve(
            old, uid=str(uuid.uuid4()), namespace=namespace, name="same-name", scheduler=scheduler
        )
        held["unknown"] = await _reserve(
            old, uid=str(uuid.uuid4()), namespace=namespace, name="only-there", scheduler=scheduler
        )
        assert all(r.cluster_id is None for r in held.values())
        await bind_pod(kube_api, namespace=namespace, name="landed", node=node)  # its commit was lost
        await bind_pod(kube_api, namespace=namespace, name="moved", node=elsewhere)

        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: scoped,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            cluster_id=CLUSTER,
        )
        report = await reconciler.run_once(reason="start")
        assert report.actions == {held["landed"].id: "commit", held["moved"].id: "release"}, report
        assert report.missing == (), "a pod holding an unscoped reservation was warned as having none"
        states = await _states(scoped)
        assert {name: states[r.id] for name, r in held.items()} == {
            "landed": "committed",
            "moved": "released",
            "pending": "reserved",
            "same-name": "reserved",
            "unknown": "reserved",
        }

        # The landed pod ends while no bound-pod watch runs: the next pass knows that UID was ours.
        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="landed", namespace=namespace, grace_period_seconds=0
        )
        report = await reconciler.run_once(reason="periodic")
        assert report.actions == {held["landed"].id: "release"}, report
        states = await _states(scoped)
        assert [states[held[name].id] for name in ("landed", "same-name", "unknown")] == [
            "released",
            "reserved",
            "reserved",
        ]


async def test_a_pass_keeps_one_reservation_of_a_running_pod_and_releases_the_surplus(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """Pod `one` runs on its node with a committed reservation and a reserved one there (a reserve
    retried under another key): the committed one is kept, the other released, not committed.
    Pod `two` has two reserved ones there: the older is committed, the newer released."""
    process, node = pool_rm
    scheduler = uniq("sched")
    pods = {
        name: await create_pod(
            kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler)
        )
        for name in ("one", "two")
    }
    async with process.client(cluster_id=CLUSTER) as rm:
        held: dict[str, Reservation] = {}
        for name, pod in pods.items():
            uid = pod["metadata"]["uid"]
            for copy in ("first", "second"):
                held[f"{name}-{copy}"] = await _reserve(
                    rm, uid=uid, namespace=namespace, name=name, scheduler=scheduler, key=f"{uid}-{copy}"
                )
            await bind_pod(kube_api, namespace=namespace, name=name, node=node)
        assert {r.node for r in held.values()} == {node}
        await rm.commit(held["one-second"].id, pod_uid=pods["one"]["metadata"]["uid"])

        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            cluster_id=CLUSTER,
        )
        report = await reconciler.run_once(reason="periodic")
        assert report.actions == {
            held["one-first"].id: "release",
            held["two-first"].id: "commit",
            held["two-second"].id: "release",
        }, report
        states = await _states(rm)
        assert {name: states[r.id] for name, r in held.items()} == {
            "one-first": "released",
            "one-second": "committed",
            "two-first": "committed",
            "two-second": "released",
        }
        report = await reconciler.run_once(reason="periodic")
        assert report.actions == {}, report
