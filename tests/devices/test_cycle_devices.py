"""The DynamicResources plugin in whole cycles, with its claims and classes on the real apiserver.

The RM here is the in-test FakeRM with a device answer added: the reference RM does not allocate
devices yet (it lists no `devices` feature), so the answer a device-allocating RM gives is played
by the test. Everything the plugin reads and writes (claims, classes, finalizer, allocation,
reservedFor, the undo) goes to the real kube-apiserver through the real adapter.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from kubernetes_asyncio import client
from prometheus_client import generate_latest

from bindery.adapters.devices import KubeDevices
from bindery.apiserver import create, resources
from bindery.controller.metrics import Metrics
from bindery.rm.models import Reservation, ReservationRequest
from bindery.scheduling.cycle import DEVICES, CycleOutcome, schedule_one
from bindery.scheduling.decisions import FailureKind, Outcome
from bindery.scheduling.devices import DELETE_PROTECTION, PodClaim
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import BindError, NodeProjection
from tests.scheduling.fakes import (
    Calls,
    FakeBinder,
    FakeConditions,
    FakeEvents,
    FakeNodes,
    FakePods,
    FakeRM,
    pod,
)

pytestmark = pytest.mark.usefixtures("controlplane")


class DeviceRM(FakeRM):
    """FakeRM that answers each claim it is sent with one device of pool ``node`` (``answer``
    False: it forgets the devices, as an RM outside the contract would)."""

    def __init__(self, calls: Calls, *, node: str) -> None:
        super().__init__(calls, node=node)
        self.answer = True
        self.devices = iter(f"gpu-{i}" for i in range(100))

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        reservation = await super().reserve(request)
        if not request.devices or not self.answer:
            return reservation
        answered = [
            {
                "claim": entry.claim.model_dump(),
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.example.com",
                        "pool": self.node,
                        "device": next(self.devices),
                    }
                ],
            }
            for entry in request.devices
        ]
        return reservation.model_copy(
            update={
                "devices": Reservation.model_validate(
                    {**reservation.model_dump(), "devices": answered}
                ).devices
            }
        )


@dataclasses.dataclass
class World:
    api: client.ApiClient
    namespace: str
    device_class: str
    calls: Calls = dataclasses.field(default_factory=Calls)

    def __post_init__(self) -> None:
        self.rm = DeviceRM(self.calls, node="n2")
        self.binder = FakeBinder(self.calls)
        self.devices = KubeDevices(api=self.api)

    def pod(self, name: str, *claims: PodClaim) -> PodInfo:
        return dataclasses.replace(pod(name), namespace=self.namespace, device_claims=claims)

    async def run(self, info: PodInfo) -> CycleOutcome:
        pods = FakePods(self.calls)
        pods.pods[info.uid] = info
        ports = Ports(
            nodes=FakeNodes(self.calls, {n: NodeProjection(name=n) for n in ("n1", "n2", "n3")}),
            pods=pods,
            binder=self.binder,
            events=FakeEvents(self.calls),
            conditions=FakeConditions(self.calls),
            devices=self.devices,
        )
        profile = Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=self.rm)
        return await schedule_one(pod=info, profile=profile, ports=ports)

    async def claim(self, name: str) -> dict[str, Any]:
        body = await self.devices.claim(namespace=self.namespace, name=name)
        assert body is not None
        return dict(body)


@pytest.fixture
async def world(kube_api: client.ApiClient, namespace: str) -> World:
    device_class = f"gpu-{namespace}.example.com"
    await create(
        kube_api,
        resources.DEVICE_CLASSES,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]},
        },
    )
    return World(api=kube_api, namespace=namespace, device_class=device_class)


async def _claim(world: World, name: str) -> PodClaim:
    await create(
        world.api,
        resources.RESOURCE_CLAIMS,
        namespace=world.namespace,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": world.device_class}}]}
            },
        },
    )
    return PodClaim(pod_claim="gpu", name=name, generated=False)


async def test_a_claim_is_allocated_by_the_rm_written_at_prebind_and_shared_by_a_second_pod(
    world: World,
) -> None:
    shared = await _claim(world, "gpu")
    before = dict(DEVICES.counts)
    first = await world.run(world.pod("a", shared))
    assert first.outcome is Outcome.BOUND, first.failure
    [sent] = world.rm.requests
    assert sent.devices is not None
    assert [entry.claim.name for entry in sent.devices] == ["gpu"]
    assert sent.devices[0].requests[0].exactly is not None
    assert sent.devices[0].requests[0].exactly.class_selectors == ["device.driver == 'gpu.example.com'"]
    claim = await world.claim("gpu")
    assert DELETE_PROTECTION in claim["metadata"]["finalizers"]
    assert claim["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "n2", "device": "gpu-0"}
    ]
    assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
    ]
    assert [entry["name"] for entry in claim["status"]["reservedFor"]] == ["a"]

    # A second pod of the same claim: reused, not sent to the RM, kept to the allocation's node.
    second = await world.run(world.pod("b", shared))
    assert second.outcome is Outcome.BOUND, second.failure
    reused = world.rm.requests[-1]
    assert reused.devices is None
    assert reused.placement.required_node_affinity[0].model_dump(by_alias=True)["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["n2"]}
    ]
    claim = await world.claim("gpu")
    assert [entry["name"] for entry in claim["status"]["reservedFor"]] == ["a", "b"]
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    delta = {key: DEVICES.counts[key] - before.get(key, 0) for key in DEVICES.counts}
    assert {key: n for key, n in delta.items() if n} == {("allocated", ""): 1, ("reused", ""): 1}
    served = generate_latest(Metrics(devices=lambda: DEVICES.counts).registry).decode()
    assert 'bindery_device_claims_total{outcome="allocated",reason=""}' in served


async def test_a_failed_binding_undoes_the_allocation_and_releases(world: World) -> None:
    own = await _claim(world, "own")
    world.binder.error = BindError("the apiserver refused the Binding (HTTP 422)", status=422)
    outcome = await world.run(world.pod("a", own))
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.BIND_ERROR, outcome.failure
    claim = await world.claim("own")
    assert "allocation" not in (claim.get("status") or {})
    assert "reservedFor" not in (claim.get("status") or {})
    assert DELETE_PROTECTION not in (claim["metadata"].get("finalizers") or ())
    assert world.calls.count("rm.release") == 1


async def test_an_rm_answer_without_the_devices_asked_writes_nothing(world: World) -> None:
    own = await _claim(world, "own")
    world.rm.answer = False
    outcome = await world.run(world.pod("a", own))
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.RM_PROTOCOL_ERROR
    assert "without devices for claim" in outcome.failure.message
    claim = await world.claim("own")
    assert not (claim.get("status") or {}).get("allocation")
    assert DELETE_PROTECTION not in (claim["metadata"].get("finalizers") or ())
    assert world.calls.count("rm.release") == 1


async def test_a_missing_class_waits_and_nothing_is_reserved(world: World) -> None:
    await create(
        world.api,
        resources.RESOURCE_CLAIMS,
        namespace=world.namespace,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "nowhere"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "none.example.com"}}]}
            },
        },
    )
    outcome = await world.run(world.pod("a", PodClaim(pod_claim="gpu", name="nowhere", generated=False)))
    assert outcome.outcome is Outcome.UNSCHEDULABLE
    assert outcome.failure is not None
    assert 'device class "none.example.com" does not exist' in outcome.failure.message
    assert world.rm.requests == []
