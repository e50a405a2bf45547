"""A pod's nodeSelector and required node affinity compiled once, then asked of every node.

Why: Bindery sends a pod's hard spread and anti-affinity as node requirements
(``kubernetes.io/hostname NotIn`` up to 256 names, ``zone In ...``), so each such pod's constraints
differ from the last one's and the RM evaluated them afresh on every node: a NotIn's values scanned
as a list, and checked to be strings, 500 times per reserve (a fifth of the RM's CPU on issue 19's
rules backlog). Compiled, a requirement is one set lookup per node.

The answers are exactly :func:`bindery.constraints.matches_term`'s and
:func:`~bindery.constraints.matches_required_affinity`'s (tests/rm/test_nodematch.py compares them
over random terms): a requirement Kubernetes would not parse makes its term match no node, an empty
term matches nothing, no terms match every node.  A term of an unusual shape (not plain dicts and
lists) is not compiled: it is asked of :func:`~bindery.constraints.matches_term` node by node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bindery.constraints import _as_int, _requirement_matches, matches_term

__all__ = ["LabelMasks", "NodeMatcher", "compile_required", "compile_term", "label_sets"]

#: Whether a node (its labels, its name) passes.
NodeMatcher = Callable[[Mapping[str, str], str], bool]


def _never(labels: Mapping[str, str], name: str) -> bool:
    return False


def _always(labels: Mapping[str, str], name: str) -> bool:
    return True


class _Unusual(Exception):
    """A term this module does not compile: matches_term answers for it."""


def _value_check(requirement: Mapping[str, Any]) -> tuple[str, Any] | None:
    """One valid requirement as (kind, argument); None when Kubernetes would not parse it."""
    if _requirement_matches(requirement, None) is None:
        return None  # invalid whatever the value: the validity checks never read the value
    operator = requirement.get("operator")
    values = requirement.get("values") or []
    if operator in ("In", "NotIn"):
        return ("in" if operator == "In" else "notin", frozenset(values))
    if operator in ("Exists", "DoesNotExist"):
        return (operator, None)
    if operator in ("Gt", "Lt"):
        return (operator, _as_int(values[0]))
    raise _Unusual(operator)  # unreachable: any other operator is invalid


def _holds(kind: str, argument: Any, value: str | None) -> bool:
    """A compiled requirement other than In/NotIn against a label value (None = absent)."""
    if kind == "Exists":
        return value is not None
    if kind == "DoesNotExist":
        return value is None
    actual = _as_int(value)
    if actual is None:
        return False
    bound: int = argument
    return actual > bound if kind == "Gt" else actual < bound


def compile_term(term: Mapping[str, Any]) -> NodeMatcher:
    """``matches_term(term=term, ...)`` as a function of the node's labels and name."""
    try:
        return _compile_term(term)
    except _Unusual:
        return lambda labels, name: matches_term(term=term, labels=labels, node_name=name)


_LabelSet = tuple[str, frozenset[str], bool]
_Parts = tuple[
    tuple[_LabelSet, ...], tuple[tuple[str, str, Any], ...], tuple[tuple[frozenset[str], bool], ...]
]


def _compile_term(term: Mapping[str, Any]) -> NodeMatcher:
    parts = _parts(term)
    return _never if parts is None else _matcher(*parts)


def _parts(term: Mapping[str, Any]) -> _Parts | None:
    """A term's requirements, sorted by kind; None when it matches no node whatever its labels."""
    if not isinstance(term, Mapping):
        raise _Unusual(term)
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list):
        raise _Unusual(term)
    if not expressions and not fields:
        return None
    # (key, values, wanted): the label's value in `values` must be `wanted` (In: True, NotIn: False)
    sets: list[_LabelSet] = []
    others: list[tuple[str, str, Any]] = []  # (key, kind, argument) for Exists, DoesNotExist, Gt, Lt
    names: list[tuple[frozenset[str], bool]] = []  # matchFields on metadata.name
    for expression in expressions:
        if not isinstance(expression, Mapping):
            raise _Unusual(expression)
        key = expression.get("key")
        if not isinstance(key, str) or not key:
            return None
        check = _value_check(expression)
        if check is None:
            return None
        kind, argument = check
        if kind in ("in", "notin"):
            sets.append((key, argument, kind == "in"))
        else:
            others.append((key, kind, argument))
    for field in fields:
        if not isinstance(field, Mapping):
            raise _Unusual(field)
        if field.get("key") != "metadata.name" or field.get("operator") not in ("In", "NotIn"):
            return None
        values = field.get("values") or []
        if not isinstance(values, list):
            raise _Unusual(field)  # matches_term's len() may raise, or accept a 1-character string
        if len(values) != 1:
            return None
        check = _value_check(field)
        if check is None:
            return None
        names.append((check[1], check[0] == "in"))
    return tuple(sets), tuple(others), tuple(names)


