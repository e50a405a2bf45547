"""kube-scheduler v1.36's inter-pod filters, evaluated once per pod and expressed as node affinity.

kube-scheduler runs its filters node by node. Bindery does not pick the node (the RM does), so it
evaluates each rule over every node at once and hands the RM the result in the language the
contract already speaks: a nodeSelectorTerm over topology labels and node names. Each rule becomes
requirements on its own topology key, so the RM needs no knowledge of pods or labels:

* **InterPodAffinity** (``pkg/scheduler/framework/plugins/interpodaffinity/filtering.go``):
  - the incoming pod's required anti-affinity (``satisfyPodAntiAffinity``) and the existing pods'
    required anti-affinity against the incoming pod (``satisfyExistingPodsAntiAffinity``, the
    symmetry) forbid the topology values where a matching pod runs: ``key NotIn (values)``, which
    nodes without the key satisfy, as upstream;
  - the incoming pod's required affinity (``satisfyPodAffinity``): an existing pod counts only if it
    matches *all* the terms (``updateWithAffinityTerms``), and a node needs every term's key with a
    count above zero: ``key In (values)``. The first pod of a group with affinity to itself (no pod
    matches, the pod matches its own terms) may go to any node carrying the keys: ``key Exists``.
* **PodTopologySpread**, ``whenUnsatisfiable: DoNotSchedule``
  (``podtopologyspread/filtering.go`` ``calPreFilterState`` and ``Filter``): domains are the values
  of the key on eligible nodes (every constraint's key present, ``nodeAffinityPolicy`` Honor: the
  pod's nodeSelector and required node affinity match, ``nodeTaintsPolicy`` Honor: its taints are
  tolerated); pods counted are the same namespace's, matching the selector, not terminating
  (``common.go`` ``countPodsMatchSelector``); the minimum is 0 while fewer than ``minDomains``
  domains exist; a value is allowed when ``count + selfMatch - min <= maxSkew``. Written as
  ``key In (allowed)``, or ``key Exists`` + ``key NotIn (refused)`` when that is shorter (a
  hostname spread over hundreds of nodes).
* **NodePorts** (``nodeports/node_ports.go``, ``fitsPorts`` → ``HostPortInfo.CheckConflict``): a node
  where a pod holds the same port and protocol on the same address, or where either side binds
  ``0.0.0.0``, is excluded by name: ``metadata.name NotIn (node)``, one requirement per node, as
  Kubernetes allows one value per ``metadata.name`` requirement.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

from bindery.constraints import (
    matches_node_selector,
    matches_required_affinity,
    untolerated_taints,
)
from bindery.podrules.model import (
    NO_SOFT,
    AffinityTerm,
    GroupPods,
    NamespaceLabels,
    NodeFacts,
    PlacedPod,
    PodRules,
    SoftRules,
    SpreadConstraint,
)
from bindery.podrules.nodes import NodeSnapshot, frozen

__all__ = [
    "IN_FLIGHT",
    "MAX_PARTS",
    "Incoming",
    "Narrowed",
    "NodeSnapshot",
    "PlacedView",
    "RuleEffect",
    "Verdict",
    "evaluate",
    "in_flight_exclusions",
    "narrowed_effect",
    "narrowing",
    "refusing",
    "with_effect",
]

ANTI_AFFINITY = "pod anti-affinity"
AFFINITY = "pod affinity"
SPREAD = "topology spread"
PORTS = "host ports"
_HOSTNAME = "kubernetes.io/hostname"
_SHOWN = 5  # node names listed in a message before "and N more"
_NONE: frozenset[str] = frozenset()
#: Values per requirement the contract carries (NodeSelectorRequirement.values, contract v1). A longer
#: NotIn is split into several requirements on the same key (ANDed, so the same set of nodes).
VALUES_CAP = 256


class PlacedView(Protocol):
    """The pods already on nodes (bound, or assumed by a running cycle), indexed for the filters."""

    def in_namespace(self, namespace: str) -> Iterable[PlacedPod]: ...

    def label_groups(self, namespace: str) -> Iterable[tuple[Mapping[str, str], Iterable[PlacedPod]]]:
        """The pods of `namespace` grouped by label set: (the labels, the pods carrying exactly them).
        A selector is matched once per group (a Deployment's pods share their labels)."""
        ...

    def namespaces(self) -> Iterable[str]: ...

    def with_anti_affinity(self) -> Iterable[PlacedPod]: ...

    def anti_affinity_toward(self, namespace: str) -> Iterable[PlacedPod]:
        """The pods with anti-affinity that may select a pod of `namespace` (a superset is fine)."""
        ...

    def anti_affinity_groups_toward(
        self, namespace: str
    ) -> Iterable[tuple[str, tuple[AffinityTerm, ...], Iterable[PlacedPod]]]:
        """:meth:`anti_affinity_toward` grouped by (the pods' namespace, their anti-affinity terms),
        which alone decide whether they select the incoming pod: matched once per group."""
        ...

    def with_host_ports(self) -> Iterable[PlacedPod]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Incoming:
    """The pod being scheduled, as the filters read it."""

    namespace: str
    labels: Mapping[str, str]
    rules: PodRules
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The pod's own required node affinity (nodeSelectorTerms).
    node_terms: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    #: Its own entry among the placed pods (assumed by an earlier cycle of it) is not counted.
    uid: str = ""
    #: The rules it prefers (bindery.podrules.soft scores them); the filters ignore them.
    soft: SoftRules = NO_SOFT


@dataclasses.dataclass(frozen=True, slots=True)
class RuleEffect:
    """What one rule requires of the node, as requirements of one nodeSelectorTerm."""

    rule: str
    expressions: tuple[Mapping[str, Any], ...] = ()
    fields: tuple[Mapping[str, Any], ...] = ()
    #: The known nodes these requirements rule out (a set: asked "is this node excluded?" and
    #: united; only the few a message names are sorted).
    excluded: frozenset[str] = frozenset()
    #: Its line for ``bindery explain`` when the rule wrote one (``zone spread allows zones a, c``);
    #: otherwise :attr:`summary` says what it excludes, written only when read.
    note: str = ""

    @property
    def summary(self) -> str:
        """One line for ``bindery explain`` and messages."""
        if self.note:
            return self.note
        count = len(self.excluded)
        summary = f"{self.rule} excludes {count} node{'' if count == 1 else 's'}"
        return summary + ": " + _listed(self.excluded)[2:-1] if self.excluded else summary

    def term(self) -> dict[str, Any]:
        term: dict[str, Any] = {}
        if self.expressions:
            term["matchExpressions"] = [dict(e) for e in self.expressions]
        if self.fields:
            term["matchFields"] = [dict(f) for f in self.fields]
        return term


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """Every rule's effect, and whether any node is left."""

    effects: tuple[RuleEffect, ...] = ()
    #: How many nodes were known (0: the node watch has not listed; nothing is refused then).
    known: int = 0
    #: Nodes the pod's own nodeSelector and required node affinity allow, sorted.
    candidates: tuple[str, ...] = ()

    def term(self) -> dict[str, Any] | None:
        """All effects as one nodeSelectorTerm (requirements ANDed); None without any."""
        expressions = [dict(e) for effect in self.effects for e in effect.expressions]
        fields = [dict(f) for effect in self.effects for f in effect.fields]
        if not expressions and not fields:
            return None
        term: dict[str, Any] = {}
        if expressions:
            term["matchExpressions"] = expressions
        if fields:
            term["matchFields"] = fields
        return term

    def refusal(self) -> str | None:
        """Why no node is left, naming the rules (None: some node is left, or nodes are unknown)."""
        if not self.known or not self.effects:
            return None
        if len(set().union(*(effect.excluded for effect in self.effects))) < len(self.candidates):
            return None  # fewer nodes excluded than candidates: one is left (most pods, and cheap)
        candidates = set(self.candidates)
        excluded: dict[str, set[str]] = defaultdict(set)  # by rule: two spread constraints are one rule
        for effect in self.effects:
            excluded[effect.rule] |= set(effect.excluded) & candidates
        if candidates - set().union(*excluded.values()):
            return None
        total = len(candidates)
        if not total:
            return None  # the pod's own node constraints leave nothing: the RM says so
        nodes = "node" if total == 1 else "nodes"
        for rule, names in excluded.items():
            if len(names) == total:
                return f"{rule} excludes all {total} {nodes} the pod may run on" + _listed(names)
        parts = [
            f"{rule} excludes {len(names)} of {total}{_listed(names)}"
            for rule, names in excluded.items()
            if names
        ]
        return f"no node satisfies the pod's placement rules together: {'; '.join(parts)}"


def _listed(names: Collection[str]) -> str:
    """` (a, b, c, d, e and 7 more)`: the first names by sort order (not the whole set sorted)."""
    shown = ", ".join(heapq.nsmallest(_SHOWN, names))
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return f" ({shown}{more})" if names else ""


def evaluate(
    *,
    pod: Incoming,
    placed: PlacedView,
    nodes: Sequence[NodeFacts],
    namespace_labels: NamespaceLabels,
) -> Verdict:
    """Pure: the node requirements the pod's rules, and existing pods' anti-affinity, impose.
    `nodes` may be a :class:`NodeSnapshot` shared by many calls (its memos then serve them all)."""
    snapshot = NodeSnapshot.of(nodes)
    fits, candidates = _candidates(pod, snapshot)
    effects = tuple(
        _effect(rule, snapshot, expressions=expressions, fields=fields, summary=summary)
        for rule, expressions, fields, summary in _requirements(
            pod=pod, placed=placed, snapshot=snapshot, namespace_labels=namespace_labels, fits=fits
        )
    )
    return Verdict(effects=effects, known=len(snapshot), candidates=candidates)


def refusing(
    *,
    pod: Incoming,
    placed: PlacedView,
    nodes: Sequence[NodeFacts],
    namespace_labels: NamespaceLabels,
    node: str,
) -> tuple[str, ...]:
    """The rules of :func:`evaluate`'s verdict whose effect excludes `node` (in the verdict's order),
    without computing what they exclude elsewhere: the pre-bind re-check asks of one node only."""
    snapshot = NodeSnapshot.of(nodes)
    chosen = snapshot.by_name.get(node)
    if chosen is None:
        return ()  # an unknown node is in no effect's excluded
    fits, _ = _candidates(pod, snapshot)
    return tuple(
        _excluding(
            pod=pod,
            placed=placed,
            snapshot=snapshot,
            namespace_labels=namespace_labels,
            fits=fits,
            chosen=chosen,
        )
    )


def _excluding(
    *,
    pod: Incoming,
    placed: PlacedView,
    snapshot: NodeSnapshot,
    namespace_labels: NamespaceLabels,
    fits: frozenset[str],
    chosen: NodeFacts,
) -> Iterator[str]:
    """:func:`_requirements`' rules, in its order, whose requirements exclude `chosen` (a node of
    `snapshot`), asked of that node's labels without writing the requirements out: NodeCheck
    re-checks every pod, and sorting and chunking hundreds of values to test one node was most of
    its cost."""
    if any(
        (value := chosen.labels.get(key)) is not None and value in values
        for key, values in _anti_values(
            pod=pod, placed=placed, snapshot=snapshot, namespace_labels=namespace_labels
        )
    ):
        yield ANTI_AFFINITY  # NotIn: a node without the key, or with another value, is allowed
    if pod.rules.affinity:
        expressions = _affinity(pod=pod, placed=placed, snapshot=snapshot, namespace_labels=namespace_labels)
        if not _compiled(expressions, ())(chosen):
            yield AFFINITY
    for constraint in pod.rules.spread:
        allowed, _ = _spread_allowed(
            pod=pod, constraint=constraint, placed=placed, snapshot=snapshot, fits=fits
        )
        # In (or Exists + NotIn the others) over the key's values, which the snapshot's nodes carry.
        if chosen.labels.get(constraint.topology_key) not in allowed:
            yield SPREAD
    if pod.rules.host_ports:
        conflicting = _port_conflicts(pod=pod, placed=placed)
        if conflicting and not _compiled(*_port_requirements(conflicting, snapshot))(chosen):
            yield PORTS


#: One rule's requirements: (the rule, matchExpressions, matchFields, its summary or "").
_Requirements = tuple[str, Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], str]


