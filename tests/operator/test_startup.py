"""Start-up is not held back by the Node list, and no pod is scheduled before it is complete.

At the size users run (thousands of Nodes), listing the Nodes takes a while. The operator's
ResourceManager handlers, and so its profiles (credentials, RM client, probe, status), must not
wait for that list; scheduling must, since a decision on a half-listed node cache is a wrong one
(NodeCheck refuses a node it does not know yet, the inter-pod rules miss domains). The test holds
every Node list at an API proxy (tests/operator/apiproxy.py), so "before the list completed" is a
state the test controls, not a race: the profile comes up (its status says the RM is reachable)
while the list is held, does not schedule, and binds the pod once the list is let through.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from tests.conftest import OPERATOR_USER
from tests.operator.apiproxy import serve_api_proxy
from tests.operator.conftest import Bindery, create_pod, delete_rm, eventually, node_of, now, pod_body
from tests.realrm import RMProcess, serve_with

OBJECTS = {"group": "bindery.dev", "version": "v1alpha1", "plural": "resourcemanagers"}
POOL_LABEL = "bindery.dev/test-pool"


async def _reachable(api: client.ApiClient, name: str) -> bool:
    body: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(name=name, **OBJECTS)
    found = (body.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Reachable" and c["status"] == "True" for c in found)


@pytest.fixture
async def pool(kube_api: client.ApiClient, uniq: Callable[[str], str]) -> tuple[str, str]:
    name, node = uniq("pool"), uniq("n")
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
async def test_the_profile_starts_while_the_node_list_is_held_and_schedules_only_once_it_completed(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    ref_rm: RMProcess,
    pool: tuple[str, str],
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
    operator_kubeconfig: pathlib.Path,  # mints the operator's identity the proxy authenticates as
) -> None:
    name, scheduler = uniq("rm"), uniq("sched")
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as proxy:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=proxy.url
        )
        proxy.hold_node_lists = True
        operator = Bindery(kubeconfig=kubeconfig)
        await operator.start()
        try:
            await serve_with(kube_api, rm=ref_rm, name=name, scheduler_names=[scheduler], namespace=namespace)
            await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
            # The ResourceManager handler ran and its profile probed the RM: not held back by the list.
            held = "the profile up while the Node list is held"
            await eventually(lambda: _reachable(kube_api, name), within=60, what=held)
            supervisor = operator.runtime.supervisors[name]
            waiting = "the profile waiting for the Nodes"
            await eventually(lambda: now(supervisor.waiting_for is not None), within=60, what=waiting)
            assert proxy.held_node_lists > 0
            assert supervisor.runner is not None
            assert not supervisor.runner.active
            assert await node_of(kube_api, namespace=namespace, name="p") is None

            proxy.hold_node_lists = False
            bound = await eventually(
                lambda: node_of(kube_api, namespace=namespace, name="p"), within=60, what="the pod bound"
            )
            assert bound == pool[0]
            assert supervisor.waiting_for is None
        finally:
            await operator.stop()
            await delete_rm(kube_api, name=name)
