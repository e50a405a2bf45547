"""check_node: what each mode checks and the exact messages users see in events."""

from __future__ import annotations

from typing import Any

import pytest

from bindery.scheduling.nodecheck import NodeCheckMode, check_node, format_taint
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.fakes import pod

PREFIX = 'resource manager "gpu-pool" chose node "n1"'


def check(
    node: NodeProjection | None, *, mode: NodeCheckMode = NodeCheckMode.FULL, **pod_fields: Any
) -> str | None:
    return check_node(pod=pod("p", **pod_fields), node_name="n1", node=node, rm_name="gpu-pool", mode=mode)


def test_healthy_matching_node_passes() -> None:
    node = NodeProjection(
        name="n1", labels={"zone": "a"}, taints=({"key": "x", "effect": "PreferNoSchedule"},)
    )
    assert check(node, node_selector={"zone": "a"}) is None


def test_missing_node() -> None:
    assert check(None) == f"{PREFIX}, which does not exist"


def test_deleting_node() -> None:
    assert check(NodeProjection(name="n1", deleting=True)) == f"{PREFIX}, which is being deleted"


def test_cordoned_node_unless_the_pod_tolerates_the_unschedulable_taint() -> None:
    cordoned = NodeProjection(name="n1", unschedulable=True)
    assert check(cordoned) == f"{PREFIX}, which is cordoned (spec.unschedulable)"
    daemon = ({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},)
    assert check(cordoned, tolerations=daemon) is None


def test_untolerated_taints_are_listed() -> None:
    node = NodeProjection(
        name="n1",
        taints=(
            {"key": "gpu", "value": "yes", "effect": "NoSchedule"},
            {"key": "maintenance", "effect": "NoExecute"},
            {"key": "soft", "effect": "PreferNoSchedule"},
        ),
    )
    assert check(node) == (
        f"{PREFIX}, whose taints {{gpu=yes:NoSchedule}}, {{maintenance:NoExecute}} the pod does not tolerate"
    )
    assert check(node, tolerations=({"key": "maintenance", "operator": "Exists"},)) == (
        f"{PREFIX}, whose taint {{gpu=yes:NoSchedule}} the pod does not tolerate"
    )
    assert check(node, tolerations=({"operator": "Exists"},)) is None


def test_node_selector_mismatch() -> None:
    node = NodeProjection(name="n1", labels={"zone": "b"})
    assert (
        check(node, node_selector={"zone": "a"}) == f"{PREFIX}, which does not match the pod's nodeSelector"
    )


def test_required_affinity_mismatch() -> None:
    node = NodeProjection(name="n1", labels={"zone": "b"})
    terms = ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},)
    assert (
        check(node, affinity_terms=terms)
        == f"{PREFIX}, which does not match the pod's required node affinity"
    )
    assert check(NodeProjection(name="n1", labels={"zone": "a"}), affinity_terms=terms) is None


@pytest.mark.parametrize(
    ("node", "basic", "off"),
    [
        (None, f"{PREFIX}, which does not exist", None),
        (NodeProjection(name="n1", deleting=True), f"{PREFIX}, which is being deleted", None),
        (NodeProjection(name="n1", unschedulable=True), None, None),
        (NodeProjection(name="n1", taints=({"key": "t", "effect": "NoSchedule"},)), None, None),
    ],
    ids=["missing", "deleting", "cordoned", "tainted"],
)
def test_basic_checks_existence_only_and_off_checks_nothing(
    node: NodeProjection | None, basic: str | None, off: str | None
) -> None:
    assert check(node, mode=NodeCheckMode.BASIC) == basic
    assert check(node, mode=NodeCheckMode.OFF) == off


def test_modes_are_named_as_in_the_crd() -> None:
    assert [mode.value for mode in NodeCheckMode] == ["Full", "Basic", "Off"]


def test_format_taint() -> None:
    assert format_taint({"key": "a", "value": "b", "effect": "NoSchedule"}) == "{a=b:NoSchedule}"
    assert format_taint({"key": "a", "effect": "NoExecute"}) == "{a:NoExecute}"


def test_node_projection_from_body() -> None:
    node = NodeProjection.from_body(
        {
            "metadata": {"name": "n1", "labels": {"zone": "a"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"unschedulable": True, "taints": [{"key": "k", "effect": "NoSchedule"}]},
        }
    )
    assert node == NodeProjection(
        name="n1",
        labels={"zone": "a"},
        taints=({"key": "k", "effect": "NoSchedule"},),
        unschedulable=True,
        deleting=True,
    )
    assert NodeProjection.from_body({"metadata": {"name": "n2"}}) == NodeProjection(name="n2")
