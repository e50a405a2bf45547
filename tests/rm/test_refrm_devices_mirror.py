"""The reference RM allocating from ResourceSlices and ResourceClaims of the REAL dev control plane.

Why: the devices an RM may give are those drivers publish, minus those claims already hold,
whoever allocated them. The slices are created by the test as a driver would publish them, and
a claim allocated by "another scheduler" is written with its status, as kube-scheduler writes it.
"""

from __future__ import annotations

import asyncio
import pathlib
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster import binaries
from bindery.reference_rm import serve_reference_rm
from bindery.reference_rm.devicemirror import ClaimMirror, SliceMirror
from bindery.reference_rm.devices import DeviceAllocator
from bindery.reference_rm.placement import InventoryNode
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import ClaimDevices, PodIdentity, ReservationRequest

from .conftest import TOKEN

GROUP, VERSION = "resource.k8s.io", "v1"


async def eventually(condition: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(30):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


def _request(uid: str, *, driver: str, namespace: str) -> ReservationRequest:
    claim = {
        "claim": {"namespace": namespace, "name": f"{uid}-gpu", "uid": f"claim-{uid}"},
        "requests": [
            {
                "name": "gpu",
                "exactly": {"deviceClassName": driver, "classSelectors": [f"device.driver == '{driver}'"]},
            }
        ],
    }
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace=namespace, name=uid, scheduler_name="bindery"),
        resources={"cpu": "1"},
        idempotency_key=uid,
        ttl_seconds=60,
        devices=[ClaimDevices.model_validate(claim)],
    )


@pytest.mark.controlplane
async def test_allocates_published_devices_minus_those_claims_hold(
    kube_api: client.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    run = uuid.uuid4().hex[:8]
    driver = f"gpu-{run}.example.com"
    nodes = [f"dev-{run}-{i}" for i in range(3)]
    custom = client.CustomObjectsApi(kube_api)
    allocator = DeviceAllocator(binary=binaries.ensure_devalloc_built(quiet=True))
    inventory = [
        InventoryNode(name=name, allocatable={"cpu": Decimal(8), "pods": Decimal(110)}) for name in nodes
    ]
    slices: list[str] = []
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=inventory, token=TOKEN, device_allocator=allocator
    ) as server:
        seen: list[tuple[Any, ...]] = []

        def claims_changed(devices: tuple[Any, ...]) -> None:
            seen.append(devices)
            server.rm.set_cluster_devices(devices)

        tasks = [
            asyncio.create_task(SliceMirror(api=kube_api, allocator=allocator).run()),
            asyncio.create_task(ClaimMirror(api=kube_api, on_change=claims_changed).run()),
        ]
        try:
            async with ResourceManagerClient(
                base_url=server.url, token=TOKEN, allow_insecure_http=True, max_attempts=1
            ) as rm:
                # A driver publishes one device on each of the first two nodes.
                for node in nodes[:2]:
                    body: dict[str, Any] = {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "ResourceSlice",
                        "metadata": {"name": f"{node}-{run}"},
                        "spec": {
                            "driver": driver,
                            "nodeName": node,
                            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                            "devices": [{"name": "gpu-0"}],
                        },
                    }
                    await custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
                    slices.append(body["metadata"]["name"])
                # Another scheduler allocated the device of node 0 to a claim.
                claim = {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "taken"},
                    "spec": {
                        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}
                    },
                }
                await custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", claim
                )
                taken = await custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", "taken"
                )
                result = {"request": "gpu", "driver": driver, "pool": nodes[0], "device": "gpu-0"}
                taken["status"] = {"allocation": {"devices": {"results": [result]}}}
                await custom.replace_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, "resourceclaims", "taken", taken
                )
                await eventually(
                    lambda: any(d.pool == nodes[0] for ds in seen for d in ds), "the claim mirrored"
                )

                # The slices arrive through the watch: reserve until the device of node 1 is given.
                async with asyncio.timeout(30):
                    while True:
                        try:
                            reservation = await rm.reserve(_request("a", driver=driver, namespace=namespace))
                            break
                        except RMUnschedulable:
                            await asyncio.sleep(0.1)
                assert reservation.node == nodes[1]
                assert reservation.devices is not None
                assert [(r.pool, r.device) for r in reservation.devices[0].results] == [(nodes[1], "gpu-0")]
                # Node 0's device is the claim's, node 1's the reservation's: nothing is left.
                with pytest.raises(RMUnschedulable, match="3 cannot allocate the claims"):
                    await rm.reserve(_request("b", driver=driver, namespace=namespace))
                # Deleting the claim frees node 0's device: the next reserve gets it.
                await custom.delete_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", "taken"
                )
                # other tests' claims stay in the shared plane (their finalizers outlive the namespace)
                await eventually(
                    lambda: not any(d.driver == driver for d in seen[-1]), "the claim's deletion mirrored"
                )
                third = await rm.reserve(_request("c", driver=driver, namespace=namespace))
                assert third.node == nodes[0]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for name in slices:
                await custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
            allocator.close()
