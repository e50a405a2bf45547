"""Issue 19, side by side: the same pods, once scheduled by kube-scheduler and once by Bindery (the
reference RM as its own process, ``--mirror-nodes``, policy binpack, as the chart installs it), on
the same four 16-CPU kwok nodes in three zones; the independent checker (tests/placement/checker.py,
no code shared with Bindery) validates every bound pod against every required rule.

The workloads state one rule each: zone spread, hostname anti-affinity, pod affinity to a zone,
host ports, nodeSelector and required node affinity, and a NoSchedule taint (every pod that does not
tolerate it must avoid that node). kube-scheduler calibrates the run: what it binds, Bindery must
bind too (a scheduler that binds nothing breaks no rule), and neither may break a rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_kwok_node
from bindery.devcluster.plane import ControlPlane
from tests.placement.checker import RULES, Violation, check
from tests.workloads import POOL, bindery_on, eventually

pytestmark = pytest.mark.controlplane

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
GPU_TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
EXAMPLES = 3
TOLERATE_GPU = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]


#: What kube-scheduler binds of each workload on these nodes: one anti-affinity pod has no node left.
EXPECTED_BOUND = {
    "cache": 1,
    "ballast": 1,
    "spread": 6,
    "anti": 4,
    "web": 3,
    "ports": 4,
    "ssd": 2,
    "affine": 2,
    "gpu": 2,
}


def pool_nodes(pool: str) -> list[tuple[str, dict[str, str], list[dict[str, str]]]]:
    """Four nodes, three zones: a has two (one tainted for GPUs, one with the ballast), b has the SSD
    node, c one (with the cache pod)."""
    return [
        (f"sbs-{pool}-0", {ZONE: "a"}, [GPU_TAINT]),
        (f"sbs-{pool}-1", {ZONE: "a"}, []),
        (f"sbs-{pool}-2", {ZONE: "b", "disk": "ssd"}, []),
        (f"sbs-{pool}-3", {ZONE: "c"}, []),
    ]


def pod(
    name: str, *, group: str, scheduler: str, pool: str, cpu: str = "500m", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": group}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {POOL: pool, **spec.pop("nodeSelector", {})},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/app:1",
                    "resources": {"requests": {"cpu": cpu}},
                    **({"ports": spec.pop("ports")} if "ports" in spec else {}),
                }
            ],
            **spec,
        },
    }


def workloads(
    *, scheduler: str, pool: str, nodes: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the pods placed first, every other pod).

    First come the pod the affinity group follows (in zone c) and a 4-CPU ballast on a zone-a node:
    a binpacking scheduler that ignores the affinity puts the followers next to the ballast, so the
    affinity rule is really exercised (without it they landed next to the cache pod by chance).
    """
    ssd_node = nodes[2]

    def group(name: str, count: int, **spec: Any) -> list[dict[str, Any]]:
        return [
            pod(f"{name}-{i}", group=name, scheduler=scheduler, pool=pool, **dict(spec)) for i in range(count)
        ]

    spread = [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "spread"}},
        }
    ]
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "anti"}}}
            ]
        }
    }
    near_cache = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "cache"}}}
            ]
        }
    }
    not_zone_a_nor_ssd = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["a"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [ssd_node]}],
                    }
                ]
            }
        }
    }
    first = [
        pod("cache-0", group="cache", scheduler=scheduler, pool=pool, nodeSelector={ZONE: "c"}),
        pod(
            "ballast-0",
            group="ballast",
            scheduler=scheduler,
            pool=pool,
            cpu="4",
            nodeSelector={HOST: nodes[1]},
        ),
    ]
    return first, [
        *group("spread", 6, topologySpreadConstraints=spread),
        *group("anti", 5, affinity=anti, tolerations=TOLERATE_GPU),
        *group("web", 3, affinity=near_cache),
        *group("ports", 4, ports=[{"containerPort": 80, "hostPort": 8080}], tolerations=TOLERATE_GPU),
        *group("ssd", 2, nodeSelector={"disk": "ssd"}),
        *group("affine", 2, affinity=not_zone_a_nor_ssd),
        *group("gpu", 2, tolerations=TOLERATE_GPU),
    ]


async def create_pool(api: client.ApiClient, pool: str) -> list[str]:
    core = client.CoreV1Api(api)
    nodes = pool_nodes(pool)
    for name, labels, taints in nodes:
        await create_kwok_node(
            api,
            name=name,
            capacity={"cpu": "16", "memory": "64Gi", "pods": "110"},
            labels={POOL: pool, **labels},
            taints=taints,
        )

    async def ready() -> bool:
        listed = await core.list_node(label_selector=f"{POOL}={pool}")
        # Ready, and the node lifecycle controller's not-ready taint gone (only ours left).
        return len(listed.items) == len(nodes) and all(
            any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            and all(t.key == GPU_TAINT["key"] for t in (n.spec.taints or []))
            for n in listed.items
        )

    await eventually(ready, within=60, what="kwok reporting the pool's nodes Ready")
    return [name for name, _, _ in nodes]


