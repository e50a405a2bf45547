"""PodPlacementRules: the inter-pod rules (pod affinity and anti-affinity, DoNotSchedule topology
spread, host ports) turned into node constraints for the RM, and kept race-free across cycles.

* **PreFilter** — evaluates the rules (:func:`bindery.podrules.filters.evaluate`) against the pods on
  nodes (:class:`~bindery.scheduling.ports.PlacedPods`: the watch of pods on nodes plus the pods this
  process assumed) and requires the result (:meth:`CycleContext.require_nodes`), ANDed into every
  term of the pod's own required node affinity. No node left: Unschedulable, with a reason naming the
  rule; more requirements than the contract carries: Unschedulable ``TooManyTerms``. Nothing is
  reserved in either case. The soft rules (preferred pod affinity and anti-affinity, ScheduleAnyway
  spread, kube-scheduler's default spreading of controller-owned pods) are scored
  (:func:`bindery.podrules.soft.preferences`) and added as weighted node preferences
  (:meth:`CycleContext.prefer_nodes`): contract v1.2 ``placement.preferredNodeAffinity``, which the
  RM client leaves out for an RM without the ``node-preferences`` feature.
* **Reserve** (after the RM's reservation) — assumes the pod on the RM's node, as kube-scheduler's
  assume cache does, so the next cycle counts it before the watch reports the Binding;
  **Unreserve** forgets it.
* **Concurrency** — up to ``maxInFlight`` cycles run at once. A pod whose placement depends on
  another in-flight pod that started earlier (its selectors match that pod, that pod's required
  anti-affinity matches it, or their host ports collide) waits, up to :data:`WAIT_SECONDS`, until
  that pod's reservation names a node or its cycle fails (:class:`InFlight`). The order is the
  order cycles started, so two pods never wait for each other. Soft rules count too (a pod whose
  spread or preferred terms select an earlier in-flight pod waits for it), or a burst of one
  Deployment's pods would all score the same empty domains and land together. A pod with no rules,
  and with no earlier in-flight pod whose anti-affinity matches it, does not wait.
* **A zone at a time** — waiting for nodes makes each Deployment with rules a chain of RM round
  trips. Among one Deployment's own pods (one signature), when their rules toward each other are
  only a DoNotSchedule spread over one key, affinity over it and anti-affinity (:func:`_narrow_key`),
  a pod with later pods of its group in flight is sent to a region (one domain of that key, or a
  part of it; only nodes it may run on: :func:`~bindery.podrules.filters.narrowing`). The later pods
  of its group wait only for that, count it on an anchor node of its region (their own evaluation
  only, :class:`_WithPlacing`; never the shared cache) and keep their anti-affinity off the whole
  region (:func:`~bindery.podrules.filters.in_flight_exclusions`). One refused only because of
  those regions waits for their nodes and is evaluated again. A narrowed reserve asks for no
  preemption; refused, it is reserved again at once without the narrowing. A pod that counted
  others in their regions waits at Reserve for their nodes, so NodeCheck re-checks it against where
  they landed, leaving out the later pods that counted it (:func:`counted_by`): the order of a
  sequential scheduler.
* **Wake-up** — a pod this plugin refuses is parked until a placed pod that could lift the refusal
  is added, changed or removed (:func:`wake_on`, :func:`touch_of`; the queue's
  :meth:`~bindery.scheduling.queue.SchedulingQueue.wake`), as kube-scheduler's InterPodAffinity,
  PodTopologySpread and NodePorts queueing hints move it (their ``EventsToRegister``: assigned pod
  add/update/delete, node add/update), only coarser: any change in the rules' scope wakes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from bindery.podrules.filters import (
    AFFINITY,
    Incoming,
    Narrowed,
    PlacedView,
    Verdict,
    evaluate,
    in_flight_exclusions,
    narrowed_effect,
    narrowing,
    refusing,
    with_effect,
)
from bindery.podrules.model import NO_SOFT, AffinityTerm, GroupPods, PlacedPod
from bindery.podrules.parse import with_service_spread
from bindery.podrules.soft import Preferences, preferences, selecting
from bindery.rm.models import (
    MAX_RULE_VICTIMS,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Placement,
    RulePreemption,
    RuleVictim,
)
from bindery.scheduling.decisions import Failure, FailureKind
from bindery.scheduling.events import ClusterEvent, Requeue, Touch, WakeOn
from bindery.scheduling.framework import CycleContext, Status, and_terms
from bindery.scheduling.inflight import STALE_SECONDS, WAIT_SECONDS, InFlight, _Cycle
from bindery.scheduling.podspec import PodInfo, max_items
from bindery.scheduling.ports import PlacedPods

__all__ = [
    "COUNTED",
    "NARROWED",
    "NARROWING",
    "PREFERENCES",
    "RULE_PREEMPTION",
    "STALE_SECONDS",
    "VERDICT",
    "WAIT_SECONDS",
    "InFlight",
    "MemberPreferences",
    "Narrowing",
    "PodPlacementRules",
    "broken_after_preemption",
    "counted_by",
    "may_be_awaited",
    "member_node_terms",
    "member_preferences",
    "members_wake_on",
    "rule_victims",
    "rules_preferences",
    "rules_refusing",
    "rules_verdict",
    "touch_of",
    "wake_on",
]

log = logging.getLogger(__name__)

#: How long a cycle waits for the placed-pod watch's first list (only just after start).
SYNC_SECONDS = 10.0
#: ctx.state key of the PreFilter verdict (NodeCheck and explain read it).
VERDICT = "PodPlacementRules/verdict"
#: ctx.state key of the soft rules' preferences (explain may read it).
PREFERENCES = "PodPlacementRules/preferences"
#: ctx.state key: where the pod's request was narrowed to (a Narrowed) while later related pods wait.
NARROWED = "PodPlacementRules/narrowed"
#: ctx.state key: the :class:`Narrowing` of the request; the RM reservation undoes it and reserves
#: again once if the RM refuses the narrowed request.
NARROWING = "PodPlacementRules/narrowing"
#: ctx.state key: the node constraint (in ``ctx.node_constraints``) the verdict's rules added.
_RULES_TERMS = "PodPlacementRules/rules-terms"
#: ctx.state key: the earlier in-flight cycles the verdict counted in their regions.
COUNTED = "PodPlacementRules/counted"
#: ctx.state key: the pod's in-flight cycle.
_CYCLE = "PodPlacementRules/cycle"
#: ctx.state key of the nodes the rules exclude only because of lower-priority pods, with those
#: pods (contract v1.2 ``rulePreemption``; the reserve sends them).
RULE_PREEMPTION = "PodPlacementRules/rule-preemption"
#: The most nodes one cycle looks for a rule's victims on: each costs the rules' evaluation once
#: per lower-priority pod there (kube-scheduler, likewise, samples candidate nodes).
RULE_PREEMPTION_NODES = 16


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class Narrowing:
    """The node constraint that narrows a pod's request (:data:`NARROWING`), and the rules' own
    constraint it stands in for while it is sent.

    A narrowing to a part of a domain names its hosts (``hostname In``, a dozen values), every one
    of which the rules' verdict allows: ANDed with the rules' requirements (``hostname NotIn`` of
    every node a group's pods took, up to hundreds of values), those add nothing the RM could use,
    yet were encoded, sent, parsed, validated and fingerprinted with every reserve of a burst. So
    the narrowed request carries the hosts alone; refused, the request without the narrowing
    carries the rules' requirements again (:meth:`undo`). NodeCheck still re-checks the chosen node
    against every rule before the Binding.
    """

    terms: tuple[Mapping[str, Any], ...]
    #: the rules' constraint taken out of ``ctx.node_constraints`` meanwhile (None: kept there)
    replaces: tuple[Mapping[str, Any], ...] | None = None

    def undo(self, constraints: list[tuple[Mapping[str, Any], ...]]) -> None:
        """`constraints` (a cycle's node constraints) as they were before the narrowing."""
        _remove_identical(constraints, self.terms)
        if self.replaces is not None:
            constraints.append(self.replaces)


def _remove_identical(constraints: list[tuple[Mapping[str, Any], ...]], terms: object) -> bool:
    """Remove `terms` itself (not an equal constraint another plugin added) from `constraints`."""
    for index, constraint in enumerate(constraints):
        if constraint is terms:
            del constraints[index]
            return True
    return False


#: ctx.state key: the pod's claims with ReadWriteOncePod access (set by VolumeBinding's PreFilter).
EXCLUSIVE_CLAIMS = "ReadWriteOncePodClaims"


def _exclusive_claims(ctx: CycleContext) -> tuple[str, ...]:
    claims = ctx.state.get(EXCLUSIVE_CLAIMS)
    return tuple(claims) if isinstance(claims, tuple) else ()


def claim_in_use(pod: PodInfo, claims: Sequence[str], placed: PlacedPods) -> str | None:
    """Pure over the cache: the first of `claims` (ReadWriteOncePod) that another pod on a node, bound
    or assumed, uses; None when none is.

    kube-scheduler's VolumeRestrictions (volumerestrictions/volume_restrictions.go, v1.36) refuses
    such a pod at PreFilter as Unschedulable, whatever the node: the claim may be mounted by one pod
    only. A finished pod no longer holds it (the cache drops Succeeded and Failed pods).
    """
    wanted = set(claims)
    for other in placed.in_namespace(pod.namespace):
        if other.uid != pod.uid and not wanted.isdisjoint(other.claims):
            return next(c for c in claims if c in other.claims)
    return None


def _incoming(pod: PodInfo) -> Incoming:
    """The pod as the pure rules read it (the filters ignore its soft rules, the scores use them)."""
    return Incoming(
        namespace=pod.namespace,
        labels=pod.labels,
        rules=pod.rules,
        node_selector=pod.node_selector,
        node_terms=pod.affinity_terms,
        tolerations=pod.tolerations,
        uid=pod.uid,
        soft=pod.soft,
    )


def rules_verdict(pod: PodInfo, placed: PlacedPods) -> Verdict | None:
    """The rules' verdict for `pod` against the pods on nodes now (itself excluded); None when
    nothing can apply (no rules of its own, and no placed pod with anti-affinity)."""
    return _verdict(pod, placed, placed)


def may_be_awaited(ctx: CycleContext) -> bool:
    """Whether another cycle may wait for this pod's node (:meth:`InFlight.wait`): its reserve then
    goes to the RM in a request of its own. Unknown (no placed-pod cache): yes."""
    cycle = ctx.state.get(_CYCLE)
    placed = ctx.ports.placed
    if not isinstance(cycle, _Cycle) or placed is None:
        return True
    return placed.in_flight.may_be_awaited(cycle, namespace_labels=placed.namespace_labels)


def counted_by(ctx: CycleContext) -> frozenset[str]:
    """The pods placed counting this one in the region it was sent to, before its node was known.

    Placed as if it came before them, so its own re-check before the Binding leaves them out, as
    a sequential scheduler would have checked it before they existed: with them, a spread may
    look skewed from its side (its zone and theirs counted, the pods they balance still in flight).
    """
    cycle = ctx.state.get(_CYCLE)
    if isinstance(cycle, _Cycle) and cycle.counted_by:
        return frozenset(cycle.counted_by)
    return frozenset()


def rules_refusing(
    pod: PodInfo, placed: PlacedPods, node: str, *, without: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """The rules of :func:`rules_verdict` whose effect excludes `node` (none when there is no
    verdict): the same answer, computed for that node only (NodeCheck's pre-bind re-check);
    `without`: pods left out (:func:`counted_by`)."""
    view: PlacedView = _Without(placed, without) if without else placed
    if not _may_apply(pod, view, placed):
        return ()
    return refusing(
        pod=_incoming(pod),
        placed=view,
        nodes=placed.nodes(),
        namespace_labels=placed.namespace_labels,
        node=node,
    )


def _verdict(pod: PodInfo, view: PlacedView, placed: PlacedPods) -> Verdict | None:
    """:func:`rules_verdict` over the pods of `view` (the nodes and namespaces from `placed`)."""
    if not _may_apply(pod, view, placed):
        return None  # no rule of its own, and no placed pod's anti-affinity selects it
    return evaluate(
        pod=_incoming(pod),
        placed=view,
        nodes=placed.nodes(),
        namespace_labels=placed.namespace_labels,
    )


def _may_apply(pod: PodInfo, view: PlacedView, placed: PlacedPods) -> bool:
    """Whether the pod has rules of its own, or a placed pod's anti-affinity selects it."""
    return bool(pod.rules) or any(
        term.matches(
            namespace=pod.namespace,
            labels=pod.labels,
            owner_namespace=owner,
            namespace_labels=placed.namespace_labels,
        )
        for owner, terms, members in view.anti_affinity_groups_toward(pod.namespace)
        if any(other.uid != pod.uid for other in members)  # once per group, not per pod
        for term in terms
    )


class _WithPlacing:
    """The pods on nodes, plus the earlier in-flight pods of the evaluated pod's group on their
    regions' anchors (only that evaluation sees them there; see :meth:`PodPlacementRules._verdict_around`)."""

    def __init__(self, placed: PlacedPods, extra: Sequence[PlacedPod]) -> None:
        self._placed = placed
        self._extra = extra

    def in_namespace(self, namespace: str) -> Iterable[PlacedPod]:
        return itertools.chain(
            self._placed.in_namespace(namespace), (p for p in self._extra if p.namespace == namespace)
        )

    def label_groups(self, namespace: str) -> Iterable[tuple[Mapping[str, str], Iterable[PlacedPod]]]:
        extra = [p for p in self._extra if p.namespace == namespace]
        if not extra:
            return self._placed.label_groups(namespace)
        return [*self._placed.label_groups(namespace), *((p.labels, (p,)) for p in extra)]

    def namespaces(self) -> Iterable[str]:
        return {*self._placed.namespaces(), *(p.namespace for p in self._extra)}

    def with_anti_affinity(self) -> Iterable[PlacedPod]:
        return itertools.chain(self._placed.with_anti_affinity(), (p for p in self._extra if p.anti_affinity))

    def anti_affinity_toward(self, namespace: str) -> Iterable[PlacedPod]:
        return itertools.chain(
            self._placed.anti_affinity_toward(namespace), (p for p in self._extra if p.anti_affinity)
        )

    def anti_affinity_groups_toward(
        self, namespace: str
    ) -> Iterable[tuple[str, tuple[AffinityTerm, ...], Iterable[PlacedPod]]]:
        return [
            *self._placed.anti_affinity_groups_toward(namespace),
            *((p.namespace, p.anti_affinity, (p,)) for p in self._extra if p.anti_affinity),
        ]

    def with_host_ports(self) -> Iterable[PlacedPod]:
        return itertools.chain(self._placed.with_host_ports(), (p for p in self._extra if p.host_ports))


class _Kept:
    """A group's pods without `gone`, filtered when iterated (again at every iteration).

    Lazily, because the filters walk only the groups whose labels a selector matches: copying every
    group of the namespace cost NodeCheck's re-check a pass over all its pods (issue 19's backlog).
    """

    __slots__ = ("_gone", "_pods")

    def __init__(self, pods: Iterable[PlacedPod], gone: frozenset[str]) -> None:
        self._pods = pods
        self._gone = gone

    def __iter__(self) -> Iterator[PlacedPod]:
        gone = self._gone
        return (pod for pod in self._pods if pod.uid not in gone)


def _kept_group(pods: Iterable[PlacedPod], gone: frozenset[str]) -> Iterable[PlacedPod]:
    """A group's pods without `gone`: the cache's groups as a counted copy (the filters' fast
    paths read their per-node counts), any other iterable filtered lazily."""
    if isinstance(pods, GroupPods):
        return pods.without(gone)
    return _Kept(pods, gone)


class _Without:
    """The pods on nodes as they will be once `gone` (a preemption plan's victims, or the later pods
    that counted the one being checked) have left."""

    def __init__(self, placed: PlacedPods, gone: frozenset[str]) -> None:
        self._placed = placed
        self._gone = gone

    def _kept(self, pods: Iterable[PlacedPod]) -> Iterator[PlacedPod]:
        return (pod for pod in pods if pod.uid not in self._gone)

    def in_namespace(self, namespace: str) -> Iterable[PlacedPod]:
        return self._kept(self._placed.in_namespace(namespace))

    def label_groups(self, namespace: str) -> Iterable[tuple[Mapping[str, str], Iterable[PlacedPod]]]:
        return [
            (labels, _kept_group(pods, self._gone)) for labels, pods in self._placed.label_groups(namespace)
        ]

    def namespaces(self) -> Iterable[str]:
        return self._placed.namespaces()

    def with_anti_affinity(self) -> Iterable[PlacedPod]:
        return self._kept(self._placed.with_anti_affinity())

    def anti_affinity_toward(self, namespace: str) -> Iterable[PlacedPod]:
        return self._kept(self._placed.anti_affinity_toward(namespace))

    def anti_affinity_groups_toward(
        self, namespace: str
    ) -> Iterable[tuple[str, tuple[AffinityTerm, ...], Iterable[PlacedPod]]]:
        return [
            (owner, terms, _kept_group(pods, self._gone))
            for owner, terms, pods in self._placed.anti_affinity_groups_toward(namespace)
        ]

    def with_host_ports(self) -> Iterable[PlacedPod]:
        return self._kept(self._placed.with_host_ports())


def broken_after_preemption(
    pod: PodInfo, placed: PlacedPods, *, node: str, victims: Collection[str], names: Sequence[str] = ()
) -> str | None:
    """Why `pod` would still break its inter-pod rules on `node` once the plan's `victims` (UIDs)
    are gone, or None when it would not (or the node is unknown to the cache: nothing to judge).

    The RM chooses victims by what they free; it knows nothing of pod labels. Evicting them may
    take away the very pod a required pod affinity needs on that node (or not be enough for a
    spread or anti-affinity rule), and the preemptor would then be refused by its rules on the room
    made for it: the victims evicted for nothing. kube-scheduler runs its filters on each candidate
    node with the victims removed (DefaultPreemption's ``SelectVictimsOnNode``, through the
    PreFilter extensions ``RemovePod`` of InterPodAffinity and PodTopologySpread); this is the same
    question asked of the one node the RM proposes, before anything is confirmed or evicted.
    ``names``: the victims as ``namespace/name``, for the message.
    """
    if not any(known.name == node for known in placed.nodes()):
        return None
    verdict = _verdict(pod, _Without(placed, frozenset(victims)), placed)
    if verdict is None:
        return None
    breaking = [effect for effect in verdict.effects if node in effect.excluded]
    if not breaking:
        return None
    evicted = ", ".join(names) if names else f"{len(victims)} victim(s)"
    rules = "; ".join(effect.summary or effect.rule for effect in breaking)
    return (
        f"with the plan's victims gone ({evicted}), the pod's placement rules would still exclude node "
        f"{node}: {rules}"
    )


def rule_victims(
    pod: PodInfo, placed: PlacedPods, verdict: Verdict, *, limit: int = RULE_PREEMPTION_NODES
) -> dict[str, tuple[PlacedPod, ...]]:
    """Per node the rules exclude only because of lower-priority pods, the fewest of those pods whose
    leaving lets the pod's rules accept it there (contract v1.2 ``rulePreemption``).

    kube-scheduler preempts *for* a rule: its DefaultPreemption removes every lower-priority pod
    from a candidate node, runs the filters (PodTopologySpread and InterPodAffinity among them), then
    gives pods back, highest priority first, while the pod still passes (``SelectVictimsOnNode``).
    The RM chooses victims by room and knows no labels, so the caller names them: e.g. Kubernetes'
    e2e "PodTopologySpread Preemption", where room needs one low pod gone and the spread two.
    Nodes a required pod affinity excludes are skipped (evicting pods never brings one its affinity
    needs); terminating and assumed pods are never named (they are leaving, or are this process's
    own cycles). A node that needs more victims than the contract carries (``MAX_RULE_VICTIMS``) is
    left out: the field could not name them all."""
    if pod.preemption_policy == "Never" or not verdict.effects:
        return {}
    lowest = placed.lowest_priority()
    if lowest is None or lowest >= pod.priority:
        return {}  # no pod anywhere it could preempt (the common case: one priority for all)
    hopeless = {node for effect in verdict.effects if effect.rule == AFFINITY for node in effect.excluded}
    excluded = {node for effect in verdict.effects for node in effect.excluded}
    nodes = sorted((excluded & set(verdict.candidates)) - hopeless)
    if not nodes:
        return {}
    lower: dict[str, list[PlacedPod]] = {}
    for node in nodes:
        for other in placed.on_node(node):
            if (
                other.priority < pod.priority
                and not other.terminating
                and not other.assumed
                and other.uid != pod.uid
            ):
                lower.setdefault(node, []).append(other)
    found: dict[str, tuple[PlacedPod, ...]] = {}
    for node in [node for node in nodes if node in lower][:limit]:
        victims = {other.uid: other for other in lower[node]}
        if broken_after_preemption(pod, placed, node=node, victims=victims.keys()) is not None:
            continue  # even with every lower-priority pod gone the rules exclude it
        for other in sorted(lower[node], key=lambda p: (-p.priority, p.uid)):
            if broken_after_preemption(pod, placed, node=node, victims=victims.keys() - {other.uid}) is None:
                del victims[other.uid]  # reprieved: the rules accept the pod with it staying
        if 0 < len(victims) <= MAX_RULE_VICTIMS:
            found[node] = tuple(sorted(victims.values(), key=lambda p: (p.priority, p.uid)))
    return found


def rule_preemption(found: Mapping[str, Sequence[PlacedPod]]) -> list[RulePreemption]:
    """:func:`rule_victims` as the reserve's ``rulePreemption`` field."""
    return [
        RulePreemption(
            node=node,
            victims=[RuleVictim(namespace=p.namespace, name=p.name, uid=p.uid) for p in victims],
        )
        for node, victims in sorted(found.items())
    ]


def _takes_rule_preemption(ctx: CycleContext) -> bool:
    """Whether the profile's RM client may pass ``rulePreemption`` on (a client without the method
    is taken not to: the victims are chosen only for an RM that may receive them)."""
    known = getattr(ctx.profile.client, "takes_rule_preemption", None)
    return False if known is None else bool(known())


def rules_preferences(pod: PodInfo, placed: PlacedPods, verdict: Verdict | None = None) -> Preferences | None:
    """The soft rules' weighted node terms for `pod` (within what the contract carries beside the
    pod's own preferred node affinity), or None when nothing can apply: no soft rules of its own and
    no placed pod with affinity or preferred terms toward its namespace (one lookup, for most pods)."""
    if pod.soft is NO_SOFT:  # identity, not __bool__: this runs for every pod
        toward = placed.preferring_toward(pod.namespace)
        if not toward:
            return None
        incoming = _incoming(pod)
        if not selecting(incoming, toward, placed.namespace_labels):
            return None  # terms elsewhere (a namespaceSelector reaches every namespace) select other pods
    else:
        incoming = _incoming(pod)
    budget = max_items(Placement, "preferred_node_affinity") - len(pod.preferred_terms)
    return preferences(
        pod=incoming,
        placed=placed,
        nodes=placed.nodes(),
        namespace_labels=placed.namespace_labels,
        budget=budget,
        excluded=frozenset(name for effect in verdict.effects for name in effect.excluded)
        if verdict is not None
        else frozenset(),
    )


#: Tags of placed pods that can lift a refusal from any namespace (see :func:`wake_on`).
TAG_ANTI_AFFINITY = "anti-affinity"
TAG_HOST_PORTS = "host-ports"
TAG_CLAIMS = "claims"


def wake_on(pod: PodInfo) -> WakeOn:
    """The placed-pod changes that may lift this plugin's refusal of `pod` (a superset).

    Its own affinity, anti-affinity and spread read the placed pods of its namespace, or of the
    terms' namespaces (a namespaceSelector: any namespace); an existing pod's anti-affinity toward it
    can sit in any namespace, and so can a pod holding its host ports or its ReadWriteOncePod claim.
    Node changes move every parked pod anyway (`PendingPods.on_node_event`).
    """
    namespaces: set[str] | None = {pod.namespace}
    for term in (*pod.rules.affinity, *pod.rules.anti_affinity):
        if term.namespace_selector is not None:
            namespaces = None
            break
        assert namespaces is not None
        namespaces.update(term.namespaces)
    tags = {TAG_ANTI_AFFINITY}
    if pod.rules.host_ports:
        tags.add(TAG_HOST_PORTS)
    if pod.claims:
        tags.add(TAG_CLAIMS)
    return WakeOn(
        namespaces=None if namespaces is None else frozenset(namespaces),
        tags=frozenset(tags),
        node_deleted=bool(pod.rules.spread),
    )


def members_wake_on(members: Iterable[PodInfo]) -> WakeOn:
    """What may lift the refusal of a pod group by its members' rules: any member's (see :func:`wake_on`)."""
    namespaces: set[str] | None = set()
    tags: set[str] = set()
    for member in members:
        one = wake_on(member)
        tags.update(one.tags)
        if namespaces is not None:
            namespaces = None if one.namespaces is None else namespaces | one.namespaces
    return WakeOn(namespaces=None if namespaces is None else frozenset(namespaces), tags=frozenset(tags))


def touch_of(pod: PlacedPod) -> Touch:
    """What a placed pod's arrival, change or departure may concern (see :func:`wake_on`)."""
    tags = []
    if pod.anti_affinity:
        tags.append(TAG_ANTI_AFFINITY)
    if pod.host_ports:
        tags.append(TAG_HOST_PORTS)
    if pod.claims:
        tags.append(TAG_CLAIMS)
    return Touch(namespace=pod.namespace, tags=frozenset(tags))


def _with_services(pod: PodInfo, placed: PlacedPods) -> PodInfo:
    """`pod` with the Services that select it in its default spreading (the same object if none)."""
    soft = with_service_spread(
        pod.soft,
        spread=bool(pod.rules.spread),
        labels=pod.labels,
        services=placed.service_selectors(pod.namespace),
    )
    return pod if soft is pod.soft else dataclasses.replace(pod, soft=soft)


def _takes_preferences(ctx: CycleContext) -> bool:
    """Whether the profile's RM client may pass node preferences on (the real client knows from
    ``GET /v1/info``; a client without the method is taken to pass them, as before)."""
    known = getattr(ctx.profile.client, "takes_node_preferences", None)
    return True if known is None else bool(known())


class PodPlacementRules:
    """PreFilter + Reserve: see the module docstring."""

    name = "PodPlacementRules"

    def __init__(self, *, wait_seconds: float = WAIT_SECONDS) -> None:
        self._wait_seconds = wait_seconds

    async def pre_filter(self, *, ctx: CycleContext) -> Status:
        placed = ctx.ports.placed
        pod = ctx.pod
        if placed is None:
            if _exclusive_claims(ctx):
                return Status.error(
                    "the pod uses a ReadWriteOncePod claim but this scheduler has no watch of placed pods "
                    "to see whether another pod uses it; it is not placed without that check"
                )
            if pod.rules:
                return Status.error(
                    "the pod states inter-pod rules (pod affinity, topology spread or host ports) but this "
                    "scheduler has no watch of placed pods to evaluate them; it is not placed without them"
                )
            return Status.success()
        if not await placed.wait_synced(SYNC_SECONDS):
            # Every pod waits, those without rules too: existing pods' anti-affinity toward it is
            # only known once the placed pods are listed.
            return Status.error(
                f"the watch of pods on nodes has not listed them within {SYNC_SECONDS:g} s of start, so "
                "the inter-pod rules (this pod's, and existing pods' anti-affinity toward it) cannot be "
                "evaluated yet; retrying"
            )
        # Soft rules only shape placement at an RM that takes node preferences; for any other the
        # scoring (milliseconds on a large cluster) and the waits in a burst would buy nothing.
        takes_preferences = _takes_preferences(ctx)
        if takes_preferences:
            pod = _with_services(pod, placed)
        cycle = placed.in_flight.begin(pod, soft=takes_preferences)
        ctx.state[_CYCLE] = cycle
        deadline = asyncio.get_running_loop().time() + self._wait_seconds
        await placed.in_flight.wait(
            cycle, namespace_labels=placed.namespace_labels, seconds=self._wait_seconds
        )
        if (exclusive := _exclusive_claims(ctx)) and (
            used := claim_in_use(pod, exclusive, placed)
        ) is not None:
            return Status.unschedulable(
                f'VolumeRestrictions: persistentvolumeclaim "{used}" has access mode ReadWriteOncePod and '
                "another pod uses it (node has pod using PersistentVolumeClaim with the same name and "
                "ReadWriteOncePod access mode)"
            )
        verdict = await self._verdict_around(cycle, pod, placed, ctx, deadline)
        if verdict is not None:
            ctx.state[VERDICT] = verdict
            refusal = verdict.refusal()
            if refusal is not None:
                found = (
                    rule_victims(pod, placed, verdict)
                    if pod.preemption_policy != "Never" and _takes_rule_preemption(ctx)
                    else {}
                )
                if not found:
                    return Status.unschedulable(refusal)
                # Every node is excluded, some only because of lower-priority pods: the reserve
                # places nowhere (the RM never places on a listed node) and may only plan there.
                # Each node's term is ANDed with each of the pod's own: as many nodes as the cap
                # on requiredNodeAffinity's terms leaves room for.
                room = max_items(Placement, "required_node_affinity") // max(
                    1, len(ctx.required_node_terms())
                )
                if room < 1:
                    return Status.unschedulable(refusal)
                found = dict(sorted(found.items())[:room])
                ctx.state[RULE_PREEMPTION] = rule_preemption(found)
                # One term per node: ``metadata.name`` takes one value per requirement.
                ctx.require_nodes(
                    [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                        for node in sorted(found)
                    ]
                )
                return Status.success()
            term = verdict.term()
            if term is not None:
                ctx.require_nodes([term])
                ctx.state[_RULES_TERMS] = ctx.node_constraints[-1]
                too_many = _beyond_caps(ctx.required_node_terms())
                if too_many is not None:
                    return Status.unschedulable(too_many)
                if pod.preemption_policy != "Never" and _takes_rule_preemption(ctx):
                    found = rule_victims(pod, placed, verdict)
                    if found:
                        ctx.state[RULE_PREEMPTION] = rule_preemption(found)
            if RULE_PREEMPTION not in ctx.state:
                self._narrow(cycle, pod, placed, verdict, ctx)
        preferred = rules_preferences(pod, placed, verdict) if takes_preferences else None
        if preferred is not None and preferred.terms:
            ctx.state[PREFERENCES] = preferred
            ctx.prefer_nodes(preferred.terms)
        narrowed = ctx.state.get(NARROWED)
        if isinstance(narrowed, Narrowed):
            # The later pods of its group go on meanwhile, counting it on a node of its region; only
            # their own evaluation sees it there (never the shared cache: another Deployment's pod
            # that does not wait for it must not count it where it may not land).
            placed.in_flight.place(pod.uid, narrowed, _assumed(pod, narrowed.anchor))
        return Status.success()

    async def _verdict_around(
        self, cycle: _Cycle, pod: PodInfo, placed: PlacedPods, ctx: CycleContext, deadline: float
    ) -> Verdict | None:
        """The verdict, counting the earlier pods of its group sent to a region whose node is not
        known yet: on their anchors (:class:`_WithPlacing`), their anti-affinity kept off their
        whole regions (:meth:`_around`). Refused only because of them, maybe (a region is excluded
        where the pod will take one node): once they have their nodes (or failed) the verdict is
        computed again; bounded by the wait's deadline, past which it goes on with what is known.

        The pods counted are kept (:data:`COUNTED`): Reserve waits for their nodes before PreBind,
        so NodeCheck re-checks the pod against where they did land (or against their absence)."""
        loop = asyncio.get_running_loop()
        while True:
            placing = placed.in_flight.placing(cycle)
            if not placing:
                return rules_verdict(pod, placed)
            view = _WithPlacing(placed, [other.anchored for other in placing if other.anchored is not None])
            verdict = _verdict(pod, view, placed)
            if verdict is None:
                return None
            around = self._around(cycle, pod, placed, verdict, placing)
            left = deadline - loop.time()
            if around.refusal() is None or left <= 0:
                ctx.state[COUNTED] = tuple(placing)
                for other in placing:
                    if other.counted_by is None:
                        other.counted_by = set()
                    other.counted_by.add(pod.uid)
                return around
            await placed.in_flight.wait_nodes(placing, seconds=left)

    @staticmethod
    def _around(
        cycle: _Cycle, pod: PodInfo, placed: PlacedPods, verdict: Verdict, placing: Sequence[_Cycle]
    ) -> Verdict:
        """The verdict with the anti-affinity kept off the domains of `placing` (earlier pods of
        the pod's group sent to a domain, their nodes not known yet)."""
        group = cycle.group
        assert group is not None
        assert group.narrow_key is not None
        return with_effect(
            verdict,
            in_flight_exclusions(
                nodes=placed.nodes(),
                key=group.narrow_key,
                placing=[other.region for other in placing if other.region is not None],
                anti_keys=group.anti_keys,
            ),
        )

    @staticmethod
    def _narrow(cycle: _Cycle, pod: PodInfo, placed: PlacedPods, verdict: Verdict, ctx: CycleContext) -> None:
        """Send the pod to one region of its spread's key when later pods of its group are in
        flight, so that they need not wait for its node (see :func:`_narrow_key`): a requirement
        of its own (:data:`NARROWING`), which the reserve drops and tries once more without should
        the RM refuse it (the region chosen may be full while another has room)."""
        group = cycle.group
        if group is None or group.narrow_key is None or not placed.in_flight.may_narrow(pod.uid):
            return
        later = placed.in_flight.followed(cycle)
        if not later:
            return
        found = narrowing(
            pod=_incoming(pod), verdict=verdict, nodes=placed.nodes(), key=group.narrow_key, later=later
        )
        if found is None:
            return
        effect = narrowed_effect(nodes=placed.nodes(), key=group.narrow_key, narrowed=found, related=later)
        ctx.require_nodes((effect.term(),))
        terms = ctx.node_constraints[-1]
        if _beyond_caps(ctx.required_node_terms()) is not None:
            _remove_identical(ctx.node_constraints, terms)  # past the contract's caps: not narrowed
            return
        replaces = None
        rules_terms = ctx.state.get(_RULES_TERMS)
        if (
            found.hosts
            and isinstance(rules_terms, tuple)
            and _remove_identical(ctx.node_constraints, rules_terms)
        ):
            # Every host named is one the verdict allows (narrowing() picks among those): see Narrowing.
            replaces = rules_terms
        ctx.state[NARROWED] = found
        ctx.state[NARROWING] = Narrowing(terms=terms, replaces=replaces)
        ctx.state[VERDICT] = with_effect(verdict, effect)

    async def reserve(self, *, ctx: CycleContext) -> Status:
        placed = ctx.ports.placed
        if placed is None or ctx.node is None:
            return Status.success()
        placed.assume(_assumed(ctx.pod, ctx.node))
        placed.in_flight.settle(ctx.pod.uid)
        counted = ctx.state.get(COUNTED)
        if isinstance(counted, tuple) and counted:
            # Counted where they were sent, before the RM placed them: NodeCheck must see where
            # they landed, or that they failed, before this pod is bound.
            await placed.in_flight.wait_nodes(counted, seconds=self._wait_seconds)
        return Status.success()

    async def unreserve(self, *, ctx: CycleContext) -> None:
        placed = ctx.ports.placed
        if placed is None:
            return
        placed.forget(ctx.pod.uid)
        placed.in_flight.settle(ctx.pod.uid)
        if ctx.node is None and ctx.state.get(NARROWED) is not None:
            placed.in_flight.narrowed_refused(ctx.pod.uid)

    def events_to_register(self, *, pod: PodInfo, failure: Failure) -> Requeue | None:
        """A refusal by the rules waits for a placed pod in their scope (:func:`wake_on`) or a Node
        added or changed (its labels may be what a term reads); a DoNotSchedule spread for a Node
        deleted too (its domain may no longer count in the skew's minimum). An error comes back on
        its backoff."""
        if failure.kind is not FailureKind.PLUGIN_UNSCHEDULABLE:
            return None
        events = {ClusterEvent.NODE_ADDED, ClusterEvent.NODE_CHANGED, ClusterEvent.PLACED_POD}
        if pod.rules.spread:
            events.add(ClusterEvent.NODE_DELETED)
        return Requeue(events=frozenset(events), placed=wake_on(pod))

    async def reserve_member(self, *, ctx: CycleContext) -> None:
        """A pod group's member, reserved with its group: assumed on its node as `reserve` does, so
        that the other members' checks see it."""
        await self.reserve(ctx=ctx)

    async def unreserve_member(self, *, ctx: CycleContext) -> None:
        await self.unreserve(ctx=ctx)


def _assumed(pod: PodInfo, node: str) -> PlacedPod:
    """The pod as the cache counts it once assumed on `node`."""
    return PlacedPod(
        uid=pod.uid,
        namespace=pod.namespace,
        node=node,
        labels=pod.labels,
        host_ports=pod.rules.host_ports,
        anti_affinity=pod.rules.anti_affinity,
        affinity=pod.rules.affinity,
        preferred_affinity=pod.soft.affinity,
        preferred_anti_affinity=pod.soft.anti_affinity,
        claims=pod.claims,
        assumed=True,
        name=pod.name,
        priority=pod.priority,
        group=pod.scheduling_group or "",
    )


def member_node_terms(
    members: Sequence[PodInfo], placed: PlacedPods | None
) -> tuple[list[list[dict[str, Any]]] | None, str | None]:
    """For a pod group: each member's required node affinity with its inter-pod rules ANDed in
    (against the pods on nodes; the other members are not placed yet, so rules between members
    are checked only at PreBind, once every member is assumed on its node), or why not.

    ``(None, None)``: no member has anything to add.
    """
    if placed is None:
        if any(member.rules for member in members):
            return None, "the members state inter-pod rules but no watch of placed pods is wired"
        return None, None
    if (between := _rule_between_members(members, placed)) is not None:
        return None, between
    terms: list[list[dict[str, Any]]] = []
    changed = False
    for member in members:
        own = [dict(term) for term in member.affinity_terms]
        verdict = rules_verdict(member, placed)
        term = verdict.term() if verdict is not None else None
        if verdict is not None and (refusal := verdict.refusal()) is not None:
            return None, f"member {member.key}: {refusal}"
        if term is None:
            terms.append(own)
            continue
        combined = and_terms(own, [term])
        if (too_many := _beyond_caps(combined)) is not None:
            return None, f"member {member.key}: {too_many}"
        terms.append(combined)
        changed = True
    return (terms, None) if changed else (None, None)


#: A member's preferences: its own preferred node affinity, then its soft rules' terms.
MemberPreferences = tuple[tuple[int, Mapping[str, Any]], ...]


def member_preferences(
    members: Sequence[PodInfo],
    placed: PlacedPods | None,
    *,
    memo: dict[tuple[object, ...], MemberPreferences] | None = None,
) -> list[MemberPreferences] | None:
    """For a pod group: each member's weighted node preferences, its own preferred node affinity
    followed by its soft inter-pod rules' terms (as :func:`rules_preferences` scores them for a
    single pod), or None when no member has any soft-rule term.

    Why: a group is reserved in one request, so its members never pass PreFilter; without this
    their ScheduleAnyway spread, default spreading and preferred pod (anti-)affinity were dropped.
    The rules are scored against the pods on nodes only: the other members have no node yet, so
    soft rules between members are not counted (as the required ones, which are refused).
    Only for an RM that takes node preferences (the caller checks).

    ``memo`` (shared across calls for one group): members alike in everything the scoring reads
    (namespace, labels, rules, node constraints, own preferences) are scored once; a gang's
    members often are, and scoring one costs milliseconds on a large cluster.
    """
    if placed is None:
        return None
    memo = {} if memo is None else memo
    found: list[MemberPreferences] = []
    added = False
    for member in members:
        key = (  # everything _incoming and _with_services read but the uid
            member.namespace,
            tuple(sorted(member.labels.items())),
            repr(member.rules),
            repr(member.soft),
            repr(member.preferred_terms),
            repr(member.node_selector),
            repr(member.affinity_terms),
            repr(member.tolerations),
        )
        terms = memo.get(key)
        if terms is None:
            pod = _with_services(member, placed)
            preferred = rules_preferences(pod, placed, rules_verdict(pod, placed))
            terms = memo[key] = (*member.preferred_terms, *(preferred.terms if preferred is not None else ()))
        added = added or len(terms) > len(member.preferred_terms)
        found.append(terms)
    return found if added else None


def _rule_between_members(members: Sequence[PodInfo], placed: PlacedPods) -> str | None:
    """Why the group is refused when a member's required rule selects another member, or None.

    The RM is sent each member's rules against the pods already on nodes only: the other members
    have no node yet, so a rule between members would go unchecked (or, with NodeCheck Full, the
    group would be reserved and released again and again). Not supported yet: refused up front.
    """
    for member in members:
        rules = member.rules
        for other in members:
            if other.uid == member.uid:
                continue
            found = None
            for name, terms in (("pod anti-affinity", rules.anti_affinity), ("pod affinity", rules.affinity)):
                if any(
                    term.matches(
                        namespace=other.namespace,
                        labels=other.labels,
                        owner_namespace=member.namespace,
                        namespace_labels=placed.namespace_labels,
                    )
                    for term in terms
                ):
                    found = name
                    break
            same_namespace = other.namespace == member.namespace
            if (
                found is None
                and same_namespace
                and any(c.selector.matches(other.labels) for c in rules.spread)
            ):
                found = "topology spread"
            if found is not None:
                return (
                    f"member {member.key}'s required {found} selects member {other.key} of the same group; "
                    "inter-pod rules between the members of a pod group are not supported yet (only "
                    "rules toward pods already on nodes): drop the rule, or narrow its selector so it "
                    "selects no member"
                )
    return None


def _beyond_caps(terms: list[dict[str, Any]]) -> str | None:
    """``TooManyTerms`` naming the field when the merged terms exceed the contract's caps."""
    path = "placement.requiredNodeAffinity"
    for i, term in enumerate(terms):
        for key, field in (("matchExpressions", "match_expressions"), ("matchFields", "match_fields")):
            requirements = term.get(key) or ()
            if len(requirements) > (cap := max_items(NodeSelectorTerm, field)):
                return (
                    f"TooManyTerms: the pod's inter-pod rules need {len(requirements)} requirements in "
                    f"{path}[{i}].{key}, more than the {cap} the resource manager contract carries"
                )
            for j, requirement in enumerate(requirements):
                values = requirement.get("values") or ()
                if len(values) > (cap := max_items(NodeSelectorRequirement, "values")):
                    return (
                        f"TooManyTerms: the pod's inter-pod rules need {len(values)} values in "
                        f"{path}[{i}].{key}[{j}].values (key {requirement.get('key')}), more than the {cap} "
                        "the resource manager contract carries"
                    )
    return None
