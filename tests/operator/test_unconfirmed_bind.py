"""A Binding that gets no answer: its reservation is settled by what happened to the pod, not left
to expire while the pod runs (the RM would then give the pod's capacity away).

The operator talks to the real apiserver through a proxy that cuts the connection of Binding POSTs
(tests/operator/apiproxy.py): the write lands, is delayed, or is dropped, and the operator sees only
a dead connection, every attempt.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.adapters import KubeBinder
from bindery.devcluster.plane import ControlPlane
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import BindError
from tests.conftest import OPERATOR_USER, api_client_for
from tests.operator.apiproxy import ApiProxy, serve_api_proxy
from tests.operator.conftest import (
    Bindery,
    Stage,
    attempts,
    condition,
    events_of,
    eventually,
    now,
    read_pod,
    states_are,
)

pytestmark = pytest.mark.controlplane

UNANSWERED = 3  # the default binder's attempts: the first and two retries


@pytest.fixture
async def proxied(
    controlplane: ControlPlane, operator_kubeconfig: pathlib.Path, tmp_path: pathlib.Path
) -> AsyncIterator[tuple[ApiProxy, Bindery]]:
    """The operator (least-privilege identity) running against the apiserver through the proxy."""
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as served:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=served.url
        )
        operator = Bindery(kubeconfig=kubeconfig)
        await operator.start()
        try:
            yield served, operator
        finally:
            await operator.stop()


@pytest.fixture
def proxy(proxied: tuple[ApiProxy, Bindery]) -> ApiProxy:
    return proxied[0]


async def test_a_binding_applied_without_an_answer_is_committed(
    *, kube_api: client.ApiClient, namespace: str, proxy: ApiProxy, stage: Stage
) -> None:
    proxy.binding_faults = ["swallow"] * UNANSWERED
    async with stage.served():
        pod = await stage.create("p")
        uid = pod["metadata"]["uid"]
        await eventually(lambda: states_are(stage.rm, uid, "committed"), what="the commit")
        # The cycle reported the unanswered Binding; once settled, the pod says it is scheduled. This
        # waits while the RM is still served: the correction may come from whichever of the tracker
        # and a reconcile pass committed, a moment after the commit.
        events = await eventually(lambda: _scheduled_again(kube_api, namespace, "p"), what="the correction")
    assert await stage.node_of("p") == stage.node
    # The first POST bound the pod; the retries met "already assigned"; nobody heard either.
    assert [status for _, status in proxy.bindings] == [201, 409, 409]
    assert not [call for call in stage.rm.calls if call[0] == "release"]
    assert stage.rm.reserve_attempts == ["p"]
    failed = [e for e in events if e["reason"] == "FailedScheduling"]
    assert len(failed) == 1
    assert "did not answer" in failed[0]["note"]
    scheduled = [e for e in events if e["reason"] == "Scheduled"]
    assert len(scheduled) == 1
    assert scheduled[0]["note"] == f"Successfully assigned {namespace}/p to {stage.node}"
    cond = condition(await read_pod(kube_api, namespace=namespace, name="p"))
    assert cond is not None
    assert "reason" not in cond
    assert "message" not in cond


async def _scheduled_again(api: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]] | None:
    """The pod's events, once PodScheduled is True and a Scheduled event exists."""
    cond = condition(await read_pod(api, namespace=namespace, name=name))
    if cond is None or cond["status"] != "True":
        return None
    events = await events_of(api, namespace=namespace, pod_name=name)
    return events if any(e["reason"] == "Scheduled" for e in events) else None


async def test_a_binding_that_landed_late_is_committed_through_the_bound_pod_watch(
    *, kube_api: client.ApiClient, namespace: str, proxy: ApiProxy, stage: Stage
) -> None:
    """The read after the cycle finds the pod pending; the late write binds it; the watch commits.

    The backoff is long, so the pod's next cycle cannot be the one that settles it.
    """
    proxy.binding_faults = ["late:3", "drop", "drop"]
    async with stage.served(backoff={"initialSeconds": 60, "maxSeconds": 60}):
        pod = await stage.create("p")
        uid = pod["metadata"]["uid"]
        await eventually(lambda: states_are(stage.rm, uid, "committed"), what="the commit")
        await eventually(lambda: _scheduled_again(kube_api, namespace, "p"), what="the correction")
    assert await stage.node_of("p") == stage.node
    assert [status for fault, status in proxy.bindings if fault.startswith("late")] == [201]
    assert stage.rm.reserve_attempts == ["p"]