def _requirements(
    *,
    pod: Incoming,
    placed: PlacedView,
    snapshot: NodeSnapshot,
    namespace_labels: NamespaceLabels,
    fits: frozenset[str],
) -> Iterator[_Requirements]:
    anti = _anti_affinity(pod=pod, placed=placed, snapshot=snapshot, namespace_labels=namespace_labels)
    if anti:
        yield ANTI_AFFINITY, anti, (), ""
    if pod.rules.affinity:
        expressions = _affinity(pod=pod, placed=placed, snapshot=snapshot, namespace_labels=namespace_labels)
        yield AFFINITY, expressions, (), ""
    for constraint in pod.rules.spread:
        expressions, summary = _spread(
            pod=pod, constraint=constraint, placed=placed, snapshot=snapshot, fits=fits
        )
        yield SPREAD, expressions, (), summary
    if pod.rules.host_ports:
        conflicting = _port_conflicts(pod=pod, placed=placed)
        if conflicting:
            yield PORTS, *_port_requirements(conflicting, snapshot), ""


def _fit_key(pod: Incoming) -> Hashable:
    """What :func:`_fits` reads of the pod (a Deployment's pods share it)."""
    return (tuple(sorted(pod.node_selector.items())), frozen(pod.node_terms))


def _candidates(pod: Incoming, snapshot: NodeSnapshot) -> tuple[frozenset[str], tuple[str, ...]]:
    """The nodes the pod's own nodeSelector and required node affinity allow (the candidates and
    every spread constraint with nodeAffinityPolicy Honor read them): as a set, and sorted."""

    def compute() -> tuple[frozenset[str], tuple[str, ...]]:
        names = tuple(sorted(node.name for node in snapshot if _fits(pod, node)))
        return frozenset(names), names

    return snapshot.memo(("fits", _fit_key(pod)), compute)


