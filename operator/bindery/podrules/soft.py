"""kube-scheduler v1.36's inter-pod scores, evaluated once per pod and expressed as weighted node terms.

kube-scheduler scores every feasible node and binds to the best; Bindery does not pick the node, so
it computes the same scores over every node at once and hands the RM the result as contract v1.2's
``placement.preferredNodeAffinity`` (feature ``node-preferences``): weighted nodeSelectorTerms, which
an RM adds up per node (NodeAffinity's Score). Two plugins are evaluated, both of default weight 2:

* **PodTopologySpread** (``pkg/scheduler/framework/plugins/podtopologyspread/scoring.go``): the
  pod's ``whenUnsatisfiable: ScheduleAnyway`` constraints, or, when it states no constraint at all,
  kube-scheduler's default ones (hostname maxSkew 3, zone maxSkew 5) for a controller-owned pod.
  A node scores ``Σ count(domain) · log(domains + 2) + maxSkew − 1`` over the constraints
  (``scoreForCount``; hostname domains count the node's own pods), then ``100 · (max + min − s) /
  max``: the fewer matching pods in its domains, the higher. Nodes missing a key of the pod's own
  constraints score 0 (``requireAllTopologies``); default constraints do not require the zone.
* **InterPodAffinity** (``pkg/scheduler/framework/plugins/interpodaffinity/scoring.go``): for each
  topology domain, ``+weight`` per existing pod in it that a preferred affinity term of the pod
  selects and ``−weight`` per one a preferred anti-affinity term selects; and the symmetry
  (``processExistingPod``): ``+weight`` / ``−weight`` where an existing pod's preferred affinity /
  anti-affinity term selects the incoming pod, ``+1`` (``hardPodAffinityWeight``) where its required
  affinity does. A node scores the sum over its labels, normalised to ``100 · (s − min) / (max − min)``.

The two are added per node. Terms carry only positive weights, so the node with the lowest sum gets
no term and every other node ``1..100`` in proportion to how far above the lowest it is: "avoid this
zone" becomes "prefer the other zones". Nodes of equal weight share one term, written over the
topology key whose domains they make up (``topology.kubernetes.io/zone In [a, c]``), else by
hostname. Past the contract's caps the weights are coarsened (fewer distinct weights, fewer terms).
An RM sums these weights with the pod's own preferred node affinity in one NodeAffinity score, where
kube-scheduler normalises each plugin apart: the ranking among the soft inter-pod rules is the same.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from bindery.constraints import matches_node_selector, matches_required_affinity, untolerated_taints
from bindery.podrules.filters import Incoming, included
from bindery.podrules.model import (
    AffinityTerm,
    LabelSelector,
    NamespaceLabels,
    NodeFacts,
    PlacedPod,
    SpreadConstraint,
)

__all__ = ["DEFAULT_SPREAD", "PreferenceView", "Preferences", "preferences"]

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
MAX_SCORE = 100
#: kube-scheduler's ``hardPodAffinityWeight`` default (InterPodAffinityArgs).
HARD_AFFINITY_WEIGHT = 1
#: Values per requirement the contract carries (NodeSelectorRequirement.values).
VALUES_CAP = 256
#: kube-scheduler's default constraints (``pkg/scheduler/apis/config/v1/defaults.go``
#: ``defaultTopologySpreadConstraints``), as (topology key, maxSkew).
DEFAULT_SPREAD = ((HOSTNAME, 3), (ZONE, 5))
#: Coarser and coarser weights tried when the terms exceed the budget.
_STEPS = (1, 2, 5, 10, 20, 25, 34, 50, 100)


class PreferenceView(Protocol):
    """What the scores read of the pods on nodes (bindery.scheduling.ports.PlacedPods has it)."""

    def in_namespace(self, namespace: str) -> Iterable[PlacedPod]: ...

    def namespaces(self) -> Iterable[str]: ...

    def preferring_toward(self, namespace: str) -> Iterable[PlacedPod]:
        """The pods whose (preferred or required) affinity terms may select a pod of `namespace`."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class Preferences:
    """The weighted node terms, and what they say for ``bindery explain``."""

    terms: tuple[tuple[int, Mapping[str, Any]], ...] = ()
    summary: str = ""
    #: Terms left out past the budget (the lowest weights), after coarsening could not fit them.
    dropped: int = 0


