"""Preemption plans of the reference RM (contract v1.2, feature ``preemption``).

When a reserve that carries ``preemptionPolicy: PreemptLowerPriority`` finds no node, the RM looks
for one node where evicting pods of lower priority makes room, and proposes them as a plan. The
caller evicts them and confirms the plan; from then until the lease ends (or the preemptor
reserves) the capacity the plan frees is held for the preemptor alone: every other reserve sees
the node with that much less allocatable, so another pod cannot slip into the room the victims
left (kubernetes/kubernetes#72124).

The candidates are the bound pods the pod mirror sees (``--mirror-nodes``), whoever placed them:
Bindery's pods and those of kube-scheduler alike, as kube-scheduler counts every pod. Without the
mirror the RM does not know its pods' priorities and proposes nothing.

PodDisruptionBudgets, which the mirror also follows, are respected as kube-scheduler's
DefaultPreemption respects them (``SelectVictimsOnNode``, ``pickOneNodeForPreemption``): on each
node the victims whose eviction a budget would refuse are given back first, and among nodes the
one with the fewest such victims wins. A plan may still name a protected victim when no node can
do without one; each such victim carries the budgets it would exceed (``violatedBudgets``), so the
caller, who evicts through the Eviction API, can refuse the plan before evicting anything. Without
the mirror the RM knows no budgets and names none. A pod group's members are victims together or
not at all (see :func:`choose_victims`).

Plans live in the store (``preemption_plans`` in SQLite and PostgreSQL), not in a server's memory:
with several replicas on one PostgreSQL a plan's confirm may reach any of them (a Service spreads
connections, not calls), and the room a confirmed plan holds must be out of every replica's reach.
So a store proposes a plan under its placement lock (two replicas never name one victim twice),
and each placement reads the held rooms inside its own transaction
(:class:`bindery.reference_rm.store.LivePlans`). A restart keeps them.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from bindery.podrules.model import LabelSelector
from bindery.podrules.parse import label_selector
from bindery.quantity import format_quantity, parse_quantity
from bindery.reference_rm.accounting import BoundPod, ClusterPods
from bindery.reference_rm.groups import MemberAsk, place_group
from bindery.reference_rm.placement import InventoryNode, Policy, effective_usage, fits, static_failure
from bindery.rm.models import PlanState

__all__ = [
    "ACTIVE_PLAN_STATES",
    "Budget",
    "BudgetIndex",
    "Candidate",
    "Chooser",
    "GroupCandidate",
    "Plan",
    "PlanMember",
    "Proposal",
    "as_of",
    "budget_from",
    "choose_group_victims",
    "choose_victims",
    "group_plan_key",
    "held_by_node",
    "hold_column",
    "plan_from_row",
    "victim_uids",
    "victims_column",
    "without_held",
]

#: How long a proposed plan waits for its confirm, and a confirmed one holds its room (seconds).
DEFAULT_LEASE_SECONDS = 60
#: A group's reprieve places the whole group once per candidate up to this many candidates (on the
#: nodes its members would use); past it, each node is reprieved alone (see choose_group_victims).
REPRIEVE_PLACEMENTS = 32


def _plus(into: dict[str, Decimal], usage: Mapping[str, Decimal], sign: int = 1) -> None:
    for name, amount in usage.items():
        into[name] = into.get(name, Decimal(0)) + sign * amount


@dataclass(frozen=True, slots=True)
class Budget:
    """The slim projection of a PodDisruptionBudget (policy/v1) the mirror keeps."""

    namespace: str
    name: str
    selector: LabelSelector
    #: ``status.disruptionsAllowed``: 0 until the disruption controller computed it, as the
    #: Eviction API reads it.
    disruptions_allowed: int
    #: ``status.disruptedPods``: pods whose eviction the controller already counted (by name).
    disrupted: frozenset[str] = frozenset()

    def covers(self, pod: BoundPod) -> bool:
        """Upstream's preemption skips a budget whose selector is empty or absent (it selects no pod
        there) and a pod the budget already counts as disrupted."""
        namespace, _, name = pod.key.partition("/")
        if namespace != self.namespace or self.selector.nothing or self.selector.empty:
            return False
        return name not in self.disrupted and self.selector.matches(dict(pod.labels))


def budget_from(raw: Mapping[str, Any]) -> Budget:
    """A PodDisruptionBudget (Kubernetes JSON shape) as the mirror keeps it."""
    metadata = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    return Budget(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        selector=label_selector(spec.get("selector")),
        disruptions_allowed=int(status.get("disruptionsAllowed") or 0),
        disrupted=frozenset(str(name) for name in status.get("disruptedPods") or {}),
    )


class BudgetIndex:
    """The PodDisruptionBudgets known, by namespace: a victim is tested only against its own
    namespace's budgets, since a budget selects pods of its namespace alone.

    Why: testing every budget of the cluster against every candidate, inside the placement lock,
    made one tenant's thousands of budgets slow every tenant's preemption. An index is immutable:
    :meth:`put` and :meth:`remove` return a new one that shares every other namespace's tuple, so
    the mirror keeps it as events arrive (a change costs one namespace's budgets, not the cluster's)
    and a chooser running in the store's thread reads one consistent view.
    """

    __slots__ = ("_by_namespace", "_count")

    def __init__(self, by_namespace: Mapping[str, tuple[Budget, ...]] | None = None) -> None:
        self._by_namespace: Mapping[str, tuple[Budget, ...]] = dict(by_namespace or {})
        self._count = sum(len(budgets) for budgets in self._by_namespace.values())

    @classmethod
    def of(cls, budgets: Iterable[Budget]) -> BudgetIndex:
        """An index of ``budgets``; a later budget of the same namespace and name replaces an
        earlier one in its place (as a mirror's dict keeps them)."""
        by_namespace: dict[str, dict[str, Budget]] = {}
        for budget in budgets:
            by_namespace.setdefault(budget.namespace, {})[budget.name] = budget
        return cls({namespace: tuple(named.values()) for namespace, named in by_namespace.items()})

    def in_namespace(self, namespace: str) -> tuple[Budget, ...]:
        """The budgets of ``namespace``, in the order they became known."""
        return self._by_namespace.get(namespace, ())

    def put(self, budget: Budget) -> BudgetIndex:
        """This index with ``budget`` added, or replacing the one of its name in its place."""
        current = self.in_namespace(budget.namespace)
        names = [known.name for known in current]
        if budget.name in names:
            at = names.index(budget.name)
            changed = (*current[:at], budget, *current[at + 1 :])
        else:
            changed = (*current, budget)
        return BudgetIndex({**self._by_namespace, budget.namespace: changed})

    def remove(self, namespace: str, name: str) -> BudgetIndex:
        """This index without the budget ``namespace/name`` (the same index if it has none)."""
        current = self.in_namespace(namespace)
        kept = tuple(known for known in current if known.name != name)
        if len(kept) == len(current):
            return self
        by_namespace = dict(self._by_namespace)
        if kept:
            by_namespace[namespace] = kept
        else:
            del by_namespace[namespace]
        return BudgetIndex(by_namespace)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Budget]:
        for budgets in self._by_namespace.values():
            yield from budgets


