"""Issue 23: a Deployment bound by Bindery through a real Slurm.

kwok nodes named as the Slurm nodes of a bed (slurmctld, one slurmd per node, slurmrestd), the
adapter (`bindery rm slurm`) and the operator as their own processes, a ResourceManager pointing
at the adapter. Every pod of the Deployment runs on the node of its own placeholder job, `squeue`
shows exactly one RUNNING job per pod, and scaled to zero no job runs without its pod.
"""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.plane import ControlPlane
from bindery.devcluster.slurm import SlurmBed, SlurmNode
from tests.realrm import operator_process
from tests.slurm.conftest import AdapterProcess, slurm_root
from tests.workloads import POOL, Cluster, deployment, eventually, kwok_pool

pytestmark = pytest.mark.controlplane
__all__ = ["slurm_root"]  # the fixture, imported so that pytest finds it here


async def _serve(
    api: client.ApiClient, *, adapter: AdapterProcess, name: str, scheduler: str, ns: str
) -> None:
    await client.CoreV1Api(api).create_namespaced_secret(
        namespace=ns,
        body={
            "metadata": {"name": f"{name}-token", "labels": {CREDENTIALS_LABEL: "true"}},
            "stringData": {"token": adapter.token_file.read_text().strip()},
        },
    )
    await client.CustomObjectsApi(api).create_cluster_custom_object(
        group="bindery.dev",
        version="v1alpha1",
        plural="resourcemanagers",
        body={
            "apiVersion": "bindery.dev/v1alpha1",
            "kind": "ResourceManager",
            "metadata": {"name": name},
            "spec": {
                "schedulerNames": [scheduler],
                "endpoint": adapter.url,
                "allowInsecureHTTP": True,
                "auth": {"tokenSecretRef": {"namespace": ns, "name": f"{name}-token"}},
            },
        },
    )


async def test_a_deployment_is_bound_through_slurm_one_running_job_per_pod(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    slurm_root: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    namespace, pool = cluster_namespace, uuid.uuid4().hex[:6]
    scheduler, rm_name = f"slurm-{pool}", f"rm-slurm-{pool}"
    nodes = await kwok_pool(
        cluster_api, pool=pool, count=2, capacity={"cpu": "4", "memory": "8Gi", "pods": "20"}
    )
    bed = SlurmBed(
        tmp_path / "slurm", [SlurmNode(node, cpus=4, memory_mib=8192) for node in nodes], root=slurm_root
    )
    bed.start()
    token_file = tmp_path / "token"
    token_file.write_text(uuid.uuid4().hex)
    # The adapter never reads the apiserver: the node map carries the labels the pods select on.
    node_map = tmp_path / "node-map.yaml"
    node_map.write_text(
        yaml.safe_dump(
            {"nodes": [{"name": n, "labels": {POOL: pool, "kubernetes.io/hostname": n}} for n in nodes]}
        )
    )
    adapter = AdapterProcess(bed, token_file, node_map=str(node_map))
    view = Cluster(api=cluster_api, namespace=namespace)
    try:
        adapter.start()
        async with operator_process(kubeconfig=cluster_operator_kubeconfig, directory=tmp_path):
            await _serve(cluster_api, adapter=adapter, name=rm_name, scheduler=scheduler, ns=namespace)
            await view.apps.create_namespaced_deployment(
                namespace, deployment("api", replicas=3, cpu="1", scheduler=scheduler, pool=pool)
            )
            await eventually(lambda: view.running("app=api", 3), within=120, what="3 pods bound and Running")

            pods = await view.pods("app=api")
            jobs = [row for row in bed.squeue() if row["name"].startswith("bindery:")]
            print("\nsqueue:\n" + "\n".join(f"{r['id']} {r['name']} {r['state']} {r['nodes']}" for r in jobs))
            assert sorted(row["name"] for row in jobs if row["state"] == "RUNNING") == sorted(
                f"bindery:{namespace}/{p['metadata']['name']}" for p in pods
            )
            where = {row["name"]: row["nodes"] for row in jobs}
            for pod in pods:
                assert pod["spec"]["nodeName"] == where[f"bindery:{namespace}/{pod['metadata']['name']}"]

            async def committed() -> bool:
                with adapter.client() as http:
                    items: list[dict[str, Any]] = http.get(
                        "/v1/reservations", params={"schedulerName": scheduler, "state": "committed"}
                    ).json()["items"]
                return {i["podUid"] for i in items} == {p["metadata"]["uid"] for p in pods}

            await eventually(committed, within=60, what="every pod's reservation committed")

            await view.apps.patch_namespaced_deployment_scale("api", namespace, {"spec": {"replicas": 0}})

            async def no_job_without_pod() -> bool:
                running = [
                    r for r in bed.squeue() if r["name"].startswith("bindery:") and r["state"] == "RUNNING"
                ]
                return not running and not await view.pods("app=api")

            await eventually(no_job_without_pod, within=90, what="no placeholder job left after scaling to 0")
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CustomObjectsApi(cluster_api).delete_cluster_custom_object(
                group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=rm_name
            )
        if adapter.process is not None and adapter.process.poll() is None:
            adapter.kill()
        bed.stop()