NONE = Preferences()


def preferences(
    *,
    pod: Incoming,
    placed: PreferenceView,
    nodes: Sequence[NodeFacts],
    namespace_labels: NamespaceLabels,
    budget: int,
    excluded: frozenset[str] = frozenset(),
) -> Preferences:
    """Pure: the soft inter-pod rules' node preferences for `pod`, at most `budget` terms.

    ``excluded``: nodes the hard rules already rule out (kube-scheduler scores only the nodes its
    filters passed, and normalises over them)."""
    soft = pod.soft
    spread = _spread_constraints(pod)
    # Only the placed pods whose terms select this one count (upstream's processExistingPod);
    # filtered before any node is looked at, so a wide term elsewhere costs other pods nothing.
    symmetric = selecting(pod, placed.preferring_toward(pod.namespace), namespace_labels)
    if budget <= 0 or not (spread or soft.affinity or soft.anti_affinity or symmetric):
        return NONE
    candidates = [node for node in nodes if node.name not in excluded and _feasible(pod, node)]
    if not candidates:
        return NONE
    totals: dict[str, int] = dict.fromkeys((n.name for n in candidates), 0)
    keys: set[str] = set()
    if spread:
        for name, score in _spread_scores(pod, spread, placed, nodes, candidates).items():
            totals[name] += score
        keys.update(c.topology_key for c in spread)
    if soft.affinity or soft.anti_affinity or symmetric:
        topo = _affinity_topology(pod, placed, nodes, namespace_labels, symmetric)
        if topo:
            for name, score in _affinity_scores(topo, candidates).items():
                totals[name] += score
            keys.update(topo)
    low, high = min(totals.values()), max(totals.values())
    if high == low:
        return NONE
    weights = {
        name: max(1, round(MAX_SCORE * (t - low) / (high - low))) for name, t in totals.items() if t > low
    }
    return _terms(weights, candidates, keys, budget)


def selecting(
    pod: Incoming, others: Iterable[PlacedPod], namespace_labels: NamespaceLabels
) -> list[PlacedPod]:
    """Pure: the placed pods (not `pod` itself) whose required affinity or preferred terms select `pod`."""

    def selects(term: AffinityTerm, owner: str) -> bool:
        return term.matches(
            namespace=pod.namespace,
            labels=pod.labels,
            owner_namespace=owner,
            namespace_labels=namespace_labels,
        )

    return [
        other
        for other in others
        if other.uid != pod.uid
        and (
            any(selects(term, other.namespace) for term in other.affinity)
            or any(
                selects(weighted.term, other.namespace)
                for weighted in (*other.preferred_affinity, *other.preferred_anti_affinity)
            )
        )
    ]


def _feasible(pod: Incoming, node: NodeFacts) -> bool:
    """The nodes kube-scheduler would score: the pod's nodeSelector, required node affinity and
    NoSchedule/NoExecute taints allow them (the hard inter-pod rules are the RM's filter)."""
    return (
        matches_node_selector(node_selector=pod.node_selector, labels=node.labels)
        and matches_required_affinity(terms=pod.node_terms, labels=node.labels, node_name=node.name)
        and not untolerated_taints(taints=node.taints, tolerations=pod.tolerations)
    )


def _spread_constraints(pod: Incoming) -> tuple[SpreadConstraint, ...]:
    soft = pod.soft
    if soft.spread:
        return soft.spread
    if soft.default_spread is None:
        return ()
    selector: LabelSelector = soft.default_spread
    # buildDefaultConstraints: nodeAffinityPolicy and nodeTaintsPolicy are unset (Honor / Ignore).
    return tuple(
        SpreadConstraint(max_skew=skew, topology_key=key, selector=selector) for key, skew in DEFAULT_SPREAD
    )


