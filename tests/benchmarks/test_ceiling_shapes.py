"""The rules shape of benchmarks/ceiling.py (issue 19's second budget), without a plane.

The backlog is only a fair comparison if every group can be placed under both rules at once, so
these check the pods the script creates: each carries a hard zone spread and a required hostname
anti-affinity over its own group, and no group outgrows half the nodes.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ceiling() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ceiling_bench", ROOT / "benchmarks" / "ceiling.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_a_rules_pod_spreads_over_zones_and_repels_its_group_per_host(ceiling: ModuleType) -> None:
    body = ceiling.pod_body(name="p", scheduler_name="s", index=7, shape=ceiling.RULES, groups=3)
    assert body["metadata"]["labels"] == {"app": "g1"}
    (spread,) = body["spec"]["topologySpreadConstraints"]
    assert spread == {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "g1"}},
    }
    (term,) = body["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": {"app": "g1"}}, "topologyKey": "kubernetes.io/hostname"}


def test_a_plain_pod_has_no_rules(ceiling: ModuleType) -> None:
    body = ceiling.pod_body(name="p", scheduler_name="s", index=7)
    assert "labels" not in body["metadata"]
    assert "affinity" not in body["spec"]
    assert "topologySpreadConstraints" not in body["spec"]


@pytest.mark.parametrize(("pods", "nodes"), [(5000, 500), (3000, 500), (2000, 100), (30, 4), (1, 1)])
def test_no_group_outgrows_half_the_nodes(ceiling: ModuleType, pods: int, nodes: int) -> None:
    groups = ceiling.rule_groups(pods=pods, nodes=nodes)
    largest = max(sum(1 for i in range(pods) if i % groups == g) for g in range(groups))
    assert largest <= max(1, nodes // 2)
