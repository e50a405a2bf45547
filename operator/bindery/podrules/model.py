"""Slim, frozen projections of what the inter-pod rules read: selectors, terms, spread, host ports.

A bound pod is kept in memory for as long as it runs (tens of thousands of them), so
:class:`PlacedPod` holds only what kube-scheduler's InterPodAffinity, PodTopologySpread and
NodePorts filters read of an existing pod: identity, namespace, labels, node, host ports and its
required anti-affinity terms (the only terms of an existing pod that can refuse an incoming one).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Protocol, cast

__all__ = [
    "AffinityTerm",
    "GroupPods",
    "HostPort",
    "LabelSelector",
    "NamespaceLabels",
    "NodeFacts",
    "PlacedPod",
    "PodRules",
    "Requirement",
    "SoftRules",
    "SpreadConstraint",
    "WeightedTerm",
]

#: namespace name → its labels, or None while the namespace is unknown.
NamespaceLabels = Callable[[str], Mapping[str, str] | None]


class NodeFacts(Protocol):
    """What the rules read of a Node (bindery.scheduling.ports.NodeProjection has it)."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def taints(self) -> tuple[Mapping[str, object], ...]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Requirement:
    """One label requirement of a label selector (matchLabels become ``In`` with one value)."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        return False  # the apiserver rejects other operators; never match on one


@dataclasses.dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector. ``nothing``: the selector was absent (``nil``), which selects no pod,
    as ``metav1.LabelSelectorAsSelector(nil)`` does; ``{}`` selects every pod."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.nothing:
            return False
        # A loop, not all() over a generator: the filters ask this of every label group of a
        # namespace, several times per cycle, and the generator was most of its cost.
        for requirement in self.requirements:  # noqa: SIM110 (see above)
            if not requirement.matches(labels):
                return False
        return True

    @property
    def empty(self) -> bool:
        """Selects everything (``{}``); PodTopologySpread counts nothing for such a selector."""
        return not self.nothing and not self.requirements


NOTHING = LabelSelector(nothing=True)


@dataclasses.dataclass(frozen=True, slots=True)
class AffinityTerm:
    """A required (anti-)affinity term, with matchLabelKeys / mismatchLabelKeys already merged in.

    Its namespaces are relative to the pod that states it (``owner_namespace`` in the methods):
    no ``namespaces`` and no ``namespaceSelector`` means the owner's namespace only; otherwise the
    union of the listed namespaces and those the selector matches (``{}``: every namespace).
    """

    selector: LabelSelector
    topology_key: str
    namespaces: frozenset[str] = frozenset()
    namespace_selector: LabelSelector | None = None

    def in_scope(self, namespace: str, *, owner_namespace: str, namespace_labels: NamespaceLabels) -> bool:
        if not self.namespaces and self.namespace_selector is None:
            return namespace == owner_namespace
        if namespace in self.namespaces:
            return True
        selector = self.namespace_selector
        if selector is None or selector.nothing:
            return False
        if selector.empty:
            return True
        labels = namespace_labels(namespace)
        return labels is not None and selector.matches(labels)

    def matches(
        self,
        *,
        namespace: str,
        labels: Mapping[str, str],
        owner_namespace: str,
        namespace_labels: NamespaceLabels,
    ) -> bool:
        """Whether a pod (``namespace``, ``labels``) is one this term selects."""
        return self.selector.matches(labels) and self.in_scope(
            namespace, owner_namespace=owner_namespace, namespace_labels=namespace_labels
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A ``topologySpreadConstraints`` entry (in :class:`PodRules`: ``whenUnsatisfiable:
    DoNotSchedule``; in :class:`SoftRules`: ``ScheduleAnyway``)."""

    max_skew: int
    topology_key: str
    selector: LabelSelector
    min_domains: int = 1
    #: nodeAffinityPolicy (default Honor): only nodes matching the pod's nodeSelector and required
    #: node affinity count as domains.
    honor_node_affinity: bool = True
    #: nodeTaintsPolicy (default Ignore): Honor counts only nodes whose taints the pod tolerates.
    honor_taints: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class HostPort:
    """A container port with a ``hostPort``; ``ip`` ``0.0.0.0`` means every address of the node."""

    port: int
    protocol: str = "TCP"
    ip: str = "0.0.0.0"

    def conflicts(self, other: HostPort) -> bool:
        """NodePorts' rule (HostPortInfo.CheckConflict): same port and protocol, and the same
        address or either one the wildcard."""
        if self.port != other.port or self.protocol != other.protocol:
            return False
        return self.ip == other.ip or "0.0.0.0" in (self.ip, other.ip)


