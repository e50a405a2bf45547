"""Issue 8, scenario 2: a pod that copies another pod's reservation annotation cannot free it.

Any user who can create pods could create one with ``spec.nodeName`` preset, Bindery's scheduler
name and a copy of a running pod's ``bindery.dev/reservation-id``; deleting it made Bindery's
bound-pod watch release the victim's committed reservation while the victim still ran, so the RM
would hand its capacity to the next pod. With contract v1.1 the watch releases with the UID of the
pod in the event, and the reference RM refuses another pod's reservation (409 pod-mismatch).

Everything is real: the apiserver, the operator and the reference RM as their own processes.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.rm.models import ReservationState
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.operator.conftest import create_pod, eventually, node_of, pod_body, read_pod
from tests.realrm import scene, settled_invariants

pytestmark = pytest.mark.controlplane


async def _delete_now(api: client.ApiClient, *, namespace: str, name: str) -> None:
    """Delete at once: the test nodes run no kubelet, which would otherwise have to confirm it."""
    await client.CoreV1Api(api).delete_namespaced_pod(
        name=name, namespace=namespace, body=client.V1DeleteOptions(grace_period_seconds=0)
    )


async def test_deleting_a_pod_with_a_copied_reservation_annotation_keeps_the_victims_reservation(
    *,
    controlplane: Any,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    async with scene(
        kube_api,
        admin_kubeconfig=controlplane.kubeconfig,
        operator_kubeconfig=operator_kubeconfig,
        namespace=namespace,
        directory=tmp_path,
    ) as stage:
        rm, operator, scheduler, node = stage.rm, stage.operator, stage.scheduler, stage.node
        victim = await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="victim", scheduler_name=scheduler)
        )
        victim_uid = victim["metadata"]["uid"]
        await eventually(
            lambda: node_of(kube_api, namespace=namespace, name="victim"), within=60, what="victim bound"
        )

        async def victims_reservation() -> Any:
            held = [r for r in await rm.reservations() if r.pod_uid == victim_uid]
            return held[0] if [r.state for r in held] == [ReservationState.COMMITTED] else None

        reservation = await eventually(
            victims_reservation, within=30, what="the victim's reservation committed"
        )
        annotation = (await read_pod(kube_api, namespace=namespace, name="victim"))["metadata"]["annotations"]
        assert annotation[RESERVATION_ANNOTATION] == reservation.id

        # The attacker: bound by its creator, Bindery's scheduler name, the victim's reservation id.
        attacker = pod_body(name="attacker", scheduler_name=scheduler, nodeName=node)
        attacker["metadata"]["annotations"] = {RESERVATION_ANNOTATION: reservation.id}
        created = await create_pod(kube_api, namespace=namespace, body=attacker)
        await _delete_now(kube_api, namespace=namespace, name="attacker")

        # Proof that the operator saw the deletion and acted on it, one way or the other.
        acted = await operator.wait_for_log(
            rf"(carries the reservation annotation of reservation {reservation.id}, which belongs to "
            rf"another pod; not releasing it)|(released reservation {reservation.id}\b)",
            within=60,
        )
        assert acted.group(1), f"the operator released the victim's reservation: {acted.group(0)}"
        warning = next(line for line in operator.log().splitlines() if acted.group(1) in line)
        assert f"{namespace}/attacker ({created['metadata']['uid']})" in warning, warning
        assert " WARNING " in warning, warning

        still = [r for r in await rm.reservations() if r.id == reservation.id]
        assert [r.state for r in still] == [ReservationState.COMMITTED], still
        await settled_invariants(api=kube_api, rm=rm, namespace=namespace, scheduler_names=[scheduler])

        # The rightful pod still frees its own reservation when it goes.
        await _delete_now(kube_api, namespace=namespace, name="victim")

        async def released() -> bool:
            return not [r for r in await rm.reservations() if r.id == reservation.id]

        await eventually(released, within=30, what="the victim's reservation released with the victim")
