"""Pure placement logic of the reference RM: which nodes fit, which one to pick, and why none did.

Kept free of I/O so it can be tested exhaustively and reasoned about on its own: the server only
feeds it an inventory snapshot and the capacity in use, under its write serialization.

Filters run in kube-scheduler's order and a node reports only its first failing filter, so the
unschedulable reason reads like kube-scheduler's own ``FailedScheduling`` message:
``0/12 nodes are available: 10 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {k: v}.``
When pods the RM did not place fill a node (see :mod:`bindery.reference_rm.accounting`), the reason adds
one sentence saying what they use there, so that "Insufficient cpu" on an apparently empty pool of
reservations is explained.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import json
import marshal
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bindery.constraints import (
    matches_node_selector,
    matches_required_affinity,
    matches_term,
    tolerates,
    untolerated_taints,
)
from bindery.reference_rm.accounting import Foreign, describe_foreign, in_use
from bindery.reference_rm.nodematch import LabelMasks, compile_required, compile_term, label_sets
from bindery.rm.models import ReservationRequest

__all__ = [
    "AFFINITY_WEIGHT",
    "MAX_NODE_SCORE",
    "MIN_FEASIBLE_NODES_PERCENTAGE",
    "MIN_FEASIBLE_NODES_TO_FIND",
    "TAINT_WEIGHT",
    "UNSCHEDULABLE_TAINT",
    "Decision",
    "InventoryNode",
    "Policy",
    "add_usage",
    "check_percentage",
    "choose_node",
    "fits",
    "format_reason",
    "node_failures",
    "nodes_to_find",
    "normalize",
    "preference_scores",
    "score",
    "static_classes",
    "static_failure",
    "static_scores",
    "subtract_usage",
]

Usage = dict[str, Decimal]
#: How kube-scheduler treats ``spec.unschedulable``: as this NoSchedule taint, which pods may tolerate.
UNSCHEDULABLE_TAINT: Mapping[str, str] = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


class Policy(enum.StrEnum):
    """How the RM weighs how full a node would be, beside the pod's preferences.

    Among the nodes that fit, each gets kube-scheduler's default weighted sum (plugin weights of
    ``pkg/scheduler/apis/config/v1/default_plugins.go``): TaintToleration (weight 3, PreferNoSchedule
    taints the pod does not tolerate), NodeAffinity (weight 2, the pod's preferred node affinity),
    and the policy (weight 1, as NodeResourcesFit): ``binpack`` scores the fill after placing the
    pod (MostAllocated), ``spread`` the room left (LeastAllocated); each is 0 to 100. The highest
    sum wins, ties to the name that sorts first. A pod without preferences on nodes without
    PreferNoSchedule taints is placed by the policy alone.
    """

    BINPACK = "binpack"  # fill the fullest node that fits: keeps whole nodes free for big pods
    SPREAD = "spread"  # use the emptiest node that fits: spreads load and failure domains


#: kube-scheduler's default score-plugin weights (default_plugins.go), and its MaxNodeScore.
TAINT_WEIGHT = 3
AFFINITY_WEIGHT = 2
MAX_NODE_SCORE = 100
#: The effects of the tolerations TaintToleration's score counts (``getAllTolerationPreferNoSchedule``).
_PREFER_EFFECTS = ("", "PreferNoSchedule")


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
    """The chosen node, or None and the kube-scheduler-style reason nothing fits; and where the
    next placement's search starts (the rotation of :func:`nodes_to_find`'s sampling)."""

    node: str | None
    reason: str = ""
    next_start: int = 0


#: kube-scheduler's ``minFeasibleNodesToFind`` and ``minFeasibleNodesPercentageToFind``
#: (``pkg/scheduler/schedule_one.go``).
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE = 5


def check_percentage(percentage: int) -> int:
    """``percentage`` if it is a valid ``percentageOfNodesToScore`` (0 to 100), else a ValueError
    saying so: kube-scheduler's configuration refuses the same values."""
    if isinstance(percentage, bool) or not isinstance(percentage, int) or not 0 <= percentage <= 100:
        raise ValueError(
            f"the percentage of nodes to score must be a whole number from 0 to 100 (got {percentage!r}): "
            "0 samples as kube-scheduler does by default, 100 examines every node"
        )
    return percentage


