"""CPU of the inter-pod rules per pod, and memory per cached placed pod (no apiserver, no RM).

Run:  .venv/bin/python benchmarks/podrules_bench.py [--placed 50000] [--nodes 500] [--pods 2000]

A PlacedPodCache holding ``--placed`` pods (50 namespaces, Deployment-like labels, no rules)
spread over ``--nodes`` nodes in 3 zones, then:

- plain pods: the PodPlacementRules PreFilter and Reserve for ``--pods`` pods without rules
  (in-flight begin/settle, the assume), and ``pod_rules`` parsing their bodies: what every pod now
  pays, in microseconds per pod;
- rules pods: the same for pods with a hard zone spread and hostname anti-affinity over their
  Deployment (400 pods in their namespace, each with that anti-affinity), and plain pods again
  with those 400 placed (their anti-affinity is checked against every plain pod: the symmetry),
  in milliseconds per pod;
- rules pods of ``--groups`` Deployments of ``--group-size`` pods in one namespace, all placed but
  the pods measured (``ceiling.py --shape rules``: 12 groups of 250), each with those rules over
  its own Deployment: the selector walk over a backlog of such pods;
- the grouped rules pods' NodeCheck re-check of one node (``rules_refusing``);
- soft pods: the same for ReplicaSet-owned pods of that Deployment without rules of their own
  (kube-scheduler's default spreading, scored into weighted node preferences);
- memory: tracemalloc of the cache's projections and of the watch cursor's entry, bytes per
  placed pod (measured first, each body freed after it was fed, as the watch does).

It prints figures and asserts nothing: compare before and after a change.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import tracemalloc
from typing import Any, cast

from bindery.adapters.placed import PlacedPodCache
from bindery.apiserver.watching import Cursor
from bindery.controller.watches.placed import remembered
from bindery.podrules.parse import pod_rules, soft_rules
from bindery.scheduling.framework import CycleContext, Ports, Profile
from bindery.scheduling.placementrules import PodPlacementRules, rules_refusing
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def pod_body(i: int, *, namespace: str, node: str | None, rules: bool, app: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "bindery",
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m"}}}],
    }
    if node:
        spec["nodeName"] = node
    if rules:
        selector = {"matchLabels": {"app": app}}
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector,
            }
        ]
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOST, "labelSelector": selector}
                ]
            }
        }
    return {
        "metadata": {
            "name": f"{app}-{i}",
            "namespace": namespace,
            "uid": f"uid-{namespace}-{i}",
            "labels": {"app": app, "pod-template-hash": "5d8f7c9b6d"},
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def nodes_of(count: int) -> list[NodeProjection]:
    return [
        NodeProjection(name=f"node-{i:04d}", labels={HOST: f"node-{i:04d}", ZONE: "abc"[i % 3]})
        for i in range(count)
    ]


async def per_pod(cache: PlacedPodCache, pods: list[PodInfo]) -> float:
    plugin = PodPlacementRules()
    ports = cast(Ports, cast(Any, type("P", (), {"placed": cache})()))
    profile = Profile(name="bench", scheduler_names=frozenset({"bindery"}), client=cast(Any, None))
    started = time.process_time()
    for index, pod in enumerate(pods):
        ctx = CycleContext(pod=pod, profile=profile, ports=ports)
        status = await plugin.pre_filter(ctx=ctx)
        assert status.ok, status.message
        ctx.reservation = cast(Any, type("R", (), {"node": f"node-{index % 500:04d}"})())
        await plugin.reserve(ctx=ctx)
        cache.forget(pod.uid)  # keep the cache as it was: each pod measured against the same state
    return (time.process_time() - started) / len(pods)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--placed", type=int, default=50_000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=250)
    args = parser.parse_args()
    nodes = nodes_of(args.nodes)

    tracemalloc.start()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    cache = PlacedPodCache(nodes=lambda: list(nodes))  # a fresh list of the same nodes, as the node index
    cursor = Cursor(remember=remembered)  # what the placed-pod watch keeps per pod
    cursor.begin()
    for i in range(args.placed):
        body = pod_body(
            i, namespace=f"ns-{i % 50}", node=nodes[i % len(nodes)].name, rules=False, app=f"app-{i % 500}"
        )
        body["metadata"]["resourceVersion"] = str(1_000_000 + i)
        cache.on_event("ADDED", body)
        cursor.page([body])
    cursor.end(resource_version="1")
    del body
    gc.collect()
    with_cursor = tracemalloc.get_traced_memory()[0]
    del cursor
    gc.collect()
    cache_only = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(
        f"memory ({args.placed} placed pods, tracemalloc, bodies freed): cache "
        f"{(cache_only - before) / args.placed:.0f} B/pod; cache + watch cursor "
        f"{(with_cursor - before) / args.placed:.0f} B/pod ({(with_cursor - before) / 2**20:.1f} MiB)"
    )

    plain_bodies = [
        pod_body(i, namespace="ns-1", node=None, rules=False, app="plain") for i in range(args.pods)
    ]
    started = time.process_time()
    for body in plain_bodies:
        pod_rules(body)
    parse = (time.process_time() - started) / args.pods
    started = time.process_time()
    for body in plain_bodies:
        soft_rules(body)
    soft_parse = (time.process_time() - started) / args.pods
    plain = [PodInfo.from_body(b) for b in plain_bodies]
    print(
        f"plain pods: pod_rules parse {parse * 1e6:.2f} us/pod; "
        f"soft_rules parse {soft_parse * 1e6:.2f} us/pod; "
        f"PreFilter+Reserve {asyncio.run(per_pod(cache, plain)) * 1e6:.2f} us/pod"
    )

    for i in range(400):  # the rules pods' own Deployment: 400 pods already placed
        cache.on_event(
            "ADDED",
            pod_body(
                10_000_000 + i, namespace="ns-rules", node=nodes[i % len(nodes)].name, rules=True, app="web"
            ),
        )
    rules = [
        PodInfo.from_body(pod_body(i, namespace="ns-rules", node=None, rules=True, app="web"))
        for i in range(min(args.pods, 200))
    ]
    print(
        "plain pods with 400 anti-affinity pods placed: "
        f"PreFilter+Reserve {asyncio.run(per_pod(cache, plain)) * 1e6:.2f} us/pod"
    )
    print(
        f"rules pods (zone spread + hostname anti-affinity, {args.placed + 400} placed, {args.nodes} nodes): "
        f"PreFilter+Reserve {asyncio.run(per_pod(cache, rules)) * 1e3:.2f} ms/pod"
    )
    for i in range(args.groups * args.group_size):
        cache.on_event(
            "ADDED",
            pod_body(
                20_000_000 + i,
                namespace="ns-groups",
                node=nodes[i % len(nodes)].name,
                rules=True,
                app=f"group-{i % args.groups}",
            ),
        )
    grouped = [
        PodInfo.from_body(pod_body(i, namespace="ns-groups", node=None, rules=True, app="group-0"))
        for i in range(min(args.pods, 200))
    ]
    print(
        f"rules pods ({args.groups} Deployments of {args.group_size} placed in their namespace, the same "
        f"rules over each): PreFilter+Reserve {asyncio.run(per_pod(cache, grouped)) * 1e3:.2f} ms/pod"
    )
    started = time.process_time()
    for index, pod in enumerate(grouped):
        rules_refusing(pod, cache, nodes[index % len(nodes)].name)
    print(
        "the same pods' pre-bind re-check of the chosen node (NodeCheck full): "
        f"{(time.process_time() - started) / len(grouped) * 1e3:.2f} ms/pod"
    )
    soft = []
    for i in range(min(args.pods, 200)):
        body = pod_body(i, namespace="ns-rules", node=None, rules=False, app="web")
        body["metadata"]["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": True}
        ]
        soft.append(PodInfo.from_body(body))
    print(
        f"soft pods (ReplicaSet-owned: default spreading over {args.nodes} hostnames and 3 zones, "
        f"400 of its pods placed): PreFilter+Reserve {asyncio.run(per_pod(cache, soft)) * 1e3:.2f} ms/pod"
    )


if __name__ == "__main__":
    main()
