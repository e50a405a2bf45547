"""Annotations are never authority (issue 20, scenario 7), against the reference RM as its own process.

A tenant who may edit their own pod ran `kubectl annotate pod P bindery.dev/reservation-id=x
--overwrite` on a running pod: the next reconcile pass found the pod on its node "without this
reservation in its annotation" and released the committed reservation while the pod ran, so an RM
that counts by reservations sold the capacity again. A reservation is held for a pod UID on a node;
while that very pod is bound there and not finished, it is kept, whatever the annotation says.
"""

from __future__ import annotations

from kubernetes_asyncio import client

from bindery.controller.reservations.fate import reservation_to_release
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.operator.conftest import Bindery, RealStage, eventually, now


async def test_overwriting_the_reservation_annotation_of_a_running_pod_frees_nothing(
    *, kube_api: client.ApiClient, bindery: Bindery, real_stage: RealStage
) -> None:
    stage = real_stage
    async with stage.served(reconcileIntervalSeconds=5):
        created = await stage.create("p")
        uid = created["metadata"]["uid"]
        assert await eventually(lambda: stage.node_of("p"), within=30, what="the bind") == stage.node
        await eventually(lambda: stage.states_are(uid, "committed"), within=30, what="the commit")
        (held,) = await stage.reservations_of(uid)

        # What the tenant runs: kubectl annotate pod p bindery.dev/reservation-id=x --overwrite
        await client.CoreV1Api(kube_api).patch_namespaced_pod(
            name="p",
            namespace=stage.namespace,
            body={"metadata": {"annotations": {RESERVATION_ANNOTATION: "x"}}},
            _content_type="application/merge-patch+json",
        )

        def passes() -> int:
            supervisor = bindery.runtime.supervisors.get(stage.rm_name)
            return supervisor.reconciled if supervisor is not None else 0

        # Two passes that began after the edit (the bound-pod watch has had its MODIFIED event too).
        after = passes() + 2
        await eventually(
            lambda: now(passes() >= after), within=60, what="two reconcile passes after the edit"
        )
        assert await stage.states_are(uid, "committed"), await stage.reservations_of(uid)
        assert [r.id for r in await stage.active()] == [held.id]

        # The pod goes away: its reservation is still released (by the next reconcile pass: the
        # bound-pod watch releases what the annotation names, the tenant's "x", unknown to the RM).
        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="p", namespace=stage.namespace, grace_period_seconds=0
        )
        await eventually(lambda: stage.states_are(uid, "released"), within=30, what="the release")
        await stage.settled()


def test_the_bound_pod_watch_releases_nothing_for_an_annotation_change() -> None:
    """The watch's path: the MODIFIED event of the edit is no departure (it releases on DELETED or a
    terminal phase only), whatever id the annotation now names, or none."""
    for edited in ({RESERVATION_ANNOTATION: "x"}, {}):
        pod = {
            "metadata": {"uid": "u-1", "namespace": "ns", "name": "p", "annotations": edited},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"},
        }
        assert reservation_to_release(event_type="MODIFIED", pod=pod) is None