def _spread_scores(
    pod: Incoming,
    constraints: Sequence[SpreadConstraint],
    placed: PreferenceView,
    nodes: Sequence[NodeFacts],
    candidates: Sequence[NodeFacts],
) -> dict[str, int]:
    """PodTopologySpread's PreScore, Score and NormalizeScore over the candidates."""
    require_all = bool(pod.soft.spread)  # requireAllTopologies: not for the system defaults
    ignored = {
        n.name for n in candidates if require_all and not all(c.topology_key in n.labels for c in constraints)
    }
    counts: list[dict[str, int]] = [{} for _ in constraints]
    for node in candidates:
        if node.name in ignored:
            continue
        for i, c in enumerate(constraints):
            if c.topology_key != HOSTNAME:
                counts[i].setdefault(node.labels.get(c.topology_key, ""), 0)
    # countPodsMatchSelector: the pod's namespace, not terminating, the selector (empty: nothing).
    on_node: list[dict[str, int]] = [defaultdict(int) for _ in constraints]
    for other in placed.in_namespace(pod.namespace):
        if other.terminating or other.uid == pod.uid:
            continue
        for i, c in enumerate(constraints):
            if not c.selector.empty and c.selector.matches(other.labels):
                on_node[i][other.node] += 1
    for node in nodes:
        if require_all and not all(c.topology_key in node.labels for c in constraints):
            continue
        for i, c in enumerate(constraints):
            if c.topology_key == HOSTNAME or not included(pod, c, node):
                continue
            value = node.labels.get(c.topology_key, "")
            if value in counts[i]:
                counts[i][value] += on_node[i].get(node.name, 0)
    sizes = [
        len(candidates) - len(ignored) if c.topology_key == HOSTNAME else len(counts[i])
        for i, c in enumerate(constraints)
    ]
    raw: dict[str, int] = {}
    for node in candidates:
        if node.name in ignored:
            continue
        score = 0.0
        for i, c in enumerate(constraints):
            domain = node.labels.get(c.topology_key)
            if domain is None:
                continue
            count = on_node[i].get(node.name, 0) if c.topology_key == HOSTNAME else counts[i][domain]
            score += count * math.log(sizes[i] + 2) + (c.max_skew - 1)  # scoreForCount
        raw[node.name] = math.floor(score + 0.5)  # Go's math.Round, for the non-negative scores here
    scores = dict.fromkeys((n.name for n in candidates), 0)
    if not raw:
        return scores
    low, high = min(raw.values()), max(raw.values())
    for name, score in raw.items():
        scores[name] = MAX_SCORE if high == 0 else MAX_SCORE * (high + low - score) // high
    return scores


def _affinity_topology(
    pod: Incoming,
    placed: PreferenceView,
    nodes: Sequence[NodeFacts],
    namespace_labels: NamespaceLabels,
    symmetric: Sequence[PlacedPod],
) -> dict[str, dict[str, int]]:
    """InterPodAffinity's PreScore: topology key → value → score (processExistingPod)."""
    by_name = {node.name: node for node in nodes}
    topo: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(term: AffinityTerm, weight: int, node_name: str) -> None:
        node = by_name.get(node_name)
        if node is not None and term.topology_key in node.labels:
            topo[term.topology_key][node.labels[term.topology_key]] += weight

    soft = pod.soft
    for terms, sign in ((soft.affinity, 1), (soft.anti_affinity, -1)):
        for weighted in terms:
            term = weighted.term
            for namespace in _scope(term, pod.namespace, placed, namespace_labels):
                for other in placed.in_namespace(namespace):
                    if other.uid != pod.uid and term.selector.matches(other.labels):
                        add(term, sign * weighted.weight, other.node)

    def selects_me(term: AffinityTerm, owner: str) -> bool:
        return term.matches(
            namespace=pod.namespace,
            labels=pod.labels,
            owner_namespace=owner,
            namespace_labels=namespace_labels,
        )

    for other in symmetric:
        for term in other.affinity:
            if selects_me(term, other.namespace):
                add(term, HARD_AFFINITY_WEIGHT, other.node)
        for weighted_terms, sign in ((other.preferred_affinity, 1), (other.preferred_anti_affinity, -1)):
            for weighted in weighted_terms:
                if selects_me(weighted.term, other.namespace):
                    add(weighted.term, sign * weighted.weight, other.node)
    return {key: dict(values) for key, values in topo.items() if any(values.values())}


def _scope(
    term: AffinityTerm, owner: str, placed: PreferenceView, namespace_labels: NamespaceLabels
) -> Iterable[str]:
    if not term.namespaces and term.namespace_selector is None:
        return (owner,)
    return [
        ns
        for ns in placed.namespaces()
        if term.in_scope(ns, owner_namespace=owner, namespace_labels=namespace_labels)
    ]