#: What the choosers accept as the budgets known: an index, or any sequence (indexed on the spot).
Budgets = BudgetIndex | Sequence[Budget]


def _indexed(budgets: Budgets) -> BudgetIndex:
    return budgets if isinstance(budgets, BudgetIndex) else BudgetIndex.of(budgets)


def _violations(victims: Sequence[BoundPod], budgets: BudgetIndex) -> dict[str, tuple[str, ...]]:
    """Per victim UID, the budgets its eviction would exceed when ``victims`` are evicted in this
    order (each eviction spends one of every covering budget's allowed disruptions), as upstream's
    ``filterPodsWithPDBViolation``; victims no budget refuses are absent. Only the budgets of a
    victim's own namespace are read (:class:`BudgetIndex`)."""
    allowed: dict[tuple[str, str], int] = {}
    found: dict[str, tuple[str, ...]] = {}
    for victim in victims:
        namespace, _, name = victim.key.partition("/")
        candidates = budgets.in_namespace(namespace)
        if not candidates:
            continue
        labels = dict(victim.labels)
        exceeded = []
        for budget in candidates:
            selector = budget.selector
            if (
                budget.namespace != namespace
                or selector.nothing
                or selector.empty
                or name in budget.disrupted
                or not selector.matches(labels)
            ):
                continue  # as Budget.covers, with the victim's labels made a dict once
            key = (budget.namespace, budget.name)
            left = allowed.get(key, budget.disruptions_allowed) - 1
            allowed[key] = left
            if left < 0:
                exceeded.append(budget.name)
        if exceeded:
            found[victim.uid] = tuple(exceeded)
    return found


