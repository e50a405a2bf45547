"""Each ResourceManager recovers on its own: no restart of the operator and no edit of the object.

Issue 8, scenario 3 and item 5: a ResourceManager created before its token Secret, and a resource
manager that is down while the operator starts, both end up scheduling once the missing piece
arrives, with their status conditions following. The reference RM runs as its own process
(tests/realrm.py) mirroring a node pool of the test's own; the operator runs embedded so the test
can start it when the scenario needs.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.backoff import Backoff
from bindery.controller.profile.supervisor import SUPERVISOR_BACKOFF
from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.rm.models import PodIdentity, ReservationRequest
from tests.conftest import OPERATOR_USER
from tests.operator.apiproxy import serve_api_proxy
from tests.operator.conftest import (
    Bindery,
    create_pod,
    delete_rm,
    eventually,
    node_of,
    now,
    pod_body,
)
from tests.realrm import RMProcess, serve_with

OBJECTS = {"group": "bindery.dev", "version": "v1alpha1", "plural": "resourcemanagers"}
POOL_LABEL = "bindery.dev/test-pool"


async def _conditions(api: client.ApiClient, name: str) -> dict[str, tuple[str, str]]:
    """Condition type → (status, reason) of the ResourceManager's status."""
    body: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(name=name, **OBJECTS)
    found = (body.get("status") or {}).get("conditions") or ()
    return {c["type"]: (c["status"], c.get("reason", "")) for c in found}


@pytest.fixture
async def pool(kube_api: client.ApiClient, uniq: Callable[[str], str]) -> tuple[str, str]:
    """A node of a pool of the test's own: (node name, label selector of the pool)."""
    name = uniq("pool")
    node = uniq("n")
    await create_node(kube_api, name=node, labels={POOL_LABEL: name})
    return node, f"{POOL_LABEL}={name}"


@pytest.fixture
async def ref_rm(
    controlplane: ControlPlane, tmp_path: pathlib.Path, pool: tuple[str, str]
) -> AsyncIterator[RMProcess]:
    async with RMProcess(
        kubeconfig=controlplane.kubeconfig, directory=tmp_path / "rm", node_selector=pool[1]
    ) as rm:
        yield rm


@pytest.mark.controlplane
async def test_a_resource_manager_created_before_its_token_secret_recovers_once_it_exists(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    ref_rm: RMProcess,
    pool: tuple[str, str],
    uniq: Callable[[str], str],
) -> None:
    name, scheduler, secret = uniq("rm"), uniq("sched"), uniq("token")
    body = {
        "apiVersion": "bindery.dev/v1alpha1",
        "kind": "ResourceManager",
        "metadata": {"name": name},
        "spec": {
            "schedulerNames": [scheduler],
            "endpoint": ref_rm.url,
            "allowInsecureHTTP": True,
            "auth": {"tokenSecretRef": {"namespace": namespace, "name": secret}},
        },
    }
    await client.CustomObjectsApi(kube_api).create_cluster_custom_object(body=body, **OBJECTS)
    try:

        async def credentials_unavailable() -> bool:
            return (await _conditions(kube_api, name)).get("Ready") == ("False", "CredentialsUnavailable")

        await eventually(credentials_unavailable, within=30, what="Ready=False CredentialsUnavailable")
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))

        await client.CoreV1Api(kube_api).create_namespaced_secret(
            namespace=namespace,
            body={
                "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
                "stringData": {"token": ref_rm.token},
            },
        )

        async def ready() -> bool:
            return (await _conditions(kube_api, name)).get("Ready") == ("True", "Scheduling")

        await eventually(ready, within=60, what="Ready=True once the Secret exists")
        bound = await eventually(
            lambda: node_of(kube_api, namespace=namespace, name="p"), within=60, what="the pod bound"
        )
        assert bound == pool[0]
    finally:
        await delete_rm(kube_api, name=name)


@pytest.mark.controlplane
async def test_an_rm_down_while_the_operator_starts_is_picked_up_when_it_comes_back(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    ref_rm: RMProcess,
    pool: tuple[str, str],
    uniq: Callable[[str], str],
) -> None:
    name, scheduler = uniq("rm"), uniq("sched")
    await serve_with(kube_api, rm=ref_rm, name=name, scheduler_names=[scheduler], namespace=namespace)
    try:
        # A leftover of an earlier operator of this cluster (so made with its cluster id, RM contract
        # v1.2): reserved for a pod that does not exist.
        cluster = (await client.CoreV1Api(kube_api).read_namespace("kube-system")).metadata.uid
        ghost = uuid.uuid4().hex
        request = ReservationRequest(
            pod=PodIdentity(uid=ghost, namespace=namespace, name="gone", scheduler_name=scheduler),
            resources={"cpu": "100m"},
            idempotency_key=ghost,
            ttl_seconds=3600,
        )
        async with ref_rm.client(cluster_id=cluster) as rm:
            leftover = await rm.reserve(request)
        assert leftover.cluster_id == cluster
        await ref_rm.stop()

        operator = Bindery(kubeconfig=operator_kubeconfig)
        await operator.start()
        try:

            async def unreachable() -> bool:
                return (await _conditions(kube_api, name)).get("Reachable", ("", ""))[0] == "False"

            await eventually(unreachable, within=60, what="Reachable=False while the RM is down")
            await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))

            await ref_rm.start()  # same port, same database

            bound = await eventually(
                lambda: node_of(kube_api, namespace=namespace, name="p"), within=60, what="the pod bound"
            )
            assert bound == pool[0]

            async def reachable() -> bool:
                return (await _conditions(kube_api, name)).get("Reachable") == ("True", "ProbeSucceeded")

            await eventually(reachable, within=60, what="Reachable=True once the RM is back")

            async def leftover_released() -> bool:
                return all(r.id != leftover.id for r in await ref_rm.reservations())

            await eventually(leftover_released, within=60, what="the leftover reservation released")
        finally:
            await operator.stop()
    finally:
        await delete_rm(kube_api, name=name)


def test_the_retry_backoff_doubles_from_one_second_to_thirty_and_starts_over_after_a_success() -> None:
    backoff = Backoff(SUPERVISOR_BACKOFF)
    assert [backoff.next() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    backoff.reset()
    assert backoff.next() == 1


@pytest.mark.controlplane
async def test_a_start_pass_that_fails_neither_keeps_the_workers_waiting_nor_is_given_up(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    ref_rm: RMProcess,
    pool: tuple[str, str],
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
    operator_kubeconfig: pathlib.Path,
) -> None:
    """The apiserver answers the start pass's list of bound pods with 503 (not a typed error of the
    client): the pods are scheduled anyway, and the pass is retried until it succeeds."""
    name, scheduler = uniq("rm"), uniq("sched")
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as proxy:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=proxy.url
        )
        proxy.bound_pod_list_status = 503
        operator = Bindery(kubeconfig=kubeconfig)
        await operator.start()
        try:
            await serve_with(kube_api, rm=ref_rm, name=name, scheduler_names=[scheduler], namespace=namespace)
            await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
            bound = await eventually(
                lambda: node_of(kube_api, namespace=namespace, name="p"), within=60, what="the pod bound"
            )
            assert bound == pool[0]
            assert proxy.failed_bound_pod_lists > 0
            supervisor = operator.runtime.supervisors[name]
            assert supervisor.reconciled == 0  # every pass so far met the 503

            proxy.bound_pod_list_status = None
            await eventually(lambda: now(supervisor.reconciled > 0), within=60, what="the start pass retried")
        finally:
            await operator.stop()
            await delete_rm(kube_api, name=name)
