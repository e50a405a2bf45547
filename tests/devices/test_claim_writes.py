"""PreBind's claim writes and Unreserve's undo, on the real apiserver (resource.k8s.io/v1).

The finalizer, the allocation and ``reservedFor`` as kube-scheduler's ``bindClaim`` writes them; a
write that meets a real conflict (a change made between the read and the write) is redone on a fresh
read; a claim someone else allocated meanwhile is never overwritten; and the undo leaves a claim
shared with another pod allocated for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.adapters.devices import KubeDevices
from bindery.apiserver import create, resources
from bindery.scheduling.devices import DELETE_PROTECTION
from bindery.scheduling.devicewrites import bind_claim, unbind_claim
from bindery.scheduling.ports import DeviceError

_ALLOCATION: dict[str, Any] = {
    "devices": {
        "results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]
    },
    "nodeSelector": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    },
}


async def _new_claim(api: client.ApiClient, namespace: str, name: str) -> None:
    await create(
        api,
        resources.RESOURCE_CLAIMS,
        namespace=namespace,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}
            },
        },
    )


class _Meddled(KubeDevices):
    """The real adapter, with a real change to the claim made between each read and the first write
    (as the resourceclaim controller or another scheduler would): the write meets a real 409."""

    def __init__(self, *, api: client.ApiClient) -> None:
        super().__init__(api=api)
        self.meddled = 0

    async def update_claim(self, claim: Mapping[str, Any]) -> Mapping[str, Any]:
        if not self.meddled:
            self.meddled += 1
            fresh = await self.claim(namespace=claim["metadata"]["namespace"], name=claim["metadata"]["name"])
            assert fresh is not None
            labels = {**(fresh["metadata"].get("labels") or {}), "touched": "yes"}
            await super().update_claim({**fresh, "metadata": {**fresh["metadata"], "labels": labels}})
        return await super().update_claim(claim)


@pytest.mark.usefixtures("controlplane")
async def test_bind_writes_finalizer_allocation_and_reserved_for_and_survives_a_conflict(
    kube_api: client.ApiClient, namespace: str
) -> None:
    await _new_claim(kube_api, namespace, "gpu")
    access = _Meddled(api=kube_api)
    await bind_claim(
        access=access, namespace=namespace, name="gpu", pod_name="p1", pod_uid="uid-1", allocation=_ALLOCATION
    )
    stored = await access.claim(namespace=namespace, name="gpu")
    assert stored is not None
    assert access.meddled == 1
    assert stored["metadata"]["labels"] == {"touched": "yes"}  # the change made meanwhile is kept
    assert DELETE_PROTECTION in stored["metadata"]["finalizers"]
    assert stored["status"]["allocation"]["devices"]["results"] == _ALLOCATION["devices"]["results"]
    assert stored["status"]["reservedFor"] == [{"resource": "pods", "name": "p1", "uid": "uid-1"}]


@pytest.mark.usefixtures("controlplane")
async def test_a_claim_allocated_elsewhere_meanwhile_is_not_overwritten(
    kube_api: client.ApiClient, namespace: str
) -> None:
    await _new_claim(kube_api, namespace, "gpu")
    access = KubeDevices(api=kube_api)
    await bind_claim(
        access=access, namespace=namespace, name="gpu", pod_name="p1", pod_uid="uid-1", allocation=_ALLOCATION
    )
    other = {
        **_ALLOCATION,
        "devices": {"results": [{**_ALLOCATION["devices"]["results"][0], "device": "gpu-1"}]},
    }
    with pytest.raises(DeviceError, match="allocated by someone else"):
        await bind_claim(
            access=access, namespace=namespace, name="gpu", pod_name="p2", pod_uid="uid-2", allocation=other
        )
    stored = await access.claim(namespace=namespace, name="gpu")
    assert stored is not None
    assert stored["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert [entry["uid"] for entry in stored["status"]["reservedFor"]] == ["uid-1"]


@pytest.mark.usefixtures("controlplane")
async def test_unreserve_keeps_a_shared_claim_for_its_other_pod_and_frees_it_after_the_last(
    kube_api: client.ApiClient, namespace: str
) -> None:
    await _new_claim(kube_api, namespace, "shared")
    access = KubeDevices(api=kube_api)
    await bind_claim(
        access=access,
        namespace=namespace,
        name="shared",
        pod_name="p1",
        pod_uid="uid-1",
        allocation=_ALLOCATION,
    )
    await bind_claim(
        access=access, namespace=namespace, name="shared", pod_name="p2", pod_uid="uid-2", allocation=None
    )
    # The first pod's binding failed after it allocated: the second still uses the devices.
    await unbind_claim(
        access=access, namespace=namespace, name="shared", pod_uid="uid-1", allocated_here=True
    )
    kept = await access.claim(namespace=namespace, name="shared")
    assert kept is not None
    assert kept["status"]["allocation"]["devices"]["results"] == _ALLOCATION["devices"]["results"]
    assert [entry["uid"] for entry in kept["status"]["reservedFor"]] == ["uid-2"]
    assert DELETE_PROTECTION in kept["metadata"]["finalizers"]

    # A claim allocated by this cycle and reserved by nobody else: allocation and finalizer go.
    await _new_claim(kube_api, namespace, "own")
    await bind_claim(
        access=access, namespace=namespace, name="own", pod_name="p3", pod_uid="uid-3", allocation=_ALLOCATION
    )
    await unbind_claim(access=access, namespace=namespace, name="own", pod_uid="uid-3", allocated_here=True)
    freed = await access.claim(namespace=namespace, name="own")
    assert freed is not None
    assert "allocation" not in (freed.get("status") or {})
    assert "reservedFor" not in (freed.get("status") or {})
    assert DELETE_PROTECTION not in (freed["metadata"].get("finalizers") or ())
