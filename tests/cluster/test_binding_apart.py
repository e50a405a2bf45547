"""A tenant's pods waiting for volumes hold no scheduling slot: another namespace's pod still binds.

On the cluster plane (kube-controller-manager's persistent-volume controller, kwok nodes,
kube-scheduler), with the reference RM as its own process. Namespace A creates `TENANT_PODS` pods,
each with a WaitForFirstConsumer claim of a StorageClass whose provisioner does not exist: every
one of them reaches PreBind, gets its claim annotated with the chosen node and waits there for a
volume that never comes. Then namespace B creates one plain pod. Before, the waiting pods held every
`maxInFlight` slot (PreBind ran inside the cycle's slot) and B waited for A's bind timeout
(600 s): "timed out after 90s waiting for namespace B's plain pod bound". Now a
PreBind wait leaves the slots for the binding pool (`maxBindingWaits`, smaller than A's count
here, so its own queue is used too), and B is bound while A's pods all still wait.

kube-scheduler runs the same scene with its own scheduler name: its binding cycle waits apart from
its scheduling cycle, so its B binds too.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import Bindery, delete_rm
from tests.realrm import RMProcess, serve_with
from tests.workloads import POOL, eventually, kwok_pool, template

#: `BINDERY_BINDING_APART=full`: the issue's figures, the defaults (maxInFlight 256, 300 pods, a
#: pool of 64; about 60 s for Bindery's run on 2 busy cores). Otherwise the same scene scaled down
#: (7 s), as CI runs it.
FULL = os.environ.get("BINDERY_BINDING_APART") == "full"
#: The in-flight budget of the test's ResourceManager.
MAX_IN_FLIGHT = 256 if FULL else 16
#: Namespace A's pods: more than `MAX_IN_FLIGHT`, so that before, they left no slot for B.
TENANT_PODS = 300 if FULL else 24
#: The binding pool of the test's ResourceManager: smaller than A's count, so A's last pods wait in
#: the pool's own queue (never in a scheduling slot).
BINDING_POOL = 64 if FULL else 8
SELECTED_NODE = "volume.kubernetes.io/selected-node"
TEST_LABEL = "bindery.dev/binding-apart-test"
SCHEDULERS = [pytest.param("bindery", id="bindery"), pytest.param("kube-scheduler", id="kube_scheduler")]


async def _annotated_claims(core: client.CoreV1Api, namespace: str) -> int:
    claims = await core.list_namespaced_persistent_volume_claim(namespace)
    return sum(1 for c in claims.items if SELECTED_NODE in (c.metadata.annotations or {}))


async def _pods(core: client.CoreV1Api, namespace: str) -> list[Any]:
    return list((await core.list_namespaced_pod(namespace)).items)


@pytest.fixture
async def tenant(cluster_api: client.ApiClient) -> AsyncIterator[str]:
    """Namespace A (the test's `cluster_namespace` is namespace B)."""
    name = f"tenant-a-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(cluster_api)
    await core.create_namespace(body={"metadata": {"name": name}})
    yield name
    await core.delete_namespace(name=name)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_a_tenants_pods_waiting_for_volumes_leave_another_namespaces_pod_a_slot(
    *,
    scheduler: str,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tenant: str,
    tmp_path: pathlib.Path,
) -> None:
    pool = uuid.uuid4().hex[:6]
    core = client.CoreV1Api(cluster_api)
    storage = client.StorageV1Api(cluster_api)
    nodes = await kwok_pool(
        cluster_api, pool=pool, count=2, capacity={"cpu": "32", "memory": "64Gi", "pods": "200"}
    )
    klass = f"nobody-provisions-{pool}"
    await storage.create_storage_class(
        body={
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": klass, "labels": {TEST_LABEL: pool}},
            # No provisioner of this name runs anywhere: the claims are never bound.
            "provisioner": f"provisioner.invalid/nobody-{pool}",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    )
    operator: Bindery | None = None
    rm_name = f"rm-{pool}"
    try:
        async with RMProcess(
            kubeconfig=cluster.kubeconfig, directory=tmp_path, node_selector=f"{POOL}={pool}"
        ) as rm:
            scheduler_name: str | None = None
            if scheduler == "bindery":
                scheduler_name = f"bindery-{pool}"
                operator = Bindery(kubeconfig=cluster_operator_kubeconfig)
                await operator.start()
                await serve_with(
                    cluster_api,
                    rm=rm,
                    name=rm_name,
                    scheduler_names=[scheduler_name],
                    namespace=cluster_namespace,
                    maxInFlight=MAX_IN_FLIGHT,
                    maxBindingWaits=BINDING_POOL,
                )

            for i in range(TENANT_PODS):
                await core.create_namespaced_persistent_volume_claim(
                    tenant,
                    body={
                        "metadata": {"name": f"data-{i}"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": klass,
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    },
                )
                body = template(labels={"app": "waits"}, cpu="100m", scheduler=scheduler_name, pool=pool)
                body["metadata"]["name"] = f"waits-{i}"
                body["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
                claim = {"claimName": f"data-{i}"}
                body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": claim}]
                await core.create_namespaced_pod(tenant, body=body)

            # Every scheduling slot the old code had is taken by a pod waiting in PreBind.
            await eventually(
                lambda: _at_least(core, tenant, MAX_IN_FLIGHT),
                within=120,
                what=f"{MAX_IN_FLIGHT} of namespace A's claims given a node (their pods waiting in PreBind)",
            )

            plain = template(labels={"app": "plain"}, cpu="100m", scheduler=scheduler_name, pool=pool)
            plain["metadata"]["name"] = "plain"
            await core.create_namespaced_pod(cluster_namespace, body=plain)

            async def bound() -> str | None:
                pod = await core.read_namespaced_pod("plain", cluster_namespace)
                return pod.spec.node_name or None

            node = await eventually(bound, within=90, what="namespace B's plain pod bound")
            assert node in nodes

            # ... while every one of A's pods still waits for its volume, unbound.
            pods = await _pods(core, tenant)
            assert len(pods) == TENANT_PODS
            assert [p.metadata.name for p in pods if p.spec.node_name] == []
            claims = (await core.list_namespaced_persistent_volume_claim(tenant)).items
            assert {c.status.phase for c in claims} == {"Pending"}

            if operator is not None:
                runner = operator.runtime.runners[rm_name]

                async def accounted() -> tuple[int, int, int, int] | None:
                    stats, waits = runner.queue.stats(), runner.binding.stats()
                    figures = (stats.in_flight, stats.binding, waits.admitted, waits.queued)
                    # Settled: every A pod in the binding phase, none in a scheduling slot; the pool
                    # full, the rest in its queue.
                    settled = (0, TENANT_PODS, BINDING_POOL, TENANT_PODS - BINDING_POOL)
                    return figures if figures == settled else None

                await eventually(
                    accounted,
                    within=60,
                    what="A's pods in the binding phase (pool full, the rest queued), no slot held",
                )
    finally:
        if operator is not None:
            await delete_rm(cluster_api, name=rm_name)
            await operator.stop()
        await storage.delete_collection_storage_class(label_selector=f"{TEST_LABEL}={pool}")
        for name in nodes:
            await core.delete_node(name)


async def _at_least(core: client.CoreV1Api, namespace: str, count: int) -> int | None:
    annotated = await _annotated_claims(core, namespace)
    return annotated if annotated >= count else None
