"""CPU of one reference-RM preemption proposal with many PodDisruptionBudgets in the cluster.

Run:  .venv/bin/python benchmarks/preemption_pdb_bench.py [--budgets 10000] [--namespaces 1000]
      [--nodes 100] [--pods-per-node 10] [--rounds 7]

What the store's chooser runs inside its placement lock for a pod nothing fits
(:func:`bindery.reference_rm.preemption.choose_victims`): ``--nodes`` full nodes, each with
``--pods-per-node`` lower-priority pods of ``--namespaces`` namespaces, and ``--budgets``
PodDisruptionBudgets spread evenly over those namespaces (a tenant's own budgets), one in ten of them
covering pods and allowing no disruption, so the reprieve gives protected pods back first. It prints
the median and the worst wall-clock milliseconds per proposal over ``--rounds`` rounds, and what
replacing one budget costs the mirror. It asserts nothing. Runs against any checkout (the PYTHONPATH
decides): without a budget index the budgets are handed over as a tuple, as the server did.
"""

from __future__ import annotations

import argparse
import statistics
import time
from decimal import Decimal
from typing import Any

from bindery.podrules.parse import label_selector
from bindery.reference_rm import preemption
from bindery.reference_rm.accounting import BoundPod, ClusterPods
from bindery.reference_rm.placement import InventoryNode
from bindery.reference_rm.preemption import Budget, choose_victims


def _budgets(count: int, namespaces: int) -> list[Budget]:
    budgets = []
    for index in range(count):
        namespace = f"ns-{index % namespaces}"
        covering = index % 10 == 0
        budgets.append(
            Budget(
                namespace=namespace,
                name=f"pdb-{index}",
                selector=label_selector({"matchLabels": {"app": "a0" if covering else f"other-{index}"}}),
                disruptions_allowed=0 if covering else 1,
            )
        )
    return budgets


def _cluster(*, nodes: int, per_node: int, namespaces: int) -> tuple[tuple[InventoryNode, ...], ClusterPods]:
    inventory = tuple(
        InventoryNode(
            name=f"node-{n:04d}",
            allocatable={"cpu": Decimal(per_node), "memory": Decimal(per_node * 2**30), "pods": Decimal(110)},
        )
        for n in range(nodes)
    )
    placed: list[BoundPod] = []
    for n, node in enumerate(inventory):
        placed.extend(
            BoundPod(
                uid=f"uid-{n}-{p}",
                key=f"ns-{(n * per_node + p) % namespaces}/pod-{n}-{p}",
                node=node.name,
                usage={"cpu": Decimal(1), "memory": Decimal(2**30), "pods": Decimal(1)},
                priority=p % 3,
                labels=(("app", f"a{p % 2}"),),
            )
            for p in range(per_node)
        )
    return inventory, ClusterPods.of(placed)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budgets", type=int, default=10_000)
    parser.add_argument("--namespaces", type=int, default=1_000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods-per-node", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    nodes, pods = _cluster(nodes=options.nodes, per_node=options.pods_per_node, namespaces=options.namespaces)
    budgets = _budgets(options.budgets, options.namespaces)
    index_type = getattr(preemption, "BudgetIndex", None)
    known: Any = index_type.of(budgets) if index_type is not None else tuple(budgets)
    used = {
        node.name: {"cpu": Decimal(options.pods_per_node), "pods": Decimal(options.pods_per_node)}
        for node in nodes
    }
    placement = {"node_selector": {}, "affinity_terms": [], "tolerations": []}
    figures = []
    for _ in range(options.rounds):
        started = time.perf_counter()
        found = choose_victims(
            nodes=nodes,
            requests={"cpu": Decimal(3), "memory": Decimal(2**30)},
            priority=10,
            placement=placement,
            used_by_node=used,
            pods=pods,
            budgets=known,
        )
        figures.append((time.perf_counter() - started) * 1000)
        assert found is not None
    print(
        f"{options.budgets} budgets in {options.namespaces} namespaces, {options.nodes} nodes x "
        f"{options.pods_per_node} pods ({'index' if index_type else 'tuple'}): "
        f"median {statistics.median(figures):.1f} ms, worst {max(figures):.1f} ms per proposal "
        f"({options.rounds} rounds; victims {len(found.victims)} on {found.node})"
    )
    if index_type is not None and budgets:
        changes = []
        for round_ in range(options.rounds):
            replaced = budgets[round_ % len(budgets)]
            started = time.perf_counter()
            known = known.put(
                Budget(
                    namespace=replaced.namespace,
                    name=replaced.name,
                    selector=replaced.selector,
                    disruptions_allowed=round_,
                )
            )
            changes.append((time.perf_counter() - started) * 1000)
        print(f"one budget changed: median {statistics.median(changes):.3f} ms, worst {max(changes):.3f} ms")


if __name__ == "__main__":
    main()