def _affinity_scores(
    topo: Mapping[str, Mapping[str, int]], candidates: Sequence[NodeFacts]
) -> dict[str, int]:
    """InterPodAffinity's Score and NormalizeScore over the candidates."""
    raw = {
        node.name: sum(values.get(node.labels[key], 0) for key, values in topo.items() if key in node.labels)
        for node in candidates
    }
    low, high = min(raw.values()), max(raw.values())
    if high == low:
        return dict.fromkeys(raw, 0)
    # upstream: int64(MaxNodeScore * (float64(s-min) / float64(max-min))), the ratio first
    return {name: int(MAX_SCORE * ((score - low) / (high - low))) for name, score in raw.items()}


def _terms(
    weights: Mapping[str, int], candidates: Sequence[NodeFacts], keys: set[str], budget: int
) -> Preferences:
    """Group the weighted nodes into terms within `budget`, coarsening the weights if needed."""
    order = [*sorted(keys - {HOSTNAME}), HOSTNAME]
    hostnames = [n.labels.get(HOSTNAME) for n in candidates]
    by_host = None not in hostnames and len(set(hostnames)) == len(hostnames)
    terms: list[tuple[int, dict[str, Any], str]] = []
    for step in _STEPS:
        coarse = {name: min(MAX_SCORE, step * math.ceil(w / step)) for name, w in weights.items()}
        groups: dict[int, set[str]] = defaultdict(set)
        for name, weight in coarse.items():
            groups[weight].add(name)
        terms = [
            (weight, term, text)
            for weight, names in sorted(groups.items(), reverse=True)
            for term, text in _express(names, candidates, order, by_host)
        ]
        if len(terms) <= budget:
            break
    kept, dropped = terms[:budget], max(0, len(terms) - budget)
    summary = "soft rules prefer " + "; ".join(f"{text} (weight {weight})" for weight, _, text in kept[:5])
    if len(kept) > 5:
        summary += f" and {len(kept) - 5} more terms"
    if dropped:
        summary += f"; {dropped} lower-weight terms left out (the contract carries {budget} here)"
    return Preferences(terms=tuple((w, t) for w, t, _ in kept), summary=summary, dropped=dropped)


#: Up to this many values an `In` list is kept even when its complement is shorter (it reads better).
_IN_READABLE = 8


def _express(
    names: set[str], candidates: Sequence[NodeFacts], order: Sequence[str], by_host: bool
) -> list[tuple[dict[str, Any], str]]:
    """Terms matching exactly the candidates in `names`: over the first key whose domains they make
    up, else by hostname, else one ``metadata.name`` term per node (matchFields takes one value)."""
    group = [n for n in candidates if n.name in names]
    for key in order:
        if key == HOSTNAME and not by_host:
            continue
        if not all(key in n.labels for n in group):
            continue
        values = {n.labels[key] for n in group}
        if all(n.name in names for n in candidates if n.labels.get(key) in values):
            short = key.rsplit("/", 1)[-1]
            others = {n.labels.get(key) for n in candidates if n.name not in names}
            if None not in others and len(values) > _IN_READABLE and len(others) < len(values):
                # The complement is shorter: `NotIn` it. It matches the same candidates (each has
                # the key); nodes outside them are never chosen (the required terms rule them out).
                # "Avoid 4 hosts of 2,000" is then 4 names, not 1,996 (27 KB per request).
                rest = sorted(str(v) for v in others)
                chunks = [rest[i : i + VALUES_CAP] for i in range(0, len(rest), VALUES_CAP)]
                return [
                    (
                        {
                            "matchExpressions": [
                                {"key": key, "operator": "NotIn", "values": chunk} for chunk in chunks
                            ]
                        },
                        f"{short} other than {', '.join(rest[:5])}{' …' if len(rest) > 5 else ''}",
                    )
                ]
            ordered = sorted(values)
            return [
                (
                    {"matchExpressions": [{"key": key, "operator": "In", "values": chunk}]},
                    f"{short} {', '.join(chunk[:5])}{' …' if len(chunk) > 5 else ''}",
                )
                for chunk in (ordered[i : i + VALUES_CAP] for i in range(0, len(ordered), VALUES_CAP))
            ]
    return [
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n.name]}]}, f"node {n.name}")
        for n in sorted(group, key=lambda n: n.name)
    ]
