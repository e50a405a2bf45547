"""DRA claims end to end: `bindery rm serve --device-allocator` and `bindery run`, each its own process.

A driver's ResourceSlices (published by the test) put one device on two of three nodes; three pods
each name a ResourceClaim of that DeviceClass. The reference RM allocates with Kubernetes' own
allocator, the operator writes the claims' status and binds: two pods are bound, each on the node
of the device its claim got, the two devices differ, every claim lists its pod in `reservedFor`
and carries the delete-protection finalizer; the third pod is refused with a reason, its claim
left unallocated. Every reservation ends committed to its pod's node or released.
"""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

from kubernetes_asyncio import client

from bindery.devcluster import binaries
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import create_pod, delete_rm, eventually, pod_body, read_pod
from tests.realrm import RMProcess, operator_process, serve_with, settled_invariants

GROUP, VERSION = "resource.k8s.io", "v1"


async def test_claims_by_name_get_distinct_devices_on_their_nodes_and_the_extra_pod_waits(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    run = uuid.uuid4().hex[:8]
    driver = f"gpu-{run}.example.com"
    pool = f"dra-{run}"
    nodes = [f"dra-{run}-{i}" for i in range(3)]
    custom = client.CustomObjectsApi(kube_api)
    for node in nodes:
        await create_node(
            kube_api,
            name=node,
            capacity={"cpu": "8", "memory": "16Gi", "pods": "110"},
            labels={"bindery.dev/test-pool": pool},
        )
    cluster_objects: list[tuple[str, str]] = []
    await custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "deviceclasses",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    cluster_objects.append(("deviceclasses", driver))
    for node in nodes[:2]:  # a driver publishes one device on each of the first two nodes
        name = f"{node}-{driver}"
        await custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "resourceslices",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "a100"}}}],
                },
            },
        )
        cluster_objects.append(("resourceslices", name))
    selector = f'device.attributes["{driver}"].model == "a100"'
    for claim in ("c0", "c1", "c2"):
        await custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "resourceclaims",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceClaim",
                "metadata": {"name": claim},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": driver,
                                    "selectors": [{"cel": {"expression": selector}}],
                                },
                            }
                        ]
                    }
                },
            },
        )
    scheduler = f"dra-{run}"
    allocator = binaries.ensure_devalloc_built(quiet=True)
    try:
        async with RMProcess(
            kubeconfig=controlplane.kubeconfig,
            directory=tmp_path / "rm",
            node_selector=f"bindery.dev/test-pool={pool}",
            options=["--device-allocator", str(allocator)],
        ) as rm:
            await serve_with(
                api=kube_api, rm=rm, name=scheduler, scheduler_names=[scheduler], namespace=namespace
            )
            async with operator_process(
                kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--namespace", namespace]
            ):
                for i in range(3):
                    body = pod_body(
                        name=f"p{i}",
                        scheduler_name=scheduler,
                        resourceClaims=[{"name": "gpu", "resourceClaimName": f"c{i}"}],
                    )
                    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
                    await create_pod(kube_api, namespace=namespace, body=body)

                async def bound() -> dict[str, str]:
                    pods = [await read_pod(kube_api, namespace=namespace, name=f"p{i}") for i in range(3)]
                    return {
                        p["metadata"]["name"]: p["spec"]["nodeName"]
                        for p in pods
                        if p["spec"].get("nodeName")
                    }

                async def two_bound() -> dict[str, str] | None:
                    placed = await bound()
                    return placed if len(placed) == 2 else None

                placed = await eventually(two_bound, within=90, what="two of the three pods bound")

                async def refused() -> dict[str, Any] | None:
                    (waiting,) = {"p0", "p1", "p2"} - set(placed)
                    pod = await read_pod(kube_api, namespace=namespace, name=waiting)
                    conditions = (pod.get("status") or {}).get("conditions") or []
                    return next(
                        (c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"),
                        None,
                    )

                condition = await eventually(refused, within=60, what="the third pod refused with a reason")
                assert condition["reason"] == "Unschedulable", condition
                assert len(await bound()) == 2, "the third pod was bound after all"

                devices = []
                for name, node in placed.items():
                    claim = await custom.get_namespaced_custom_object(
                        GROUP, VERSION, namespace, "resourceclaims", f"c{name[1:]}"
                    )
                    status = claim.get("status") or {}
                    (result,) = status["allocation"]["devices"]["results"]
                    assert result["driver"] == driver
                    assert result["pool"] == node, (
                        f"{name} is on {node} but its device is in pool {result['pool']}"
                    )
                    devices.append((result["pool"], result["device"]))
                    consumers = [r["name"] for r in status.get("reservedFor") or []]
                    assert consumers == [name], consumers
                    assert "resource.kubernetes.io/delete-protection" in claim["metadata"].get(
                        "finalizers", []
                    )
                assert len(set(devices)) == 2, devices
                (waiting,) = {"p0", "p1", "p2"} - set(placed)
                left = await custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", f"c{waiting[1:]}"
                )
                assert not (left.get("status") or {}).get("allocation"), left.get("status")
                await settled_invariants(
                    api=kube_api, rm=rm, namespace=namespace, scheduler_names=[scheduler], within=60
                )
    finally:
        await delete_rm(kube_api, name=scheduler)
        for plural, name in cluster_objects:
            await custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        for node in nodes:
            await client.CoreV1Api(kube_api).delete_node(name=node)
