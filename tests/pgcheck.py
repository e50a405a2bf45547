"""What "nothing lost, nothing doubled, nothing overcommitted" means for the reference RM's replicas on
PostgreSQL, judged from the RM's rows (read with SQL) and the apiserver's pods and events.

Why a checker of its own: the store's code decides what it writes and what it reports, so a check
that asked the store (or shared its usage arithmetic) would repeat its mistakes. This one shares no
code with it; `bindery audit` is run beside it as the product's own check.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from tests.realrm import double_schedules


def millicores(quantity: str) -> int:
    """CPU quantity to millicores: only the forms these tests write and Kubernetes echoes back."""
    text = str(quantity)
    if text.endswith("m"):
        return int(text[:-1])
    return round(float(text) * 1000)


def active_rows(db: str) -> list[dict[str, str]]:
    """The RM's active reservations, read with SQL from its tables (not through the store)."""
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT id, pod_uid, namespace, name, node, state, resources FROM reservations "
            "WHERE state IN ('reserved', 'committed')"
        ).fetchall()
    keys = ("id", "pod_uid", "namespace", "name", "node", "state", "resources")
    return [dict(zip(keys, (str(value) for value in row), strict=True)) for row in rows]


def independent_violations(
    *,
    rows: Sequence[Mapping[str, str]],
    nodes: Mapping[str, int],
    pods: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    namespace: str,
) -> list[str]:
    """Pure: what does not hold now, one line each. `nodes`: pool node -> allocatable millicores;
    `pods`: every pod of `namespace`; `rows`: every active row of the RM's database."""
    lines = double_schedules(events)
    by_pods: collections.Counter[str] = collections.Counter()
    by_rows: collections.Counter[str] = collections.Counter()
    bound = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            bound[pod["metadata"]["uid"]] = (pod["metadata"]["name"], node)
            for container in pod["spec"]["containers"]:
                by_pods[node] += millicores(container["resources"]["requests"]["cpu"])
    for row in rows:
        by_rows[row["node"]] += millicores(json.loads(row["resources"]).get("cpu", "0"))
    for node, allocatable in sorted(nodes.items()):
        if by_pods[node] > allocatable:
            lines.append(f"node {node}: bound pods request {by_pods[node]}m of {allocatable}m")
        if by_rows[node] > allocatable:
            lines.append(f"node {node}: the RM's active rows hold {by_rows[node]}m of {allocatable}m")
    rows_of: dict[str, list[Mapping[str, str]]] = collections.defaultdict(list)
    for row in rows:
        rows_of[row["pod_uid"]].append(row)
    for uid, (name, node) in sorted(bound.items()):
        mine = rows_of.get(uid, [])
        if len(mine) != 1:
            lines.append(f"pod {name} ({uid}) bound to {node} has {len(mine)} active reservations")
        elif mine[0]["node"] != node or mine[0]["state"] != "committed":
            lines.append(
                f"pod {name} bound to {node}: its reservation is {mine[0]['state']} on {mine[0]['node']}"
            )
    for uid, mine in sorted(rows_of.items()):
        if uid not in bound and any(row["namespace"] == namespace for row in mine):
            lines.append(f"reservation {mine[0]['id']} of {mine[0]['name']} ({uid}): no bound pod holds it")
    return lines