def _effect(
    rule: str,
    snapshot: NodeSnapshot,
    *,
    expressions: Sequence[Mapping[str, Any]] = (),
    fields: Sequence[Mapping[str, Any]] = (),
    summary: str = "",
) -> RuleEffect:
    return RuleEffect(
        rule=rule,
        expressions=tuple(expressions),
        fields=tuple(fields),
        excluded=_excluded(snapshot, expressions, fields),
        note=summary,
    )


def _excluded(
    snapshot: NodeSnapshot, expressions: Sequence[Mapping[str, Any]], fields: Sequence[Mapping[str, Any]]
) -> frozenset[str]:
    """The names of the nodes :func:`_compiled` refuses: per requirement a few set operations on the
    snapshot's value index instead of a predicate run over every node."""
    out: set[str] = set()
    within: frozenset[str] | None = None  # the nodes every In requirement allows
    ins = [e for e in expressions if e["operator"] == "In"]
    if len(ins) == 1:  # a spread's (over a few zones): the nodes of the other values, added up
        key = str(ins[0]["key"])
        kept = frozenset(ins[0].get("values") or ())
        out |= _lacking(snapshot, key)
        out.update(*(names for value, names in snapshot.holders(key).items() if value not in kept))
    for expression in expressions:
        key, op = str(expression["key"]), str(expression["operator"])
        values = expression.get("values") or ()
        if op == "In":
            if len(ins) == 1:
                continue
            holders = snapshot.holders(key)
            allowed = frozenset().union(*(holders[v] for v in values if v in holders))
            within = allowed if within is None else within & allowed
        elif op == "NotIn":
            single = _single(snapshot, key)
            if single is not None:  # a hostname's: one node per value
                out.update(map(single.get, values, itertools.repeat("")))
                out.discard("")
            else:
                out.update(*map(snapshot.holders(key).get, values, itertools.repeat(_NONE)))
        elif op == "Exists":
            out |= _lacking(snapshot, key)
        else:  # DoesNotExist, as _compiled reads any other operator
            out |= snapshot.with_key(key)
    for field in fields:
        values = frozenset(field.get("values") or ())
        if str(field["operator"]) == "In":
            out |= snapshot.names - values
        elif str(field["operator"]) == "NotIn":
            out |= snapshot.names & values
        else:  # Exists on a name every node has; DoesNotExist on it: every node
            out |= snapshot.names if str(field["operator"]) != "Exists" else frozenset()
    if within is not None:
        out |= snapshot.names - within
    return frozenset(out)


