"""`bindery run --namespace`: a namespaced operator reads and releases nothing outside its namespaces.

Two namespaced operators can share a scheduler name and an RM (one per team namespace); each must
leave the other's bound pods and committed reservations alone, at startup and while running.
"""

from __future__ import annotations

import asyncio
import pathlib
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from bindery.controller.startup.entry import EmbeddedOperator
from bindery.controller.startup.options import OperatorOptions
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnavailable, RMUnschedulable
from bindery.rm.models import PodIdentity, Reservation, ReservationRequest, ReservationState
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.operator.conftest import RealStage, bind_pod, create_pod, eventually, now, pod_body

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
    real_stage: RealStage,
) -> None:
    """The other namespace's reservations are made at the reference RM as another operator would
    make them (reserve, Binding with the annotation, commit), so they are real and counted."""
    stage = real_stage
    node, scheduler = stage.node, stage.scheduler
    core = client.CoreV1Api(kube_api)
    # Another operator's pod, bound in the other namespace with a committed reservation ...
    theirs = await create_pod(
        kube_api, namespace=other_namespace, body=pod_body(name="theirs", scheduler_name=scheduler)
    )
    async with stage.rm.client() as rm:
        committed = await _reserve_and_commit(
            rm, uid=theirs["metadata"]["uid"], name="theirs", namespace=other_namespace, scheduler=scheduler
        )
        # ... and a committed reservation there whose pod this operator cannot see (not listed: not gone).
        unseen = await _reserve_and_commit(
            rm, uid=f"u-{uuid.uuid4().hex}", name="unseen", namespace=other_namespace, scheduler=scheduler
        )
    assert committed.node == unseen.node == node
    await bind_pod(
        kube_api,
        namespace=other_namespace,
        name="theirs",
        node=node,
        annotations={RESERVATION_ANNOTATION: committed.id},
    )

    operator = EmbeddedOperator(
        options=OperatorOptions(kubeconfig=operator_kubeconfig, probe_interval=2.0, namespaces=(namespace,))
    )
    await operator.start()
    try:
        async with stage.served(reconcileIntervalSeconds=5):
            ours = await stage.create("ours")
            uid = ours["metadata"]["uid"]
            await eventually(lambda: stage.states_are(uid, "committed"), within=30, what="our pod committed")
            # Their pod goes first, then ours: an all-namespaces watch would see both, in this order.
            await core.delete_namespaced_pod(name="theirs", namespace=other_namespace, grace_period_seconds=0)
            await core.delete_namespaced_pod(name="ours", namespace=namespace, grace_period_seconds=0)
            await eventually(lambda: stage.states_are(uid, "released"), what="our reservation released")
            # A reconcile pass ran after both deletions (the positive signal): it would have released
            # the other namespace's reservations had it judged them.
            passes = _passes(operator, stage.rm_name)
            await eventually(lambda: now(_passes(operator, stage.rm_name) > passes), what="a reconcile pass")
            await stage.settled()
    finally:
        await operator.stop()
    states = {r.id: r.state for r in await stage.rm.reservations(active=False)}
    assert states[committed.id] is ReservationState.COMMITTED
    assert states[unseen.id] is ReservationState.COMMITTED


def _passes(operator: EmbeddedOperator, rm_name: str) -> int:
    supervisor = operator.runtime.supervisors.get(rm_name)
    return supervisor.reconciled if supervisor is not None else 0


async def _reserve_and_commit(
    rm: ResourceManagerClient, *, uid: str, name: str, namespace: str, scheduler: str
) -> Reservation:
    """Reserve and commit as another operator would (retrying until the RM has mirrored the node)."""
    request = ReservationRequest(
        pod=PodIdentity(uid=uid, namespace=namespace, name=name, scheduler_name=scheduler),
        resources={"cpu": "100m"},
        idempotency_key=uid,
        ttl_seconds=600,
    )
    async with asyncio.timeout(60):
        while True:
            try:
                reservation = await rm.reserve(request)
                break
            except (RMUnavailable, RMUnschedulable):
                await asyncio.sleep(0.2)
    return await rm.commit(reservation.id, pod_uid=uid)