def _units(
    members: Iterable[BoundPod],
    *,
    node: str,
    priority: int,
    spoken_for: frozenset[str],
    pods: ClusterPods,
    groups: dict[str, list[BoundPod]],
) -> list[tuple[BoundPod, ...]]:
    """The eviction candidates on ``node``, lowest priority first: single pods, and whole pod groups
    (see :func:`choose_victims`). ``groups`` caches every group's bound members, built on first use."""
    units: list[tuple[BoundPod, ...]] = []
    seen: set[str] = set()
    for pod in members:
        if pod.priority >= priority or pod.uid in spoken_for:
            continue
        if pod.group is None:
            units.append((pod,))
            continue
        if pod.group in seen:
            continue
        seen.add(pod.group)
        if not groups:
            for entry in pods.nodes.values():
                for member in entry.members:
                    if member.group is not None:
                        groups.setdefault(member.group, []).append(member)
        group = groups.get(pod.group, [pod])
        if all(m.node == node and m.priority < priority and m.uid not in spoken_for for m in group):
            units.append(tuple(sorted(group, key=lambda m: (m.priority, m.uid))))
    units.sort(key=lambda unit: (max(m.priority for m in unit), unit[0].uid))
    return units


@dataclass(frozen=True)
class Candidate:
    """One node where evicting ``victims`` makes room; ordered as kube-scheduler orders them.

    ``violations``: per victim UID, the PodDisruptionBudgets its eviction would exceed.
    """

    node: str
    victims: tuple[BoundPod, ...]
    violations: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def rank(self) -> tuple[int, int, int, int, str]:
        """Fewest victims a budget protects (kube-scheduler's first criterion), then fewest
        victims, then the lowest highest victim priority, then the lowest sum, then the name."""
        priorities = [victim.priority for victim in self.victims]
        return (len(self.violations), len(priorities), max(priorities), sum(priorities), self.node)


def _protected_first(
    units: Sequence[tuple[BoundPod, ...]], protected: Mapping[str, tuple[str, ...]]
) -> list[tuple[BoundPod, ...]]:
    """Upstream's reprieve order: the units a budget protects are given back first, then the others,
    each part in ``units``' order (highest priority first)."""
    return [u for u in units if any(p.uid in protected for p in u)] + [
        u for u in units if not any(p.uid in protected for p in u)
    ]


def _reprieve(
    units: Sequence[tuple[BoundPod, ...]],
    protected: Mapping[str, tuple[str, ...]],
    *,
    node: InventoryNode,
    usage: Mapping[str, Decimal],
    used: dict[str, Decimal],
) -> list[BoundPod]:
    """kube-scheduler's reprieve on one node: give each unit back (``used`` counts it again) while
    the pod still fits; the units that cannot be given back are the victims."""
    victims: list[BoundPod] = []
    for unit in _protected_first(units, protected):
        for pod in unit:
            _plus(used, pod.usage)
        if not fits(node, usage, used):
            for pod in unit:
                _plus(used, pod.usage, -1)
            victims.extend(unit)
    return victims