def nodes_to_find(*, percentage: int, total: int) -> int:
    """How many feasible nodes a placement looks for before it stops: kube-scheduler's
    ``numFeasibleNodesToFind`` for ``percentageOfNodesToScore``.

    Every node below 100 nodes or at 100 %; 0 is adaptive (50 % less one per 125 nodes, at least
    5 %); never fewer than 100. Why the same numbers: a user moving from kube-scheduler keeps
    the trade it made between the time to place and how good the pick is.
    """
    if total < MIN_FEASIBLE_NODES_TO_FIND or percentage >= 100:
        return total
    if percentage <= 0:
        percentage = max(MIN_FEASIBLE_NODES_PERCENTAGE, 50 - total // 125)
    return max(MIN_FEASIBLE_NODES_TO_FIND, total * percentage // 100)


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


def preference_scores(
    *,
    node: InventoryNode,
    preferences: Sequence[tuple[int, Mapping[str, Any]]],
    tolerations: Sequence[Mapping[str, Any]],
) -> tuple[int, int]:
    """A node's raw NodeAffinity and TaintToleration scores for a pod, before normalization.

    NodeAffinity (``pkg/scheduler/framework/plugins/nodeaffinity``, Score): the sum of the weights
    of the preferred terms the node matches. TaintToleration (``.../tainttoleration``, Score): how
    many PreferNoSchedule taints of the node no toleration with effect ``""`` or
    ``PreferNoSchedule`` tolerates.
    """
    affinity = sum(
        weight
        for weight, term in preferences
        if weight > 0 and matches_term(term=term, labels=node.labels, node_name=node.name)
    )
    prefer = [t for t in tolerations if (t.get("effect") or "") in _PREFER_EFFECTS]
    taints = len(untolerated_taints(taints=node.taints, tolerations=prefer, effects=("PreferNoSchedule",)))
    return affinity, taints


def normalize(raw: int, highest: int, *, reverse: bool) -> int:
    """kube-scheduler's ``helper.DefaultNormalizeScore`` for one node: ``raw`` scaled to 0..100
    by the highest raw score among the feasible nodes (integer division), reversed if asked; all
    zero stays zero (100 when reversed)."""
    if highest == 0:
        return MAX_NODE_SCORE if reverse else 0
    score = MAX_NODE_SCORE * raw // highest
    return MAX_NODE_SCORE - score if reverse else score


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
    preferences: Sequence[tuple[int, Mapping[str, Any]]] = (),
    percentage_of_nodes_to_score: int = 100,
    start: int = 0,
) -> Decision:
    """Pick a node by ``policy`` among those that fit; ties go to the node name that sorts first.

    ``usage_by_node`` is what this RM's reservations hold; ``foreign`` what pods it did not place
    use (:func:`bindery.reference_rm.accounting.foreign_usage`).  Both count against ``allocatable``.

    Every reserve scans every node, so this is the RM's hottest loop (500 nodes: 3.6 ms of CPU per
    call written as :func:`node_failures` and :func:`score` per node).  It decides exactly what
    they decide, with the same Decimal arithmetic, but does not do the same work twice: the filters
    that do not depend on usage are evaluated once per inventory and kind of pod
    (:func:`_static_outcome`), and a node's fit and score for a kind of request are remembered with
    the usage they were computed from.  Between two reserves only the usage of the node the last
    one took changes (and what releases, expiries and the pod mirror change), so the others answer
    after comparing a few numbers, and the pick is the same minimum of the same scores.

    ``preferences`` (contract v1.2, ``(weight, nodeSelectorTerm)``) and the nodes' PreferNoSchedule
    taints are scored with the policy as :class:`Policy` says; when neither tells the nodes apart,
    the policy alone decides, on the path above.

    ``percentage_of_nodes_to_score`` below 100 samples as kube-scheduler does
    (:func:`nodes_to_find`): the nodes are searched in inventory order from position ``start``,
    round, and the search stops once that many fit; the pick is the best of those, and
    :attr:`Decision.next_start` is where the next search starts (after the last node examined).
    When no node fits, every node is examined, for a reason that counts them all.
    """
    cache = _inventory_cache(nodes)
    count = len(nodes)
    budget = nodes_to_find(percentage=percentage_of_nodes_to_score, total=count)
    start = start % count if count else 0
    if budget < count:
        sampled = _choose_sampled(
            cache=cache,
            nodes=nodes,
            requests=requests,
            usage_by_node=usage_by_node,
            node_selector=node_selector,
            affinity_terms=affinity_terms,
            tolerations=tolerations,
            binpack=policy is Policy.BINPACK,
            foreign=foreign,
            preferences=preferences,
            budget=budget,
            start=start,
        )
        if sampled is not None:
            return sampled
    decision = _choose_all(
        cache=cache,
        nodes=nodes,
        requests=requests,
        usage_by_node=usage_by_node,
        node_selector=node_selector,
        affinity_terms=affinity_terms,
        tolerations=tolerations,
        policy=policy,
        foreign=foreign,
        preferences=preferences,
    )
    return Decision(node=decision.node, reason=decision.reason, next_start=start)


def _choose_all(
    *,
    cache: _InventoryCache,
    nodes: Sequence[InventoryNode],
    requests: Mapping[str, Decimal],
    usage_by_node: Mapping[str, Mapping[str, Decimal]],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    policy: Policy,
    foreign: Mapping[str, Foreign] | None,
    preferences: Sequence[tuple[int, Mapping[str, Any]]],
) -> Decision:
    """:func:`choose_node` over every node: the exact pick, or the reason that counts every node."""
    static = _static_outcome(
        cache=cache,
        nodes=nodes,
        node_selector=node_selector,
        affinity_terms=affinity_terms,
        tolerations=tolerations,
        preferences=preferences,
    )
    shapes = _shapes(requests)
    memo = cache.memo(tuple(requests.items()), len(nodes))  # by position in the inventory
    failed: list[tuple[str, ...]] = []  # counted only when nothing fits: then they are the reason
    binpack = policy is Policy.BINPACK
    best: Decimal | None = None  # the fullest fill (binpack) or the emptiest (spread) so far
    best_name = ""
    empty: Mapping[str, Decimal] = {}
    raw = static.raw_scores
    feasible: list[tuple[int, Decimal]] = []  # (index in static.passing, fill): only with raw scores
    own_usage = usage_by_node.get
    for passed, (node, counts_pods, index) in enumerate(static.passing):
        name = node.name
        own = own_usage(name, empty)
        elsewhere = foreign.get(name) if foreign else None
        known = memo[index]
        if known is not None and known[1] is elsewhere and known[0] == own:
            outcome = known[2]
        else:
            outcome = _fit(
                node, own if elsewhere is None else _plus(own, elsewhere.usage), *shapes[counts_pods]
            )
            memo[index] = (dict(own), elsewhere, outcome)
        if isinstance(outcome, tuple):
            failed.append(outcome)
            continue
        if raw is not None:
            feasible.append((passed, outcome))
            continue
        if (
            best is None
            or (outcome > best if binpack else outcome < best)
            or (outcome == best and name < best_name)
        ):
            best, best_name = outcome, name
    if feasible:
        assert raw is not None
        return Decision(node=_best_scored(static=static, raw=raw, feasible=feasible, binpack=binpack))
    if best is not None:
        return Decision(node=best_name)
    failures: Counter[str] = Counter(static.failures)
    for reasons in failed:
        failures.update(reasons)
    reason = format_reason(total_nodes=len(nodes), failures=failures)
    if not foreign:
        return Decision(node=None, reason=reason)
    # Every node failed: name the resources each node with foreign pods lacks (static failures
    # included, as the reason's last sentence only says what those pods use there).
    total = in_use(usage_by_node, foreign)
    short = {
        node.name: _short(
            node, requests, total.get(node.name, empty), usage_items=shapes["pods" in node.allocatable][1]
        )
        for node in nodes
        if node.name in foreign
    }
    explained = describe_foreign(foreign=foreign, short=short)
    return Decision(node=None, reason=f"{reason} {explained}" if explained else reason)


_Shapes = Mapping[bool, tuple[Mapping[str, Decimal], Sequence[tuple[str, Decimal]]]]


def _shapes(requests: Mapping[str, Decimal]) -> _Shapes:
    """The pod's usage on a node that does not count pods (False) and on one that does (True):
    in request order, for the score, and its items sorted by name, for the fit check's reasons."""
    usage = {name: amount for name, amount in requests.items() if amount > 0}
    with_pods = usage if "pods" in usage else {**usage, "pods": Decimal(1)}
    return {False: (usage, sorted(usage.items())), True: (with_pods, sorted(with_pods.items()))}


def _choose_sampled(
    *,
    cache: _InventoryCache,
    nodes: Sequence[InventoryNode],
    requests: Mapping[str, Decimal],
    usage_by_node: Mapping[str, Mapping[str, Decimal]],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    binpack: bool,
    foreign: Mapping[str, Foreign] | None,
    preferences: Sequence[tuple[int, Mapping[str, Any]]],
    budget: int,
    start: int,
) -> Decision | None:
    """:func:`choose_node` with sampling: the first ``budget`` nodes that fit from ``start`` on,
    round, and the best of them; None when none fits (the caller then counts every node's reason)
    or when fewer pass the filters than it looks for (then every one of them is the sample).

    Why it does not first filter every node: a pod whose constraints are new (each pod of a rules
    backlog) would pay for the whole inventory before looking at a tenth of it. The filters are
    asked of each node as the search reaches it, in the same order; a required label value
    (nodeSelector, ``In``) narrows the search to the nodes having it, from the label index.
    """
    count = len(nodes)
    key = _json_key([node_selector, affinity_terms, tolerations, preferences])
    static = None
    if key is not None and (static := cache.outcomes.get(key)) is None and isinstance(nodes, tuple):
        if key in cache.seen:  # a kind of pod seen before: its filters, once, for all its kind
            static = _static_outcome(
                cache=cache,
                nodes=nodes,
                node_selector=node_selector,
                affinity_terms=affinity_terms,
                tolerations=tolerations,
                preferences=preferences,
            )
        else:  # maybe a one-off (a rules pod): asked node by node as the search goes
            if len(cache.seen) >= _StaticCache.size:
                cache.seen.clear()
            cache.seen[key] = None
    if static is not None and len(static.passing) <= budget:
        return None  # the search would walk every node that passes: the exact pick is the same
    shapes = _shapes(requests)
    memo = cache.memo(tuple(requests.items()), count)
    own_usage = usage_by_node.get
    empty: Mapping[str, Decimal] = {}
    found: list[tuple[str, Decimal, tuple[int, int] | None]] = []  # (name, fill, raw scores)
    last = start
    for node, counts_pods, position, raw in _search_order(
        cache=cache,
        static=static,
        nodes=nodes,
        node_selector=node_selector,
        affinity_terms=affinity_terms,
        tolerations=tolerations,
        preferences=preferences,
        start=start,
    ):
        name = node.name
        own = own_usage(name, empty)
        elsewhere = foreign.get(name) if foreign else None
        known = memo[position]
        if known is not None and known[1] is elsewhere and known[0] == own:
            outcome = known[2]
        else:
            outcome = _fit(
                node, own if elsewhere is None else _plus(own, elsewhere.usage), *shapes[counts_pods]
            )
            memo[position] = (dict(own), elsewhere, outcome)
        if isinstance(outcome, tuple):
            continue
        found.append((name, outcome, raw))
        if len(found) >= budget:
            last = position + 1
            break
    if not found:
        return None
    return Decision(node=_best_found(found, binpack=binpack), next_start=last % count)


def _search_order(
    *,
    cache: _InventoryCache,
    static: _StaticOutcome | None,
    nodes: Sequence[InventoryNode],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    preferences: Sequence[tuple[int, Mapping[str, Any]]],
    start: int,
) -> Iterator[tuple[InventoryNode, bool, int, tuple[int, int] | None]]:
    """The nodes passing the filters that do not depend on usage, from position ``start`` on and
    round, each with whether it counts pods, its position and its raw (NodeAffinity,
    TaintToleration) scores (None when no node can score: the policy alone decides).

    From ``static`` when this kind of pod's filters are known; else each asked as it comes."""
    if static is not None:
        passing = static.passing
        raw_scores = static.raw_scores
        first = bisect.bisect_left(static.positions, start)
        for index in itertools.chain(range(first, len(passing)), range(first)):
            node, counts_pods, position = passing[index]
            yield node, counts_pods, position, raw_scores[index] if raw_scores is not None else None
        return
    tolerated = _tolerated(cache, nodes, tolerations)
    per_node = tolerated.per_node
    allowed = compile_required(node_selector=node_selector, terms=affinity_terms)
    preferred = [(weight, compile_term(term)) for weight, term in preferences if weight > 0]
    scored = bool(preferred) or tolerated.scored
    entries = cache.entries(nodes)
    count = len(nodes)
    candidates: Sequence[int] = range(count)
    matching: set[int] | None = None  # the nodes meeting the selector and affinity, when indexed
    if isinstance(nodes, tuple):
        requirements = label_sets(node_selector=node_selector, terms=affinity_terms)
        if requirements is not None:
            matching = _label_matches(cache.label_index(nodes), requirements, count)
            if len(matching) * _NARROW < count:  # few: walk only them
                candidates = sorted(matching)
    first = bisect.bisect_left(candidates, start)
    for index in itertools.chain(range(first, len(candidates)), range(first)):
        position = candidates[index]
        failure, untolerated = per_node[position]
        if failure is not None:
            continue
        node = nodes[position]
        if (position not in matching) if matching is not None else not allowed(node.labels, node.name):
            continue
        raw = None
        if scored:
            affinity = sum(weight for weight, term in preferred if term(node.labels, node.name))
            raw = (affinity, untolerated)
        yield node, entries[position][1], position, raw


def _best_found(found: Sequence[tuple[str, Decimal, tuple[int, int] | None]], *, binpack: bool) -> str:
    """The pick among the sampled feasible nodes, as :func:`_choose_all` picks among all of them:
    by the weighted sum when a raw score tells nodes apart, else by the policy alone."""
    if any(raw is not None and (raw[0] or raw[1]) for _, _, raw in found):
        highest_affinity = max(raw[0] if raw else 0 for _, _, raw in found)
        highest_taints = max(raw[1] if raw else 0 for _, _, raw in found)
        top: tuple[Decimal, str] | None = None
        for name, fill, raw in found:
            affinity, taints = raw if raw is not None else (0, 0)
            total = (
                AFFINITY_WEIGHT * normalize(affinity, highest_affinity, reverse=False)
                + TAINT_WEIGHT * normalize(taints, highest_taints, reverse=True)
                + MAX_NODE_SCORE * (fill if binpack else 1 - fill)
            )
            if top is None or total > top[0] or (total == top[0] and name < top[1]):
                top = (total, name)
        assert top is not None
        return top[1]
    best: tuple[Decimal, str] | None = None
    for name, fill, _ in found:
        if (
            best is None
            or (fill > best[0] if binpack else fill < best[0])
            or (fill == best[0] and name < best[1])
        ):
            best = (fill, name)
    assert best is not None
    return best[1]


def _best_scored(
    *,
    static: _StaticOutcome,
    raw: Sequence[tuple[int, int]],
    feasible: Sequence[tuple[int, Decimal]],
    binpack: bool,
) -> str:
    """The feasible node with the highest weighted sum (see :class:`Policy`), ties to the first name.

    Normalization is over the feasible nodes only, as kube-scheduler scores only the nodes that
    passed its filters.
    """
    highest_affinity = max(raw[index][0] for index, _ in feasible)
    highest_taints = max(raw[index][1] for index, _ in feasible)
    best: tuple[Decimal, str] | None = None
    for index, fill in feasible:
        affinity, taints = raw[index]
        total = (
            AFFINITY_WEIGHT * normalize(affinity, highest_affinity, reverse=False)
            + TAINT_WEIGHT * normalize(taints, highest_taints, reverse=True)
            + MAX_NODE_SCORE * (fill if binpack else 1 - fill)
        )
        name = static.passing[index][0].name
        if best is None or total > best[0] or (total == best[0] and name < best[1]):
            best = (total, name)
    assert best is not None
    return best[1]


#: A node's outcome for a kind of request: its fill after placing it (see :func:`score`), or the
#: reasons it cannot take it (``Insufficient cpu``...).
_Outcome = Decimal | tuple[str, ...]


def _fit(
    node: InventoryNode,
    used: Mapping[str, Decimal],
    usage: Mapping[str, Decimal],
    items: Sequence[tuple[str, Decimal]],
) -> _Outcome:
    """:func:`_short` then :func:`score`, inlined: the same operations in the same order, so the
    same rounding.  ``items`` is ``usage``'s items sorted by name (the order of the reasons)."""
    allocatable = node.allocatable
    short = tuple(
        "Too many pods" if resource == "pods" else f"Insufficient {resource}"
        for resource, amount in items
        if amount > allocatable.get(resource, _ZERO) - used.get(resource, _ZERO)
    )
    if short:
        return short
    total = _ZERO
    count = 0
    for resource, amount in usage.items():
        capacity = allocatable.get(resource, _ZERO)
        if capacity > 0:
            total += (used.get(resource, _ZERO) + amount) / capacity
            count += 1
    return total / count if count else _ZERO


def _plus(own: Mapping[str, Decimal], other: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """``own`` plus ``other``, added as :func:`bindery.reference_rm.accounting.in_use` adds them."""
    total = dict(own)
    for name, amount in other.items():
        total[name] = total.get(name, _ZERO) + amount
    return total


@dataclass(frozen=True)
class _StaticOutcome:
    """The usage-independent filters over one inventory for one kind of pod: the nodes that pass
    them (with whether each counts pods, and its position in the inventory), and how many failed
    for each reason."""

    passing: tuple[tuple[InventoryNode, bool, int], ...]
    failures: Mapping[str, int]
    #: Per passing node, its raw (NodeAffinity, TaintToleration) scores (:func:`preference_scores`);
    #: None when they are zero on every passing node, so they cannot tell nodes apart.
    raw_scores: tuple[tuple[int, int], ...] | None = None
    #: The passing nodes' positions in the inventory (sorted): where a sampled search starts.
    positions: tuple[int, ...] = ()


_Memo = tuple[dict[str, Decimal], Foreign | None, _Outcome]


@dataclass(frozen=True)
class _Tolerated:
    """The first two filters of :func:`static_failure` (unschedulable, then taints) over one
    inventory for one set of tolerations, and the TaintToleration score of
    :func:`preference_scores`: they depend on the tolerations alone."""

    #: Per node: its failure (or None), and how many of its PreferNoSchedule taints are untolerated.
    per_node: tuple[tuple[str | None, int], ...]
    #: The positions of the nodes without a failure, in inventory order.
    passing: tuple[int, ...]
    failures: Mapping[str, int]
    #: Whether any node has a PreferNoSchedule taint left untolerated (a TaintToleration score).
    scored: bool = False


@dataclass
class _InventoryCache:
    """What is remembered of one inventory tuple: the static outcome per kind of pod (by all its
    constraints), the taint filters per set of tolerations, the nodes by label value, and per kind
    of request (its items, in order: the score's sum depends on it) each node's fit with the usage
    it was computed from.

    The taint outcomes and the fits do not depend on the pod's node affinity: a backlog whose every
    pod carries other affinity (Bindery's hard spread and anti-affinity, as ``hostname NotIn``)
    shares them, and evaluates only its affinity per pod."""

    outcomes: dict[str, _StaticOutcome] = field(default_factory=dict)
    taints: dict[str, _Tolerated] = field(default_factory=dict)
    memos: dict[tuple[tuple[str, Decimal], ...], list[_Memo | None]] = field(default_factory=dict)
    #: label key -> value -> the positions of the nodes with it (built when first needed)
    labels: dict[str, dict[str, list[int]]] | None = None
    #: per node, its entry of :attr:`_StaticOutcome.passing` (built when first needed)
    passing_entries: tuple[tuple[InventoryNode, bool, int], ...] | None = None
    #: the labels and names as bitmasks, for preferred terms (built when first needed)
    label_masks: LabelMasks | None = None
    #: :func:`static_scores` answers, with a plain copy of the constraints each answers for
    scores: list[_KnownScores] = field(default_factory=list)
    #: the constraints of the kinds of pod a sampled search has seen once (see _choose_sampled)
    seen: dict[str, None] = field(default_factory=dict)

    def masks(self, nodes: Sequence[InventoryNode]) -> LabelMasks:
        if self.label_masks is None:
            self.label_masks = LabelMasks([(node.labels, node.name) for node in nodes])
        return self.label_masks

    def memo(self, kind: tuple[tuple[str, Decimal], ...], size: int) -> list[_Memo | None]:
        memo = self.memos.get(kind)
        if memo is None:
            if len(self.memos) >= _StaticCache.memo_tables:
                self.memos.clear()
            memo = self.memos[kind] = [None] * size
        return memo

    def entries(self, nodes: Sequence[InventoryNode]) -> tuple[tuple[InventoryNode, bool, int], ...]:
        if self.passing_entries is None:
            self.passing_entries = tuple(
                (node, "pods" in node.allocatable, position) for position, node in enumerate(nodes)
            )
        return self.passing_entries

    def label_index(self, nodes: Sequence[InventoryNode]) -> dict[str, dict[str, list[int]]]:
        if self.labels is None:
            index: dict[str, dict[str, list[int]]] = {}
            for position, node in enumerate(nodes):
                for key, value in node.labels.items():
                    index.setdefault(key, {}).setdefault(value, []).append(position)
            self.labels = index
        return self.labels


@dataclass
class _KnownScores:
    """One :func:`static_scores` answer and a copy of what it was asked for (plain data only)."""

    weights: tuple[tuple[type, object], ...]
    constraints: object  # [node_selector, affinity_terms, tolerations, preferences], copied
    scores: Mapping[str, tuple[int, int]]
    #: the passing nodes by their raw scores, in inventory order (built when first asked)
    classes: Mapping[tuple[int, int], Sequence[InventoryNode]] | None = None


class _StaticCache:
    """The cache of the last inventory seen (:class:`_InventoryCache`).

    One attribute holding the inventory and its cache together, replaced as a whole: a reader
    never pairs one inventory with another's outcomes.
    """

    #: Static outcomes, and taint outcomes, kept at most per inventory.
    size = 256
    #: Memo tables (one entry per node each) kept at most: a backlog has a handful of pod shapes;
    #: a stream of distinct ones must not grow memory.
    memo_tables = 32
    #: :func:`static_scores` answers kept at most (each a node map, and up to 64 x 64 requirements).
    scores = 32

    def __init__(self) -> None:
        self.entry: tuple[tuple[InventoryNode, ...], _InventoryCache] = ((), _InventoryCache())


_STATIC_CACHE = _StaticCache()


def _inventory_cache(nodes: Sequence[InventoryNode]) -> _InventoryCache:
    """The cache of ``nodes`` if it is a tuple (immutable: the server swaps in a new one when the
    mirror sees a change), kept by its identity; a fresh one, not kept, for a list."""
    if not isinstance(nodes, tuple):
        return _InventoryCache()
    cached_nodes, cache = _STATIC_CACHE.entry
    if cached_nodes is not nodes:
        cache = _InventoryCache()
        _STATIC_CACHE.entry = (nodes, cache)
    return cache


def _json_key(value: object) -> str | None:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return None  # not plain JSON data: evaluate, do not remember


def _tolerated(
    cache: _InventoryCache, nodes: Sequence[InventoryNode], tolerations: Sequence[Mapping[str, Any]]
) -> _Tolerated:
    """:class:`_Tolerated` for ``tolerations``, remembered in ``cache``."""
    key = _json_key(tolerations)
    if key is not None and (known := cache.taints.get(key)) is not None:
        return known
    prefer = [t for t in tolerations if (t.get("effect") or "") in _PREFER_EFFECTS]
    tolerates_unschedulable = any(tolerates(toleration=t, taint=UNSCHEDULABLE_TAINT) for t in tolerations)
    per_node = []
    passing = []
    failures: Counter[str] = Counter()
    for position, node in enumerate(nodes):
        failure = None
        if node.unschedulable and not tolerates_unschedulable:
            failure = "node(s) were unschedulable"
        else:
            blocking = untolerated_taints(taints=node.taints, tolerations=tolerations)
            if blocking:
                taint = blocking[0]
                failure = (
                    f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value') or ''}}}"
                )
        untolerated = (
            len(untolerated_taints(taints=node.taints, tolerations=prefer, effects=("PreferNoSchedule",)))
            if node.taints
            else 0
        )
        per_node.append((failure, untolerated))
        if failure is None:
            passing.append(position)
        else:
            failures[failure] += 1
    result = _Tolerated(
        per_node=tuple(per_node),
        passing=tuple(passing),
        failures=dict(failures),
        scored=any(untolerated for _, untolerated in per_node),
    )
    if key is not None:
        if len(cache.taints) >= _StaticCache.size:
            cache.taints.clear()
        cache.taints[key] = result
    return result


_AFFINITY_FAILURE = "node(s) didn't match Pod's node affinity/selector"
#: When the label index leaves fewer than 1 in this many nodes, only those are walked.
_NARROW = 4


def _static_outcome(
    *,
    cache: _InventoryCache,
    nodes: Sequence[InventoryNode],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    preferences: Sequence[tuple[int, Mapping[str, Any]]] = (),
) -> _StaticOutcome:
    """:func:`static_failure` of every node, remembered in ``cache`` by the pod's constraints.

    Why: taints, labels and affinity do not change between two reserves, only the usage does, and
    evaluating them was a third of a placement's CPU.  When the constraints are new (every pod of a
    rules backlog: its anti-affinity names the nodes taken so far), the taint filters still come
    from ``cache`` and the selector and affinity are compiled once (:mod:`.nodematch`), the same
    answers as :func:`static_failure`'s, asked of each node.
    """
    key = _json_key([node_selector, affinity_terms, tolerations, preferences])
    if key is not None and (known := cache.outcomes.get(key)) is not None:
        return known
    tolerated = _tolerated(cache, nodes, tolerations)
    failures: Counter[str] = Counter(tolerated.failures)
    requirements = (
        label_sets(node_selector=node_selector, terms=affinity_terms)
        if not preferences and isinstance(nodes, tuple)
        else None
    )
    if requirements is not None:
        # Bindery's spread and anti-affinity: the nodes that meet them from the label index, a
        # lookup per value instead of a check per node. Only for a kept inventory (a tuple): for
        # a list, indexing its labels would cost more than asking each node once.
        matching = _label_matches(cache.label_index(nodes), requirements, len(nodes))
        if len(matching) * _NARROW < len(tolerated.passing):
            # A required value narrowed the nodes to a few: only they are asked, not every node.
            per_node = tolerated.per_node
            positions = sorted([position for position in matching if per_node[position][0] is None])
        else:
            positions = [position for position in tolerated.passing if position in matching]
    else:
        allowed = compile_required(node_selector=node_selector, terms=affinity_terms)
        positions = [
            position
            for position in tolerated.passing
            if allowed(nodes[position].labels, nodes[position].name)
        ]
    if len(positions) < len(tolerated.passing):
        failures[_AFFINITY_FAILURE] += len(tolerated.passing) - len(positions)
    preferred = [(weight, compile_term(term)) for weight, term in preferences if weight > 0]
    entries = cache.entries(nodes)
    passing = tuple([entries[position] for position in positions])
    per_node = tolerated.per_node
    raw: list[tuple[int, int]] | None = None
    if preferred:
        raw = [
            (
                sum(weight for weight, term in preferred if term(node.labels, node.name)),
                per_node[position][1],
            )
            for node, _, position in passing
        ]
    elif tolerated.scored:  # some node has a PreferNoSchedule taint these tolerations leave
        raw = [(0, per_node[position][1]) for position in positions]
    outcome = _StaticOutcome(
        passing=passing,
        failures=dict(failures),
        raw_scores=tuple(raw) if raw is not None and any(a or t for a, t in raw) else None,
        positions=tuple(positions),
    )
    if key is not None:
        if len(cache.outcomes) >= _StaticCache.size:
            cache.outcomes.clear()
        cache.outcomes[key] = outcome
    return outcome


def static_scores(
    *,
    nodes: Sequence[InventoryNode],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    preferences: Sequence[tuple[int, Mapping[str, Any]]] = (),
) -> Mapping[str, tuple[int, int]]:
    """The nodes passing the filters that do not depend on usage (:func:`static_failure`), each
    with its raw (NodeAffinity, TaintToleration) scores (:func:`preference_scores`).

    The same answers, from the compiled filters :func:`choose_node` uses, and each preferred term
    matched against every node at once (:class:`~bindery.reference_rm.nodematch.LabelMasks`).
    With a kept inventory the answer is remembered by the constraints' content: a group's retry
    is a new request of the same terms, and comparing them (in C) costs a fraction of parsing
    64 x 64 requirements again. The answer is shared: do not change it.
    """
    return _known_scores(
        nodes=nodes,
        node_selector=node_selector,
        affinity_terms=affinity_terms,
        tolerations=tolerations,
        preferences=preferences,
    ).scores


def static_classes(
    *,
    nodes: Sequence[InventoryNode],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    preferences: Sequence[tuple[int, Mapping[str, Any]]] = (),
) -> Mapping[tuple[int, int], Sequence[InventoryNode]]:
    """:func:`static_scores` as the passing nodes of each raw score, in inventory order (remembered
    with it): group placement keeps one heap per raw score. Shared: do not change it."""
    known = _known_scores(
        nodes=nodes,
        node_selector=node_selector,
        affinity_terms=affinity_terms,
        tolerations=tolerations,
        preferences=preferences,
    )
    if known.classes is None:
        classes: dict[tuple[int, int], list[InventoryNode]] = {}
        scores = known.scores
        for node in nodes:
            raw = scores.get(node.name)
            if raw is not None:
                classes.setdefault(raw, []).append(node)
        known.classes = classes
    return known.classes


def _known_scores(
    *,
    nodes: Sequence[InventoryNode],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    preferences: Sequence[tuple[int, Mapping[str, Any]]],
) -> _KnownScores:
    cache = _inventory_cache(nodes)
    weights = tuple((type(weight), weight) for weight, _ in preferences)
    constraints = [node_selector, affinity_terms, tolerations, preferences]
    kept = isinstance(nodes, tuple)
    if kept:
        for known in cache.scores:
            # The weights' types too: 1 and 1.0 are equal, their sums not the same kind of number.
            if known.weights == weights and known.constraints == constraints:
                return known
    scores = _static_scores(
        cache=cache,
        nodes=nodes,
        node_selector=node_selector,
        affinity_terms=affinity_terms,
        tolerations=tolerations,
        preferences=preferences,
    )
    copied = _plain_copy(constraints) if kept else None
    answer = _KnownScores(weights=weights, constraints=copied, scores=scores)
    if copied is not None:
        if len(cache.scores) >= _StaticCache.scores:
            cache.scores.clear()
        cache.scores.append(answer)
    return answer


def _plain_copy(value: Any) -> object | None:
    """A deep copy of plain data (dicts, lists, tuples, strings, numbers), None for anything else:
    a remembered answer must not change when the caller later changes its objects."""
    try:
        copied: object = marshal.loads(marshal.dumps(value))
    except ValueError:  # not plain data
        return None
    return copied


def _static_scores(
    *,
    cache: _InventoryCache,
    nodes: Sequence[InventoryNode],
    node_selector: Mapping[str, str],
    affinity_terms: Sequence[Mapping[str, Any]],
    tolerations: Sequence[Mapping[str, Any]],
    preferences: Sequence[tuple[int, Mapping[str, Any]]],
) -> dict[str, tuple[int, int]]:
    static = _static_outcome(
        cache=cache,
        nodes=nodes,
        node_selector=node_selector,
        affinity_terms=affinity_terms,
        tolerations=tolerations,
    )
    taints = static.raw_scores
    positions = [position for _, _, position in static.passing]
    affinity = [0] * len(positions)
    preferred = [(weight, term) for weight, term in preferences if weight > 0]
    if preferred and positions:
        masks = cache.masks(nodes)
        # Nodes alike for every term so far share a class; each term splits classes, not nodes.
        classes: list[tuple[int, int]] = [(masks.all, 0)]  # (nodes, affinity so far)
        for weight, term in preferred:
            matched = masks.term(term)
            if matched is None:  # an unusual shape: asked of each node
                matches = compile_term(term)
                matched = 0
                for position, node in enumerate(nodes):
                    if matches(node.labels, node.name):
                        matched |= 1 << position
            split: list[tuple[int, int]] = []
            for members, score in classes:
                inside = members & matched
                if inside:
                    split.append((inside, score + weight))
                if inside != members:
                    split.append((members & ~matched, score))
            classes = split
        by_position = [0] * len(nodes)
        for members, score in classes:
            left = members if score else 0
            while left:
                low = left & -left
                by_position[low.bit_length() - 1] = score
                left ^= low
        affinity = [by_position[position] for position in positions]
    return {
        node.name: (affinity[index], taints[index][1] if taints is not None else 0)
        for index, (node, _, _) in enumerate(static.passing)
    }


def _label_matches(
    index: Mapping[str, Mapping[str, Sequence[int]]],
    requirements: Sequence[tuple[str, frozenset[str], bool]],
    count: int,
) -> set[int]:
    """The positions of the nodes meeting every requirement ``(key, values, wanted)``: whether the
    node's label ``key`` has a value in ``values`` is ``wanted`` (an absent label has none)."""
    matching: set[int] | None = None
    # Wanted values first: what they leave is small, and the unwanted are taken out of it.
    for key, values, wanted in sorted(requirements, key=lambda requirement: not requirement[2]):
        by_value = index.get(key, {})
        having: set[int] = set()
        for value in values:
            having.update(by_value.get(value, ()))
        if wanted:
            matching = having if matching is None else matching & having
        else:
            matching = set(range(count)) - having if matching is None else matching - having
    return set(range(count)) if matching is None else matching


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


def placeable(nodes: Sequence[InventoryNode], request: ReservationRequest) -> Sequence[InventoryNode]:
    """The nodes a reserve may place on: never one the caller named in ``rulePreemption`` (contract
    v1.2): its inter-pod rules accept the pod there only once the named pods are gone."""
    if not request.rule_preemption:
        return nodes
    ruled = {entry.node for entry in request.rule_preemption}
    return [node for node in nodes if node.name not in ruled]
