"""Contract v1.2 features `node-preferences` and `toleration-comparisons`, end to end over HTTP.

Why: a pod's preferred node affinity and a node's PreferNoSchedule taints were dropped (issue 19),
and a Gt/Lt toleration got a 400 from the RM that the client retried forever. These tests run the
client against the reference RM serving v1.2, and serving as a v1.1 RM (`cluster_ids=False`), which
must never receive a v1.2 field.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import (
    GroupIdentity,
    GroupMemberRequest,
    Placement,
    PodIdentity,
    ReservationGroupRequest,
    ReservationRequest,
)

from .conftest import TOKEN

_SLA_TAINT = {"key": "example.com/sla", "value": "950", "effect": "NoSchedule"}


def _inventory() -> list[InventoryNode]:
    """Three equal nodes: `a` sorts first (binpack's tie-break), `b` is labelled, `c` has a numeric taint,
    and `a` a PreferNoSchedule taint."""

    def one(name: str, **kwargs: Any) -> InventoryNode:
        return InventoryNode(name=name, allocatable={"cpu": Decimal(4), "pods": Decimal(110)}, **kwargs)

    return [
        one("a", taints=({"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"},)),
        one("b", labels={"disk": "ssd"}),
        one("c", taints=(_SLA_TAINT,)),
    ]


def _request(uid: str, placement: dict[str, Any]) -> ReservationRequest:
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="ns", name=f"pod-{uid}", scheduler_name="bindery"),
        resources={"cpu": "1"},
        placement=Placement.model_validate(placement),
        idempotency_key=uid,
        ttl_seconds=60,
    )


_PREFER_SSD = {
    "preferredNodeAffinity": [
        {
            "weight": 10,
            "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
        }
    ]
}
_TOLERATE_SLA_ABOVE_900 = {
    "tolerations": [{"key": "example.com/sla", "operator": "Gt", "value": "900", "effect": "NoSchedule"}],
    "nodeSelector": {},
}


@pytest.fixture
async def v1_2(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=_inventory(), token=TOKEN, policy=Policy.BINPACK
    ) as server:
        yield server


@pytest.fixture
async def v1_1(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async with serve_reference_rm(
        db_path=tmp_path / "old.sqlite", inventory=_inventory(), token=TOKEN, cluster_ids=False
    ) as server:
        yield server


def _client(url: str) -> ResourceManagerClient:
    return ResourceManagerClient(base_url=url, token=TOKEN, allow_insecure_http=True, batching=False)


async def test_info_lists_the_features(v1_2: RunningServer) -> None:
    async with _client(v1_2.url) as client:
        info = await client.contract_info()
    assert {"node-preferences", "toleration-comparisons"} <= info.features


async def test_a_preferred_node_wins_over_binpack_and_a_prefer_no_schedule_taint_is_avoided(
    v1_2: RunningServer,
) -> None:
    """Binpack alone picks `a` (first name among equal nodes); a pod preferring `disk=ssd` lands on `b`,
    and a pod with no preference avoids `a`'s PreferNoSchedule taint (c's NoSchedule taint is hard)."""
    async with _client(v1_2.url) as client:
        preferring = await client.reserve(_request("p1", _PREFER_SSD))
        plain = await client.reserve(_request("p2", {}))
        tolerating = await client.reserve(
            _request("p3", {"tolerations": [{"key": "maintenance", "operator": "Exists"}]})
        )
    assert preferring.node == "b"
    assert plain.node == "b"  # not a (PreferNoSchedule), not c (NoSchedule); binpack then fills b
    assert tolerating.node == "b"  # tolerated taint scores as none: binpack's fuller node b


async def test_a_v1_1_rm_never_receives_preferences_and_the_client_warns_once(
    v1_1: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bindery.rm.client")
    async with _client(v1_1.url) as client:
        first = await client.reserve(_request("p1", _PREFER_SSD))
        second = await client.reserve(_request("p2", _PREFER_SSD))
        group = await client.reserve_group(
            ReservationGroupRequest(
                group=GroupIdentity(namespace="ns", name="g", scheduler_name="bindery"),
                members=[
                    GroupMemberRequest(pod=r.pod, resources=r.resources, placement=r.placement)
                    for r in (_request("g1", _PREFER_SSD), _request("g2", _PREFER_SSD))
                ],
                idempotency_key="g",
                ttl_seconds=60,
            )
        )
    # Accepted at all: the same body with the field is a 400 (the next test), so it was left out.
    assert first.state.value == second.state.value == "reserved"
    assert len(group.members) == 2
    warnings = [r.getMessage() for r in caplog.records if "node-preferences" in r.getMessage()]
    assert len(warnings) == 1, warnings


async def test_a_v1_1_rm_refuses_the_fields_it_does_not_know(v1_1: RunningServer) -> None:
    """What a client that skipped negotiation would get: 400 naming each field (so the client must not)."""
    body = _request("p1", {**_PREFER_SSD, **_TOLERATE_SLA_ABOVE_900}).model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        answer = await http.post(f"{v1_1.url}/v1/reservations", json=body)
        listed = await http.get(f"{v1_1.url}/v1/reservations")
    assert answer.status_code == 400
    locations = {error["location"] for error in answer.json()["errors"]}
    assert locations == {"placement/preferredNodeAffinity", "placement/tolerations/0/operator"}
    assert listed.json()["items"] == []


async def test_a_gt_toleration_is_matched_numerically(v1_2: RunningServer) -> None:
    """c's taint value 950 is greater than 900, so `Gt 900` tolerates it and a pod that may only go
    to c lands there; `Gt 960` does not, and the refusal names the taint."""
    only_c = {
        "requiredNodeAffinity": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}
        ]
    }
    async with _client(v1_2.url) as client:
        above = await client.reserve(_request("p1", {**only_c, **_TOLERATE_SLA_ABOVE_900}))
        higher = {"tolerations": [{"key": "example.com/sla", "operator": "Gt", "value": "960"}]}
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve(_request("p2", {**only_c, **higher}))
    assert above.node == "c"
    assert "untolerated taint {example.com/sla: 950}" in refused.value.reason


async def test_a_gt_toleration_for_a_v1_1_rm_is_unschedulable_with_a_reason_and_nothing_reserved(
    v1_1: RunningServer,
) -> None:
    async with _client(v1_1.url) as client:
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve(_request("p1", _TOLERATE_SLA_ABOVE_900))
        listed = await client.list_reservations()
    assert "spec.tolerations" in refused.value.reason
    assert "toleration-comparisons" in refused.value.reason
    assert listed == []
