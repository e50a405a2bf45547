"""`bindery run --namespace`: a namespaced operator reads and releases nothing outside its namespaces.

Two namespaced operators can share a scheduler name and an RM (one per team namespace); each must
leave the other's bound pods and committed reservations alone, at startup and while running.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes_asyncio import client

from bindery.controller.embedded import EmbeddedOperator
from bindery.controller.options import OperatorOptions
from bindery.devcluster.nodes import create_node
from tests.operator.conftest import (
    create_pod,
    eventually,
    pod_body,
    reservation_entry,
    resource_manager,
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
    uniq: Callable[[str], str],
) -> None:
    node = uniq("n")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 5
    core = client.CoreV1Api(kube_api)
    # Another operator's pod, bound in the other namespace with a committed reservation ...
    theirs = await create_pod(
        kube_api, namespace=other_namespace, body=pod_body(name="theirs", scheduler_name=scheduler)
    )
    await core.create_namespaced_pod_binding(
        name="theirs",
        namespace=other_namespace,
        body={
            "metadata": {"name": "theirs", "annotations": {"bindery.dev/reservation-id": "c-theirs"}},
            "target": {"kind": "Node", "name": node},
        },
        _preload_content=False,
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
        async with resource_manager(
            kube_api, name=uniq("rm"), scheduler_names=[scheduler], endpoint=fake_rm.url
        ):
            ours = await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="ours", scheduler_name=scheduler)
            )
            uid = ours["metadata"]["uid"]
            await eventually(lambda: _states_of(fake_rm, uid, "committed"), what="our pod committed")
            # Their pod goes first, then ours: an all-namespaces watch would see both, in this order.
            await core.delete_namespaced_pod(name="theirs", namespace=other_namespace, grace_period_seconds=0)
            await core.delete_namespaced_pod(name="ours", namespace=namespace, grace_period_seconds=0)
            await eventually(lambda: _states_of(fake_rm, uid, "released"), what="our reservation released")
    finally:
        await operator.stop()
    assert fake_rm.states()["c-theirs"] == "committed"
    assert fake_rm.states()["c-unseen"] == "committed"
    assert ("release", "c-theirs") not in fake_rm.calls


async def _states_of(rm: FakeRM, uid: str, state: str) -> bool:
    return [r["state"] for r in rm.for_pod(uid)] == [state]
