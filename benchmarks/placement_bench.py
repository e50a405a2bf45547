"""CPU of the reference RM's placement per reserve, measured alone (no HTTP, no SQLite).

Run:  .venv/bin/python benchmarks/placement_bench.py [--nodes 500] [--pods 5000] [--profile]

The ceiling benchmark's backlog as the RM's placement sees it: ``--nodes`` nodes of 64 CPUs, 256Gi
and 110 pods (Node objects through :func:`bindery.reference_rm.inventory.node_from_object`, one inventory
tuple as the server holds it), and ``--pods`` pods of the benchmark's three sizes placed one after
the other from empty nodes by :func:`bindery.reference_rm.placement.choose_node`, each placement accounted
in place before the next as the store does (so bin-packing fills node after node to 110 pods, and
the full ones answer "Too many pods").  It prints the mean milliseconds of CPU per call for each
policy, and with ``--profile`` cProfile's top functions.  ``--constraints`` adds a taint on every
node and a nodeSelector and a toleration on every pod; ``--preferences`` gives every pod a
preferred node term (contract v1.2) that half the nodes match, so every call takes the scored path
(NodeAffinity and TaintToleration with the policy).  ``--rules`` gives every pod what Bindery
sends for ceiling.py's ``--shape rules`` (a hard zone spread and a hostname anti-affinity over its
group, groups of half the nodes): one term of ``kubernetes.io/hostname NotIn`` the group's nodes so
far (split at 256 values) and ``zone In`` the zones with the fewest of the group's pods, so every
pod's constraints are new.  ``--selector`` gives every pod a nodeSelector on a rack (a tenth
of the nodes) and a required ``zone In`` two of three zones.  ``--percentage`` passes
``percentage_of_nodes_to_score`` (the RM's ``--percentage-of-nodes-to-score``; 0 adaptive, 100 every
node) and carries each call's ``next_start`` to the next, as the store does; without it the call
is made as on a main without sampling, so the same command measures both.  ``--rounds`` repeats
the run and prints the median and the worst round.  It asserts nothing: compare the figure
before and after a change to placement (benchmarks/PROFILE.md).
"""

from __future__ import annotations

import argparse
import cProfile
import math
import pstats
import statistics
import time
from collections import Counter
from decimal import Decimal
from typing import Any

from bindery.quantity import parse_quantity
from bindery.reference_rm.inventory import node_from_object
from bindery.reference_rm.placement import InventoryNode, Policy, add_usage, choose_node, effective_usage

SIZES = [("100m", "64Mi"), ("250m", "128Mi"), ("500m", "256Mi")]


TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


def inventory(count: int, *, constraints: bool) -> tuple[InventoryNode, ...]:
    nodes = []
    for index in range(count):
        obj = {
            "metadata": {
                "name": f"node-{index + 1:04d}",
                "labels": {
                    "type": "kwok",
                    "pool": "bench",
                    "half": "ab"[index % 2],
                    "kubernetes.io/hostname": f"node-{index + 1:04d}",
                    "topology.kubernetes.io/zone": f"zone-{index % 3}",
                    "rack": f"rack-{index % 10}",
                },
            },
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


SELECTOR_TERM = {
    "matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-0", "zone-1"]}
    ]
}
PREFERENCES = [(50, {"matchExpressions": [{"key": "half", "operator": "In", "values": ["a"]}]})]


