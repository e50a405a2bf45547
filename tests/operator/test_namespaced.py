"""`bindery run --namespace`: a namespaced operator reads and releases nothing outside its namespaces.

Two namespaced operators can share a scheduler name and an RM (one per team namespace); each must
leave the other's bound pods and committed reservations alone, at startup and while running.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from bindery.controller.embedded import EmbeddedOperator
from bindery.controller.options import OperatorOptions
from tests.operator.conftest import (
    Stage,
    bind_pod,
    create_pod,
    eventually,
    pod_body,
    reservation_entry,
    states_are,
)
from tests.operator.fakerm import FakeRM

pytestmark = pytest.mark.controlplane


@pytest.fixture
async def other_namespace(kube_api: client.ApiClient) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube_api)
    await core.create_namespace(body={"metadata": {"name": name}})
    yield name
    await core.delete_namespace(name=name)


async def test_a_namespaced_operator_leaves_other_namespaces_reservations_alone(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    other_namespace: str,
    operator_kubeconfig: pathlib.Path,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    node, scheduler = stage.node, stage.scheduler
    core = client.CoreV1Api(kube_api)
    # Another operator's pod, bound in the other namespace with a committed reservation ...
    theirs = await create_pod(
        kube_api, namespace=other_namespace, body=pod_body(name="theirs", scheduler_name=scheduler)
    )
    await bind_pod(
        kube_api,
        namespace=other_namespace,
        name="theirs",
        node=node,
        annotations={"bindery.dev/reservation-id": "c-theirs"},
    )
    # ... and a committed reservation there whose pod this operator cannot see (not listed: not gone).
    for rid, name, uid in (("c-theirs", "theirs", theirs["metadata"]["uid"]), ("c-unseen", "unseen", "u-1")):
        entry = reservation_entry(
            rid=rid, node=node, scheduler=scheduler, namespace=other_namespace, name=name, uid=uid
        )
        fake_rm.reservations[rid] = {**entry, "state": "committed"}

    operator = EmbeddedOperator(
        options=OperatorOptions(kubeconfig=operator_kubeconfig, probe_interval=2.0, namespaces=(namespace,))
    )
    await operator.start()
    try:
        async with stage.served():
            ours = await stage.create("ours")
            uid = ours["metadata"]["uid"]
            await eventually(lambda: states_are(fake_rm, uid, "committed"), what="our pod committed")
            # Their pod goes first, then ours: an all-namespaces watch would see both, in this order.
            await core.delete_namespaced_pod(name="theirs", namespace=other_namespace, grace_period_seconds=0)
            await core.delete_namespaced_pod(name="ours", namespace=namespace, grace_period_seconds=0)
            await eventually(lambda: states_are(fake_rm, uid, "released"), what="our reservation released")
    finally:
        await operator.stop()
    assert fake_rm.states()["c-theirs"] == "committed"
    assert fake_rm.states()["c-unseen"] == "committed"
    assert ("release", "c-theirs") not in fake_rm.calls
