"""CPU per pod of the scheduling cycle's bookkeeping around the rules (no apiserver, no RM).

Run:  .venv/bin/python benchmarks/inflight_bench.py [--window 256] [--pods 3000] [--placed 1500]

What issue 19's rules backlog (``ceiling.py --shape rules``: 12 Deployments whose pods each have a
hard zone spread and a hostname anti-affinity over their Deployment) pays per pod besides the
rules' evaluation:

- in-flight: ``InFlight.begin`` and ``earlier_related`` for each pod while ``--window`` cycles are in
  flight (the ResourceManager's maxInFlight, 256 by default), the oldest settled as each new one
  begins; the pods of the 12 Deployments interleaved as the queue hands them out;
- rule victims: ``rule_victims`` for one such pod against ``--placed`` pods on ``--nodes`` nodes, every
  pod of one priority (the rules exclude nodes, so PreFilter looks for a rule's victims each cycle).

It prints microseconds per pod and asserts nothing: compare before and after a change.
"""

from __future__ import annotations

import argparse
import collections
import time

from podrules_bench import nodes_of, pod_body  # benchmarks/ is sys.path[0] when run as a script

from bindery.adapters.placed import PlacedPodCache
from bindery.scheduling.placementrules import InFlight, rule_victims, rules_verdict
from bindery.scheduling.podspec import PodInfo

GROUPS = 12


def in_flight(window: int, pods: int) -> tuple[float, float]:
    """µs per pod, and the mean number of earlier related cycles found."""
    infos = [
        PodInfo.from_body(pod_body(i, namespace="bench", node=None, rules=True, app=f"app-{i % GROUPS}"))
        for i in range(pods)
    ]
    flight = InFlight()
    flying: collections.deque[str] = collections.deque()
    found = 0
    started = time.process_time()
    for info in infos:
        if len(flying) >= window:
            flight.settle(flying.popleft())
        cycle = flight.begin(info)
        flying.append(info.uid)
        found += len(flight.earlier_related(cycle, namespace_labels=lambda namespace: None))
    return (time.process_time() - started) / pods * 1e6, found / pods


def victims(placed: int, node_count: int, repeat: int) -> float:
    """µs per rule_victims call."""
    nodes = nodes_of(node_count)
    cache = PlacedPodCache(nodes=lambda: nodes)
    for i in range(placed):
        body = pod_body(
            i, namespace="bench", node=nodes[i % node_count].name, rules=True, app=f"app-{i % GROUPS}"
        )
        cache.on_event("ADDED", body)
    pod = PodInfo.from_body(pod_body(placed, namespace="bench", node=None, rules=True, app="app-0"))
    verdict = rules_verdict(pod, cache)
    assert verdict is not None, "the bench pod has rules"
    assert verdict.effects, "the bench pod's rules must exclude nodes"
    started = time.process_time()
    for _ in range(repeat):
        rule_victims(pod, cache, verdict)
    return (time.process_time() - started) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--placed", type=int, default=1500)
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args()
    per_pod, related = in_flight(args.window, args.pods)
    print(
        f"in-flight: {per_pod:8.1f} µs/pod  (window {args.window}, {GROUPS} Deployments, "
        f"{related:.1f} earlier related cycles per pod)"
    )
    per_call = victims(args.placed, args.nodes, 500)
    print(f"rule victims: {per_call:8.1f} µs/call  ({args.placed} placed, {args.nodes} nodes)")


if __name__ == "__main__":
    main()
