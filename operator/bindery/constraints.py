"""Placement constraints evaluated exactly as kube-scheduler evaluates them.

Both the scheduler (to double-check the node an RM picked) and the reference RM (to pick one) need
the same answers to "does this pod tolerate that node's taints?" and "does this node satisfy the
pod's nodeSelector and required node affinity?".  Disagreement here means pods bound to nodes the
kubelet then rejects, so this module follows the Kubernetes helpers line by line
(``v1.Toleration.ToleratesTaint``, ``nodeaffinity.NodeSelector``) on plain dicts in Kubernetes JSON
shape (camelCase keys), without any I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

__all__ = [
    "SCHEDULING_EFFECTS",
    "matches_node_selector",
    "matches_required_affinity",
    "matches_term",
    "tolerates",
    "untolerated_taints",
]

_CANONICAL_INT = re.compile(r"0|-?[1-9][0-9]*")
#: The taint effects that keep a new pod off a node (PreferNoSchedule is only a preference).
SCHEDULING_EFFECTS: tuple[str, ...] = ("NoSchedule", "NoExecute")


def tolerates(*, toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one toleration tolerates one taint (``v1.Toleration.ToleratesTaint``).

    An empty toleration effect matches every effect; an empty key with operator ``Exists`` matches
    every taint; operator ``""`` means ``Equal``; ``Gt`` and ``Lt`` compare values as integers.
    Unknown operators tolerate nothing.
    """
    effect = toleration.get("effect") or ""
    if effect and effect != (taint.get("effect") or ""):
        return False
    key = toleration.get("key") or ""
    if key and key != (taint.get("key") or ""):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    if operator in ("Gt", "Lt"):
        # Kubernetes 1.35+ (TaintTolerationComparisonOperators): the taint's value compared with
        # the toleration's as int64, Gt tolerating a larger taint value, Lt a smaller one; either
        # value not a canonical integer tolerates nothing (compareNumericValues, core/v1/toleration.go).
        bound = _canonical_int(toleration.get("value"))
        actual = _canonical_int(taint.get("value"))
        if bound is None or actual is None:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def _canonical_int(text: object) -> int | None:
    """An int64 written as Kubernetes accepts it for Gt/Lt tolerations: decimal digits, an optional
    minus, no sign ``+``, no leading zero, no spaces (``0100``, ``+5`` and ``-0`` are not numbers)."""
    if not isinstance(text, str) or not _CANONICAL_INT.fullmatch(text):
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


def untolerated_taints(
    *,
    taints: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    effects: Collection[str] = SCHEDULING_EFFECTS,
) -> list[Mapping[str, Any]]:
    """The taints with one of ``effects`` that no toleration tolerates, in node order."""
    return [
        taint
        for taint in taints
        if taint.get("effect") in effects
        and not any(tolerates(toleration=toleration, taint=taint) for toleration in tolerations)
    ]


def matches_node_selector(*, node_selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Every nodeSelector entry is a label on the node with exactly that value."""
    return all(key in labels and labels[key] == value for key, value in node_selector.items())


def _as_int(text: object) -> int | None:
    """An int64 the way Kubernetes parses Gt/Lt operands, or None when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        number = int(text, 10)
    except ValueError:
        return None
    if text.strip() != text or "_" in text or not -(2**63) <= number < 2**63:
        return None
    return number


def _requirement_matches(requirement: Mapping[str, Any], value: str | None) -> bool | None:
    """Evaluate one requirement against a field/label value (None = absent).

    Returns None for an invalid requirement, which makes its whole term match nothing, as in
    Kubernetes (the selector fails to parse).
    """
    operator = requirement.get("operator")
    values = requirement.get("values") or []
    if not isinstance(values, list) or not all(isinstance(item, str) for item in values):
        return None
    if operator in ("In", "NotIn"):
        if not values:
            return None
        present = value is not None and value in values
        return present if operator == "In" else not present
    if operator in ("Exists", "DoesNotExist"):
        if values:
            return None
        return (value is not None) is (operator == "Exists")
    if operator in ("Gt", "Lt"):
        if len(values) != 1:
            return None
        bound = _as_int(values[0])
        if bound is None:
            return None
        actual = _as_int(value)
        if actual is None:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return None


def matches_term(*, term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    """One nodeSelectorTerm: all matchExpressions and all matchFields hold; an empty term matches nothing."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    for expression in expressions:
        key = expression.get("key")
        if not isinstance(key, str) or not key:
            return False
        if _requirement_matches(expression, labels.get(key)) is not True:
            return False
    for field in fields:
        # Kubernetes supports only metadata.name, with In/NotIn and exactly one value.
        if field.get("key") != "metadata.name" or field.get("operator") not in ("In", "NotIn"):
            return False
        if len(field.get("values") or []) != 1:
            return False
        if _requirement_matches(field, node_name) is not True:
            return False
    return True


def matches_required_affinity(
    *, terms: Sequence[Mapping[str, Any]], labels: Mapping[str, str], node_name: str
) -> bool:
    """``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``: terms are ORed.

    No terms at all means no constraint (matches every node).
    """
    if not terms:
        return True
    return any(matches_term(term=term, labels=labels, node_name=node_name) for term in terms)
