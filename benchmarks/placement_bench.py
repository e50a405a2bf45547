"""CPU of the reference RM's placement per reserve, measured alone (no HTTP, no SQLite).

Run:  .venv/bin/python benchmarks/placement_bench.py [--nodes 500] [--calls 300] [--profile]

Builds the ceiling benchmark's inventory (``--nodes`` nodes of 64 CPUs, 256Gi, 110 pods, as Node
objects through :func:`bindery.refrm.inventory.node_from_object`), the capacity in use of a backlog
half placed (each node holding a few of the benchmark's pods), and then times
:func:`bindery.refrm.placement.choose_node` for the benchmark's three pod sizes, each placement
accounted before the next as the store does.  It prints milliseconds of CPU per call for each
policy, and with ``--profile`` cProfile's top functions.  It asserts nothing: compare the figure
before and after a change to placement (benchmarks/PROFILE.md).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time
from decimal import Decimal

from bindery.quantity import parse_quantity
from bindery.refrm.inventory import node_from_object
from bindery.refrm.placement import InventoryNode, Policy, add_usage, choose_node, effective_usage

SIZES = [("100m", "64Mi"), ("250m", "128Mi"), ("500m", "256Mi")]


TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


def inventory(count: int, *, constraints: bool) -> tuple[InventoryNode, ...]:
    nodes = []
    for index in range(count):
        obj = {
            "metadata": {"name": f"node-{index + 1:04d}", "labels": {"type": "kwok", "pool": "bench"}},
            "spec": {"taints": [TAINT] if constraints else []},
            "status": {
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        node = node_from_object(obj)
        assert node is not None
        nodes.append(node)
    return tuple(nodes)  # as the server holds it: one immutable tuple per inventory


def requests(index: int) -> dict[str, Decimal]:
    cpu, memory = SIZES[index % len(SIZES)]
    return {"cpu": parse_quantity(cpu), "memory": parse_quantity(memory)}


def run(
    *, nodes: tuple[InventoryNode, ...], calls: int, policy: Policy, seed: int, constraints: bool
) -> float:
    rng = random.Random(seed)
    usage: dict[str, dict[str, Decimal]] = {}
    for node in nodes:
        for index in range(rng.randrange(0, 8)):
            add_usage(usage, node.name, effective_usage(requests(index), node))
    tolerations = [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}] if constraints else []
    by_name = {node.name: node for node in nodes}
    started = time.process_time()
    for index in range(calls):
        pod = requests(index)
        decision = choose_node(
            nodes=nodes,
            requests=pod,
            usage_by_node=usage,
            node_selector={"pool": "bench"} if constraints else {},
            affinity_terms=[],
            tolerations=tolerations,
            policy=policy,
        )
        assert decision.node is not None, decision.reason
        add_usage(usage, decision.node, effective_usage(pod, by_name[decision.node]))
    return (time.process_time() - started) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument(
        "--constraints",
        action="store_true",
        help="tainted nodes and pods with a nodeSelector and a toleration (default: none, as in ceiling.py)",
    )
    options = parser.parse_args()
    nodes = inventory(options.nodes, constraints=options.constraints)
    more = {"constraints": options.constraints}
    for policy in Policy:
        run(nodes=nodes, calls=20, policy=policy, seed=1, **more)  # warm up
        best = min(run(nodes=nodes, calls=options.calls, policy=policy, seed=2, **more) for _ in range(3))
        print(f"{policy.value:8s} {options.nodes} nodes: {best:.3f} ms CPU per choose_node (best of 3)")
    if options.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        run(nodes=nodes, calls=options.calls, policy=Policy.BINPACK, seed=2, **more)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
