"""Issue 19 item 3 on the cluster plane: a ScheduleAnyway zone spread reaches a binpacking RM as node
preferences, and six pods created at once spread over three zones as kube-scheduler spreads them;
so do six bare pods that a Service selects (kube-scheduler's default spreading).

Before, the soft spread was dropped and the reference RM (its own process, ``--mirror-nodes``, policy
binpack, as the chart can install it) put all six on the first node. kube-scheduler schedules the
same pods in another namespace on the same nodes at the same time (spread selectors count one
namespace), and its placement is printed beside Bindery's.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import uuid
from collections import Counter
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_kwok_node
from bindery.devcluster.plane import ControlPlane
from tests.workloads import POOL, bindery_on, eventually

pytestmark = pytest.mark.controlplane

ZONE = "topology.kubernetes.io/zone"
ZONES = ("a", "b", "c")
PODS = 6


def spread_pod(name: str, *, scheduler: str, pool: str, constraints: bool = True) -> dict[str, Any]:
    """`constraints` False: no spread of its own; a Service selecting it brings default spreading."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"app": "soft"}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": ZONE,
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"app": "soft"}},
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/app:1",
                    "resources": {"requests": {"cpu": "500m"}},
                }
            ],
        },
    }
    if not constraints:
        del body["spec"]["topologySpreadConstraints"]
    return body


SERVICE = {"metadata": {"name": "soft"}, "spec": {"selector": {"app": "soft"}, "ports": [{"port": 80}]}}


async def zones_of(api: client.ApiClient, namespace: str, zone_of: dict[str, str]) -> Counter[str] | None:
    """Pods per zone once all `PODS` are bound, else None."""
    response = await client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    pods = (await response.json())["items"]
    nodes = [p["spec"].get("nodeName") for p in pods]
    if len(pods) < PODS or not all(nodes):
        return None
    return Counter(zone_of[n] for n in nodes)


async def test_six_pods_with_a_schedule_anyway_zone_spread_spread_over_three_zones_under_binpack(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    await _side_by_side(
        "schedule-anyway",
        cluster=cluster,
        cluster_api=cluster_api,
        cluster_operator_kubeconfig=cluster_operator_kubeconfig,
        cluster_namespace=cluster_namespace,
        tmp_path=tmp_path,
    )


async def test_six_bare_pods_a_service_selects_spread_over_three_zones_under_binpack(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    """kube-scheduler's default spreading with a Service's selector (before: Bindery 6/0/0)."""
    await _side_by_side(
        "service",
        cluster=cluster,
        cluster_api=cluster_api,
        cluster_operator_kubeconfig=cluster_operator_kubeconfig,
        cluster_namespace=cluster_namespace,
        tmp_path=tmp_path,
    )


async def _side_by_side(
    source: str,
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    pool = uuid.uuid4().hex[:6]
    core = client.CoreV1Api(cluster_api)
    zone_of = {f"soft-{pool}-{zone}": zone for zone in ZONES}
    ks_namespace = f"{cluster_namespace}-ks"
    await core.create_namespace(body={"metadata": {"name": ks_namespace}})
    try:
        for name, zone in zone_of.items():
            await create_kwok_node(
                cluster_api,
                name=name,
                capacity={"cpu": "16", "memory": "64Gi", "pods": "110"},
                labels={POOL: pool, ZONE: zone},
            )

        async def ready() -> bool:
            listed = await core.list_node(label_selector=f"{POOL}={pool}")
            # Ready, and the node lifecycle controller's not-ready taint gone.
            return len(listed.items) == len(zone_of) and all(
                any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
                and not n.spec.taints
                for n in listed.items
            )

        await eventually(ready, within=60, what="kwok reporting the pool's nodes Ready")
        async with bindery_on(
            api=cluster_api,
            cluster=cluster,
            operator_kubeconfig=cluster_operator_kubeconfig,
            namespace=cluster_namespace,
            pool=pool,
            directory=tmp_path,
        ) as stage:
            constraints = source == "schedule-anyway"
            if not constraints:  # bare pods behind a Service: kube-scheduler's default spreading
                for namespace in (cluster_namespace, ks_namespace):
                    await core.create_namespaced_service(namespace, SERVICE)
            # Both schedulers' pods at once, as a Deployment's ReplicaSet creates them.
            await asyncio.gather(
                *(
                    core.create_namespaced_pod(
                        namespace,
                        spread_pod(f"soft-{i}", scheduler=scheduler, pool=pool, constraints=constraints),
                    )
                    for namespace, scheduler in (
                        (cluster_namespace, stage.scheduler),
                        (ks_namespace, "default-scheduler"),
                    )
                    for i in range(PODS)
                )
            )
            bindery = await eventually(
                lambda: zones_of(cluster_api, cluster_namespace, zone_of),
                within=60,
                what="Bindery binding the six pods",
            )
            kube_scheduler = await eventually(
                lambda: zones_of(cluster_api, ks_namespace, zone_of),
                within=60,
                what="kube-scheduler binding the six pods",
            )
        line = "zone | kube-scheduler | Bindery (binpack)\n" + "\n".join(
            f"{zone} | {kube_scheduler[zone]} | {bindery[zone]}" for zone in ZONES
        )
        print("\n" + line)
        counts = [bindery[zone] for zone in ZONES]
        assert max(counts) - min(counts) <= 1, f"Bindery did not spread the pods:\n{line}"
    finally:
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(ks_namespace)
        for name in zone_of:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(name)
