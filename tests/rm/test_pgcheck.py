"""The chaos suite's independent checker (`tests.pgcheck`) names each way a run can go wrong: a
checker that cannot fail would make `tests/chaos/test_pg_chaos.py` prove nothing."""

from __future__ import annotations

import json
from typing import Any

from tests.pgcheck import independent_violations, millicores

NODES = {"n1": 1000, "n2": 1000}


def pod(name: str, node: str | None, cpu: str = "400m") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Pending"},
    }


def row(name: str, node: str, state: str = "committed", cpu: str = "400m", rid: str = "") -> dict[str, str]:
    return {
        "id": rid or f"rsv-{name}",
        "pod_uid": f"uid-{name}",
        "namespace": "ns",
        "name": name,
        "node": node,
        "state": state,
        "resources": json.dumps({"cpu": cpu}),
    }


def check(
    rows: list[dict[str, str]], pods: list[dict[str, Any]], events: list[Any] | None = None
) -> list[str]:
    return independent_violations(rows=rows, nodes=NODES, pods=pods, events=events or [], namespace="ns")


def test_a_settled_run_has_no_violations() -> None:
    assert check([row("a", "n1"), row("b", "n2")], [pod("a", "n1"), pod("b", "n2")]) == []


def test_each_way_of_going_wrong_is_named() -> None:
    overcommitted_by_pods = check(
        [row("a", "n1"), row("b", "n1"), row("c", "n1")],
        [pod("a", "n1"), pod("b", "n1"), pod("c", "n1")],
    )
    assert "node n1: bound pods request 1200m of 1000m" in overcommitted_by_pods
    assert "node n1: the RM's active rows hold 1200m of 1000m" in overcommitted_by_pods
    lost = check([], [pod("a", "n1")])
    assert lost == ["pod a (uid-a) bound to n1 has 0 active reservations"]
    doubled = check([row("a", "n1"), row("a", "n2", rid="rsv-again")], [pod("a", "n1")])
    assert doubled == ["pod a (uid-a) bound to n1 has 2 active reservations"]
    elsewhere = check([row("a", "n2", state="reserved")], [pod("a", "n1")])
    assert elsewhere == ["pod a bound to n1: its reservation is reserved on n2"]
    leaked = check([row("gone", "n1")], [])
    assert leaked == ["reservation rsv-gone of gone (uid-gone): no bound pod holds it"]
    twice = [
        {"reason": "Scheduled", "regarding": {"uid": "uid-a", "name": "a"}},
        {"reason": "Scheduled", "regarding": {"uid": "uid-a", "name": "a"}},
    ]
    assert check([row("a", "n1")], [pod("a", "n1")], twice) == ["pod a (uid-a) was scheduled 2 times"]


def test_millicores_reads_the_forms_kubernetes_echoes() -> None:
    assert [millicores(q) for q in ("100m", "1", "0.5", "2")] == [100, 1000, 500, 2000]