def _lacking(snapshot: NodeSnapshot, key: str) -> frozenset[str]:
    """The names of the nodes without label `key` (memoized per snapshot)."""
    return snapshot.memo(("lacking", key), lambda: snapshot.names - snapshot.with_key(key))


def _single(snapshot: NodeSnapshot, key: str) -> Mapping[str, str] | None:
    """Value of `key` → the one node carrying it, when no two nodes share a value (hostnames);
    else None (memoized per snapshot)."""

    def compute() -> Mapping[str, str] | None:
        holders = snapshot.holders(key)
        if any(len(names) != 1 for names in holders.values()):
            return None
        return {value: next(iter(names)) for value, names in holders.items()}

    return snapshot.memo(("single", key), compute)


def _compiled(
    expressions: Sequence[Mapping[str, Any]], fields: Sequence[Mapping[str, Any]]
) -> Callable[[NodeFacts], bool]:
    """The requirements this module writes (In, NotIn, Exists, DoesNotExist; metadata.name In/NotIn)
    as one predicate over nodes, with value sets: the same answer as
    :func:`bindery.constraints.matches_term` on them, without its per-call list scans (a hostname
    NotIn of hundreds of values, tested against hundreds of nodes, was 90% of a cycle's CPU)."""
    checks = [(str(e["key"]), str(e["operator"]), frozenset(e.get("values") or ())) for e in expressions] + [
        ("", str(f["operator"]), frozenset(f.get("values") or ())) for f in fields
    ]

    def allows(node: NodeFacts) -> bool:
        for key, operator, values in checks:
            value = node.labels.get(key) if key else node.name
            if operator == "In":
                ok = value is not None and value in values
            elif operator == "NotIn":
                ok = value is None or value not in values
            elif operator == "Exists":
                ok = value is not None
            else:  # DoesNotExist
                ok = value is None
            if not ok:
                return False
        return True

    return allows


#: Requirements no node satisfies (a key both present and absent): the rule allows no node.
def _nowhere(key: str) -> list[Mapping[str, Any]]:
    return [{"key": key, "operator": "Exists"}, {"key": key, "operator": "DoesNotExist"}]


def _not_in(key: str, values: Sequence[str]) -> list[Mapping[str, Any]]:
    return [
        {"key": key, "operator": "NotIn", "values": list(values[i : i + VALUES_CAP])}
        for i in range(0, len(values), VALUES_CAP)
    ]


def _in(key: str, allowed: Sequence[str], refused: Sequence[str]) -> list[Mapping[str, Any]]:
    """Nodes whose `key` is one of `allowed`: ``In``, or ``Exists`` + ``NotIn (refused)`` when that is
    shorter or ``allowed`` is past the contract's cap (``refused``: the other values nodes carry)."""
    if len(allowed) <= VALUES_CAP and len(allowed) <= len(refused) + 1:
        return [{"key": key, "operator": "In", "values": list(allowed)}]
    return [{"key": key, "operator": "Exists"}, *_not_in(key, refused)]


def _scope(
    term: AffinityTerm, *, owner: str, placed: PlacedView, namespace_labels: NamespaceLabels
) -> Iterable[str]:
    if not term.namespaces and term.namespace_selector is None:
        return (owner,)
    return [
        ns
        for ns in placed.namespaces()
        if term.in_scope(ns, owner_namespace=owner, namespace_labels=namespace_labels)
    ]


def _anti_affinity(
    *, pod: Incoming, placed: PlacedView, snapshot: NodeSnapshot, namespace_labels: NamespaceLabels
) -> list[Mapping[str, Any]]:
    forbidden = _anti_forbidden(pod=pod, placed=placed, snapshot=snapshot, namespace_labels=namespace_labels)
    return [
        requirement
        for key, values in sorted(forbidden.items())
        if values
        for requirement in _not_in(key, sorted(values))
    ]


