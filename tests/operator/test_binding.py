"""The binding pipeline end to end: real apiserver, the reference RM as its own process, operator
in-process."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from tests.operator.conftest import Bindery, RealStage, condition, events_of, eventually, read_pod

pytestmark = pytest.mark.controlplane


async def test_happy_path_binds_to_the_rm_node_with_one_event_and_a_commit(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    real_stage: RealStage,
) -> None:
    stage = real_stage
    node, scheduler = stage.node, stage.scheduler
    async with stage.served():
        created = await stage.create("p")
        assert await eventually(lambda: stage.node_of("p"), within=30, what="the pod to be bound") == node
        await eventually(lambda: stage.states_are(created["metadata"]["uid"], "committed"), what="the commit")

        pod = await read_pod(kube_api, namespace=namespace, name="p")
        (reservation,) = await stage.reservations_of(pod["metadata"]["uid"])
        assert (reservation.node, reservation.name) == (node, "p")
        assert pod["metadata"].get("annotations") == {"bindery.dev/reservation-id": reservation.id}
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
        await stage.settled()
