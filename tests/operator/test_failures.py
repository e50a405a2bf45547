"""Failure paths of the binding pipeline: every one reports, releases what it reserved, and retries."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from tests.operator.conftest import (
    Bindery,
    condition,
    create_pod,
    events_of,
    eventually,
    pod_body,
    read_pod,
    resource_manager,
)
from tests.operator.fakerm import FakeRM

pytestmark = pytest.mark.controlplane


async def _node_of(api: client.ApiClient, namespace: str, name: str) -> str | None:
    pod = await read_pod(api, namespace=namespace, name=name)
    node: str | None = pod["spec"].get("nodeName")
    return node


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


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_unschedulable_reports_retries_and_binds_when_capacity_frees(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    node = uniq("full")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 0
    async with resource_manager(
        kube_api,
        name=uniq("rm"),
        scheduler_names=[scheduler],
        endpoint=fake_rm.url,
        backoff={"initialSeconds": 0.2, "maxSeconds": 0.5},
    ):
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "Unschedulable"), what="Unschedulable"
        )
        assert "all nodes are full" in cond["message"]
        attempts = len([c for c in fake_rm.calls if c[0] == "reserve"])
        fake_rm.slots[node] = 1  # capacity frees up (the RM's view); backoff brings the pod back
        assert await eventually(lambda: _node_of(kube_api, namespace, "p"), what="the bind") == node
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
    uniq: Callable[[str], str],
    fault: str,
) -> None:
    node = uniq("n")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 5
    fake_rm.mode = "ok" if fault == "down" else fault
    fake_rm.slow_seconds = 3.0
    endpoint = _closed_port_url() if fault == "down" else fake_rm.url
    async with resource_manager(
        kube_api,
        name=uniq("rm"),
        scheduler_names=[scheduler],
        endpoint=endpoint,
        timeouts={"connectSeconds": 0.5, "readSeconds": 0.5},
    ):
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "SchedulerError"), within=40, what="SchedulerError"
        )
        assert cond["message"]
        assert await _node_of(kube_api, namespace, "p") is None
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
) -> None:
    node = uniq(problem)
    scheduler = uniq("sched")
    rm_name = uniq("rm")
    if problem == "cordoned":
        await create_node(kube_api, name=node, unschedulable=True)
    elif problem == "tainted":
        await create_node(
            kube_api, name=node, taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
        )
    fake_rm.choose = node
    async with resource_manager(kube_api, name=rm_name, scheduler_names=[scheduler], endpoint=fake_rm.url):
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "SchedulerError"), what="the report"
        )
        assert f'resource manager "{rm_name}" chose node "{node}"' in cond["message"]
        assert fake_rm.reservations
        assert fake_rm.active() == [], "the reservation on the bad node was not released"
        assert await _node_of(kube_api, namespace, "p") is None


async def test_a_pod_deleted_between_reserve_and_bind_releases_its_reservation(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    node = uniq("n")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 5

    async def delete_the_pod(reservation: dict[str, Any]) -> None:
        await client.CoreV1Api(kube_api).delete_namespaced_pod(name=reservation["name"], namespace=namespace)

    fake_rm.on_reserve = delete_the_pod
    async with resource_manager(kube_api, name=uniq("rm"), scheduler_names=[scheduler], endpoint=fake_rm.url):
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
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
) -> None:
    ours, theirs = uniq("ours"), uniq("theirs")
    scheduler = uniq("sched")
    await create_node(kube_api, name=ours)
    await create_node(kube_api, name=theirs)
    fake_rm.slots[ours] = 5

    async def someone_else_binds(reservation: dict[str, Any]) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": reservation["name"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": theirs},
        }
        await client.CoreV1Api(kube_api).create_namespaced_pod_binding(
            name=reservation["name"], namespace=namespace, body=binding, _preload_content=False
        )

    fake_rm.on_reserve = someone_else_binds
    async with resource_manager(kube_api, name=uniq("rm"), scheduler_names=[scheduler], endpoint=fake_rm.url):
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
        await eventually(lambda: _released_all(fake_rm), what="the release")
        assert await _node_of(kube_api, namespace, "p") == theirs
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert not [e for e in events if e["reason"] in ("Scheduled", "FailedScheduling")]


async def test_two_pods_racing_for_the_last_slot(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    node = uniq("last")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 1
    async with resource_manager(kube_api, name=uniq("rm"), scheduler_names=[scheduler], endpoint=fake_rm.url):
        for name in ("a", "b"):
            await create_pod(
                kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler)
            )

        async def one_bound_one_unschedulable() -> bool:
            nodes = [await _node_of(kube_api, namespace, n) for n in ("a", "b")]
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
    uniq: Callable[[str], str],
) -> None:
    """A bound pod leaving the unbound-pod watch is "left scope"; a deleted one may have freed room."""
    node = uniq("n")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 0
    fake_rm.retry_after = 120  # parked for 2 minutes unless something may have freed capacity
    fake_rm.place["bound"] = node
    async with resource_manager(
        kube_api,
        name=uniq("rm"),
        scheduler_names=[scheduler],
        endpoint=fake_rm.url,
        backoff={"initialSeconds": 0.2, "maxSeconds": 0.5},
    ):
        await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="parked", scheduler_name=scheduler)
        )
        await eventually(lambda: _failed(kube_api, namespace, "parked", "Unschedulable"), what="parked")
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="bound", scheduler_name=scheduler))
        await eventually(lambda: _node_of(kube_api, namespace, "bound"), what="the other pod bound")
        await asyncio.sleep(2)  # the bound pod's DELETED event (left scope) has arrived by now
        assert _reserves(fake_rm, "parked") == 1

        await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="doomed", scheduler_name=scheduler)
        )
        await eventually(
            lambda: _failed(kube_api, namespace, "doomed", "Unschedulable"), what="doomed parked"
        )
        await client.CoreV1Api(kube_api).delete_namespaced_pod(name="doomed", namespace=namespace)
        await eventually(lambda: _async(_reserves(fake_rm, "parked") >= 2), what="the parked pod retried")


def _reserves(rm: FakeRM, name: str) -> int:
    return rm.reserve_attempts.count(name)


async def _async(value: bool) -> bool:
    return value


async def test_repeated_failures_do_not_flood_the_api(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    node = uniq("n")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 0
    async with resource_manager(
        kube_api,
        name=uniq("rm"),
        scheduler_names=[scheduler],
        endpoint=fake_rm.url,
        backoff={"initialSeconds": 0.1, "maxSeconds": 0.2},
    ):
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
        await eventually(lambda: _async(_reserves(fake_rm, "p") >= 8), what="eight attempts")
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert len([e for e in events if e["reason"] == "FailedScheduling"]) == 1
        writes = bindery.runtime.writes.snapshot()
        assert writes.get("condition", 0) <= 2, writes  # an unchanged condition is not rewritten