def _anti_forbidden(
    *, pod: Incoming, placed: PlacedView, snapshot: NodeSnapshot, namespace_labels: NamespaceLabels
) -> dict[str, set[str]]:
    """Per topology key, the values pod anti-affinity keeps the pod off (its own terms' and the
    existing pods' terms selecting it)."""
    forbidden: dict[str, set[str]] = defaultdict(set)
    for key, values in _anti_values(
        pod=pod, placed=placed, snapshot=snapshot, namespace_labels=namespace_labels
    ):
        forbidden[key].update(values)
    return forbidden


def _anti_values(
    *, pod: Incoming, placed: PlacedView, snapshot: NodeSnapshot, namespace_labels: NamespaceLabels
) -> Iterator[tuple[str, Collection[str]]]:
    """(topology key, values pod anti-affinity keeps the pod off) per group of pods concerned,
    lazily: the re-check of one node stops at the first that holds its value."""
    # The incoming pod's terms against existing pods (satisfyPodAntiAffinity).
    for term in pod.rules.anti_affinity:
        key = term.topology_key
        value_of = snapshot.value_of(key)
        for namespace in _scope(term, owner=pod.namespace, placed=placed, namespace_labels=namespace_labels):
            for labels, members in placed.label_groups(namespace):
                if term.selector.matches(labels):
                    yield key, _group_values(members, key, value_of, pod.uid)
    # Existing pods' terms against the incoming pod (satisfyExistingPodsAntiAffinity): whether a
    # term selects it depends only on the term and its owner's namespace, so once per group.
    for owner, terms, members in placed.anti_affinity_groups_toward(pod.namespace):
        for term in terms:
            if term.matches(
                namespace=pod.namespace,
                labels=pod.labels,
                owner_namespace=owner,
                namespace_labels=namespace_labels,
            ):
                key = term.topology_key
                yield key, _group_values(members, key, snapshot.value_of(key), pod.uid)


def _group_values(
    members: Iterable[PlacedPod], key: str, value_of: Mapping[str, str], uid: str
) -> Collection[str]:
    """The values of `key` over the nodes of `members`, the incoming pod's own entry (uid) left out."""
    if isinstance(members, GroupPods):  # the cache's groups count them as pods come and go
        return members.values(key, value_of, leaving=uid)
    return _values(value_of, (other.node for other in members if other.uid != uid))


def _values(value_of: Mapping[str, str], nodes: Iterable[str]) -> set[str]:
    """The values `value_of` gives the known nodes among `nodes` that carry the key ("" included)."""
    found: set[str | None] = set(map(value_of.get, nodes))
    found.discard(None)
    return cast(set[str], found)


def _affinity(
    *, pod: Incoming, placed: PlacedView, snapshot: NodeSnapshot, namespace_labels: NamespaceLabels
) -> list[Mapping[str, Any]]:
    by_name = snapshot.by_name
    terms = pod.rules.affinity
    scopes = [
        set(_scope(t, owner=pod.namespace, placed=placed, namespace_labels=namespace_labels)) for t in terms
    ]
    counts: dict[str, set[str]] = defaultdict(set)  # key → values where a pod matching all terms runs
    for namespace in set().union(*scopes):
        for labels, members in placed.label_groups(namespace):
            if not all(
                namespace in scope and t.selector.matches(labels)
                for t, scope in zip(terms, scopes, strict=True)
            ):
                continue
            for other in members:
                node = by_name.get(other.node)
                if node is None or other.uid == pod.uid:
                    continue
                for t in terms:
                    if t.topology_key in node.labels:
                        counts[t.topology_key].add(node.labels[t.topology_key])
    keys = sorted({t.topology_key for t in terms})
    values_of = {key: set(snapshot.holders(key)) for key in keys}
    if counts:
        return [
            requirement
            for key in keys
            for requirement in (
                _in(key, sorted(counts[key]), sorted(values_of[key] - counts[key]))
                if counts.get(key)
                else _nowhere(key)
            )
        ]
    self_match = all(
        t.matches(
            namespace=pod.namespace,
            labels=pod.labels,
            owner_namespace=pod.namespace,
            namespace_labels=namespace_labels,
        )
        for t in terms
    )
    if self_match:  # the first pod of a group with affinity to itself
        return [{"key": key, "operator": "Exists"} for key in keys]
    return _nowhere(keys[0])


def _fits(pod: Incoming, node: NodeFacts) -> bool:
    """The pod's own nodeSelector and required node affinity allow `node`."""
    return matches_node_selector(
        node_selector=pod.node_selector, labels=node.labels
    ) and matches_required_affinity(terms=pod.node_terms, labels=node.labels, node_name=node.name)


def _eligible(pod: Incoming, constraint: SpreadConstraint, node: NodeFacts, fits: bool) -> bool:
    """matchNodeInclusionPolicies, and every constraint's key present (nodeLabelsMatchSpreadConstraints);
    `fits`: :func:`_fits` of the node, computed once per node by the caller."""
    if not all(c.topology_key in node.labels for c in pod.rules.spread):
        return False
    if constraint.honor_node_affinity and not fits:
        return False
    return not (
        constraint.honor_taints and untolerated_taints(taints=node.taints, tolerations=pod.tolerations)
    )