class Rules:
    """The node requirements of ceiling.py's rules pods, as Bindery sends them, kept up to date."""

    def __init__(self, *, nodes: int, pods: int) -> None:
        self.groups = max(1, math.ceil(pods / max(1, nodes // 2)))
        self.taken: dict[int, list[str]] = {}
        self.zones: dict[int, Counter[str]] = {}

    def terms(self, index: int) -> list[dict[str, Any]]:
        group = index % self.groups
        names = sorted(self.taken.get(group, []))
        counts = self.zones.setdefault(group, Counter({f"zone-{z}": 0 for z in range(3)}))
        low = min(counts.values())
        expressions: list[dict[str, Any]] = [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": names[i : i + 256]}
            for i in range(0, len(names), 256)
        ]
        zones = sorted(zone for zone, count in counts.items() if count <= low)
        expressions.append({"key": "topology.kubernetes.io/zone", "operator": "In", "values": zones})
        return [{"matchExpressions": expressions}]

    def placed(self, index: int, node: InventoryNode) -> None:
        group = index % self.groups
        self.taken.setdefault(group, []).append(node.name)
        self.zones[group][node.labels["topology.kubernetes.io/zone"]] += 1


def run(
    *,
    nodes: tuple[InventoryNode, ...],
    calls: int,
    policy: Policy,
    constraints: bool,
    preferences: bool,
    rules: bool = False,
    selector: bool = False,
    percentage: int | None = None,
) -> float:
    usage: dict[str, dict[str, Decimal]] = {}
    tolerations = [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}] if constraints else []
    by_name = {node.name: node for node in nodes}
    ruled = Rules(nodes=len(nodes), pods=calls) if rules else None
    node_selector = {"pool": "bench"} if constraints else {}
    affinity: list[dict[str, Any]] = []
    if selector:
        node_selector = {**node_selector, "rack": "rack-3"}
        affinity = [SELECTOR_TERM]
    sampling: dict[str, int] = {}
    if percentage is not None:
        sampling = {"percentage_of_nodes_to_score": percentage, "start": 0}
    started = time.process_time()
    for index in range(calls):
        pod = requests(index)
        decision = choose_node(
            nodes=nodes,
            requests=pod,
            usage_by_node=usage,
            node_selector=node_selector,
            affinity_terms=ruled.terms(index) if ruled else affinity,
            tolerations=tolerations,
            policy=policy,
            preferences=PREFERENCES if preferences else (),
            **sampling,
        )
        assert decision.node is not None, decision.reason
        if sampling:
            sampling["start"] = decision.next_start
        if ruled:
            ruled.placed(index, by_name[decision.node])
        add_usage(usage, decision.node, effective_usage(pod, by_name[decision.node]))
    return (time.process_time() - started) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument(
        "--constraints",
        action="store_true",
        help="tainted nodes and pods with a nodeSelector and a toleration (default: none, as in ceiling.py)",
    )
    parser.add_argument(
        "--preferences", action="store_true", help="every pod prefers the half of the nodes labelled half=a"
    )
    parser.add_argument(
        "--rules", action="store_true", help="every pod's hard zone spread and hostname anti-affinity"
    )
    parser.add_argument(
        "--selector", action="store_true", help="every pod's nodeSelector on a rack and required zone In"
    )
    parser.add_argument(
        "--percentage", type=int, help="percentage_of_nodes_to_score (default: not passed, every node)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per policy: the median and worst")
    parser.add_argument("--policy", choices=[p.value for p in Policy], help="only this policy")
    options = parser.parse_args()
    nodes = inventory(options.nodes, constraints=options.constraints)
    more: dict[str, Any] = {
        "constraints": options.constraints,
        "preferences": options.preferences,
        "rules": options.rules,
        "selector": options.selector,
    }
    if options.percentage is not None:
        more["percentage"] = options.percentage
    policies = [Policy(options.policy)] if options.policy else list(Policy)
    for policy in policies:
        rounds = [run(nodes=nodes, calls=options.pods, policy=policy, **more) for _ in range(options.rounds)]
        median = statistics.median(rounds)
        print(
            f"{policy.value:8s} {options.nodes} nodes, {options.pods} pods: {median:.3f} ms "
            f"CPU per choose_node (median of {len(rounds)}, worst {max(rounds):.3f})"
        )
    if options.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        run(nodes=nodes, calls=options.pods, policy=policies[0], **more)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
