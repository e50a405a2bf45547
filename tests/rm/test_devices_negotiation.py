"""Contract v1.3 feature `devices`: claims go only to an RM that lists it, and fingerprints of v1.2 stay."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.placement import InventoryNode
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMFeatureMissing
from bindery.rm.models import (
    ClaimDevices,
    ClaimRef,
    DeviceRequest,
    DeviceSubRequest,
    GroupIdentity,
    GroupMemberRequest,
    PodIdentity,
    ReservationGroupRequest,
    ReservationRequest,
)

from .conftest import TOKEN

_POD = PodIdentity(uid="p1", namespace="ns", name="pod-1", scheduler_name="bindery")
_GPU = ClaimDevices(
    claim=ClaimRef(namespace="ns", name="pod-1-gpu-x7k2p", uid="c1"),
    requests=[DeviceRequest(name="gpu", exactly=DeviceSubRequest(device_class_name="gpu.example.com"))],
)


def _request(*, devices: list[ClaimDevices] | None) -> ReservationRequest:
    return ReservationRequest(
        pod=_POD, resources={"cpu": "1"}, idempotency_key="p1", ttl_seconds=60, devices=devices
    )


@pytest.fixture
async def without_devices(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    inventory = [InventoryNode(name="a", allocatable={"cpu": Decimal(4), "pods": Decimal(110)})]
    async with serve_reference_rm(db_path=tmp_path / "rm.sqlite", inventory=inventory, token=TOKEN) as server:
        yield server


async def test_claims_for_an_rm_without_devices_are_refused_with_a_reason_and_nothing_reserved(
    without_devices: RunningServer,
) -> None:
    async with ResourceManagerClient(
        base_url=without_devices.url, token=TOKEN, allow_insecure_http=True, batching=False
    ) as client:
        if "devices" in (await client.contract_info()).features:
            pytest.skip("this reference RM offers devices; the refusal needs one that does not")
        with pytest.raises(RMFeatureMissing) as refused:
            await client.reserve(_request(devices=[_GPU]))
        group = ReservationGroupRequest(
            group=GroupIdentity(namespace="ns", name="g", scheduler_name="bindery"),
            members=[GroupMemberRequest(pod=_POD, resources={"cpu": "1"}, devices=[_GPU])],
            idempotency_key="g",
            ttl_seconds=60,
        )
        with pytest.raises(RMFeatureMissing) as group_refused:
            await client.reserve_group(group)
        listed = await client.list_reservations()
    assert "does not offer the devices feature" in refused.value.reason
    assert "ns/pod-1-gpu-x7k2p" in refused.value.reason
    assert "does not offer the devices feature" in group_refused.value.reason
    assert listed == []


def test_devices_are_part_of_the_identity_and_absent_ones_keep_the_v1_2_fingerprint() -> None:
    plain = _request(devices=None)
    assert "devices" not in plain.fingerprint()
    assert _request(devices=[_GPU]).fingerprint() != plain.fingerprint()
    member = GroupMemberRequest(pod=_POD, resources={"cpu": "1"})
    group = ReservationGroupRequest(
        group=GroupIdentity(namespace="ns", name="g", scheduler_name="bindery"),
        members=[member],
        idempotency_key="g",
        ttl_seconds=60,
    )
    assert "devices" not in group.fingerprint()
    with_gpu = group.model_copy(update={"members": [member.model_copy(update={"devices": [_GPU]})]})
    assert with_gpu.fingerprint() != group.fingerprint()