def included(pod: Incoming, constraint: SpreadConstraint, node: NodeFacts) -> bool:
    """matchNodeInclusionPolicies: nodeAffinityPolicy Honor, nodeTaintsPolicy Honor (the filter and
    the ScheduleAnyway score both apply them)."""
    if constraint.honor_node_affinity and not _fits(pod, node):
        return False
    return not (
        constraint.honor_taints and untolerated_taints(taints=node.taints, tolerations=pod.tolerations)
    )


def _domains(
    pod: Incoming, constraint: SpreadConstraint, snapshot: NodeSnapshot, fits: frozenset[str]
) -> tuple[Mapping[str, str], tuple[str, ...], tuple[str, ...]]:
    """The constraint's eligible nodes (name → their value of its key), the key's values over
    every node, sorted, and the eligible nodes' values: memoized by what :func:`_eligible` reads of
    the pod."""
    key = constraint.topology_key

    def compute() -> tuple[Mapping[str, str], tuple[str, ...], tuple[str, ...]]:
        eligible = {
            node.name: node.labels[key]
            for node in snapshot
            if _eligible(pod, constraint, node, node.name in fits)
        }
        return eligible, tuple(sorted(snapshot.holders(key))), tuple(set(eligible.values()))

    memo_key = (
        "domains",
        key,
        tuple(c.topology_key for c in pod.rules.spread),
        _fit_key(pod) if constraint.honor_node_affinity else None,
        frozen(pod.tolerations) if constraint.honor_taints else None,
    )
    return snapshot.memo(memo_key, compute)


def _spread(
    *,
    pod: Incoming,
    constraint: SpreadConstraint,
    placed: PlacedView,
    snapshot: NodeSnapshot,
    fits: frozenset[str],
) -> tuple[list[Mapping[str, Any]], str]:
    key = constraint.topology_key
    allowed, values = _spread_allowed(
        pod=pod, constraint=constraint, placed=placed, snapshot=snapshot, fits=fits
    )
    kept = set(allowed)
    refused = [v for v in values if v not in kept]
    short = key.rsplit("/", 1)[-1]
    if not allowed:
        return _nowhere(key), f"{short} spread (maxSkew {constraint.max_skew}) allows no {short}"
    summary = f"{short} spread (maxSkew {constraint.max_skew}) allows {short}s {', '.join(allowed[:_SHOWN])}"
    if len(allowed) > _SHOWN:
        summary += f" and {len(allowed) - _SHOWN} more"
    return _in(key, allowed, refused), summary


def _spread_allowed(
    *,
    pod: Incoming,
    constraint: SpreadConstraint,
    placed: PlacedView,
    snapshot: NodeSnapshot,
    fits: frozenset[str],
) -> tuple[list[str], tuple[str, ...]]:
    """The values of the constraint's key it allows (PodTopologySpread's Filter), and every value
    of the key over the nodes; both sorted."""
    eligible, values, domains = _domains(pod, constraint, snapshot, fits)
    counts: dict[str, int] = dict.fromkeys(domains, 0)
    if not constraint.selector.empty:
        for labels, members in placed.label_groups(pod.namespace):
            if not constraint.selector.matches(labels):
                continue
            if isinstance(members, GroupPods):
                key = constraint.topology_key
                _count_group(counts, members, eligible, uid=pod.uid, key=key, value_of=snapshot.value_of(key))
                continue
            for other in members:
                if other.terminating or other.uid == pod.uid:
                    continue
                value = eligible.get(other.node)
                if value is not None:
                    counts[value] += 1
    minimum = min(counts.values(), default=0) if len(counts) >= constraint.min_domains else 0
    self_match = 1 if constraint.selector.matches(pod.labels) else 0
    allowed = [v for v in values if counts.get(v, 0) + self_match - minimum <= constraint.max_skew]
    return allowed, values


def _count_group(
    counts: dict[str, int],
    members: GroupPods,
    eligible: Mapping[str, str],
    *,
    uid: str,
    key: str,
    value_of: Mapping[str, str],
) -> None:
    """Add to `counts` (per domain) the group's pods that are not terminating on `eligible` nodes,
    the incoming pod's own entry (uid) left out. When every node carrying the key is eligible
    (`value_of`: all of them; the default inclusion policies on a pod without node constraints),
    the group's kept counts per value; else one pass over the group's nodes, in C."""
    if len(eligible) == len(value_of):  # eligible ⊆ value_of, equal values: the same mapping
        for value, count in members.live_counts(key, value_of).items():
            counts[value] += count
    else:
        tally = Counter(map(eligible.get, members.live))  # a node each, None for the ineligible
        for node, count in members.crowded.items():
            tally[eligible.get(node)] += count - 1
        for found, count in tally.items():
            if found is not None:
                counts[found] += count
    own = members.by_uid.get(uid)
    if own is not None and not own.terminating and (mine := eligible.get(own.node)) is not None:
        counts[mine] -= 1