def choose_victims(
    *,
    nodes: Sequence[InventoryNode],
    requests: Mapping[str, Decimal],
    priority: int,
    placement: Mapping[str, Any],
    used_by_node: Mapping[str, Mapping[str, Decimal]],
    pods: ClusterPods,
    spoken_for: frozenset[str] = frozenset(),
    budgets: Budgets = (),
) -> Candidate | None:
    """The node and the smallest set of lower-priority pods to evict there so the pod fits, or None.

    Per node, as kube-scheduler's DefaultPreemption does: take away every pod of lower priority;
    if the pod still does not fit, the node cannot help. Otherwise give back the candidates, highest
    priority first, as long as the pod still fits: what is left are the victims, the lowest
    priorities first. ``used_by_node`` is what the RM counts in use now (its reservations, the pods
    it did not place, the rooms held for other plans); ``spoken_for`` are the pod UIDs that other
    plans already evict (they are not victims twice).

    A pod group's members (``spec.schedulingGroup``) are one candidate: all of them are evicted or
    none (volcano#4607: gang-blind victims break many jobs). A group is a candidate on a node only
    when every member bound anywhere is on that node, of lower priority and not spoken for;
    otherwise none of its members is (a plan frees room on one node, and evicting members elsewhere
    too is not proposed yet).

    ``budgets``: the PodDisruptionBudgets known. The candidates a budget protects (counted highest
    priority first, as upstream) are given back before the others, so they are victims only when
    the pod cannot fit without them.
    """
    best: Candidate | None = None
    index = _indexed(budgets)
    groups: dict[str, list[BoundPod]] = {}  # filled on the first group member met
    for node in nodes:
        if static_failure(node=node, **placement) is not None:
            continue
        entry = pods.nodes.get(node.name)
        if entry is None:
            continue
        usage = effective_usage(requests, node)
        used = dict(used_by_node.get(node.name, {}))
        if fits(node, usage, used):
            continue  # room without evicting (held for another plan, or freed since): not a plan
        units = _units(
            entry.members, node=node.name, priority=priority, spoken_for=spoken_for, pods=pods, groups=groups
        )
        if not units:
            continue
        for unit in units:
            for pod in unit:
                _plus(used, pod.usage, -1)
        if not fits(node, usage, used):
            continue
        highest_first = units[::-1]
        protected = _violations([p for unit in highest_first for p in unit], index) if index else {}
        victims = _reprieve(highest_first, protected, node=node, usage=usage, used=used)
        victims.sort(key=lambda pod: (pod.priority, pod.uid))
        chosen = _violations(victims[::-1], index) if protected else {}
        found = Candidate(node=node.name, victims=tuple(victims), violations=chosen)
        if best is None or found.rank() < best.rank():
            best = found
    return best


def choose_rule_victims(
    *,
    nodes: Sequence[InventoryNode],
    requests: Mapping[str, Decimal],
    priority: int,
    tolerations: Sequence[Mapping[str, Any]],
    required: Mapping[str, frozenset[str]],
    used_by_node: Mapping[str, Mapping[str, Decimal]],
    pods: ClusterPods,
    spoken_for: frozenset[str] = frozenset(),
    budgets: Budgets = (),
) -> Candidate | None:
    """The best plan on the nodes a caller named for its inter-pod rules (contract v1.2
    ``rulePreemption``), or None.

    On each such node every pod the caller named must be a victim; they, and pods for room on top
    (chosen as :func:`choose_victims` does: everything of lower priority away, then given back
    highest priority first while the pod fits), make the plan. The node needs no room to spare:
    a plan is what the caller asks for there, since the pod may not be placed on it without victims.
    The node is skipped when a named pod is not on it, not of lower priority, or already spoken for
    by another plan (only pods of lower priority may be named), or when a group member is named
    whose group is not all there. The caller's node selector and affinity already chose the node
    (its rules' requirement excludes it from the placement); its taints are still checked."""
    best: Candidate | None = None
    index = _indexed(budgets)
    groups: dict[str, list[BoundPod]] = {}
    by_name = {node.name: node for node in nodes}
    for name in sorted(required):
        node = by_name.get(name)
        entry = pods.nodes.get(name)
        if node is None or entry is None or not required[name]:
            continue
        if (
            static_failure(node=node, node_selector={}, affinity_terms=[], tolerations=tolerations)
            is not None
        ):
            continue
        units = _units(
            entry.members, node=name, priority=priority, spoken_for=spoken_for, pods=pods, groups=groups
        )
        named = [unit for unit in units if any(p.uid in required[name] for p in unit)]
        if not {p.uid for unit in named for p in unit} >= required[name]:
            continue  # a named pod is no candidate here: not on it, not lower, or spoken for
        usage = effective_usage(requests, node)
        used = dict(used_by_node.get(name, {}))
        for unit in units:
            for pod in unit:
                _plus(used, pod.usage, -1)
        if not fits(node, usage, used):
            continue
        others = [unit for unit in units if unit not in named][::-1]  # highest priority first
        protected = _violations([p for unit in others for p in unit], index) if index else {}
        victims = [p for unit in named for p in unit]
        victims += _reprieve(others, protected, node=node, usage=usage, used=used)
        victims.sort(key=lambda pod: (pod.priority, pod.uid))
        chosen = _violations(victims[::-1], index) if index else {}
        found = Candidate(node=name, victims=tuple(victims), violations=chosen)
        if best is None or found.rank() < best.rank():
            best = found
    return best