async def raw_list(api: client.ApiClient, method: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    response = await getattr(client.CoreV1Api(api), method)(*args, _preload_content=False, **kwargs)
    items: list[dict[str, Any]] = (await response.json())["items"]
    return items


@dataclasses.dataclass(frozen=True)
class Run:
    """One scheduler's round: the nodes each workload's pods were bound to, and the violations."""

    bound: dict[str, list[str]]
    violations: list[Violation]


def decided(p: Mapping[str, Any]) -> bool:
    """Bound, or refused by its scheduler (PodScheduled=False)."""
    if p["spec"].get("nodeName"):
        return True
    conditions = (p.get("status") or {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)


async def run(
    api: client.ApiClient, *, namespace: str, scheduler: str, pool: str, nodes: Sequence[str]
) -> Run:
    """Create the workloads (the cache and ballast pods first, bound before the rest exist), wait until every
    pod is bound or refused, and check the cluster's bound pods on the pool."""
    core = client.CoreV1Api(api)
    first, others = workloads(scheduler=scheduler, pool=pool, nodes=nodes)
    for body in first:
        await core.create_namespaced_pod(namespace, body)

    async def first_bound() -> bool:
        pods = await raw_list(api, "list_namespaced_pod", namespace)
        return len(pods) == len(first) and all(p["spec"].get("nodeName") for p in pods)

    await eventually(first_bound, within=60, what=f"{scheduler} binding the cache and ballast pods")
    for body in others:
        await core.create_namespaced_pod(namespace, body)

    async def all_decided() -> list[dict[str, Any]] | None:
        pods = await raw_list(api, "list_namespaced_pod", namespace)
        return pods if len(pods) == len(first) + len(others) and all(decided(p) for p in pods) else None

    pods = await eventually(all_decided, within=90, what=f"{scheduler} binding or refusing every pod")
    on_pool = [
        p for p in await raw_list(api, "list_pod_for_all_namespaces") if p["spec"].get("nodeName") in nodes
    ]
    pool_nodes_listed = await raw_list(api, "list_node", label_selector=f"{POOL}={pool}")
    violations = check(
        pods=on_pool,
        nodes=pool_nodes_listed,
        namespaces=await raw_list(api, "list_namespace"),
        scope=lambda p: p["metadata"]["namespace"] == namespace,
    )
    bound: dict[str, list[str]] = {}
    for p in pods:
        bound.setdefault(p["metadata"]["labels"]["app"], [])
        if p["spec"].get("nodeName"):
            bound[p["metadata"]["labels"]["app"]].append(p["spec"]["nodeName"])
    return Run(bound=bound, violations=violations)


async def empty(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)

    async def gone() -> bool:
        return not await raw_list(api, "list_namespaced_pod", namespace)

    await eventually(gone, within=60, what=f"the pods of {namespace} deleted")


def report(ks: Run, bindery: Run) -> str:
    width = max(len(r) for r in RULES)
    lines = [f"{'rule':<{width}} | kube-scheduler | Bindery", "-" * (width + 27)]
    for rule in RULES:
        a = sum(v.rule == rule for v in ks.violations)
        b = sum(v.rule == rule for v in bindery.violations)
        lines.append(f"{rule:<{width}} | {a:>14} | {b:>7}")
    lines += ["", "workload | bound by kube-scheduler | bound by Bindery"]
    for name in sorted(ks.bound):
        lines.append(f"{name} | {len(ks.bound[name])} | {len(bindery.bound.get(name, []))}")
    for title, found in (("kube-scheduler", ks.violations), ("Bindery", bindery.violations)):
        if found:
            lines += ["", f"{title}'s violations (at most {EXAMPLES} per rule):"]
        for rule in RULES:
            of_rule = [v for v in found if v.rule == rule]
            lines += [f"  {v}" for v in of_rule[:EXAMPLES]]
            if len(of_rule) > EXAMPLES:
                lines.append(f"  ... and {len(of_rule) - EXAMPLES} more {rule} violations")
    return "\n".join(lines)


async def test_kube_scheduler_and_bindery_break_no_required_rule_on_the_same_nodes(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    pool = uuid.uuid4().hex[:6]
    core = client.CoreV1Api(cluster_api)
    second = f"{cluster_namespace}-b"
    await core.create_namespace(body={"metadata": {"name": second}})
    nodes = [name for name, _, _ in pool_nodes(pool)]
    try:
        await create_pool(cluster_api, pool)
        ks = await run(
            cluster_api, namespace=cluster_namespace, scheduler="default-scheduler", pool=pool, nodes=nodes
        )
        await empty(cluster_api, cluster_namespace)
        async with bindery_on(
            api=cluster_api,
            cluster=cluster,
            operator_kubeconfig=cluster_operator_kubeconfig,
            namespace=second,
            pool=pool,
            directory=tmp_path,
        ) as stage:
            bindery = await run(
                cluster_api, namespace=second, scheduler=stage.scheduler, pool=pool, nodes=nodes
            )
        summary = report(ks, bindery)
        print("\n" + summary)
        # Calibration: kube-scheduler bound the shapes this test expects (else the run proves nothing).
        assert {name: len(where) for name, where in ks.bound.items()} == EXPECTED_BOUND, summary
        assert ks.violations == [], summary
        assert bindery.violations == [], f"Bindery broke required rules:\n{summary}"
        assert {n: len(w) for n, w in bindery.bound.items()} == EXPECTED_BOUND, summary
    finally:
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(second)
        for name in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(name)
