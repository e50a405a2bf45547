"""Issue 20 on the cluster plane: a hostile tenant's pod churn, with controllers, kwok and
kube-scheduler running beside Bindery and the reference RM as its own process.

A namespace user who may only create pods loops: create a pod that never fits, wait until Bindery
refuses it, delete it. Each deletion of a pending pod of a served name used to send every parked
pod of the ResourceManager back to the RM (an RM call per parked pod per deletion). Here another
namespace's parked pod must keep its single attempt through the loop, and be retried when a bound
pod really ends (its reservation is released).
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
import uuid
from typing import Any

from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from bindery.scheduling.queue import SchedulingQueue
from tests.operator.conftest import Bindery, condition, create_pod, delete_rm, node_of, pod_body, read_pod
from tests.operator.test_preemption_lying_rm import lying_rm_evicts_nobody
from tests.realrm import RMProcess, serve_with
from tests.workloads import POOL, eventually, kwok_pool

ROUNDS = 3


async def _refused(api: client.ApiClient, namespace: str, name: str) -> bool:
    cond = condition(await read_pod(api, namespace=namespace, name=name))
    return cond is not None and cond.get("status") == "False" and cond.get("reason") == "Unschedulable"


async def test_a_tenants_create_delete_loop_does_not_retry_another_namespaces_parked_pod(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    pool = uuid.uuid4().hex[:6]
    await kwok_pool(cluster_api, pool=pool, count=1, capacity={"cpu": "4", "memory": "8Gi", "pods": "20"})
    tenant = f"hostile-{pool}"
    core = client.CoreV1Api(cluster_api)
    await core.create_namespace(body={"metadata": {"name": tenant}})
    scheduler, rm_name = f"bindery-{pool}", f"rm-{pool}"
    operator = Bindery(kubeconfig=cluster_operator_kubeconfig)
    await operator.start()
    try:
        async with RMProcess(
            kubeconfig=cluster.kubeconfig, directory=tmp_path, node_selector=f"{POOL}={pool}"
        ) as rm:
            await serve_with(
                cluster_api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=cluster_namespace
            )
            runs = await create_pod(
                cluster_api,
                namespace=cluster_namespace,
                body=pod_body(name="runs", scheduler_name=scheduler, cpu="3"),
            )
            assert await eventually(
                lambda: node_of(cluster_api, namespace=cluster_namespace, name="runs"),
                within=60,
                what="the first pod bound",
            )
            parked = await create_pod(
                cluster_api,
                namespace=cluster_namespace,
                body=pod_body(name="parked", scheduler_name=scheduler, cpu="2"),
            )
            await eventually(
                lambda: _refused(cluster_api, cluster_namespace, "parked"), within=60, what="parked refused"
            )
            queue: SchedulingQueue = operator.runtime.runners[rm_name].queue
            uid = parked["metadata"]["uid"]
            assert queue.attempts(uid) == 1

            for round_ in range(ROUNDS):
                name = f"doomed-{round_}"
                doomed: dict[str, Any] = await create_pod(
                    cluster_api, namespace=tenant, body=pod_body(name=name, scheduler_name=scheduler, cpu="2")
                )
                await eventually(
                    functools.partial(_refused, cluster_api, tenant, name), within=60, what=f"{name} refused"
                )
                await core.delete_namespaced_pod(name=name, namespace=tenant)

                async def handled(doomed_uid: str = doomed["metadata"]["uid"]) -> bool:
                    gone = operator.runtime.pods.get(doomed_uid) is None
                    return gone and queue.position(doomed_uid) is None

                await eventually(handled, within=60, what=f"the deletion of {name} handled")
                assert (queue.attempts(uid), queue.stats().unschedulable) == (1, 1), (
                    f"the tenant's deletion of {name} retried the other namespace's parked pod"
                )

            # A bound pod ending releases its reservation: that may make room, so the parked pod is
            # tried again (and now fits).
            await core.delete_namespaced_pod(name="runs", namespace=cluster_namespace, grace_period_seconds=0)
            assert await eventually(
                lambda: node_of(cluster_api, namespace=cluster_namespace, name="parked"),
                within=60,
                what="the parked pod bound once the first pod ended",
            )
            assert runs["metadata"]["uid"] != uid
    finally:
        await delete_rm(cluster_api, name=rm_name)
        await operator.stop()
        await core.delete_namespace(name=tenant)


async def test_a_lying_rms_plans_evict_nobody_on_kwok_nodes(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
) -> None:
    """Issue 35 on the cluster plane: the lying RM of tests/operator/test_preemption_lying_rm.py,
    its victims running on kwok nodes (which would finish their termination), with
    kube-controller-manager's disruption controller and kube-scheduler beside Bindery."""
    token = uuid.uuid4().hex[:6]
    nodes: dict[str, dict[str, str]] = {}
    for side in ("a", "b"):
        pool = f"lie{side}-{token}"
        (node,) = await kwok_pool(
            cluster_api, pool=pool, count=1, capacity={"cpu": "4", "memory": "8Gi", "pods": "20"}
        )
        nodes[node] = {POOL: pool}
    operator = Bindery(kubeconfig=cluster_operator_kubeconfig)
    await operator.start()
    try:
        await lying_rm_evicts_nobody(
            api=cluster_api, namespace=cluster_namespace, nodes=nodes, uniq=lambda prefix: f"{prefix}-{token}"
        )
    finally:
        await operator.stop()
        for node in nodes:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(cluster_api).delete_node(name=node)
