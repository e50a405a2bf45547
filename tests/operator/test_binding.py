"""The binding pipeline end to end: real apiserver, real HTTP resource manager, operator in-process."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from tests.operator.conftest import Bindery, Stage, condition, events_of, eventually, read_pod, states_are
from tests.operator.fakerm import FakeRM

pytestmark = pytest.mark.controlplane


async def test_happy_path_binds_to_the_rm_node_with_one_event_and_a_commit(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    node, scheduler = stage.node, stage.scheduler
    async with stage.served():
        created = await stage.create("p")
        assert await eventually(lambda: stage.node_of("p"), what="the pod to be bound") == node
        await eventually(
            lambda: states_are(fake_rm, created["metadata"]["uid"], "committed"), what="the commit"
        )

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
