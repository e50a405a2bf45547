"""Two clusters, one resource manager (issue 20, scenario 1): neither frees the other's allocations.

Clusters A and B each run Bindery with a ResourceManager for the same RM and the same scheduler
name. Without a cluster identity in the contract, A's reconcile pass lists every reservation of the
name, looks each pod up in its own cluster, finds none of B's, and releases them while B's pods run;
`bindery audit` in A reports them as leaks. Here A is the shared plane and B a plane of the test's
own; the reference RM is one process both reach.
"""

from __future__ import annotations

import logging
import pathlib
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.audit.collect import run_audit
from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.rm.models import Reservation
from tests.conftest import OPERATOR_USER, api_client_for
from tests.operator.conftest import Bindery, create_pod, delete_rm, eventually, now, pod_body
from tests.realrm import RMProcess, serve_with

POOL_LABEL = "bindery.dev/test-pool"
CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "20"}


async def _committed(rm: RMProcess, pod: dict[str, Any]) -> Reservation | None:
    uid = pod["metadata"]["uid"]
    found = [r for r in await rm.reservations() if r.pod_uid == uid and r.state.value == "committed"]
    return found[0] if found else None


async def _committed_eventually(rm: RMProcess, pod: dict[str, Any]) -> Reservation:
    async def committed() -> Reservation | None:
        return await _committed(rm, pod)

    held: Reservation = await eventually(committed, within=60, what=f"{pod['metadata']['name']} committed")
    return held


async def _audit_is_clean(api: client.ApiClient, *, rm_a: str, held: Reservation) -> None:
    """`bindery audit` in A reports nothing at A's ResourceManager: not B's reservation as a leak."""
    audit = await run_audit(api=api)
    ours = [f for f in audit.findings if f.resource_manager == rm_a]
    assert not ours, f"A's audit reports at the shared RM (B's reservation is {held.id}): {ours}"
    assert all(rm_a not in gap for gap in audit.gaps), audit.gaps


@pytest.mark.controlplane
async def test_a_reconcile_pass_and_audit_in_one_cluster_leave_the_other_clusters_reservations_alone(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> None:
    """B's pod is bound and committed; A's audit does not call its reservation a leak; A then serves
    the same scheduler name with the same RM and runs reconcile passes: B's reservation stays
    committed, and A's audit is still clean."""
    pool = uniq("pool")
    node = uniq("shared")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node, capacity=CAPACITY, labels={POOL_LABEL: pool})
    async with RMProcess(
        kubeconfig=controlplane.kubeconfig, directory=tmp_path / "rm", node_selector=f"{POOL_LABEL}={pool}"
    ) as rm:
        with ControlPlane.start() as plane_b:
            api_b = await api_client_for(str(plane_b.kubeconfig))
            operator_b: Bindery | None = None
            rm_a, rm_b = uniq("rm-a"), uniq("rm-b")
            try:
                await apply_crd(api=api_b)
                await grant_operator(api=api_b, user=OPERATOR_USER)
                # The same node name in B: the RM places by its inventory (A's Nodes), B binds there.
                await create_node(api_b, name=node, capacity=CAPACITY)
                namespace_b = f"b-{uuid.uuid4().hex[:8]}"  # no such namespace in A
                await client.CoreV1Api(api_b).create_namespace(body={"metadata": {"name": namespace_b}})
                operator_b = Bindery(kubeconfig=plane_b.mint_kubeconfig(user=OPERATOR_USER))
                await operator_b.start()
                await serve_with(api_b, rm=rm, name=rm_b, scheduler_names=[scheduler], namespace=namespace_b)
                pod_b = await create_pod(
                    api_b, namespace=namespace_b, body=pod_body(name="runs-in-b", scheduler_name=scheduler)
                )
                held = await eventually(
                    lambda: _committed(rm, pod_b), within=60, what="B's pod bound and committed"
                )

                def passes() -> int:
                    supervisor = bindery.runtime.supervisors.get(rm_a)
                    return supervisor.reconciled if supervisor is not None else 0

                # First A's ResourceManager serves another name, so A's reconciliation leaves B's
                # reservation alone: what A's audit reports then is the audit's own verdict.
                await serve_with(
                    kube_api,
                    rm=rm,
                    name=rm_a,
                    scheduler_names=[uniq("other")],
                    namespace=namespace,
                    reconcileIntervalSeconds=5,
                )
                await eventually(lambda: now(passes() >= 1), within=60, what="A's first reconcile pass")
                await _audit_is_clean(kube_api, rm_a=rm_a, held=held)

                # Then A serves the shared name too and runs passes over it.
                await client.CustomObjectsApi(kube_api).patch_cluster_custom_object(
                    group="bindery.dev",
                    version="v1alpha1",
                    plural="resourcemanagers",
                    name=rm_a,
                    body={"spec": {"schedulerNames": [scheduler]}},
                    _content_type="application/merge-patch+json",
                )
                pod_a = await create_pod(
                    kube_api, namespace=namespace, body=pod_body(name="runs-in-a", scheduler_name=scheduler)
                )
                await eventually(lambda: _committed(rm, pod_a), within=60, what="A's pod bound and committed")
                # A's pod was bound under the shared name, so the passes from here on serve it.
                since = passes()
                await eventually(
                    lambda: now(passes() >= since + 2), within=60, what="two more reconcile passes in A"
                )
                after = [r for r in await rm.reservations(active=False) if r.id == held.id]
                assert [r.state.value for r in after] == ["committed"], (
                    f"A's reconcile pass changed B's reservation {held.id}: {after}"
                )
                await _audit_is_clean(kube_api, rm_a=rm_a, held=held)
            finally:
                if operator_b is not None:
                    await operator_b.stop()
                await delete_rm(kube_api, name=rm_a)
                await api_b.close()


async def test_against_a_v1_1_rm_the_operator_schedules_as_before_and_warns_once(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    bindery: Bindery,
    tmp_path: pathlib.Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An RM without /v1/info (the reference RM serving as v1.1, which answers 400 to clusterId):
    pods bind and commit with no cluster id sent, and the operator says once that sharing that RM
    between clusters is unsafe."""
    pool, scheduler = uniq("pool"), uniq("sched")
    await create_node(kube_api, name=uniq("old"), capacity=CAPACITY, labels={POOL_LABEL: pool})
    async with RMProcess(
        kubeconfig=controlplane.kubeconfig,
        directory=tmp_path / "rm",
        node_selector=f"{POOL_LABEL}={pool}",
        options=["--no-cluster-id"],
    ) as rm:
        name = uniq("rm-old")
        try:
            with caplog.at_level(logging.WARNING, logger="bindery.rm.client"):
                await serve_with(kube_api, rm=rm, name=name, scheduler_names=[scheduler], namespace=namespace)
                for index in range(2):
                    body = pod_body(name=f"p{index}", scheduler_name=scheduler)
                    pod = await create_pod(kube_api, namespace=namespace, body=body)
                    held = await _committed_eventually(rm, pod)
                    assert held.cluster_id is None
            said = [r.getMessage() for r in caplog.records]
            warnings = [m for m in said if rm.url in m and "without the cluster-id feature" in m]
            assert len(warnings) == 1, warnings
        finally:
            await delete_rm(kube_api, name=name)
