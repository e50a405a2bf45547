"""Issue 8, scenario 1 end to end, as the user found it: kube-scheduler, Bindery and the reference RM
share two nodes, each a real process on the real dev control plane.

Two 4-CPU nodes each run a 3-CPU pod that kube-scheduler placed.  Four ``schedulerName: bindery``
pods of 2 CPU selecting those nodes were all bound (7 CPU on each node) because the reference RM
counted only its own reservations.  Now none is bound while the other pods run, each says why, and
all four are bound once those pods are gone; no node is ever overcommitted.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import create_pod, delete_rm, eventually, pod_body, read_pod
from tests.realrm import RMProcess, invariant_violations, operator_process, serve_with, settled_invariants
from tests.rm.test_refrm_accounting import Pool, kube_scheduler, make_nodes, wait_bound
from tests.rm.test_refrm_accounting import pod_body as other_pod

pytestmark = pytest.mark.controlplane


def _unschedulable_message(pod: dict[str, Any]) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or "")
    return ""


async def test_scenario_1_bindery_pods_wait_for_the_cpu_kube_scheduler_pods_use(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> None:
    core = client.CoreV1Api(kube_api)
    pool = Pool()
    nodes = await make_nodes(kube_api, pool, 2)
    scheduler, rm_name = uniq("sched"), uniq("rm")
    ours = [f"bindery-{i}" for i in range(4)]
    try:
        async with kube_scheduler(controlplane, tmp_path):
            for name in ("other-1", "other-2"):
                await core.create_namespaced_pod(
                    namespace=namespace, body=other_pod(name, pool=pool, cpu="3")
                )
            placed = await wait_bound(core, namespace, ["other-1", "other-2"])
        assert sorted(placed.values()) == nodes, placed

        async with (
            RMProcess(
                kubeconfig=controlplane.kubeconfig,
                directory=tmp_path,
                node_selector=pool.selector,
                # The other pods' end frees room with no release the operator hears of: the parked
                # pods are tried again on the RM's hint, 30 s by default, which this test would wait.
                options=["--foreign-retry-seconds", "3"],
            ) as rm,
            operator_process(kubeconfig=operator_kubeconfig, directory=tmp_path),
        ):
            await serve_with(kube_api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=namespace)
            for name in ours:
                body = pod_body(
                    name=name,
                    scheduler_name=scheduler,
                    cpu="2",
                    nodeSelector=dict(pool.labels),
                    tolerations=[pool.toleration],
                )
                await create_pod(kube_api, namespace=namespace, body=body)

            # The operator tried each pod and the RM said why none fits (the positive signal) ...
            for name in ours:

                async def explained(name: str = name) -> str:
                    pod = await read_pod(kube_api, namespace=namespace, name=name)
                    if pod["spec"].get("nodeName"):
                        return f"(none: {name} was bound to {pod['spec']['nodeName']}, overcommitting it)"
                    return _unschedulable_message(pod)

                message = await eventually(explained, within=90, what=f"pod {name} reported unschedulable")
                assert "0/2 nodes are available: 2 Insufficient cpu." in message, message
                assert f"node {nodes[0]}: 3 cpu (1 pod); node {nodes[1]}: 3 cpu (1 pod)" in message, message
            # ... and none was bound: no node holds more than its 4 CPUs.
            for name in ours:
                pod = await read_pod(kube_api, namespace=namespace, name=name)
                assert not pod["spec"].get("nodeName"), f"{name} was bound to {pod['spec']['nodeName']}"
            assert (
                await invariant_violations(
                    api=kube_api, rm=rm, namespace=namespace, scheduler_names=[scheduler]
                )
                == []
            )

            # The other pods go: all four fit, two per node.
            for name in ("other-1", "other-2"):
                await core.delete_namespaced_pod(name=name, namespace=namespace, grace_period_seconds=0)
            bound = await wait_bound(core, namespace, ours)
            assert sorted(bound.values()) == sorted(nodes * 2), bound
            await settled_invariants(api=kube_api, rm=rm, namespace=namespace, scheduler_names=[scheduler])
    finally:
        await delete_rm(kube_api, name=rm_name)
        for node in nodes:
            await core.delete_node(name=node)
