"""Issue 19's concurrency proof: Deployments whose pods state hard inter-pod rules, created at once,
scheduled by up to maxInFlight 256 concurrent cycles, break no rule; nor when the operator is
SIGKILLed mid-burst and restarted.

Half the Deployments spread their pods over three zones (``maxSkew: 1``, ``DoNotSchedule``), the
other half repel their own pods by hostname (required anti-affinity); the pool has more nodes than
an anti-affinity Deployment has replicas and room for every pod, so everything must end bound. The
reference RM runs as its own process (``--mirror-nodes``), the operator as its own process. Once
every pod is bound, the independent checker (tests/placement/checker.py, no code shared with
Bindery) validates every bound pod against every required rule, and the reservations must match
the bindings (tests/realrm.py invariants).

CI runs the short version (100 pods in 10 Deployments on 12 nodes). The full one (1,000 pods in 50
Deployments on 24 nodes) is a command::

    BINDERY_BURST_PODS=1000 BINDERY_BURST_DEPLOYMENTS=50 BINDERY_BURST_NODES=24 \\
        .venv/bin/pytest tests/placement/test_rules_burst.py -s

Each run prints one line: pods, Deployments, nodes, seconds from the creates to the last binding,
violations, and (for the SIGKILL run) how many pods were bound when the operator was killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_kwok_node
from bindery.devcluster.plane import ControlPlane
from tests.placement.checker import check
from tests.realrm import invariant_violations
from tests.workloads import POOL, bindery_on, eventually

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
ZONES = ("zone-a", "zone-b", "zone-c")
PODS = int(os.environ.get("BINDERY_BURST_PODS", "100"))
DEPLOYMENTS = int(os.environ.get("BINDERY_BURST_DEPLOYMENTS", "10"))
NODES = int(os.environ.get("BINDERY_BURST_NODES", "12"))
MAX_IN_FLIGHT = 256
#: Time for the whole burst to be bound; the full version gets more.
WITHIN = max(120.0, PODS * 0.5)
pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(int(2 * WITHIN) + 120)]


def replicas() -> int:
    per = PODS // DEPLOYMENTS
    assert per * DEPLOYMENTS == PODS, "BINDERY_BURST_PODS must be a multiple of BINDERY_BURST_DEPLOYMENTS"
    assert per <= NODES, "an anti-affinity Deployment needs a node per replica"
    return per


def burst_deployment(index: int, *, scheduler: str, pool: str) -> dict[str, Any]:
    """Even indexes spread over zones, odd ones repel their own pods by hostname."""
    app = f"burst-{index}"
    selector = {"matchLabels": {"app": app}}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "nodeSelector": {POOL: pool},
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "main", "image": "registry.invalid/app:1", "resources": {"requests": {"cpu": "100m"}}}
        ],
    }
    if index % 2 == 0:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector,
            }
        ]
    else:
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": selector, "topologyKey": HOST}
                ]
            }
        }
    return {
        "metadata": {"name": app},
        "spec": {
            "replicas": replicas(),
            "selector": selector,
            "template": {"metadata": {"labels": {"app": app, "burst": "yes"}}, "spec": spec},
        },
    }


async def pool_of(api: client.ApiClient, pool: str) -> list[str]:
    """NODES kwok nodes over three zones, returned once kwok reports them Ready and untainted."""
    names = [f"burst-{pool}-{i}" for i in range(NODES)]
    for i, name in enumerate(names):
        await create_kwok_node(
            api,
            name=name,
            capacity={"cpu": "64", "memory": "256Gi", "pods": "250"},
            labels={POOL: pool, ZONE: ZONES[i % len(ZONES)]},
        )
    core = client.CoreV1Api(api)

    async def ready() -> bool:
        listed = await core.list_node(label_selector=f"{POOL}={pool}")
        return len(listed.items) == NODES and all(
            any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            and not n.spec.taints
            for n in listed.items
        )

    await eventually(ready, within=90, what="kwok reporting the burst's nodes Ready")
    return names


async def items(api: client.ApiClient, method: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    response = await getattr(client.CoreV1Api(api), method)(*args, _preload_content=False, **kwargs)
    found: list[dict[str, Any]] = (await response.json())["items"]
    return found


def bound_count(pods: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for p in pods if p["spec"].get("nodeName"))


@pytest.mark.parametrize("kill", [False, True], ids=["steady", "operator_sigkilled"])
async def test_a_burst_of_deployments_with_hard_spread_and_anti_affinity_breaks_no_rule(
    *,
    kill: bool,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    pool = uuid.uuid4().hex[:6]
    namespace = cluster_namespace
    core, apps = client.CoreV1Api(cluster_api), client.AppsV1Api(cluster_api)
    nodes = await pool_of(cluster_api, pool)
    try:
        async with bindery_on(
            api=cluster_api,
            cluster=cluster,
            operator_kubeconfig=cluster_operator_kubeconfig,
            namespace=namespace,
            pool=pool,
            directory=tmp_path,
            operator_args=["--namespace", namespace],
            maxInFlight=MAX_IN_FLIGHT,
        ) as stage:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.gather(
                *(
                    apps.create_namespaced_deployment(
                        namespace, burst_deployment(i, scheduler=stage.scheduler, pool=pool)
                    )
                    for i in range(DEPLOYMENTS)
                )
            )
            killed_at: int | None = None
            if kill:
                threshold = max(1, PODS // 10)

                async def some_bound() -> bool:
                    # Only the bound pods are sent (no `limit`: with a field selector a page may
                    # hold fewer matches than its limit).
                    found = await items(
                        cluster_api, "list_namespaced_pod", namespace, field_selector="spec.nodeName!="
                    )
                    return len(found) >= threshold

                await eventually(some_bound, within=WITHIN, what="a tenth of the burst bound", every=0.05)
                stage.operator.kill()
                await stage.operator.wait()
                killed_at = bound_count(await items(cluster_api, "list_namespaced_pod", namespace))
                await stage.operator.start()

            async def all_bound() -> list[dict[str, Any]] | None:
                pods = await items(cluster_api, "list_namespaced_pod", namespace, label_selector="burst=yes")
                return pods if len(pods) == PODS and bound_count(pods) == PODS else None

            pods = await eventually(all_bound, within=WITHIN, what=f"all {PODS} pods bound", every=1.0)
            seconds = loop.time() - started
            on_pool = [
                p
                for p in await items(cluster_api, "list_pod_for_all_namespaces")
                if p["spec"].get("nodeName") in nodes
            ]
            violations = check(
                pods=on_pool,
                nodes=await items(cluster_api, "list_node", label_selector=f"{POOL}={pool}"),
                namespaces=await items(cluster_api, "list_namespace"),
                scope=lambda p: p["metadata"]["namespace"] == namespace,
            )
            lines: list[str] = []

            async def settled() -> bool:
                nonlocal lines
                lines = await invariant_violations(
                    api=cluster_api, rm=stage.rm, namespace=namespace, scheduler_names=[stage.scheduler]
                )
                return not lines

            with contextlib.suppress(AssertionError):
                await eventually(settled, within=60, what="reservations matching the bindings")
            print(
                f"\nrules burst: {PODS} pods in {DEPLOYMENTS} Deployments on {NODES} nodes, maxInFlight "
                f"{MAX_IN_FLIGHT}{f', operator SIGKILLed at {killed_at} bound' if kill else ''}: all bound "
                f"in {seconds:.1f} s, {len(violations)} violation(s), {len(lines)} invariant violation(s)"
            )
            assert len(pods) == PODS
            assert violations == [], "\n".join(map(str, violations))
            assert lines == [], "\n".join(lines)
            if kill:
                assert killed_at is not None, "the operator was not killed"
                assert killed_at < PODS, "the kill came after the burst was bound"
    finally:
        for name in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(name)