def _port_requirements(
    conflicting: Sequence[str], snapshot: NodeSnapshot
) -> tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]:
    """The nodes whose host ports are taken (expressions, fields), excluded by hostname when every
    node carries its own ``kubernetes.io/hostname``: a few chunked NotIn, where one ``metadata.name
    NotIn`` per node (matchFields NotIn takes one value) runs past the contract's 64 requirements at
    65 nodes."""

    by_name = _hostnames(snapshot)
    if by_name is not None and all(name in by_name for name in conflicting):
        values = sorted({by_name[name] or "" for name in conflicting})
        return _not_in(_HOSTNAME, values), ()
    return (), tuple({"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in conflicting)


def _hostnames(snapshot: NodeSnapshot) -> Mapping[str, str | None] | None:
    """Node name → its ``kubernetes.io/hostname`` when every node carries its own; else None."""

    def compute() -> Mapping[str, str | None] | None:
        names = [node.labels.get(_HOSTNAME) for node in snapshot]
        unique = None not in names and len(set(names)) == len(names)
        return {node.name: node.labels.get(_HOSTNAME) for node in snapshot} if unique else None

    return snapshot.memo(("hostnames",), compute)


def _port_conflicts(*, pod: Incoming, placed: PlacedView) -> list[str]:
    wanted = pod.rules.host_ports
    return sorted(
        {
            other.node
            for other in placed.with_host_ports()
            if other.uid != pod.uid
            and any(mine.conflicts(theirs) for mine in wanted for theirs in other.host_ports)
        }
    )


# -- related pods in flight: placed in a domain before their node is known -------------------------

#: The rule name of what Bindery adds for related pods still in flight (explain shows it).
IN_FLIGHT = "related pods in flight"


@dataclasses.dataclass(frozen=True, slots=True)
class Narrowed:
    """Where a pod was sent before the RM names its node: a domain of the spread's key and, when
    its later pods are many, a part of it (its nodes' hostnames; empty: the whole domain)."""

    domain: str
    #: the node the pod is counted on meanwhile (one of `hosts`' nodes, or of the domain)
    anchor: str
    hosts: tuple[str, ...] = ()


def in_flight_exclusions(
    *, nodes: Sequence[NodeFacts], key: str, placing: Sequence[Narrowed], anti_keys: Collection[str]
) -> RuleEffect | None:
    """Pure: what pod anti-affinity with topology keys `anti_keys` excludes, for related pods whose
    node is not known yet but whose region is (`placing`: a domain of `key` each, or part of one).

    Such a pod may land on any node of its region, so every `anti_keys` domain meeting the region
    is excluded: for a region that is a whole domain and a key finer than `key`
    (``kubernetes.io/hostname`` under a zone: each host is in one zone), the domain itself, said as
    one ``key NotIn``; otherwise the key's values over the region's nodes. A superset of what the
    pods' real nodes will exclude: sound whatever nodes the RM picks in those regions.
    """
    if not placing or not anti_keys:
        return None
    snapshot = NodeSnapshot.of(nodes)
    holders = snapshot.holders(key)
    by_host = snapshot.holders(_HOSTNAME)
    whole: set[str] = set()
    values: dict[str, set[str]] = defaultdict(set)
    for region in placing:
        inside: frozenset[str] | None = None
        for anti_key in anti_keys:
            if anti_key == key or (not region.hosts and _finer(snapshot, anti_key, key)):
                whole.add(region.domain)
                continue
            if region.hosts and anti_key == _HOSTNAME:  # the hosts' own values: the hosts
                values[anti_key].update(filter(by_host.__contains__, region.hosts))
                continue
            if inside is None:
                inside = (
                    frozenset().union(*(by_host.get(host, frozenset()) for host in region.hosts))
                    if region.hosts
                    else holders.get(region.domain, frozenset())
                )
            value_of = snapshot.value_of(anti_key)
            values[anti_key].update(value_of[name] for name in inside if name in value_of)
    expressions: list[Mapping[str, Any]] = []
    if whole:
        expressions.extend(_not_in(key, sorted(whole)))
    for anti_key in sorted(values):
        if values[anti_key]:
            expressions.extend(_not_in(anti_key, sorted(values[anti_key])))
    if not expressions:
        return None
    short = key.rsplit("/", 1)[-1]
    domains = sorted({region.domain for region in placing})
    summary = (
        f"{ANTI_AFFINITY} keeps off where {len(placing)} related pod{'' if len(placing) == 1 else 's'} "
        f"are being placed ({short}s {', '.join(domains[:_SHOWN])})"
    )
    return _effect(IN_FLIGHT, snapshot, expressions=expressions, summary=summary)


def _finer(snapshot: NodeSnapshot, fine: str, coarse: str) -> bool:
    """Whether every domain of `fine` lies in one domain of `coarse` (each host in one zone), on
    the nodes that carry `fine`; memoized per snapshot."""

    def compute() -> bool:
        coarse_of = snapshot.value_of(coarse)
        seen: dict[str, str | None] = {}
        for name, value in snapshot.value_of(fine).items():
            outer = coarse_of.get(name)
            if seen.setdefault(value, outer) != outer:
                return False
        return True

    return snapshot.memo(("finer", fine, coarse), compute)


#: The most parts a domain is cut into for the later pods of one group (see :func:`narrowing`).
MAX_PARTS = 8


def narrowing(
    *, pod: Incoming, verdict: Verdict, nodes: Sequence[NodeFacts], key: str, later: int = 0
) -> Narrowed | None:
    """Pure: where to send the pod (a domain of `key`, the key of one of its DoNotSchedule spread
    constraints) so that its `later` related pods in flight need not wait for its node; None when
    no node the verdict leaves carries the key.

    Only nodes the pod may run on count: its own node constraints, the rules, its tolerations of
    the nodes' NoSchedule and NoExecute taints, and not cordoned (the RM knows their room; a region
    of cordoned or tainted nodes would be refused for nothing). The domain is the one with the most
    such nodes (then the first by name): room for the RM to choose. With more later pods than
    domains, and hostnames unique, the pod goes to a part of the domain only (its first nodes by
    name, up to :data:`MAX_PARTS` parts), so the next pods can go to the rest of it at once. The
    anchor is the first node of the region the pod's own spread over `key` counts (its inclusion
    policies), so the pod counts as it will once placed there.
    """
    constraint = next(
        (
            c
            for c in pod.rules.spread
            if c.topology_key == key and not c.selector.empty and c.selector.matches(pod.labels)
        ),
        None,
    )
    if constraint is None:
        return None
    snapshot = NodeSnapshot.of(nodes)
    fits, judged = _candidates(pod, snapshot)
    # Set operations first: the nodes left are a few dozen of hundreds on a busy group. Only the
    # nodes the verdict judged (its candidates): a node `nodes` has and the verdict's did not is
    # excluded by none of its effects, yet no rule was asked of it. A verdict of this snapshot
    # holds this very tuple, whose nodes `fits` are.
    pool = _placeable(pod, snapshot, fits)
    if verdict.candidates is not judged:
        pool = pool.intersection(verdict.candidates)
    pool = pool.difference(*(effect.excluded for effect in verdict.effects))
    # How many such nodes each domain has, in one C-level pass; a domain's nodes are sorted only
    # when it is looked at (the first, mostly): sorting the pool for every pod was most of the cost.
    counts = Counter(map(snapshot.value_of(key).get, pool))
    counts.pop(None, None)
    left = cast("Counter[str]", counts)
    if not left:
        return None
    holders = snapshot.holders(key)
    eligible, _, _ = _domains(pod, constraint, snapshot, fits)
    hostnames = _hostnames(snapshot)
    parts = max(1, min(MAX_PARTS, -(-(later + 1) // len(left))))
    for value in sorted(left, key=lambda v: (-left[v], v)):
        names = sorted(pool.intersection(holders[value]))
        part = names[: -(-len(names) // parts)]
        if parts > 1 and hostnames is not None and len(part) < len(names) and len(part) <= VALUES_CAP:
            anchor = next((name for name in part if name in eligible), None)
            if anchor is not None:
                return Narrowed(
                    domain=value, anchor=anchor, hosts=tuple(sorted(hostnames[name] or "" for name in part))
                )
        anchor = next((name for name in names if name in eligible), None)
        if anchor is not None:
            return Narrowed(domain=value, anchor=anchor)
    return None


def _placeable(pod: Incoming, snapshot: NodeSnapshot, fits: frozenset[str]) -> frozenset[str]:
    """The candidates (`fits`) that are :func:`_usable` (memoized: a Deployment's pods share it)."""
    return snapshot.memo(
        ("placeable", _fit_key(pod), frozen(pod.tolerations)), lambda: fits & _usable(pod, snapshot)
    )


def _usable(pod: Incoming, snapshot: NodeSnapshot) -> frozenset[str]:
    """The nodes not cordoned whose NoSchedule and NoExecute taints the pod tolerates (memoized)."""

    def compute() -> frozenset[str]:
        return frozenset(
            node.name
            for node in snapshot
            if not getattr(node, "unschedulable", False)
            and not untolerated_taints(taints=node.taints, tolerations=pod.tolerations)
        )

    return snapshot.memo(("usable", frozen(pod.tolerations)), compute)


def with_effect(verdict: Verdict, effect: RuleEffect | None) -> Verdict:
    """The verdict with one more effect (its requirements ANDed)."""
    if effect is None:
        return verdict
    return dataclasses.replace(verdict, effects=(*verdict.effects, effect))


def narrowed_effect(*, nodes: Sequence[NodeFacts], key: str, narrowed: Narrowed, related: int) -> RuleEffect:
    """The requirements that send the pod where :func:`narrowing` chose."""
    short = key.rsplit("/", 1)[-1]
    expressions: list[Mapping[str, Any]] = [{"key": key, "operator": "In", "values": [narrowed.domain]}]
    where = f"{short} {narrowed.domain}"
    if narrowed.hosts:
        expressions.append({"key": _HOSTNAME, "operator": "In", "values": list(narrowed.hosts)})
        where += f" ({len(narrowed.hosts)} of its nodes)"
    return _effect(
        IN_FLIGHT,
        NodeSnapshot.of(nodes),
        expressions=expressions,
        summary=f"{where} chosen among those the spread allows, so that {related} related "
        f"pod{'' if related == 1 else 's'} in flight can be placed at once",
    )