@dataclass
class Plan:
    """A plan and its lease; ``hold`` is what the preemptor needs on ``node`` once confirmed."""

    plan_id: str
    node: str
    pod_uid: str
    victims: tuple[BoundPod, ...]
    hold: Mapping[str, Decimal]
    lease_seconds: int
    expires_at: float
    state: PlanState = PlanState.PROPOSED
    #: Per victim UID, the PodDisruptionBudgets its eviction would exceed (``violatedBudgets``).
    violations: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: A group plan's members, each with its node and the room held for it there (a pod's plan
    #: has none: ``hold`` on ``node`` is its room).
    members: tuple[PlanMember, ...] = ()

    @property
    def active(self) -> bool:
        return self.state in (PlanState.PROPOSED, PlanState.CONFIRMED)

    def to_json(self) -> dict[str, Any]:
        return {
            "planId": self.plan_id,
            "node": self.node,
            "podUid": self.pod_uid,
            "victims": [
                {
                    **({"reservationId": victim.reservation_id} if victim.reservation_id else {}),
                    "pod": dict(zip(("namespace", "name"), victim.key.split("/", 1), strict=True))
                    | {"uid": victim.uid},
                    "frees": {name: format_quantity(amount) for name, amount in sorted(victim.usage.items())},
                    **({"node": victim.node} if self.members else {}),
                    **(
                        {"violatedBudgets": list(self.violations[victim.uid])}
                        if victim.uid in self.violations
                        else {}
                    ),
                }
                for victim in self.victims
            ],
            **(
                {"members": [{"podUid": member.pod_uid, "node": member.node} for member in self.members]}
                if self.members
                else {}
            ),
            "leaseSeconds": self.lease_seconds,
            "state": self.state.value,
            "expiresAt": datetime.fromtimestamp(self.expires_at, UTC).isoformat().replace("+00:00", "Z"),
        }


@dataclass(frozen=True)
class Proposal:
    """What a chooser found: the node, its victims, and the room the preemptor needs there."""

    node: str
    victims: tuple[BoundPod, ...]
    hold: Mapping[str, Decimal]
    violations: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: A group's plan: each member, its node and its room there (``node`` is the first member's).
    members: tuple[PlanMember, ...] = ()


#: Called by a store's ``propose_plan`` inside its placement transaction with the capacity in use
#: per node (the holds of other preemptors' confirmed plans included) and the pod UIDs that active
#: plans already evict; returns the plan to store, or None when no eviction makes room.
Chooser = Callable[[Mapping[str, Mapping[str, Decimal]], frozenset[str]], Proposal | None]

#: A plan's states that still hold (confirmed) or reserve victims (proposed and confirmed).
ACTIVE_PLAN_STATES = (PlanState.PROPOSED.value, PlanState.CONFIRMED.value)


def _quantities(usage: Mapping[str, Decimal]) -> dict[str, str]:
    return {name: format_quantity(amount) for name, amount in sorted(usage.items())}


def _amounts(text: Mapping[str, str]) -> dict[str, Decimal]:
    return {str(name): parse_quantity(str(amount)) for name, amount in text.items()}


def victims_column(victims: Iterable[BoundPod], violations: Mapping[str, tuple[str, ...]]) -> str:
    """A plan's victims as a store keeps them (JSON): what its answer names and what marks them
    spoken for, not the labels and group that chose them."""
    return json.dumps(
        [
            {
                "uid": victim.uid,
                "key": victim.key,
                "node": victim.node,
                "usage": _quantities(victim.usage),
                "reservationId": victim.reservation_id,
                "priority": victim.priority,
                **({"violatedBudgets": list(violations[victim.uid])} if victim.uid in violations else {}),
            }
            for victim in victims
        ]
    )


