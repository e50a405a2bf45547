"""Pure placement of a reservation group (contract v1.1): every member, or none, and why not.

Why a module of its own: a group is placed in one step under the store's write serialization, so
the decision must be made against one view of the capacity in use, with each member's choice
counted before the next member is placed; and when it fails, the answer must say why the GROUP
does not fit ("8 pods of 1 cpu; the most any value of zone holds is 7"), not merely why its last
member did.  Kept free of I/O, like :mod:`bindery.reference_rm.placement`, which it uses per member.

The algorithm is a greedy first-fit-decreasing per topology domain:

* without topology the whole inventory is one domain;
* with topology keys, a domain is one combination of values of those labels; a node that lacks
  any of the labels belongs to no domain and takes no member;
* in each domain the members are placed largest first (by their share of the largest node's
  allocatable), each by the RM's policy among the domain's nodes, with its preferences and the
  nodes' PreferNoSchedule taints scored as for a single pod (contract v1.2 ``node-preferences``);
* among the domains that take every member, ``binpack`` picks the one left fullest, ``spread``
  the one left emptiest; ties go to the values that sort first.

Greedy can miss a packing that exists (bin packing is NP-hard); it never overcommits, and its
"no" names the member it could not place and what stopped it.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bindery.quantity import format_quantity
from bindery.reference_rm.accounting import Foreign, in_use
from bindery.reference_rm.placement import (
    AFFINITY_WEIGHT,
    MAX_NODE_SCORE,
    TAINT_WEIGHT,
    InventoryNode,
    Policy,
    add_usage,
    choose_node,
    effective_usage,
    fits,
    normalize,
    score,
    static_classes,
)

__all__ = ["GroupDecision", "MemberAsk", "place_group"]

Usage = dict[str, dict[str, Decimal]]


@dataclass(frozen=True)
class MemberAsk:
    """One member as placement sees it: its requests and its own hard constraints."""

    label: str  # namespace/name, for messages
    requests: Mapping[str, Decimal]
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity_terms: Sequence[Mapping[str, Any]] = ()
    tolerations: Sequence[Mapping[str, Any]] = ()
    #: Contract v1.2 ``preferredNodeAffinity`` as ``(weight, nodeSelectorTerm)``: such a member (and
    #: every member, on nodes with PreferNoSchedule taints) is placed as a single reserve would be
    #: (:func:`bindery.reference_rm.placement.choose_node`), scored (:class:`_ScoredCandidates`).
    preferences: Sequence[tuple[int, Mapping[str, Any]]] = ()


@dataclass(frozen=True)
class GroupDecision:
    """Per member (in request order) its node, or None and why the group does not fit."""

    nodes: tuple[str, ...] | None
    topology_value: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""


@dataclass
class _Attempt:
    """The outcome of placing the group greedily in one domain."""

    value: tuple[str, ...]
    nodes: list[InventoryNode]
    assigned: dict[int, str] = field(default_factory=dict)
    failure: str = ""  # the first member that did not fit, and why
    after: Usage = field(default_factory=dict)


def _copy(usage: Mapping[str, Mapping[str, Decimal]]) -> Usage:
    return {node: dict(bucket) for node, bucket in usage.items()}


def _size_order(members: Sequence[MemberAsk], nodes: Sequence[InventoryNode]) -> list[int]:
    """Member indexes, largest first: each member's summed share of the largest allocatable of
    every resource it requests (a stable sort, so equal members keep the request's order)."""
    largest: dict[str, Decimal] = {}
    for node in nodes:
        for name, amount in node.allocatable.items():
            largest[name] = max(largest.get(name, Decimal(0)), amount)

    def share(index: int) -> Decimal:
        return sum(
            (amount / largest[name] for name, amount in members[index].requests.items() if largest.get(name)),
            Decimal(0),
        )

    return sorted(range(len(members)), key=lambda index: -share(index))


def _kinds(members: Sequence[MemberAsk]) -> list[int]:
    """Per member, the index of the first member of its kind (same requests and constraints):
    members of one kind share their candidate nodes.

    Compared with ``==`` (and the weights' types: 1 and 1.0 are equal, their sums are not the same
    kind of number), which runs in C: printing each member's 64 x 64 preferred requirements to
    compare them cost more than the rest of the placement.
    """
    firsts: dict[tuple[object, ...], list[int]] = {}
    kinds: list[int] = []
    for index, member in enumerate(members):
        quick = (
            tuple(sorted(member.requests.items())),
            tuple((type(weight), weight) for weight, _ in member.preferences),
            len(member.affinity_terms),
            len(member.tolerations),
        )
        bucket = firsts.setdefault(quick, [])
        for first in bucket:
            other = members[first]
            if (
                other.node_selector == member.node_selector
                and other.affinity_terms == member.affinity_terms
                and other.tolerations == member.tolerations
                and other.preferences == member.preferences
            ):
                kinds.append(first)
                break
        else:
            bucket.append(index)
            kinds.append(index)
    return kinds


class _Fills:
    """Each node's fill after placing one kind of request (:func:`score`), None where it does not
    fit, from the usage of one attempt: shared by the kinds of member asking the same, so a node
    is scored once per request rather than once per kind (and per class of its preferences)."""

    def __init__(self, *, requests: Mapping[str, Decimal], total: Usage) -> None:
        self._requests = requests
        self._total = total
        self._known: dict[str, Decimal | None] = {}

    def of(self, node: InventoryNode) -> Decimal | None:
        name = node.name
        if name in self._known:
            return self._known[name]
        used = self._total.get(name, {})
        usage = effective_usage(self._requests, node)
        fill = score(node, usage, used) if fits(node, usage, used) else None
        self._known[name] = fill
        return fill

    def many(self, nodes: Sequence[InventoryNode]) -> list[Decimal | None]:
        """:meth:`of` each of ``nodes``, in one call."""
        known = self._known
        return [known[node.name] if node.name in known else self.of(node) for node in nodes]

    def touch(self, name: str) -> None:
        """The usage of node ``name`` changed."""
        self._known.pop(name, None)


class _Candidates:
    """The nodes one kind of member fits on now, best first by the policy (the order
    :func:`bindery.reference_rm.placement.choose_node` picks in), kept in a heap.

    Why: choosing each of 1000 members by scanning 500 nodes with every filter took seconds on the
    store's single writer.  The filters that do not depend on usage run once per kind of member;
    a placement changes one node, whose entry is then replaced (:meth:`touch`), so each member costs
    a heap operation instead of a scan.  Entries of older versions are dropped when they surface.
    """

    def __init__(self, *, nodes: Sequence[InventoryNode], fills: _Fills, policy: Policy) -> None:
        """``nodes``: those passing the member's usage-independent filters."""
        self._fills = fills
        self._binpack = policy is Policy.BINPACK
        self._nodes = {node.name: node for node in nodes}
        self._version: dict[str, int] = dict.fromkeys(self._nodes, 1)
        pairs = zip(nodes, fills.many(nodes), strict=True)
        self._heap: list[tuple[Decimal, str, int]] = (
            [(-fill, node.name, 1) for node, fill in pairs if fill is not None]
            if self._binpack
            else [(fill, node.name, 1) for node, fill in pairs if fill is not None]
        )
        heapq.heapify(self._heap)

    def touch(self, name: str) -> None:
        """The usage of node ``name`` changed (and its fill was forgotten): its old entry no longer
        counts; a new one if it fits."""
        node = self._nodes.get(name)
        if node is None:
            return
        version = self._version[name] + 1
        self._version[name] = version
        fill = self._fills.of(node)
        if fill is not None:
            heapq.heappush(self._heap, (-fill if self._binpack else fill, name, version))

    def best(self) -> InventoryNode | None:
        entry = self.best_entry()
        return None if entry is None else entry[1]

    def best_entry(self) -> tuple[Decimal, InventoryNode] | None:
        """The best node and its fill after placing the member (see :func:`score`)."""
        while self._heap:
            key, name, version = self._heap[0]
            if version == self._version[name]:
                return (-key if self._binpack else key), self._nodes[name]
            heapq.heappop(self._heap)
        return None


class _ScoredCandidates:
    """:class:`_Candidates` for a member whose nodes its soft rules tell apart (its preferences, or
    PreferNoSchedule taints): one heap per (NodeAffinity, TaintToleration) raw score, since those do
    not change with usage; the best of each heap is scored as
    :func:`bindery.reference_rm.placement.choose_node` scores it, normalized over the scores that
    still have a node that fits. Why: scanning every node for each of 1000 members took seconds.
    """

    def __init__(
        self,
        *,
        classes: Mapping[tuple[int, int], Sequence[InventoryNode]],
        fills: _Fills,
        policy: Policy,
    ) -> None:
        """``classes``: the nodes passing the member's usage-independent filters, by their raw
        scores (:func:`bindery.reference_rm.placement.static_classes`)."""
        self._binpack = policy is Policy.BINPACK
        self._classes = {
            raw: _Candidates(nodes=nodes, fills=fills, policy=policy) for raw, nodes in classes.items()
        }

    def touch(self, name: str) -> None:
        for candidates in self._classes.values():
            candidates.touch(name)

    def best(self) -> InventoryNode | None:
        entries = [
            (raw, entry)
            for raw, candidates in self._classes.items()
            if (entry := candidates.best_entry()) is not None
        ]
        if not entries:
            return None
        highest_affinity = max(raw[0] for raw, _ in entries)
        highest_taints = max(raw[1] for raw, _ in entries)
        best: tuple[Decimal, InventoryNode] | None = None
        for (affinity, taints), (fill, node) in entries:
            total = (
                AFFINITY_WEIGHT * normalize(affinity, highest_affinity, reverse=False)
                + TAINT_WEIGHT * normalize(taints, highest_taints, reverse=True)
                + MAX_NODE_SCORE * (fill if self._binpack else 1 - fill)
            )
            if best is None or total > best[0] or (total == best[0] and node.name < best[1].name):
                best = (total, node)
        assert best is not None
        return best[1]


class _Statics:
    """Per kind of member, the nodes of the whole inventory passing its usage-independent filters,
    by their raw preference scores (:func:`bindery.reference_rm.placement.static_classes`, asked
    once per kind and group placement: every domain reads them), and those of a domain."""

    def __init__(self, nodes: Sequence[InventoryNode]) -> None:
        self._nodes = nodes
        self._known: dict[int, Mapping[tuple[int, int], Sequence[InventoryNode]]] = {}

    def of(
        self, kind: int, member: MemberAsk, domain: Sequence[InventoryNode]
    ) -> Mapping[tuple[int, int], Sequence[InventoryNode]]:
        known = self._known.get(kind)
        if known is None:
            known = self._known[kind] = static_classes(
                nodes=self._nodes,
                node_selector=member.node_selector,
                affinity_terms=member.affinity_terms,
                tolerations=member.tolerations,
                preferences=member.preferences,
            )
        if len(domain) == len(self._nodes):  # the whole inventory (domains do not overlap)
            return known
        names = {node.name for node in domain}
        inside = {raw: [node for node in nodes if node.name in names] for raw, nodes in known.items()}
        return {raw: nodes for raw, nodes in inside.items() if nodes}


def _attempt(
    *,
    value: tuple[str, ...],
    nodes: list[InventoryNode],
    members: Sequence[MemberAsk],
    order: Sequence[int],
    own: Mapping[str, Mapping[str, Decimal]],
    foreign: Mapping[str, Foreign] | None,
    policy: Policy,
    kinds_of: Sequence[int] | None = None,
    statics: _Statics | None = None,
) -> _Attempt:
    """Place the members greedily in one domain; ``kinds_of`` is ``_kinds(members)``;
    ``statics`` what the group's kinds pass (of the whole inventory, or of ``nodes``)."""
    if kinds_of is None:
        kinds_of = _kinds(members)
    if statics is None:
        statics = _Statics(nodes)
    attempt = _Attempt(value=value, nodes=nodes)
    names = {node.name for node in nodes}
    mine = {name: dict(bucket) for name, bucket in own.items() if name in names}
    total = in_use(mine, {n: f for n, f in (foreign or {}).items() if n in names}) if foreign else _copy(mine)
    kinds: dict[int, _Candidates | _ScoredCandidates] = {}
    fills: dict[tuple[tuple[str, Decimal], ...], _Fills] = {}  # by the requests, in their order
    # PreferNoSchedule taints are scored for every member, as for a single pod (TaintToleration).
    scored = any(
        taint.get("effect") == "PreferNoSchedule" for node in nodes if node.taints for taint in node.taints
    )
    for index in order:
        member = members[index]
        kind = kinds_of[index]
        if kind not in kinds:
            classes = statics.of(kind, member, nodes)
            asked = tuple(member.requests.items())
            if asked not in fills:
                fills[asked] = _Fills(requests=member.requests, total=total)
            kinds[kind] = (
                _ScoredCandidates(classes=classes, fills=fills[asked], policy=policy)
                if member.preferences or scored
                else _Candidates(
                    nodes=[node for passing in classes.values() for node in passing],
                    fills=fills[asked],
                    policy=policy,
                )
            )
        node = kinds[kind].best()
        if node is None:
            if not attempt.failure:
                # Why, as a single reserve would say it: this RM's own usage and the foreign pods
                # apart, so the reason can say what pods the RM did not place use there.
                explained = choose_node(
                    nodes=nodes,
                    requests=member.requests,
                    usage_by_node=mine,
                    node_selector=member.node_selector,
                    affinity_terms=member.affinity_terms,
                    tolerations=member.tolerations,
                    policy=policy,
                    foreign=foreign,
                )
                attempt.failure = f"for member {member.label}: {explained.reason}"
            continue
        usage = effective_usage(member.requests, node)
        add_usage(total, node.name, usage)
        add_usage(mine, node.name, usage)
        for known in fills.values():
            known.touch(node.name)
        for candidates in kinds.values():
            candidates.touch(node.name)
        attempt.assigned[index] = node.name
    attempt.after = total
    return attempt


def _fullness(attempt: _Attempt, members: Sequence[MemberAsk]) -> Decimal:
    """Mean fraction in use, after placing the group, of each resource the group requests."""
    names = sorted({name for member in members for name, amount in member.requests.items() if amount > 0})
    fractions = []
    for name in names:
        capacity = sum((node.allocatable.get(name, Decimal(0)) for node in attempt.nodes), Decimal(0))
        if capacity > 0:
            used = sum(
                (attempt.after.get(node.name, {}).get(name, Decimal(0)) for node in attempt.nodes), Decimal(0)
            )
            fractions.append(used / capacity)
    return sum(fractions, Decimal(0)) / len(fractions) if fractions else Decimal(0)


def _shape(members: Sequence[MemberAsk]) -> str:
    """``8 pods of 1 cpu, 1Gi memory`` when every member asks the same, else ``8 pods``."""
    count = f"{len(members)} pod{'' if len(members) == 1 else 's'}"
    first = members[0].requests
    if any(member.requests != first for member in members[1:]):
        return count
    amounts = ", ".join(
        f"{format_quantity(amount)} {name}" for name, amount in sorted(first.items()) if amount
    )
    return f"{count} of {amounts}" if amounts else count


def place_group(
    *,
    group: str,
    members: Sequence[MemberAsk],
    topology_keys: Sequence[str],
    nodes: Sequence[InventoryNode],
    usage_by_node: Mapping[str, Mapping[str, Decimal]],
    policy: Policy,
    foreign: Mapping[str, Foreign] | None = None,
) -> GroupDecision:
    """Place every member or none; see the module docstring.  ``group`` names it in messages."""
    order = _size_order(members, nodes)
    kinds_of = _kinds(members)
    statics = _Statics(nodes)
    domains: dict[tuple[str, ...], list[InventoryNode]] = {}
    unlabelled = 0
    for node in nodes:
        values = tuple(node.labels.get(key) for key in topology_keys)
        if any(value is None for value in values):
            unlabelled += 1
            continue
        domains.setdefault(tuple(str(value) for value in values), []).append(node)
    needs = _shape(members)
    if topology_keys:
        keys = ", ".join(topology_keys)
        where = f" on nodes sharing one value of {keys}"
    else:
        keys, where = "", ""
    if not domains:
        if not nodes:
            why = "the resource manager has no nodes in its inventory"
        else:
            why = (
                f"none of the {len(nodes)} nodes has the label{'s' if len(topology_keys) > 1 else ''} {keys}"
            )
        return GroupDecision(nodes=None, reason=f"group {group} needs {needs}{where}; {why}.")
    attempts = [
        _attempt(
            value=value,
            nodes=domain,
            members=members,
            order=order,
            own=usage_by_node,
            foreign=foreign,
            policy=policy,
            kinds_of=kinds_of,
            statics=statics,
        )
        for value, domain in sorted(domains.items())
    ]
    complete = [attempt for attempt in attempts if len(attempt.assigned) == len(members)]
    if complete:
        # One domain (every group without topology) has nothing to rank: its fullness is not needed.
        best = (
            complete[0]
            if len(complete) == 1
            else min(
                complete,
                key=lambda a: (
                    -_fullness(a, members) if policy is Policy.BINPACK else _fullness(a, members),
                    a.value,
                ),
            )
        )
        return GroupDecision(
            nodes=tuple(best.assigned[index] for index in range(len(members))),
            topology_value=dict(zip(topology_keys, best.value, strict=True)),
        )
    most = max(attempts, key=lambda a: len(a.assigned))  # max keeps the first of equals: sorted values
    if not topology_keys:
        reason = (
            f"group {group} needs {needs} reserved together; the RM could place only "
            f"{len(most.assigned)} of them, {most.failure}"
        )
    else:
        value = ", ".join(f"{k}={v}" for k, v in zip(topology_keys, most.value, strict=True))
        reason = (
            f"group {group} needs {needs}{where}; the most any value holds is {len(most.assigned)} ({value}; "
            f"{len(domains)} value{'' if len(domains) == 1 else 's'} tried), {most.failure}"
        )
        if unlabelled:
            reason += (
                f" {unlabelled} node{' lacks' if unlabelled == 1 else 's lack'} the label"
                f"{'s' if len(topology_keys) > 1 else ''} and take{'s' if unlabelled == 1 else ''} no member."
            )
    return GroupDecision(nodes=None, reason=reason)
