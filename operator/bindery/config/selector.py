"""A ResourceManager's `spec.namespaceSelector`: which namespaces' pods may use its pool.

Routing is by scheduler name, and any namespace user may write any `schedulerName`: without a
selector a pod in `team-b` naming `bindery-gpu` consumes team A's pool. The selector is a
metav1.LabelSelector, matched against the labels of the pod's *namespace*, as admission webhooks'
`namespaceSelector` is: namespace labels are written by whoever may edit the namespace (a cluster
administrator, usually), never by a tenant who may only create pods, so they can carry authority;
pod labels cannot. Absent means every namespace (the behaviour before the field existed); an empty
selector (`{}`) also matches every namespace, as in Kubernetes.

Pure: parsing (with the same rules as the CRD's schema, for objects stored before it) and matching.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SelectorError(ValueError):
    """The selector cannot be used; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """metav1.LabelSelectorRequirement: NotIn and DoesNotExist hold when the key is absent."""
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist

    def describe(self) -> str:
        if self.operator in ("In", "NotIn"):
            word = "in" if self.operator == "In" else "notin"
            return f"{self.key} {word} ({','.join(self.values)})"
        return self.key if self.operator == "Exists" else f"!{self.key}"


@dataclasses.dataclass(frozen=True)
class NamespaceSelector:
    """matchLabels and matchExpressions, ANDed; both empty matches every namespace."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.match_labels) and all(
            requirement.matches(labels) for requirement in self.match_expressions
        )

    def describe(self) -> str:
        """kubectl's selector syntax, e.g. `team=a,tier in (gpu,cpu),!frozen`."""
        parts = [f"{key}={value}" for key, value in self.match_labels]
        parts += [requirement.describe() for requirement in self.match_expressions]
        return ",".join(parts) or "(everything)"


def parse_namespace_selector(
    value: object, *, field: str = "spec.namespaceSelector"
) -> NamespaceSelector | None:
    """A metav1.LabelSelector body → a selector; None when absent. Raises SelectorError."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SelectorError(f"{field} must be a label selector object, got {type(value).__name__}")
    labels = value.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()
    ):
        raise SelectorError(f"{field}.matchLabels must map label keys to string values")
    expressions = value.get("matchExpressions") or []
    if not isinstance(expressions, Sequence) or isinstance(expressions, str):
        raise SelectorError(f"{field}.matchExpressions must be a list of requirements")
    return NamespaceSelector(
        match_labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        match_expressions=tuple(
            _requirement(item, f"{field}.matchExpressions[{index}]") for index, item in enumerate(expressions)
        ),
    )


def _requirement(value: Any, field: str) -> Requirement:
    if not isinstance(value, Mapping):
        raise SelectorError(f"{field} must be an object with key, operator and values")
    key, operator, values = value.get("key"), value.get("operator"), value.get("values") or []
    if not isinstance(key, str) or not key:
        raise SelectorError(f"{field}.key must be a non-empty label key")
    if operator not in OPERATORS:
        raise SelectorError(f"{field}.operator is {operator!r}; use one of {', '.join(OPERATORS)}")
    if (
        not isinstance(values, Sequence)
        or isinstance(values, str)
        or not all(isinstance(v, str) for v in values)
    ):
        raise SelectorError(f"{field}.values must be a list of strings")
    if operator in ("In", "NotIn") and not values:
        raise SelectorError(f"{field}: operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise SelectorError(f"{field}: operator {operator} takes no values; remove them")
    return Requirement(key=key, operator=str(operator), values=tuple(str(v) for v in values))
