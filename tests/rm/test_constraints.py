"""Taints, tolerations, nodeSelector and required node affinity behave as in kube-scheduler."""

from __future__ import annotations

from typing import Any

import pytest

from bindery.constraints import (
    matches_node_selector,
    matches_required_affinity,
    tolerates,
    untolerated_taints,
)

GPU = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}, True),  # "" means Equal
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "false", "effect": "NoSchedule"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),  # empty effect = all effects
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),  # empty key + Exists tolerates everything
        ({"key": "", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Gte", "value": "true"}, False),  # unknown operator
    ],
)
def test_tolerates(toleration: dict[str, Any], expected: bool) -> None:
    assert tolerates(toleration=toleration, taint=GPU) is expected


SLA = {"key": "example.com/sla", "value": "950", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("operator", "value", "taint_value", "expected"),
    [  # the cases of Kubernetes' TestTolerationToleratesTaint / TestCompareNumericValues (core/v1)
        ("Gt", "900", "950", True),
        ("Gt", "950", "950", False),
        ("Gt", "960", "950", False),
        ("Lt", "960", "950", True),
        ("Lt", "950", "950", False),
        ("Gt", "-100", "-50", True),
        ("Lt", "0", "-1", True),
        ("Gt", "0", "9223372036854775807", True),
        ("Gt", "0", "9223372036854775808", False),  # past int64: not a number
        ("Gt", "0100", "200", False),  # leading zero: not canonical
        ("Gt", "+100", "200", False),
        ("Gt", "100", "0200", False),
        ("Lt", "100", " 50", False),
        ("Gt", "-0", "5", False),
        ("Gt", "100", "high", False),
        ("Gt", "", "100", False),
    ],
)
def test_gt_and_lt_compare_values_as_int64(
    operator: str, value: str, taint_value: str, expected: bool
) -> None:
    toleration = {"key": "example.com/sla", "operator": operator, "value": value, "effect": "NoSchedule"}
    assert tolerates(toleration=toleration, taint={**SLA, "value": taint_value}) is expected


def test_gt_still_needs_the_key_and_effect_to_match() -> None:
    assert not tolerates(toleration={"key": "other", "operator": "Gt", "value": "1"}, taint=SLA)
    assert not tolerates(
        toleration={"key": "example.com/sla", "operator": "Gt", "value": "1", "effect": "NoExecute"},
        taint=SLA,
    )
    assert tolerates(toleration={"key": "example.com/sla", "operator": "Gt", "value": "1"}, taint=SLA)


def test_untolerated_taints_ignores_prefer_no_schedule_and_keeps_order() -> None:
    taints = [
        {"key": "a", "effect": "PreferNoSchedule"},
        {"key": "b", "value": "1", "effect": "NoExecute"},
        GPU,
    ]
    assert untolerated_taints(taints=taints, tolerations=[]) == [taints[1], GPU]
    assert untolerated_taints(taints=taints, tolerations=[{"key": "b", "operator": "Exists"}]) == [GPU]
    assert untolerated_taints(taints=taints, tolerations=[{"operator": "Exists"}]) == []
    assert untolerated_taints(taints=taints, tolerations=[], effects=("PreferNoSchedule",)) == [taints[0]]


def test_node_selector() -> None:
    labels = {"zone": "a", "gpu": "true"}
    assert matches_node_selector(node_selector={}, labels=labels)
    assert matches_node_selector(node_selector={"zone": "a"}, labels=labels)
    assert not matches_node_selector(node_selector={"zone": "b"}, labels=labels)
    assert not matches_node_selector(node_selector={"rack": ""}, labels=labels)
    assert matches_node_selector(node_selector={"rack": ""}, labels={"rack": ""})


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


LABELS = {"zone": "a", "cores": "16"}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        (expr("zone", "In", "a", "b"), True),
        (expr("zone", "In", "c"), False),
        (expr("zone", "NotIn", "c"), True),
        (expr("zone", "NotIn", "a"), False),
        (expr("missing", "NotIn", "a"), True),  # absent label satisfies NotIn
        (expr("missing", "In", "a"), False),
        (expr("zone", "Exists"), True),
        (expr("missing", "Exists"), False),
        (expr("missing", "DoesNotExist"), True),
        (expr("zone", "DoesNotExist"), False),
        (expr("cores", "Gt", "8"), True),
        (expr("cores", "Gt", "16"), False),
        (expr("cores", "Lt", "32"), True),
        (expr("zone", "Gt", "1"), False),  # label is not an integer
        (expr("missing", "Lt", "1"), False),
        (expr("cores", "Gt", "x"), False),  # invalid operand: term matches nothing
        (expr("cores", "Gt", "1", "2"), False),
        (expr("zone", "In"), False),  # In needs values
        (expr("zone", "Exists", "a"), False),  # Exists takes none
        (expr("zone", "Bogus", "a"), False),
        ({}, False),  # an empty term matches nothing
        ({"matchExpressions": [], "matchFields": []}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}, False),
        ({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["n1"]}]}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}, False),
        (
            {
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
            },
            True,
        ),
        (
            {
                "matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]},
                    {"key": "cores", "operator": "Lt", "values": ["4"]},
                ]
            },
            False,  # expressions are ANDed
        ),
    ],
)
def test_single_term(term: dict[str, Any], expected: bool) -> None:
    assert matches_required_affinity(terms=[term], labels=LABELS, node_name="n1") is expected


def test_terms_are_ored_and_empty_list_matches() -> None:
    assert matches_required_affinity(terms=[], labels=LABELS, node_name="n1")
    assert matches_required_affinity(
        terms=[expr("zone", "In", "b"), expr("zone", "In", "a")], labels=LABELS, node_name="n1"
    )
    assert not matches_required_affinity(terms=[expr("zone", "In", "b"), {}], labels=LABELS, node_name="n1")
