"""Pure placement logic of the reference RM: which nodes fit, which one to pick, and why none did.

Kept free of I/O so it can be tested exhaustively and reasoned about on its own: the server only
feeds it an inventory snapshot and the capacity in use, under its write serialization.

Filters run in kube-scheduler's order and a node reports only its first failing filter, so the
unschedulable reason reads like kube-scheduler's own ``FailedScheduling`` message:
``0/12 nodes are available: 10 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {k: v}.``
When pods the RM did not place fill a node (see :mod:`bindery.refrm.accounting`), the reason adds
one sentence saying what they use there, so that "Insufficient cpu" on an apparently empty pool of
reservations is explained.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bindery.constraints import (
    matches_node_selector,
    matches_required_affinity,
    tolerates,
    untolerated_taints,
)
from bindery.refrm.accounting import Foreign, describe_foreign, in_use

__all__ = [
    "UNSCHEDULABLE_TAINT",
    "Decision",
    "InventoryNode",
    "Policy",
    "add_usage",
    "choose_node",
    "fits",
    "format_reason",
    "node_failures",
    "score",
    "static_failure",
    "subtract_usage",
]

Usage = dict[str, Decimal]
#: How kube-scheduler treats ``spec.unschedulable``: as this NoSchedule taint, which pods may tolerate.
UNSCHEDULABLE_TAINT: Mapping[str, str] = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


class Policy(enum.StrEnum):
    BINPACK = "binpack"  # fill the fullest node that fits: keeps whole nodes free for big pods
    SPREAD = "spread"  # use the emptiest node that fits: spreads load and failure domains


@dataclass(frozen=True)
class InventoryNode:
    """One node the RM owns: its labels, taints and allocatable capacity per resource name."""

    name: str
    allocatable: Mapping[str, Decimal]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    unschedulable: bool = False


@dataclass(frozen=True)
class Decision:
    """The chosen node, or None and the kube-scheduler-style reason nothing fits."""

    node: str | None
    reason: str = ""


def effective_usage(requests: Mapping[str, Decimal], node: InventoryNode) -> Usage:
    """What a pod consumes on ``node``: its non-zero requests, plus one pod slot if the node counts pods."""
    usage = {name: amount for name, amount in requests.items() if amount > 0}
    if "pods" in node.allocatable and "pods" not in usage:
        usage["pods"] = Decimal(1)
    return usage


def node_failures(
    *,
    node: InventoryNode,
    requests: Mapping[str, Decimal],
    used: Mapping[str, Decimal],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    usage_items: Sequence[tuple[str, Decimal]] | None = None,
) -> list[str]:
    """Why ``node`` cannot take the pod (empty when it fits), from the first failing filter only."""
    failure = static_failure(
        node=node, node_selector=node_selector, affinity_terms=affinity_terms, tolerations=tolerations
    )
    if failure is not None:
        return [failure]
    return [
        "Too many pods" if name == "pods" else f"Insufficient {name}"
        for name in _short(node, requests, used, usage_items=usage_items)
    ]


def static_failure(
    *,
    node: InventoryNode,
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
) -> str | None:
    """The filters that do not depend on what is in use (unschedulable, taints, affinity/selector):
    the first one ``node`` fails, or None.  Group placement evaluates them once per kind of member."""
    if node.unschedulable and not any(
        tolerates(toleration=t, taint=UNSCHEDULABLE_TAINT) for t in tolerations
    ):
        return "node(s) were unschedulable"
    blocking = untolerated_taints(taints=node.taints, tolerations=tolerations)
    if blocking:
        taint = blocking[0]
        return f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value') or ''}}}"
    if not matches_node_selector(
        node_selector=node_selector, labels=node.labels
    ) or not matches_required_affinity(terms=affinity_terms, labels=node.labels, node_name=node.name):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def fits(node: InventoryNode, usage: Mapping[str, Decimal], used: Mapping[str, Decimal]) -> bool:
    """Whether ``usage`` (see :func:`effective_usage`) fits in what ``node`` has free."""
    return all(
        amount <= node.allocatable.get(name, Decimal(0)) - used.get(name, Decimal(0))
        for name, amount in usage.items()
    )


_ZERO = Decimal(0)


def _short(
    node: InventoryNode,
    requests: Mapping[str, Decimal],
    used: Mapping[str, Decimal],
    *,
    usage_items: Sequence[tuple[str, Decimal]] | None = None,
) -> list[str]:
    """The resource names of which ``node`` has less free than the pod needs, sorted."""
    items = sorted(effective_usage(requests, node).items()) if usage_items is None else usage_items
    allocatable = node.allocatable
    return [name for name, amount in items if amount > allocatable.get(name, _ZERO) - used.get(name, _ZERO)]


def format_reason(*, total_nodes: int, failures: Mapping[str, int]) -> str:
    """kube-scheduler's FitError message: reasons with counts, sorted as strings."""
    if total_nodes == 0:
        return "0/0 nodes are available: the resource manager has no nodes in its inventory."
    parts = sorted(f"{count} {reason}" for reason, count in failures.items())
    return f"0/{total_nodes} nodes are available: {', '.join(parts)}."


