"""The binding pipeline end to end: real apiserver, real HTTP resource manager, operator in-process."""

from __future__ import annotations

from collections.abc import Callable

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


async def _bound_node(api: client.ApiClient, namespace: str, name: str) -> str | None:
    pod = await read_pod(api, namespace=namespace, name=name)
    node: str | None = pod["spec"].get("nodeName")
    return node


async def test_happy_path_binds_to_the_rm_node_with_one_event_and_a_commit(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    node = uniq("happy")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 5
    async with resource_manager(kube_api, name=uniq("rm"), scheduler_names=[scheduler], endpoint=fake_rm.url):
        created = await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler)
        )
        assert (
            await eventually(lambda: _bound_node(kube_api, namespace, "p"), what="the pod to be bound")
            == node
        )
        await eventually(lambda: _committed(fake_rm, created["metadata"]["uid"]), what="the commit")

        pod = await read_pod(kube_api, namespace=namespace, name="p")
        (reservation,) = fake_rm.for_pod(pod["metadata"]["uid"])
        assert pod["metadata"].get("annotations") == {"bindery.dev/reservation-id": reservation["id"]}
        assert not pod["metadata"].get("finalizers")
        scheduled = condition(pod)
        assert scheduled is not None
        assert scheduled["status"] == "True"

        events = await eventually(
            lambda: events_of(kube_api, namespace=namespace, pod_name="p"), what="events"
        )
        (event,) = events
        assert event["type"] == "Normal"
        assert event["reason"] == "Scheduled"
        assert event["action"] == "Binding"
        assert event["note"] == f"Successfully assigned {namespace}/p to {node}"
        assert event["reportingController"] == scheduler
        assert event["reportingInstance"].startswith(f"{scheduler}-")
        assert event["regarding"]["uid"] == pod["metadata"]["uid"]
        assert event["regarding"]["kind"] == "Pod"
        # the version the operator saw when it bound: the pod as created (binding changes it later)
        assert event["regarding"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        assert "." in event["eventTime"]  # MicroTime


async def _committed(rm: FakeRM, uid: str) -> bool:
    return any(r["state"] == "committed" for r in rm.for_pod(uid))
