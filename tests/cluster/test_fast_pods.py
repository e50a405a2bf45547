"""Pods that finish the moment they are bound (kwok completes Job pods at once; on a real cluster, a
container that exits or crashes at start): the bound-pod watch sees the pod finished while its
scheduling cycle has not committed yet.

Before the fix, the watch released the reservation first and the cycle's commit then met a released
reservation: a `PostBind plugin 'CommitReservation' failed` warning (HTTP 409) for a pod that had
done nothing wrong, on most pods of such a Job. Now the watch leaves the release to the pod's cycle,
which releases right after its commit; every reservation still ends released.
"""

from __future__ import annotations

import pathlib
import uuid

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.realrm import audit_findings, invariant_violations
from tests.workloads import Cluster, bindery_on, eventually, job, kwok_pool

pytestmark = pytest.mark.controlplane

COMPLETIONS = 12


async def test_pods_finishing_at_once_are_committed_then_released_without_a_failed_commit(
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
        cluster_api, pool=pool, count=2, capacity={"cpu": "4", "memory": "8Gi", "pods": "40"}
    )
    view = Cluster(api=cluster_api, namespace=namespace)
    async with bindery_on(
        api=cluster_api,
        cluster=cluster,
        operator_kubeconfig=cluster_operator_kubeconfig,
        namespace=namespace,
        pool=pool,
        directory=tmp_path,
    ) as stage:
        await view.batch.create_namespaced_job(
            namespace,
            job(
                "quick",
                completions=COMPLETIONS,
                parallelism=6,
                cpu="250m",
                scheduler=stage.scheduler,
                pool=pool,
            ),
        )

        async def complete() -> bool:
            status = (await view.batch.read_namespaced_job_status("quick", namespace)).status
            return (status.succeeded or 0) == COMPLETIONS

        await eventually(complete, within=120, what=f"the Job completing {COMPLETIONS} pods")

        async def all_released() -> bool:
            active = [r for r in await stage.rm.reservations() if r.namespace == namespace]
            return not active

        await eventually(all_released, within=60, what="every reservation of the Job released")
        assert (
            await invariant_violations(
                api=cluster_api, rm=stage.rm, namespace=namespace, scheduler_names=[stage.scheduler]
            )
            == []
        )
        assert (
            await audit_findings(
                kubeconfig=cluster.kubeconfig, namespace=namespace, rm_name=stage.rm_name, nodes=nodes
            )
            == []
        )
        log = stage.operator.log()
        assert "bound pod" in log  # the log is the operator's, and it placed the pods
        failed = [line for line in log.splitlines() if "CommitReservation" in line and "failed" in line]
        assert failed == [], "\n".join(failed)
