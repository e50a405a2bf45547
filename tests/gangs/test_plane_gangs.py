"""The cluster plane serves the Workload API with the gang gates on every component (issue 11 item 3),
and kube-scheduler's own gang scheduling answers scenario (a) there: the CI cut of
``python -m tests.gangs.compare`` (which runs every scenario under both schedulers)."""

from __future__ import annotations

import uuid

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_kwok_node
from tests.gangs.scenarios import Stage, room_for_seven
from tests.workloads import POOL, eventually, job

pytestmark = pytest.mark.controlplane


async def test_kwok_nodes_keep_the_capacity_they_were_created_with(*, cluster_api: client.ApiClient) -> None:
    """kwok's first stage writes allocatable from the Node as it saw it; a capacity patched in after
    the create was sometimes overwritten with kwok's default of 1000 CPUs (a 3-CPU node took 8 pods)."""
    pool = uuid.uuid4().hex[:6]
    names = [f"cap-{pool}-{i}" for i in range(8)]
    core = client.CoreV1Api(cluster_api)
    try:
        for name in names:
            await create_kwok_node(
                cluster_api,
                name=name,
                capacity={"cpu": "3", "memory": "8Gi", "pods": "110"},
                labels={POOL: pool},
            )

        async def ready() -> list[str] | None:
            listed = await core.list_node(label_selector=f"{POOL}={pool}")
            if len(listed.items) < len(names) or not all(
                any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
                for n in listed.items
            ):
                return None
            return [f"{n.metadata.name}={n.status.allocatable['cpu']}" for n in listed.items]

        allocatable = await eventually(ready, within=60, what="kwok reporting the nodes Ready")
        assert allocatable == [f"{name}=3" for name in names]
    finally:
        for name in names:
            await core.delete_node(name=name)


async def test_an_indexed_job_gets_a_pod_group_from_the_job_controller(
    *, cluster_api: client.ApiClient, cluster_namespace: str
) -> None:
    """WorkloadWithJob: parallelism == completions > 1, Indexed: a Workload and a PodGroup of minCount
    = parallelism, and every pod names it in spec.schedulingGroup."""
    body = job(
        "trainers", completions=3, parallelism=3, cpu="100m", scheduler="nobody-serves-this", pool="none"
    )
    body["spec"]["completionMode"] = "Indexed"
    await client.BatchV1Api(cluster_api).create_namespaced_job(cluster_namespace, body)
    custom = client.CustomObjectsApi(cluster_api)

    async def grouped() -> tuple[int, set[str | None]] | None:
        groups = await custom.list_namespaced_custom_object(
            "scheduling.k8s.io", "v1alpha2", cluster_namespace, "podgroups"
        )
        pods = await client.CoreV1Api(cluster_api).list_namespaced_pod(
            cluster_namespace, _preload_content=False
        )
        items = (await pods.json())["items"]
        if len(groups["items"]) != 1 or len(items) != 3:
            return None
        group = groups["items"][0]
        return group["spec"]["schedulingPolicy"]["gang"]["minCount"], {
            (p["spec"].get("schedulingGroup") or {}).get("podGroupName") for p in items
        } | {group["metadata"]["name"]}

    min_count, names = await eventually(grouped, within=60, what="the Job's PodGroup and its 3 pods")
    assert min_count == 3
    assert len(names) == 1, names  # every pod names the one PodGroup


async def test_kube_scheduler_gangs_hold_8_where_7_fit_then_bind_all(
    *, cluster_api: client.ApiClient, cluster_namespace: str
) -> None:
    stage = Stage(api=cluster_api, namespace=cluster_namespace, scheduler="default-scheduler")
    try:
        result = await room_for_seven(stage)
    finally:
        await stage.cleanup()
    # kube-scheduler explains a held gang either way, depending on which of its attempts wrote the
    # condition last: the gang still gathering, or the whole group not fitting (CI saw both).
    assert any(
        reason in result.notes[0] for reason in ("waiting for minCount pods from a gang", "Insufficient cpu")
    ), result.notes