def score(node: InventoryNode, usage: Mapping[str, Decimal], used: Mapping[str, Decimal]) -> Decimal:
    """Mean fraction of each consumed resource that would be in use after placing the pod."""
    fractions = [
        (used.get(name, Decimal(0)) + amount) / node.allocatable[name]
        for name, amount in usage.items()
        if node.allocatable.get(name, Decimal(0)) > 0
    ]
    return sum(fractions, Decimal(0)) / len(fractions) if fractions else Decimal(0)


def choose_node(
    *,
    nodes: Sequence[InventoryNode],
    requests: Mapping[str, Decimal],
    usage_by_node: Mapping[str, Mapping[str, Decimal]],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    policy: Policy,
    foreign: Mapping[str, Foreign] | None = None,
) -> Decision:
    """Pick a node by ``policy`` among those that fit; ties go to the node name that sorts first.

    ``usage_by_node`` is what this RM's reservations hold; ``foreign`` what pods it did not place
    use (:func:`bindery.refrm.accounting.foreign_usage`).  Both count against ``allocatable``.
    """
    if foreign:
        usage_by_node = in_use(usage_by_node, foreign)
    failures: Counter[str] = Counter()
    candidates: list[tuple[Decimal, str]] = []
    short: dict[str, list[str]] = {}
    # The pod's usage on a node depends only on whether the node counts pods: computed once per
    # call, not three times per node (every reserve scans every node; 500 nodes made it the RM's
    # largest cost once the foreign usage was resolved incrementally).
    usages: dict[bool, tuple[Usage, list[tuple[str, Decimal]]]] = {}
    for node in nodes:
        counts_pods = "pods" in node.allocatable
        known = usages.get(counts_pods)
        if known is None:
            usage = effective_usage(requests, node)
            known = usages[counts_pods] = (usage, sorted(usage.items()))
        used = usage_by_node.get(node.name, {})
        reasons = node_failures(
            node=node,
            requests=requests,
            used=used,
            node_selector=node_selector,
            affinity_terms=affinity_terms,
            tolerations=tolerations,
            usage_items=known[1],
        )
        if reasons:
            failures.update(reasons)
            if foreign and node.name in foreign:
                short[node.name] = _short(node, requests, used, usage_items=known[1])
            continue
        fill = score(node, known[0], used)
        candidates.append((-fill if policy is Policy.BINPACK else fill, node.name))
    if not candidates:
        reason = format_reason(total_nodes=len(nodes), failures=failures)
        explained = describe_foreign(foreign=foreign or {}, short=short)
        return Decision(node=None, reason=f"{reason} {explained}" if explained else reason)
    return Decision(node=min(candidates)[1])


def add_usage(total: dict[str, Usage], node: str, usage: Mapping[str, Decimal]) -> None:
    """Account ``usage`` on ``node`` in the running totals (mutates ``total``)."""
    bucket = total.setdefault(node, {})
    for name, amount in usage.items():
        bucket[name] = bucket.get(name, Decimal(0)) + amount


def subtract_usage(total: dict[str, Usage], node: str, usage: Mapping[str, Decimal]) -> None:
    """Return ``usage`` on ``node`` to the pool (mutates ``total``)."""
    bucket = total.setdefault(node, {})
    for name, amount in usage.items():
        bucket[name] = bucket.get(name, Decimal(0)) - amount
