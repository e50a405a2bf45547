"""A pod group over contract v1.1's caps is refused once, in words, on its members and its PodGroup.

A group reservation carries at most MAX_GROUP_MEMBERS members and 8 topology keys; a larger group
failed the request's validation inside the group's task, which logged a traceback and tried again
after its backoff, for ever, and told the members nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.podgroups.coordinator import over_caps
from bindery.rm.models import MAX_GROUP_MEMBERS
from bindery.scheduling.podgroups import PodGroupInfo
from bindery.scheduling.podspec import PodInfo
from tests.gangs.scenarios import member, pod_group
from tests.operator.conftest import Bindery, RealStage, eventually

KEYS = [f"example.com/level-{i}" for i in range(9)]


def test_a_group_of_more_members_than_a_request_carries_is_refused_with_the_cap() -> None:
    members = [PodInfo(uid=f"u{i}", namespace="ns", name=f"m-{i}", scheduler_name="s") for i in range(1001)]
    message = over_caps(group=PodGroupInfo(namespace="ns", name="big", min_count=1001), members=members)
    assert message is not None
    assert f"1001 pending members; a group reservation carries at most {MAX_GROUP_MEMBERS}" in message
    assert over_caps(group=PodGroupInfo(namespace="ns", name="ok", min_count=2), members=members[:2]) is None


def test_a_group_with_nine_topology_keys_is_refused_with_the_cap() -> None:
    """The apiserver of 1.36 accepts one topology key per PodGroup; a later one may accept more."""
    group = PodGroupInfo(namespace="ns", name="wide", min_count=1, topology_keys=tuple(KEYS))
    members = [PodInfo(uid="u", namespace="ns", name="m", scheduler_name="s")]
    message = over_caps(group=group, members=members)
    assert message is not None
    assert "9 topology keys; a group reservation carries at most 8" in message


@pytest.mark.controlplane
async def test_a_group_of_1001_members_is_refused_on_its_members_and_its_podgroup(
    *, real_stage: RealStage, bindery: Bindery
) -> None:
    stage = real_stage
    custom = client.CustomObjectsApi(stage.api)
    core = client.CoreV1Api(stage.api)
    size = MAX_GROUP_MEMBERS + 1
    async with stage.served():
        await custom.create_namespaced_custom_object(
            "scheduling.k8s.io", "v1alpha2", stage.namespace, "podgroups", pod_group("big", min_count=size)
        )
        gate = asyncio.Semaphore(16)

        async def create(i: int) -> None:
            body = member(f"big-{i}", group="big", scheduler=stage.scheduler, pool="", cpu="1m")
            del body["spec"]["nodeSelector"]
            async with gate:
                await core.create_namespaced_pod(stage.namespace, body, _preload_content=False)

        await asyncio.gather(*(create(i) for i in range(size)))

        async def group_condition() -> dict[str, Any] | None:
            body = await custom.get_namespaced_custom_object(
                "scheduling.k8s.io", "v1alpha2", stage.namespace, "podgroups", "big"
            )
            for c in (body.get("status") or {}).get("conditions") or ():
                if c["type"] == "PodGroupScheduled" and "cannot be placed" in c.get("message", ""):
                    return dict(c)
            return None

        condition = await eventually(group_condition, within=120, what="the PodGroup's condition says why")
        assert condition["status"] == "False"
        assert (
            f"{size} pending members; a group reservation carries at most {MAX_GROUP_MEMBERS}"
            in (condition["message"])
        )

        async def told() -> list[str] | None:
            events = await core.list_namespaced_event(
                stage.namespace, field_selector="involvedObject.name=big-0,reason=FailedScheduling"
            )
            found = [e.message for e in events.items if "cannot be placed" in (e.message or "")]
            return found or None

        await eventually(told, within=120, what="a FailedScheduling event on a member saying why")