@dataclasses.dataclass(frozen=True, slots=True)
class PodRules:
    """The inter-pod rules an incoming pod states (required ones; soft rules are preferences)."""

    affinity: tuple[AffinityTerm, ...] = ()
    anti_affinity: tuple[AffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    host_ports: tuple[HostPort, ...] = ()

    @property
    def inter_pod(self) -> bool:
        """Whether the pod's placement depends on other pods' labels (affinity, anti-affinity, spread)."""
        return bool(self.affinity or self.anti_affinity or self.spread)

    def __bool__(self) -> bool:
        return bool(self.inter_pod or self.host_ports)


NO_RULES = PodRules()


@dataclasses.dataclass(frozen=True, slots=True)
class WeightedTerm:
    """A ``preferredDuringSchedulingIgnoredDuringExecution`` pod (anti-)affinity term and its weight."""

    weight: int
    term: AffinityTerm


@dataclasses.dataclass(frozen=True, slots=True)
class SoftRules:
    """The inter-pod rules an incoming pod prefers: kube-scheduler scores them, never filters on them.

    ``default_spread``: the selector of kube-scheduler's default spreading (hostname maxSkew 3, zone
    maxSkew 5, ScheduleAnyway), set only for a pod owned by a ReplicaSet, StatefulSet or
    ReplicationController that states no ``topologySpreadConstraints`` of its own.
    """

    affinity: tuple[WeightedTerm, ...] = ()
    anti_affinity: tuple[WeightedTerm, ...] = ()
    #: ``whenUnsatisfiable: ScheduleAnyway`` constraints (their max_skew weighs the score).
    spread: tuple[SpreadConstraint, ...] = ()
    default_spread: LabelSelector | None = None

    def __bool__(self) -> bool:
        return bool(self.affinity or self.anti_affinity or self.spread or self.default_spread is not None)


NO_SOFT = SoftRules()


@dataclasses.dataclass(frozen=True, slots=True)
class PlacedPod:
    """A pod bound (or assumed) to a node, as the rules of later pods see it."""

    uid: str
    namespace: str
    node: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    host_ports: tuple[HostPort, ...] = ()
    anti_affinity: tuple[AffinityTerm, ...] = ()
    #: Its required pod affinity and its preferred (weighted) pod affinity and anti-affinity: what
    #: InterPodAffinity's Score reads of an existing pod toward the incoming one (the symmetry).
    affinity: tuple[AffinityTerm, ...] = ()
    preferred_affinity: tuple[WeightedTerm, ...] = ()
    preferred_anti_affinity: tuple[WeightedTerm, ...] = ()
    #: The PersistentVolumeClaims its volumes use (ephemeral ones as ``<pod>-<volume>``): a claim
    #: with ReadWriteOncePod access is refused to any other pod (VolumeRestrictions).
    claims: tuple[str, ...] = ()
    #: Being deleted: PodTopologySpread no longer counts it (upstream #87621); the others still do.
    terminating: bool = False
    #: Reserved by this process and not yet seen bound by the watch (kube-scheduler's assumed pod).
    assumed: bool = False
    #: Its name and ``spec.priority``: a preemption for a rule names the lower-priority pods the rule
    #: needs gone (``bindery.scheduling.placementrules.rule_victims``).
    name: str = ""
    priority: int = 0
    #: ``spec.schedulingGroup.podGroupName`` (immutable): a waiting pod group counts its placed
    #: members here, and is woken when one arrives or leaves.
    group: str = ""

    @property
    def scores_others(self) -> bool:
        """Whether its terms weigh where other pods go (InterPodAffinity's Score, the symmetry)."""
        return bool(self.affinity or self.preferred_affinity or self.preferred_anti_affinity)


class GroupPods:
    """Pods that share their labels (or their anti-affinity terms), and how many of them sit on
    each node, kept as pods come and go.

    Why: a Deployment's pods form one group, and a pod with rules over its group read every member
    twice per cycle (its verdict, then NodeCheck's re-check): the nodes its anti-affinity excludes,
    the pods its spread counts per domain; on a rules backlog that walk was a large share of the
    operator's CPU (benchmarks/README.md). Per node counts let the filters take the group's nodes
    as they are, and count a spread's domains with one C-level pass over those nodes.

    Its nodes' values of a topology key (:meth:`values`), and its live pods per value
    (:meth:`live_counts`), are counted too, once asked for and then as pods come and go: a pod's
    anti-affinity, and the group's toward it, turned the group's hundreds of nodes into hostnames
    twice per evaluation, and its spread counted the group's pods per zone twice more; these were
    the largest costs left in a rules pod's cycle.

    Iterating it yields its pods (a view of a group may still be any iterable of pods: the filters
    walk those as before).
    """

    __slots__ = ("_live_valued", "_valued", "by_uid", "crowded", "every", "live")

    def __init__(self) -> None:
        self.by_uid: dict[str, PlacedPod] = {}
        #: node -> how many of the pods are on it
        self.every: dict[str, int] = {}
        #: node -> how many of the pods on it are not terminating (the ones a spread counts)
        self.live: dict[str, int] = {}
        #: the nodes of `live` holding two pods or more, with that count (rare with anti-affinity)
        self.crowded: dict[str, int] = {}
        #: topology key -> (the node -> value mapping counted with, value -> how many of `every`'s
        #: nodes carry it); nodes without the key are not counted
        self._valued: _KeptCounts = {}
        #: the same for the live pods: value -> how many of them are on nodes carrying it
        self._live_valued: _KeptCounts = {}

    def __iter__(self) -> Iterator[PlacedPod]:
        return iter(self.by_uid.values())

    def __len__(self) -> int:
        return len(self.by_uid)

    def add(self, pod: PlacedPod) -> None:
        """Add `pod` (not a member yet)."""
        self.by_uid[pod.uid] = pod
        node = pod.node
        on_node = self.every[node] = self.every.get(node, 0) + 1
        if on_node == 1 and self._valued:
            _shift(self._valued, node, up=True)
        if not pod.terminating:
            count = self.live[node] = self.live.get(node, 0) + 1
            if count > 1:
                self.crowded[node] = count
            if self._live_valued:
                _shift(self._live_valued, node, up=True)

    def without(self, uids: Collection[str]) -> GroupPods:
        """The group without the members `uids` (this very group when none of them is one).

        A copy, counts included: NodeCheck re-checks a pod without the later pods that counted it,
        and a view that filtered the members as they were walked made every filter walk the group
        pod by pod."""
        by_uid = self.by_uid
        if by_uid.keys().isdisjoint(uids):
            return self
        kept = GroupPods()
        kept.by_uid = dict(by_uid)
        kept.every = dict(self.every)
        kept.live = dict(self.live)
        kept.crowded = dict(self.crowded)
        kept._valued = _copied(self._valued)
        kept._live_valued = _copied(self._live_valued)
        for uid in by_uid.keys() & uids:
            kept.discard(uid)
        return kept

    def forget_counts(self) -> None:
        """Drop the counts kept per topology key (the nodes changed: their mappings are another
        snapshot's now); the next read counts afresh."""
        self._valued.clear()
        self._live_valued.clear()

    def discard(self, uid: str) -> PlacedPod | None:
        """Remove the member `uid`; the pod removed, or None if it was not one."""
        pod = self.by_uid.pop(uid, None)
        if pod is None:
            return None
        node = pod.node
        if not _count_down(self.every, node) and self._valued:
            _shift(self._valued, node, up=False)
        if not pod.terminating:
            left = _count_down(self.live, node)
            if left > 1:
                self.crowded[node] = left
            else:
                self.crowded.pop(node, None)
            if self._live_valued:
                _shift(self._live_valued, node, up=False)
        return pod

    def live_counts(self, key: str, value_of: Mapping[str, str]) -> Mapping[str, int]:
        """Value of `key` -> how many of the group's live (not terminating) pods are on nodes
        carrying it (`value_of`: node -> value). Kept as :meth:`values` is."""
        memo = self._live_valued.get(key)
        if memo is None or memo[0] is not value_of:
            found: dict[str, int] = {}
            for node, count in self.live.items():
                if (value := value_of.get(node)) is not None:
                    found[value] = found.get(value, 0) + count
            memo = self._live_valued[key] = (value_of, found)
        return memo[1]

    def values(self, key: str, value_of: Mapping[str, str], *, leaving: str = "") -> Collection[str]:
        """The values of `key` (`value_of`: node -> value, the nodes carrying it) over the group's
        nodes, but for the member `leaving` (the incoming pod's own entry): the nodes no other
        member shares do not count. Kept per key from the first call on; counted afresh when
        `value_of` is another mapping (a node changed)."""
        memo = self._valued.get(key)
        if memo is None or memo[0] is not value_of:
            found = Counter(map(value_of.get, self.every))
            found.pop(None, None)
            memo = self._valued[key] = (value_of, cast(dict[str, int], dict(found)))
        counts = memo[1]
        own = self.by_uid.get(leaving) if leaving else None
        if own is None or self.every[own.node] > 1:
            return counts.keys()
        value = value_of.get(own.node)
        if value is None or counts[value] > 1:
            return counts.keys()
        return counts.keys() - {value}


#: topology key -> (the node -> value mapping counted with, value -> count)
_KeptCounts = dict[str, tuple[Mapping[str, str], dict[str, int]]]


def _shift(kept: _KeptCounts, node: str, *, up: bool) -> None:
    """Count one more (or one less) for `node`'s value in each of the `kept` counts."""
    for value_of, counts in kept.values():
        if (value := value_of.get(node)) is not None:
            if up:
                counts[value] = counts.get(value, 0) + 1
            else:
                _count_down(counts, value)


def _copied(kept: _KeptCounts) -> _KeptCounts:
    """`kept` with its counts copied (the mappings are shared: they are never changed)."""
    return {key: (value_of, dict(counts)) for key, (value_of, counts) in kept.items()}


def _count_down(counts: dict[str, int], key: str) -> int:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
    return left
