"""Bindery in a small real cluster: controllers make the pods, kwok runs them, kube-scheduler shares
the nodes.

Three kwok nodes of 4 CPU. A DaemonSet and a Deployment of the default scheduler land first (kube-
scheduler places them); then a Deployment and a Job of Bindery's scheduler name are placed by the
operator through the reference RM, which mirrors the nodes and counts every pod on them. The pods
turn Running (the Job's pods then Succeeded), the Deployment is scaled past what fits and back,
and the namespace is deleted. After each step: no node overcommitted (whoever bound its pods), no pod
scheduled twice, every reservation committed to its pod's node or released, and `bindery audit`
clean.

The default-scheduler pods are placed before Bindery's: two schedulers placing pods onto the same
node *at the same instant* can overcommit it whatever either does (kube-scheduler has the same race
with any second scheduler; the kubelet then rejects one pod). What is checked is that Bindery never
overcommits a node given what is already bound there.
"""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.realrm import audit_findings, invariant_violations
from tests.workloads import (
    Cluster,
    bindery_on,
    default_scheduler_share,
    deployment,
    eventually,
    job,
    kwok_pool,
)

pytestmark = pytest.mark.controlplane

NODES = 3


async def test_controllers_kwok_and_two_schedulers_share_nodes_without_overcommit_or_leaks(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    namespace = cluster_namespace
    pool = uuid.uuid4().hex[:6]
    nodes = await kwok_pool(
        cluster_api, pool=pool, count=NODES, capacity={"cpu": "4", "memory": "8Gi", "pods": "20"}
    )
    view = Cluster(api=cluster_api, namespace=namespace)

    # The default scheduler's share first: 0.5 CPU per node (DaemonSet) + 3 x 1 CPU.
    await default_scheduler_share(view, pool=pool, nodes=NODES)

    try:
        async with bindery_on(
            api=cluster_api,
            cluster=cluster,
            operator_kubeconfig=cluster_operator_kubeconfig,
            namespace=namespace,
            pool=pool,
            directory=tmp_path,
        ) as stage:
            rm, scheduler, rm_name = stage.rm, stage.scheduler, stage.rm_name

            async def clean() -> list[str]:
                lines = await invariant_violations(
                    api=cluster_api, rm=rm, namespace=namespace, scheduler_names=[scheduler]
                )
                return lines + await audit_findings(
                    kubeconfig=cluster.kubeconfig, namespace=namespace, rm_name=rm_name, nodes=nodes
                )

            async def settled() -> bool:
                return not await clean()

            # 12 CPU in all, 4.5 used by the default scheduler's pods: 7.5 left.
            await view.apps.create_namespaced_deployment(
                namespace, deployment("api", replicas=4, cpu="1", scheduler=scheduler, pool=pool)
            )
            await view.batch.create_namespaced_job(
                namespace,
                job("batch", completions=6, parallelism=3, cpu="500m", scheduler=scheduler, pool=pool),
            )
            await eventually(
                lambda: view.running("app=api", 4), within=90, what="Bindery's Deployment Running"
            )

            async def job_complete() -> bool:
                status = (await view.batch.read_namespaced_job_status("batch", namespace)).status
                return (status.succeeded or 0) == 6

            await eventually(job_complete, within=120, what="Bindery's Job completing its 6 pods")
            await eventually(settled, within=60, what="no finding after the Job completed")
            # Every pod Bindery placed for the Job ended: their reservations were released.
            finished = await view.pods("job=batch")
            assert len(finished) == 6
            assert all(p["status"]["phase"] == "Succeeded" for p in finished)
            assert {p["spec"]["schedulerName"] for p in finished} == {scheduler}
            held = {r.pod_uid for r in await rm.reservations() if r.namespace == namespace}
            assert not held & {p["metadata"]["uid"] for p in finished}

            # Past what fits: each node has 4 - 0.5 - (its share of 3 x 1) CPU free, which holds six
            # 1-CPU pods in all however kube-scheduler spread "web": two more of 5 fit, 3 stay
            # pending, with the RM's reason in their condition.
            await view.apps.patch_namespaced_deployment_scale("api", namespace, {"spec": {"replicas": 9}})

            async def placed_and_explained() -> list[dict[str, Any]] | None:
                pods = await view.pods("app=api")
                bound = [p for p in pods if p["spec"].get("nodeName")]
                pending = [p for p in pods if not p["spec"].get("nodeName")]
                explained = [
                    p
                    for p in pending
                    for c in (p.get("status") or {}).get("conditions") or []
                    if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message")
                ]
                return pending if len(pods) == 9 and len(bound) == 6 and len(explained) == 3 else None

            pending = await eventually(placed_and_explained, within=90, what="6 of 9 placed, 3 explained")
            assert await clean() == []
            reasons = [
                c["message"] for c in pending[0]["status"]["conditions"] if c["type"] == "PodScheduled"
            ]
            print(f"\na pending pod says: {reasons[0]}")

            # Back down: the pending pods go first; the rest keep running on their reservations.
            await view.apps.patch_namespaced_deployment_scale("api", namespace, {"spec": {"replicas": 2}})
            await eventually(
                lambda: view.running("app=api", 2), within=90, what="the Deployment at 2 replicas"
            )
            await eventually(settled, within=60, what="no finding after scaling down")
            api_uids = {p["metadata"]["uid"] for p in await view.pods("app=api")}
            held = {r.pod_uid for r in await rm.reservations() if r.namespace == namespace}
            assert held == api_uids, "exactly the running pods of Bindery hold reservations"

            # The namespace goes, with everything in it: the namespace controller deletes the pods,
            # kwok finishes their deletion, and every reservation is released.
            await view.core.delete_namespace(namespace)

            async def namespace_gone() -> bool:
                try:
                    await view.core.read_namespace(namespace)
                except client.ApiException as exc:
                    return bool(exc.status == 404)
                return False

            await eventually(namespace_gone, within=120, what="the namespace deleted")

            async def all_released() -> bool:
                return not [r for r in await rm.reservations() if r.namespace == namespace]

            await eventually(all_released, within=60, what="every reservation of the namespace released")
    finally:
        for node in nodes:
            with contextlib.suppress(client.ApiException):
                await view.core.delete_node(node)