async def test_a_binding_that_never_landed_is_bound_by_the_next_cycle_on_the_same_reservation(
    *, proxy: ApiProxy, stage: Stage
) -> None:
    proxy.binding_faults = ["drop"] * UNANSWERED
    async with stage.served(backoff={"initialSeconds": 0.5, "maxSeconds": 1}):
        pod = await stage.create("p")
        uid = pod["metadata"]["uid"]
        await eventually(lambda: states_are(stage.rm, uid, "committed"), what="the commit")
    assert await stage.node_of("p") == stage.node
    assert stage.rm.reserve_attempts == ["p", "p"]  # the second call replayed the same reservation
    assert [status for _, status in proxy.bindings] == [None, None, None, 201]


async def test_a_late_binding_landing_during_the_next_cycle_is_committed_not_released(
    *, proxied: tuple[ApiProxy, Bindery], stage: Stage
) -> None:
    """The next cycle gets the same reservation back; while it waits for the RM, the late Binding
    lands (the proxy holds it until then) and the operator drops the pod from its unbound pods. The
    cycle then finds the pod gone, and its release must become a commit: the pod runs on it."""
    proxy, operator = proxied
    proxy.binding_faults = ["held", "drop", "drop"]

    async def until_bound_and_forgotten(reservation: dict[str, Any]) -> None:
        stage.rm.on_replay = None
        proxy.forward_held()
        await eventually(lambda: stage.node_of("p"), what="the late Binding")
        uid = reservation["podUid"]
        await eventually(lambda: now(uid not in operator.runtime.pods.uids()), what="the pod dropped")

    stage.rm.on_replay = until_bound_and_forgotten
    async with stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.2}):
        pod = await stage.create("p")
        uid = pod["metadata"]["uid"]
        await eventually(lambda: now(stage.rm.reserve_attempts == ["p", "p"]), what="the replay")
        await eventually(lambda: states_are(stage.rm, uid, "committed"), what="the commit")
        # The second cycle is counted only once it has ended, its release (or not) included: two
        # cycles counted means the release that must not happen had its chance.
        await eventually(
            lambda: now(attempts(operator, resource_manager=stage.rm_name) >= 2),
            what="the second cycle ended",
        )
        assert await states_are(stage.rm, uid, "committed")
    assert await stage.node_of("p") == stage.node
    assert not [call for call in stage.rm.calls if call[0] == "release"]


async def test_a_pod_deleted_after_an_unanswered_binding_has_its_reservation_released(
    *, kube_api: client.ApiClient, namespace: str, proxy: ApiProxy, stage: Stage
) -> None:
    proxy.binding_faults = ["late:2", "drop", "drop"]
    async with stage.served(backoff={"initialSeconds": 60, "maxSeconds": 60}):
        pod = await stage.create("p")
        uid = pod["metadata"]["uid"]
        await eventually(lambda: states_are(stage.rm, uid, "committed"), what="the commit")
        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="p", namespace=namespace, grace_period_seconds=0
        )
        await eventually(lambda: states_are(stage.rm, uid, "released"), what="the release")


async def test_a_binding_left_hanging_times_out_as_unanswered(
    *, controlplane: ControlPlane, operator_kubeconfig: pathlib.Path, tmp_path: pathlib.Path, stage: Stage
) -> None:
    """The generated client waits forever by default; the binder gives up after its timeout."""
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as served:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=served.url
        )
        api = await api_client_for(str(kubeconfig))
        try:
            pod = PodInfo.from_body(await stage.create("p"))
            served.binding_faults = ["hang"]
            with pytest.raises(BindError) as raised:
                await KubeBinder(api=api, timeout=1.0).bind(pod=pod, node=stage.node, annotations={})
        finally:
            await api.close()
    assert raised.value.status is None  # unanswered, not refused
    assert "the apiserver did not answer" in str(raised.value)
    assert await stage.node_of("p") is None


async def test_a_pod_deleted_pending_after_an_unanswered_binding_leaves_no_assumed_copy(
    *, kube_api: client.ApiClient, namespace: str, proxied: tuple[ApiProxy, Bindery], stage: Stage
) -> None:
    """The cycle assumed the pod on its node for the inter-pod rules; the Binding never landed and
    the pod is deleted while pending, so the placed-pod watch never sees it: the pending side must
    forget the assumed copy, or its anti-affinity keeps every later pod off that node for good."""
    proxy, operator = proxied
    proxy.binding_faults = ["drop"] * UNANSWERED
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "solo"}}}
            ]
        }
    }
    async with stage.served(backoff={"initialSeconds": 60, "maxSeconds": 60}):
        pod = await stage.create("p", labels={"app": "solo"}, affinity=anti)
        uid = pod["metadata"]["uid"]
        placed = operator.runtime.placed
        assert placed is not None
        await eventually(lambda: now(placed.get(uid) is not None), what="the assumed copy")
        await eventually(lambda: now(not proxy.binding_faults), what="every Binding unanswered")
        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="p", namespace=namespace, grace_period_seconds=0
        )
        await eventually(lambda: now(placed.get(uid) is None), what="the assumed copy forgotten")