def _matcher(
    sets: tuple[_LabelSet, ...],
    others: tuple[tuple[str, str, Any], ...],
    names: tuple[tuple[frozenset[str], bool], ...],
) -> NodeMatcher:
    def matches(labels: Mapping[str, str], name: str) -> bool:
        get = labels.get
        for key, values, wanted in sets:
            if (get(key) in values) is not wanted:
                return False
        for key, kind, argument in others:
            if not _holds(kind, argument, get(key)):
                return False
        return all((name in values) is wanted for values, wanted in names) if names else True

    return matches


def compile_required(*, node_selector: Mapping[str, str], terms: Sequence[Mapping[str, Any]]) -> NodeMatcher:
    """``matches_node_selector(...) and matches_required_affinity(...)`` as one function."""
    selector = tuple(node_selector.items())
    compiled = [compile_term(term) for term in terms]
    if not selector and not compiled:
        return _always
    if compiled and all(term is _never for term in compiled):
        return _never  # every term matches nothing
    if not selector and len(compiled) == 1:
        return compiled[0]  # Bindery's rules: one term, no nodeSelector

    def matches(labels: Mapping[str, str], name: str) -> bool:
        for key, value in selector:
            if key not in labels or labels[key] != value:
                return False
        return any(term(labels, name) for term in compiled) if compiled else True

    return matches


def label_sets(
    *, node_selector: Mapping[str, str], terms: Sequence[Mapping[str, Any]]
) -> tuple[tuple[str, frozenset[str], bool], ...] | None:
    """The same constraint as :func:`compile_required`, as requirements ``(key, values, wanted)``
    all of which a node must meet (its label ``key`` has a value in ``values``: ``wanted``), when it
    can be written so: at most one term, of In and NotIn label requirements only (Bindery's spread
    and anti-affinity). Then the nodes that pass can be found from an index of the labels, without
    asking every node. None otherwise (and when there is no requirement at all)."""
    if len(terms) > 1 or not all(isinstance(value, str) for value in node_selector.values()):
        return None
    sets: list[_LabelSet] = [(key, frozenset((value,)), True) for key, value in node_selector.items()]
    if terms:
        try:
            parts = _parts(terms[0])
        except _Unusual:
            return None
        if parts is None or parts[1] or parts[2]:
            return None
        sets.extend(parts[0])
    return tuple(sets) if sets else None


class LabelMasks:
    """An inventory's labels and names as bitmasks (bit ``i``: the ``i``-th node), so a term is
    matched against every node at once: an ``In`` is the OR of its values' masks, a term the AND of
    its requirements'.

    Why: a pod's preferred terms (up to 64 of 64 requirements each, contract v1.2) asked of every
    node one by one cost a requirement per node per term; as masks they cost a few integer
    operations per requirement, whatever the number of nodes. The answers are
    :func:`compile_term`'s (tests/rm/test_nodematch.py compares them).
    """

    def __init__(self, nodes: Sequence[tuple[Mapping[str, str], str]]) -> None:
        self.count = len(nodes)
        self.all = (1 << self.count) - 1
        self._values: dict[str, dict[str, int]] = {}
        self._names: dict[str, int] = {}
        for position, (labels, name) in enumerate(nodes):
            bit = 1 << position
            for key, value in labels.items():
                by_value = self._values.setdefault(key, {})
                by_value[value] = by_value.get(value, 0) | bit
            self._names[name] = self._names.get(name, 0) | bit
        self._present = {key: _union(by_value.values()) for key, by_value in self._values.items()}

    def term(self, term: Mapping[str, Any]) -> int | None:
        """The nodes ``term`` matches, as a mask; None for a term of an unusual shape (ask
        :func:`compile_term` node by node)."""
        try:
            parts = _parts(term)
        except _Unusual:
            return None
        if parts is None:
            return 0
        sets, others, names = parts
        mask = self.all
        for key, values, wanted in sets:
            by_value = self._values.get(key, {})
            having = (
                _union(by_value.get(value, 0) for value in values)
                if len(values) < len(by_value)
                else (_union(found for value, found in by_value.items() if value in values))
            )
            mask &= having if wanted else ~having
            if not mask:
                return 0
        for key, kind, argument in others:
            if kind == "Exists":
                mask &= self._present.get(key, 0)
            elif kind == "DoesNotExist":
                mask &= ~self._present.get(key, 0)
            else:
                mask &= _union(
                    found
                    for value, found in self._values.get(key, {}).items()
                    if _holds(kind, argument, value)
                )
            if not mask:
                return 0
        for values, wanted in names:
            having = _union(self._names.get(name, 0) for name in values)
            mask &= having if wanted else ~having
        return mask & self.all


def _union(masks: Any) -> int:
    total = 0
    for mask in masks:
        total |= mask
    return total
