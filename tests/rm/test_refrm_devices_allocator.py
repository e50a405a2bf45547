"""The reference RM's device allocator: upstream's structured allocator behind the JSON-lines pipe.

Real helper process (built from ``devcluster/gomod/devalloc`` on first use), real CEL: these are
the answers kube-scheduler's DynamicResources plugin would give for the same slices and claims.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bindery.devcluster import binaries
from bindery.reference_rm.devices import (
    Allocated,
    AllocationError,
    DeviceAllocator,
    DeviceInUse,
    NotAllocated,
    claim_answer,
)
from bindery.rm.models import ClaimDevices

DRIVER = "gpu.example.com"
CLASS_SELECTOR = f"device.driver == '{DRIVER}'"


@pytest.fixture(scope="module")
def allocator() -> Iterator[DeviceAllocator]:
    helper = DeviceAllocator(binary=binaries.ensure_devalloc_built(quiet=True))
    yield helper
    helper.close()


def _slice(
    node: str, devices: list[dict[str, Any]], *, count: int = 1, name: str | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name or f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def _gpu(name: str, *, model: str, numa: int, memory: str = "40Gi") -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"model": {"string": model}, "numa": {"int": numa}},
        "capacity": {"memory": {"value": memory}},
    }


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


def _claim(
    name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None
) -> ClaimDevices:
    return ClaimDevices.model_validate(
        {
            "claim": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "requests": requests,
            "constraints": constraints or [],
        }
    )


def _exactly(name: str = "gpu", **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {"deviceClassName": DRIVER, "classSelectors": [CLASS_SELECTOR], **fields},
    }


@pytest.fixture(scope="module", autouse=True)
def cluster(allocator: DeviceAllocator) -> None:
    allocator.update_slices(
        upserted=[
            _slice("n1", [_gpu("gpu-0", model="a100", numa=0), _gpu("gpu-1", model="h100", numa=1)]),
            _slice(
                "n2",
                [_gpu(f"gpu-{i}", model="h100", numa=i // 2, memory="80Gi") for i in range(4)],
            ),
            # n3's pool has two slices of which one is published: it does not count yet.
            _slice("n3", [_gpu("gpu-0", model="h100", numa=0)], count=2),
        ]
    )


NODES = [_node("n0"), _node("n1"), _node("n2"), _node("n3")]


def _devices(outcome: Allocated | NotAllocated) -> list[tuple[str, str, str]]:
    assert isinstance(outcome, Allocated), outcome
    return [
        (result["request"], result["pool"], result["device"])
        for allocation in outcome.allocations
        for result in allocation["devices"]["results"]
    ]


def test_selector_picks_the_first_node_with_a_matching_device(allocator: DeviceAllocator) -> None:
    claim = _claim("c", [_exactly(selectors=[f"device.attributes['{DRIVER}'].model == 'h100'"])])
    outcome = allocator.allocate(claims=[claim], used=[], nodes=NODES)
    assert _devices(outcome) == [("gpu", "n1", "gpu-1")]
    assert isinstance(outcome, Allocated)
    answer = claim_answer(claim, outcome.allocations[0])
    assert answer["results"] == [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"}]
    assert answer["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n1"]


def test_a_device_in_use_is_not_given_again(allocator: DeviceAllocator) -> None:
    claim = _claim("c", [_exactly(selectors=[f"device.attributes['{DRIVER}'].model == 'h100'"])])
    used = [DeviceInUse(driver=DRIVER, pool="n1", device="gpu-1")]
    assert _devices(allocator.allocate(claims=[claim], used=used, nodes=NODES)) == [("gpu", "n2", "gpu-0")]


def test_count_all_and_quantity(allocator: DeviceAllocator) -> None:
    two = _claim(
        "two",
        [
            _exactly(
                count=3, selectors=[f"device.capacity['{DRIVER}'].memory.compareTo(quantity('64Gi')) >= 0"]
            )
        ],
    )
    assert [d[1] for d in _devices(allocator.allocate(claims=[two], used=[], nodes=NODES))] == ["n2"] * 3
    every = _claim("all", [_exactly(allocationMode="All")])
    assert len(_devices(allocator.allocate(claims=[every], used=[], nodes=[_node("n2")]))) == 4


def test_first_available_falls_back_in_order(allocator: DeviceAllocator) -> None:
    claim = _claim(
        "fa",
        [
            {
                "name": "gpu",
                "firstAvailable": [
                    {
                        "name": "big",
                        "deviceClassName": DRIVER,
                        "classSelectors": [CLASS_SELECTOR],
                        "count": 2,
                    },
                    {"name": "one", "deviceClassName": DRIVER, "classSelectors": [CLASS_SELECTOR]},
                ],
            }
        ],
    )
    used = [DeviceInUse(driver=DRIVER, pool="n1", device="gpu-0")]
    assert _devices(allocator.allocate(claims=[claim], used=used, nodes=[_node("n1")])) == [
        ("gpu/one", "n1", "gpu-1")
    ]


def test_match_attribute_keeps_devices_on_one_numa_node(allocator: DeviceAllocator) -> None:
    claim = _claim("numa", [_exactly(count=2)], [{"matchAttribute": f"{DRIVER}/numa"}])
    used = [DeviceInUse(driver=DRIVER, pool="n2", device="gpu-0")]
    # On n2 numa 0 has gpu-0 (used) and gpu-1; numa 1 has gpu-2 and gpu-3: only numa 1 fits both.
    assert _devices(allocator.allocate(claims=[claim], used=used, nodes=[_node("n1"), _node("n2")])) == [
        ("gpu", "n2", "gpu-2"),
        ("gpu", "n2", "gpu-3"),
    ]


def test_an_incomplete_pool_does_not_count(allocator: DeviceAllocator) -> None:
    claim = _claim("c", [_exactly()])
    outcome = allocator.allocate(claims=[claim], used=[], nodes=[_node("n3")])
    assert isinstance(outcome, NotAllocated)
    assert set(outcome.reasons) == {"n3"}


def test_a_selector_that_does_not_compile_is_an_error_naming_it(allocator: DeviceAllocator) -> None:
    claim = _claim("bad", [_exactly(selectors=["device.attributes[ =="])])
    with pytest.raises(AllocationError, match="CEL compile error"):
        allocator.allocate(claims=[claim], used=[], nodes=NODES)
    # The helper is still there for the next call.
    assert isinstance(allocator.allocate(claims=[_claim("c", [_exactly()])], used=[], nodes=NODES), Allocated)
