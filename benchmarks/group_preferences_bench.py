"""CPU of one reference-RM group placement whose members carry maximal node preferences.

Run:  .venv/bin/python benchmarks/group_preferences_bench.py [--nodes 1000] [--members 8]
      [--kinds N] [--terms 64] [--expressions 64] [--values 1] [--rounds 7]

What the store runs inside its placement lock for a group reserve
(:func:`bindery.reference_rm.groups.place_group`): ``--members`` members of ``--kinds`` kinds
(default: each its own), each kind with ``--terms`` preferred node terms (the contract's cap: 64)
of ``--expressions`` ``In`` requirements (cap: 64) of ``--values`` values (cap: 256; a group's
body is capped at 2 MiB, which 8 kinds of 64 x 64 one-value requirements nearly fill), on
``--nodes`` nodes labelled so every requirement but each term's last holds on every node (a term is
read to its end, the worst case
for a matcher that stops at the first failing requirement), and the last one holds on a quarter of
the nodes. The inventory is one tuple, as the server holds it; every round places the group from
the same usage, as a retry after a release does, with members built afresh (a retry is a new
request: its terms are new dicts of the same content, so only a memo by content helps). It
prints the median and worst wall-clock milliseconds per placement over ``--rounds`` rounds (the
first round apart: it compiles), and asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from decimal import Decimal
from typing import Any

from bindery.reference_rm.groups import MemberAsk, place_group
from bindery.reference_rm.placement import InventoryNode, Policy


def _inventory(count: int, expressions: int) -> tuple[InventoryNode, ...]:
    return tuple(
        InventoryNode(
            name=f"node-{index:04d}",
            allocatable={"cpu": Decimal(64), "memory": Decimal(256 * 2**30), "pods": Decimal(110)},
            labels={
                **{f"bench.bindery.dev/k{key}": f"v{key}" for key in range(expressions - 1)},
                "bench.bindery.dev/quarter": f"q{index % 4}",
                "topology.kubernetes.io/zone": f"zone-{index % 3}",
            },
        )
        for index in range(count)
    )


def _preferences(
    member: int, *, terms: int, expressions: int, values: int
) -> list[tuple[int, dict[str, Any]]]:
    def requirement(key: str, wanted: str) -> dict[str, Any]:
        return {"key": key, "operator": "In", "values": [wanted] + [f"x{v}" for v in range(values - 1)]}

    return [
        (
            1 + (member * 7 + term) % 100,
            {
                "matchExpressions": [
                    requirement(f"bench.bindery.dev/k{key}", f"v{key}") for key in range(expressions - 1)
                ]
                + [requirement("bench.bindery.dev/quarter", f"q{(member + term) % 4}")]
            },
        )
        for term in range(terms)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--terms", type=int, default=64)
    parser.add_argument("--expressions", type=int, default=64)
    parser.add_argument("--kinds", type=int, default=0, help="distinct preference sets (0: one per member)")
    parser.add_argument("--values", type=int, default=1)
    parser.add_argument("--topology", action="store_true", help="members share one zone (3 zones)")
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    nodes = _inventory(options.nodes, options.expressions)

    def members() -> list[MemberAsk]:
        return [
            MemberAsk(
                label=f"bench/m{member}",
                requests={"cpu": Decimal(1), "memory": Decimal(2**30)},
                preferences=_preferences(
                    member % (options.kinds or options.members),
                    terms=options.terms,
                    expressions=options.expressions,
                    values=options.values,
                ),
            )
            for member in range(options.members)
        ]

    figures = []
    for _ in range(options.rounds + 1):
        asks = members()
        started = time.perf_counter()
        decision = place_group(
            group="bench/gang",
            members=asks,
            topology_keys=["topology.kubernetes.io/zone"] if options.topology else [],
            nodes=nodes,
            usage_by_node={},
            policy=Policy.BINPACK,
        )
        figures.append((time.perf_counter() - started) * 1000)
        assert decision.nodes is not None, decision.reason
    first, rest = figures[0], figures[1:]
    print(
        f"{options.members} members of {options.kinds or options.members} kinds x {options.terms} terms x "
        f"{options.expressions} expressions x "
        f"{options.values} values on {options.nodes} nodes{' (zone topology)' if options.topology else ''}: "
        f"first {first:.1f} ms; then median {statistics.median(rest):.1f} ms, worst {max(rest):.1f} ms "
        f"per placement ({options.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
