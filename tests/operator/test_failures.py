"""Failure paths of the binding pipeline: every one reports, releases what it reserved, and retries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from tests.operator.conftest import (
    Bindery,
    Stage,
    bind_pod,
    closed_port_url,
    condition,
    events_of,
    eventually,
    now,
    read_pod,
)
from tests.operator.fakerm import FakeRM

pytestmark = pytest.mark.controlplane


async def _failed(api: client.ApiClient, namespace: str, name: str, reason: str) -> dict[str, Any] | None:
    """The PodScheduled=False condition with `reason`, once a FailedScheduling event exists too."""
    pod = await read_pod(api, namespace=namespace, name=name)
    cond = condition(pod)
    if cond is None or cond.get("status") != "False" or cond.get("reason") != reason:
        return None
    events = await events_of(api, namespace=namespace, pod_name=name)
    if not any(e["reason"] == "FailedScheduling" and e["type"] == "Warning" for e in events):
        return None
    return cond


async def test_unschedulable_reports_retries_and_binds_when_capacity_frees(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    node = stage.node
    fake_rm.slots[node] = 0
    async with stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
        await stage.create("p")
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "Unschedulable"), what="Unschedulable"
        )
        assert "all nodes are full" in cond["message"]
        attempts = len([c for c in fake_rm.calls if c[0] == "reserve"])
        fake_rm.slots[node] = 1  # capacity frees up (the RM's view); backoff brings the pod back
        assert await eventually(lambda: stage.node_of("p"), what="the bind") == node
        assert len([c for c in fake_rm.calls if c[0] == "reserve"]) > attempts
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert [e["reason"] for e in events].count("Scheduled") == 1


@pytest.mark.parametrize("fault", ["down", "500", "malformed", "slow"])
async def test_rm_faults_are_scheduler_errors_without_leaks(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
    fault: str,
) -> None:
    fake_rm.mode = "ok" if fault == "down" else fault
    fake_rm.slow_seconds = 3.0
    endpoint = closed_port_url() if fault == "down" else fake_rm.url
    async with stage.served(endpoint=endpoint, timeouts={"connectSeconds": 0.5, "readSeconds": 0.5}):
        await stage.create("p")
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "SchedulerError"), within=40, what="SchedulerError"
        )
        assert cond["message"]
        assert await stage.node_of("p") is None
        assert fake_rm.active() == []


@pytest.mark.parametrize("problem", ["missing", "cordoned", "tainted"])
async def test_a_bad_node_choice_is_released_and_reported(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
    problem: str,
    stage: Stage,
) -> None:
    node = uniq(problem)  # the RM's choice, besides the stage's node
    rm_name = stage.rm_name
    if problem == "cordoned":
        await create_node(kube_api, name=node, unschedulable=True)
    elif problem == "tainted":
        await create_node(
            kube_api, name=node, taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
        )
    fake_rm.choose = node
    async with stage.served():
        await stage.create("p")
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "SchedulerError"), what="the report"
        )
        assert f'resource manager "{rm_name}" chose node "{node}"' in cond["message"]
        assert fake_rm.reservations
        assert fake_rm.active() == [], "the reservation on the bad node was not released"
        assert await stage.node_of("p") is None


async def test_a_pod_deleted_between_reserve_and_bind_releases_its_reservation(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    async def delete_the_pod(reservation: dict[str, Any]) -> None:
        await client.CoreV1Api(kube_api).delete_namespaced_pod(name=reservation["name"], namespace=namespace)

    fake_rm.on_reserve = delete_the_pod
    async with stage.served():
        await stage.create("p")
        await eventually(lambda: _released_all(fake_rm), what="the release")
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert not [e for e in events if e["reason"] == "Scheduled"]


async def test_a_pod_bound_by_someone_else_first_is_released_not_double_bound(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
    stage: Stage,
) -> None:
    theirs = uniq("theirs")  # ours is the stage's node, where the RM reserves
    await create_node(kube_api, name=theirs)

    async def someone_else_binds(reservation: dict[str, Any]) -> None:
        await bind_pod(kube_api, namespace=namespace, name=reservation["name"], node=theirs)

    fake_rm.on_reserve = someone_else_binds
    async with stage.served():
        await stage.create("p")
        await eventually(lambda: _released_all(fake_rm), what="the release")
        assert await stage.node_of("p") == theirs
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert not [e for e in events if e["reason"] in ("Scheduled", "FailedScheduling")]


async def test_two_pods_racing_for_the_last_slot(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    node = stage.node
    fake_rm.slots[node] = 1
    async with stage.served():
        for name in ("a", "b"):
            await stage.create(name)

        async def one_bound_one_unschedulable() -> bool:
            nodes = [await stage.node_of(n) for n in ("a", "b")]
            loser = "b" if nodes[0] else "a"
            return nodes.count(node) == 1 and bool(await _failed(kube_api, namespace, loser, "Unschedulable"))

        await eventually(one_bound_one_unschedulable, what="one winner and one Unschedulable")
        assert len(fake_rm.active()) == 1


async def _released_all(rm: FakeRM) -> bool:
    return bool(rm.reservations) and all(state == "released" for state in rm.states().values())


async def test_parked_pods_are_retried_on_deletions_not_on_our_own_binds(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    """A bound pod leaving the unbound-pod watch is "left scope"; a deleted one may have freed room."""
    node = stage.node
    fake_rm.slots[node] = 0
    fake_rm.retry_after = 120  # parked for 2 minutes unless something may have freed capacity
    fake_rm.place["bound"] = node
    async with stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
        await stage.create("parked")
        await eventually(lambda: _failed(kube_api, namespace, "parked", "Unschedulable"), what="parked")
        await stage.create("bound")
        await eventually(lambda: stage.node_of("bound"), what="the other pod bound")
        await asyncio.sleep(2)  # the bound pod's DELETED event (left scope) has arrived by now
        assert _reserves(fake_rm, "parked") == 1

        await stage.create("doomed")
        await eventually(
            lambda: _failed(kube_api, namespace, "doomed", "Unschedulable"), what="doomed parked"
        )
        await client.CoreV1Api(kube_api).delete_namespaced_pod(name="doomed", namespace=namespace)
        await eventually(lambda: now(_reserves(fake_rm, "parked") >= 2), what="the parked pod retried")


def _reserves(rm: FakeRM, name: str) -> int:
    return rm.reserve_attempts.count(name)


async def test_repeated_failures_do_not_flood_the_api(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    fake_rm.slots[stage.node] = 0
    async with stage.served(backoff={"initialSeconds": 0.1, "maxSeconds": 0.2}):
        await stage.create("p")
        await eventually(lambda: now(_reserves(fake_rm, "p") >= 8), what="eight attempts")
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert len([e for e in events if e["reason"] == "FailedScheduling"]) == 1
        writes = bindery.runtime.writes.snapshot()
        assert writes.get("condition", 0) <= 2, writes  # an unchanged condition is not rewritten