def hold_column(hold: Mapping[str, Decimal], members: Sequence[PlanMember] = ()) -> str:
    """The room a plan holds once confirmed: the preemptor's on the plan's node, or for a group's
    plan each member's on its own node (``{"members": [...]}``, which no resource name can be)."""
    if members:
        return json.dumps(
            {
                "members": [
                    {"podUid": member.pod_uid, "node": member.node, "hold": _quantities(member.hold)}
                    for member in members
                ]
            }
        )
    return json.dumps(_quantities(hold))


def _members_of(hold: Mapping[str, Any]) -> tuple[PlanMember, ...]:
    return tuple(
        PlanMember(pod_uid=str(item["podUid"]), node=str(item["node"]), hold=_amounts(item["hold"]))
        for item in hold.get("members") or ()
    )


#: The columns of a new plan's row, in the order of :func:`new_plan_row`'s values.
NEW_PLAN_COLUMNS = (
    "id, pod_uid, node, victims, hold, lease_seconds, state, created_at, expires_at, updated_at"
)


def new_plan_row(pod_uid: str, proposal: Proposal, *, lease_seconds: int, now: float) -> tuple[Any, ...]:
    """The values both stores insert for a proposed plan: a fresh id, the lease running from now."""
    return (
        f"pln-{uuid.uuid4().hex}",
        pod_uid,
        proposal.node,
        victims_column(proposal.victims, proposal.violations),
        hold_column(proposal.hold, proposal.members),
        lease_seconds,
        PlanState.PROPOSED.value,
        now,
        now + lease_seconds,
        now,
    )


def plan_from_row(
    *,
    plan_id: str,
    pod_uid: str,
    node: str,
    victims: str,
    hold: str,
    lease_seconds: int,
    state: str,
    expires_at: float,
) -> Plan:
    """A plan as a store row holds it (see :func:`victims_column`)."""
    stored = json.loads(victims)
    held = json.loads(hold)
    members = _members_of(held) if "members" in held else ()
    return Plan(
        plan_id=plan_id,
        node=node,
        pod_uid=pod_uid,
        victims=tuple(
            BoundPod(
                uid=str(item["uid"]),
                key=str(item["key"]),
                node=str(item["node"]),
                usage=_amounts(item["usage"]),
                reservation_id=None if item.get("reservationId") is None else str(item["reservationId"]),
                priority=int(item.get("priority") or 0),
            )
            for item in stored
        ),
        hold={} if members else _amounts(held),
        members=members,
        lease_seconds=int(lease_seconds),
        expires_at=float(expires_at),
        state=PlanState(state),
        violations={
            str(item["uid"]): tuple(str(name) for name in item["violatedBudgets"])
            for item in stored
            if item.get("violatedBudgets")
        },
    )


def as_of(plan: Plan, now: float) -> Plan | None:
    """``plan`` as its lease says at ``now``: an active plan whose lease ran out is expired; an
    ended one is remembered one lease more (a late confirm gets 409, not 404), then is gone."""
    if plan.active and plan.expires_at <= now:
        plan = dataclasses.replace(plan, state=PlanState.EXPIRED)
    if not plan.active and plan.expires_at + plan.lease_seconds <= now:
        return None
    return plan


def held_by_node(
    plans: Iterable[tuple[str, str, str]], *, except_pods: Collection[str] = ()
) -> dict[str, dict[str, Decimal]]:
    """Per node, the room confirmed plans hold for preemptors other than ``except_pods``;
    ``plans`` are the live confirmed plans as (preemptor pod UID, node, hold column)."""
    held: dict[str, dict[str, Decimal]] = {}
    for pod_uid, node, hold in plans:
        if pod_uid in except_pods:
            continue
        parsed = json.loads(hold)
        if "members" in parsed:  # a group's plan: each member's room on its own node
            for member in _members_of(parsed):
                _plus(held.setdefault(member.node, {}), member.hold)
        else:
            _plus(held.setdefault(node, {}), _amounts(parsed))
    return held


def victim_uids(victims: str) -> list[str]:
    """The pod UIDs of a victims column: spoken for while the plan is active."""
    return [str(item["uid"]) for item in json.loads(victims)]


def without_held(
    nodes: Sequence[InventoryNode], held: Mapping[str, Mapping[str, Decimal]]
) -> Sequence[InventoryNode]:
    """``nodes`` with the held room taken out of each node's allocatable (the same tuple when
    nothing is held, so placement keeps its cache of the inventory)."""
    if not held:
        return nodes
    return [
        dataclasses.replace(
            node,
            allocatable={
                name: amount - held[node.name].get(name, Decimal(0))
                for name, amount in node.allocatable.items()
            },
        )
        if node.name in held
        else node
        for node in nodes
    ]


# -- pod groups as preemptors (feature ``group-preemption``) ---------------------------------------


@dataclass(frozen=True)
class PlanMember:
    """One member of a group's plan: the node it is meant for and the room held for it there."""

    pod_uid: str
    node: str
    hold: Mapping[str, Decimal]


def group_plan_key(namespace: str, name: str) -> str:
    """The preemptor key a group's plan is stored and held under (``podUid`` in its answer): one
    active plan per group, as per pod. A pod UID never contains ``/``, so the two never meet."""
    return f"group/{namespace}/{name}"


@dataclass(frozen=True)
class GroupCandidate:
    """Where a group fits once ``victims`` are gone: per member (in request order) its node."""

    nodes: tuple[str, ...]
    victims: tuple[BoundPod, ...]
    violations: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def rank(self) -> tuple[int, int, int, int]:
        """As :meth:`Candidate.rank`: fewest protected victims, fewest victims, the lowest highest
        priority, the lowest sum."""
        priorities = [victim.priority for victim in self.victims]
        return (len(self.violations), len(priorities), max(priorities), sum(priorities))


def _group_units(
    *, nodes: Sequence[InventoryNode], priority: int, spoken_for: frozenset[str], pods: ClusterPods
) -> list[tuple[BoundPod, ...]]:
    """The candidates for a group's plan: single pods below ``priority``, and whole pod groups whose
    every bound member is below it, not spoken for and on a node of the inventory, wherever those
    members are (a group's plan may evict on several nodes, so a gang spread over nodes is evicted
    whole across them; a pod's plan, on one node, never takes such a gang)."""
    inventory = {node.name for node in nodes}
    groups: dict[str, list[BoundPod]] = {}
    for bound in pods.nodes.values():
        for member in bound.members:
            if member.group is not None:
                groups.setdefault(member.group, []).append(member)
    units: list[tuple[BoundPod, ...]] = []
    seen: set[str] = set()
    for node in nodes:
        entry = pods.nodes.get(node.name)
        if entry is None:
            continue
        for pod in entry.members:
            if pod.priority >= priority or pod.uid in spoken_for:
                continue
            if pod.group is None:
                units.append((pod,))
            elif pod.group not in seen:
                seen.add(pod.group)
                group = groups[pod.group]
                if all(
                    m.priority < priority and m.uid not in spoken_for and m.node in inventory for m in group
                ):
                    units.append(tuple(sorted(group, key=lambda m: (m.priority, m.uid))))
    return units


def choose_group_victims(
    *,
    members: Sequence[MemberAsk],
    topology_keys: Sequence[str],
    nodes: Sequence[InventoryNode],
    priority: int,
    used_by_node: Mapping[str, Mapping[str, Decimal]],
    pods: ClusterPods,
    policy: Policy,
    spoken_for: frozenset[str] = frozenset(),
    budgets: Budgets = (),
) -> GroupCandidate | None:
    """The fewest lower-priority pods, on any nodes, whose eviction lets every member fit, or None.

    kube-scheduler's reprieve, over the whole inventory instead of one node, since a group's members
    land on several nodes: take away every candidate below ``priority`` (the lowest priority among
    the members: a victim is below every one of them); if the group still does not fit
    (:func:`bindery.reference_rm.groups.place_group`, topology included), no plan helps. Otherwise
    give the candidates back one by one, those a PodDisruptionBudget protects first, then the others,
    highest priority first in each, keeping each given back while the whole group still fits. What
    is left are the victims; the members are placed as the group's reserve would place them with
    the victims gone. Pod groups among the candidates are one candidate each, as for a pod's plan;
    so the reprieve is also run giving the largest candidates back first, and the better of the two
    sets (ranked as a pod's candidate nodes are: fewest protected, then fewest victims) is the plan.
    """
    used = {node: dict(bucket) for node, bucket in used_by_node.items()}
    index = _indexed(budgets)
    units = _group_units(nodes=nodes, priority=priority, spoken_for=spoken_for, pods=pods)
    if not units:
        return None

    def place() -> tuple[str, ...] | None:
        return place_group(
            group="preemptor",
            members=members,
            topology_keys=topology_keys,
            nodes=nodes,
            usage_by_node=used,
            policy=policy,
        ).nodes

    def take(unit: tuple[BoundPod, ...], sign: int) -> None:
        for pod in unit:
            _plus(used.setdefault(pod.node, {}), pod.usage, sign)

    for unit in units:
        take(unit, -1)
    first = place()
    if first is None:
        return None
    if len(units) > REPRIEVE_PLACEMENTS:
        # Many candidates: those on nodes the first placement does not use go back in one step (one
        # look at whether the group still fits), so the reprieve weighs only where members would go.
        meant = set(first)
        outside = [unit for unit in units if not any(pod.node in meant for pod in unit)]
        for unit in outside:
            take(unit, 1)
        if outside and place() is None:
            for unit in outside:
                take(unit, -1)
        else:
            units = [unit for unit in units if any(pod.node in meant for pod in unit)]
    highest_first = sorted(units, key=lambda unit: (-max(m.priority for m in unit), unit[0].uid))
    protected = _violations([p for unit in highest_first for p in unit], index) if index else {}

    def candidate(victims: list[BoundPod], placed: tuple[str, ...] | None) -> GroupCandidate | None:
        if not victims or placed is None:
            return None  # the group fits as things are (room freed meanwhile): no plan
        victims.sort(key=lambda pod: (pod.priority, pod.uid))
        chosen = _violations(victims[::-1], index) if protected else {}
        return GroupCandidate(nodes=placed, victims=tuple(victims), violations=chosen)

    def reprieve(order: Sequence[tuple[BoundPod, ...]]) -> GroupCandidate | None:
        """Give ``order``'s units back while the group fits (``used`` is as it was after)."""
        victims: list[BoundPod] = []
        kept: list[tuple[BoundPod, ...]] = []
        for unit in _protected_first(order, protected):
            take(unit, 1)
            if place() is None:
                take(unit, -1)
                victims.extend(unit)
            else:
                kept.append(unit)
        placed = place()
        for unit in kept:
            take(unit, -1)
        return candidate(victims, placed)

    def per_node(order: Sequence[tuple[BoundPod, ...]]) -> GroupCandidate | None:
        """The members where ``first`` put them; on each of those nodes, kube-scheduler's one-node
        reprieve for their summed requests (a fit test per candidate, no placement)."""
        by_name = {node.name: node for node in nodes}
        needs: dict[str, dict[str, Decimal]] = {}
        for ask, name in zip(members, first, strict=True):
            _plus(needs.setdefault(name, {}), effective_usage(ask.requests, by_name[name]))
        victims: list[BoundPod] = []
        kept: list[tuple[BoundPod, ...]] = []
        for unit in _protected_first(order, protected):
            take(unit, 1)
            if all(fits(by_name[n], needs.get(n, {}), used.get(n, {})) for n in {pod.node for pod in unit}):
                kept.append(unit)
            else:
                take(unit, -1)
                victims.extend(unit)
        for unit in kept:
            take(unit, -1)
        return candidate(victims, first)

    # Upstream's order (highest priority given back first), and the largest units first, which
    # keeps a gang whole where one smaller victim elsewhere does: the better by a pod's plan's rank.
    # Each try places the whole group, so past REPRIEVE_PLACEMENTS candidates the members stay
    # where the first placement put them and each node is reprieved alone (placing a group of 100
    # on 500 nodes once per candidate took 42 s inside the store's placement lock).
    orders = (highest_first, sorted(highest_first, key=lambda unit: -len(unit)))
    reprieved = reprieve if len(units) <= REPRIEVE_PLACEMENTS else per_node
    found = [reprieved(order) for order in orders]
    return min((c for c in found if c is not None), key=GroupCandidate.rank, default=None)
