"""Preemption decisions (contract v1.2, feature ``preemption``), free of I/O.

The RM proposes a plan with its Unschedulable answer; before anything is evicted Bindery vets it
against the cluster as it is now, because the RM's view of the pods may be a moment old: a victim
deleted and recreated under the same name is another pod, one that moved is no longer in the way,
one whose priority is not lower would not be evicted by kube-scheduler either.

Nor is the RM trusted with more than it is owed: it may be buggy or hostile, and Bindery holds the
eviction right. So a plan is carried out only when the reserve asked for one (the pod's policy, no
back-off, the ``preemption`` feature negotiated), the node is one the preemptor may run on (its
node selector, required node affinity, taints, as the node check reads them), every victim is
on that node, of strictly lower priority, frees something and no more than it requests, and, by
default (:class:`VictimScope`), is a pod this RM serves. Each refusal carries a reason
(:class:`Refusal`), counted by the controller. What the apiserver
is told (the victims' ``DisruptionTarget`` condition, the ``Preempted`` event) is shaped here as
kube-scheduler shapes it (``pkg/scheduler/framework/preemption``), so that tools reading those
keep working. The I/O is :mod:`bindery.controller.preemption`.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from decimal import Decimal
from typing import Any

from bindery.podresources import PodResourcesError, effective_requests
from bindery.podrules.parse import label_selector
from bindery.quantity import QuantityError, parse_quantity
from bindery.rm.models import PreemptionPlan, PreemptionVictim
from bindery.scheduling.nodecheck import NodeCheckMode, check_node
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection

__all__ = [
    "DISRUPTION_TARGET",
    "REFUSAL_REASONS",
    "PlanScope",
    "Preemptor",
    "Refusal",
    "VictimScope",
    "budgets_exceeded",
    "disruption_condition",
    "pod_group",
    "preempted_note",
    "unasked",
    "vet",
]

DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTED = "PreemptionByScheduler"

#: Why a plan is refused: the ``reason`` label of ``bindery_preemption_plans_refused_total``.
REFUSAL_REASONS = (
    "unasked",  # the reserve asked for no plan (policy Never, back-off, feature not negotiated)
    "preemptor",  # the plan is for another pod, or the preemptor says Never
    "node",  # the preemptor may not run on the plan's node
    "victim_gone",  # a victim was deleted or recreated
    "victim_node",  # a victim is not on the plan's node
    "victim_priority",  # a victim's priority is not below the preemptor's
    "victim_scope",  # a victim is not a pod this RM serves
    "frees",  # a victim frees nothing, or more than it requests
    "gang",  # the plan evicts part of a pod group
    "budget",  # a PodDisruptionBudget would refuse an eviction
    "rules",  # the preemptor's inter-pod rules still exclude the node
)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a plan is not carried out: ``reason`` (one of :data:`REFUSAL_REASONS`) and words for
    the log and the preemptor's event."""

    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


class VictimScope(enum.StrEnum):
    """Which pods an RM's plan may name (the ResourceManager's ``spec.preemption.victims``)."""

    #: Pods of its scheduler names in namespaces its ``namespaceSelector`` selects: an RM cannot
    #: evict kube-system's, another tenant's or another scheduler's pods. The default.
    SERVED = "Served"
    #: Any pod of lower priority, as kube-scheduler preempts: for an RM that counts the pods other
    #: schedulers bind (the reference RM with ``--mirror-nodes``) and is trusted to.
    ANY = "Any"


def _every_namespace(namespace: str) -> bool | None:
    return True


@dataclasses.dataclass(frozen=True)
class PlanScope:
    """What a ResourceManager's plans may touch, from its object."""

    rm_name: str
    victims: VictimScope = VictimScope.SERVED
    scheduler_names: frozenset[str] = frozenset()
    #: Whether its ``namespaceSelector`` selects a namespace; None while the labels are unknown.
    selects: Callable[[str], bool | None] = _every_namespace
    #: ``spec.nodeCheck``: how the plan's node is checked against the preemptor (``Off`` checks as
    #: ``Basic``: a plan on a node that does not exist evicts for nothing).
    node_check: NodeCheckMode = NodeCheckMode.FULL


def unasked(plan: PreemptionPlan, *, asked: str | None) -> Refusal | None:
    """Why a plan came although the reserve asked for none, or None when it asked.

    ``asked``: the ``preemptionPolicy`` of the reserve as sent to the RM (None when the client left
    it out: the RM's ``GET /v1/info`` does not list ``preemption``, or the reserve was narrowed to
    a region Bindery chose). A plan is an offer to evict: only an explicit ``PreemptLowerPriority``
    invites one.
    """
    if asked == "PreemptLowerPriority":
        return None
    why = (
        "its preemptionPolicy was Never (the pod's own policy, or its preemption back-off after a "
        "failed plan)"
        if asked == "Never"
        else "it carried no preemptionPolicy (the RM did not negotiate the preemption feature, or the "
        "reserve was narrowed to a region Bindery chose)"
    )
    return Refusal("unasked", f"the RM proposed plan {plan.plan_id} to a reserve that asked for none: {why}")


@dataclasses.dataclass(frozen=True)
class Preemptor:
    """Whom a plan makes room for: one pod, or the pending members of a pod group (feature
    ``group-preemption``). Both go through the same steps (vet, confirm, nominate, evict, back off);
    a group is nominated member by member, each on the node its plan holds room on."""

    #: The plan's ``podUid``: the pod's UID, or ``group/<namespace>/<name>`` for a group. Also the
    #: key of the preemptor's back-off.
    uid: str
    pods: tuple[PodInfo, ...]
    #: How messages name it: ``pod ns/name`` or ``pod group ns/name``.
    label: str

    @classmethod
    def of_pod(cls, pod: PodInfo) -> Preemptor:
        return cls(uid=pod.uid, pods=(pod,), label=f"pod {pod.key}")

    @classmethod
    def of_group(cls, *, namespace: str, name: str, members: Sequence[PodInfo]) -> Preemptor:
        return cls(
            uid=f"group/{namespace}/{name}", pods=tuple(members), label=f"pod group {namespace}/{name}"
        )

    @property
    def priority(self) -> int:
        """The lowest priority among its pods: a victim must be below every one of them."""
        return min(pod.priority for pod in self.pods)

    @property
    def scheduler_name(self) -> str:
        return self.pods[0].scheduler_name

    def never(self) -> PodInfo | None:
        """A pod with ``preemptionPolicy: Never``: then the preemptor preempts nothing."""
        return next((pod for pod in self.pods if pod.preemption_policy == "Never"), None)

    def pod_on(self, plan: PreemptionPlan, node: str) -> PodInfo:
        """The pod the room on ``node`` is for (a group's first member meant for it)."""
        if plan.members:
            uid = next((member.pod_uid for member in plan.members if member.node == node), None)
            return next((pod for pod in self.pods if pod.uid == uid), self.pods[0])
        return self.pods[0]


def pod_group(body: Mapping[str, Any]) -> str | None:
    """``namespace/podGroupName`` of a pod group member (``spec.schedulingGroup``), else None."""
    name = ((body.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    return f"{(body.get('metadata') or {}).get('namespace', '')}/{name}" if name else None


def vet(
    plan: PreemptionPlan,
    *,
    preemptor: PodInfo | Preemptor,
    victims: Mapping[str, Mapping[str, Any] | None],
    asked: str | None,
    scope: PlanScope,
    nodes: Callable[[str], NodeProjection | None],
    group_members: Mapping[str, Collection[str]] | None = None,
) -> Refusal | None:
    """Why the plan must not be carried out, or None when it may.

    ``victims``: each victim's current Pod by ``namespace/name`` (None when it is gone). ``asked``:
    the reserve's ``preemptionPolicy`` as sent (:func:`unasked`). ``scope``: what the RM's plans may
    touch. ``nodes``: the Nodes the watch knows, by name.
    ``group_members``: for each pod group a victim belongs to, the UIDs of its members bound now
    and not terminating; a plan that evicts some of them and not the others would break the gang
    (a gang with one member gone is of no use: its job waits or fails), so it is refused. A plan
    naming a victim a PodDisruptionBudget protects (``violatedBudgets``, from an RM that follows
    budgets) is refused whole: Bindery evicts through the Eviction API, which would refuse that
    victim, and evicting the others first would be evicting them for nothing.
    """
    if (refusal := unasked(plan, asked=asked)) is not None:
        return refusal
    who = preemptor if isinstance(preemptor, Preemptor) else Preemptor.of_pod(preemptor)
    if (never := who.never()) is not None:
        return Refusal("preemptor", f"pod {never.key} has preemptionPolicy Never")
    if plan.pod_uid != who.uid:
        return Refusal(
            "preemptor", f"the plan is for pod uid {plan.pod_uid}, not {who.label} (uid {who.uid})"
        )
    if plan.members and {member.pod_uid for member in plan.members} != {pod.uid for pod in who.pods}:
        return Refusal(
            "preemptor", f"the plan holds room for other pods than the pending members of {who.label}"
        )
    if (refusal := _node_refusal(plan, who=who, scope=scope, nodes=nodes)) is not None:
        return refusal
    rooms = {member.node for member in plan.members} or {plan.node}
    for victim in plan.victims:
        if (
            refusal := _victim_refusal(
                plan, victim, who=who, body=victims.get(_key(victim)), rooms=rooms, scope=scope
            )
        ) is not None:
            return refusal
    planned = {victim.pod.uid for victim in plan.victims}
    for group, members in sorted((group_members or {}).items()):
        kept = sorted(set(members) - planned)
        if kept and set(members) & planned:
            return Refusal(
                "gang",
                f"the plan evicts part of pod group {group} only ({len(kept)} bound member(s) would stay), "
                "which would break the gang; a group is evicted whole or not at all",
            )
    for victim in plan.victims:
        # Checked last, after every victim is known to be current: the Eviction API would answer
        # 429 for this one, possibly after others were evicted for nothing.
        if victim.violated_budgets:
            budgets = ", ".join(f"{victim.pod.namespace}/{name}" for name in victim.violated_budgets)
            plural = "s" if len(victim.violated_budgets) > 1 else ""
            where = plan.node_of(victim)
            return Refusal(
                "budget",
                f"evicting victim {victim.pod.namespace}/{victim.pod.name} on node {where} would "
                f"exceed PodDisruptionBudget{plural} {budgets}, and every node needs such a victim",
            )
    return None


def _key(victim: PreemptionVictim) -> str:
    return f"{victim.pod.namespace}/{victim.pod.name}"


def _node_refusal(
    plan: PreemptionPlan, *, who: Preemptor, scope: PlanScope, nodes: Callable[[str], NodeProjection | None]
) -> Refusal | None:
    """Each node the plan holds room on must be one its pod may run on, by the pod's own node rules
    (nodeSelector, required node affinity, taints, cordon) as the pre-bind node check reads them."""
    mode = NodeCheckMode.BASIC if scope.node_check is NodeCheckMode.OFF else scope.node_check
    rooms = [(member.node, member.pod_uid) for member in plan.members] or [(plan.node, who.uid)]
    for node, uid in rooms:
        pod = next((p for p in who.pods if p.uid == uid), who.pods[0])
        problem = check_node(pod=pod, node_name=node, node=nodes(node), rm_name=scope.rm_name, mode=mode)
        if problem is not None:
            return Refusal(
                "node", f"the plan makes room for pod {pod.key} on a node it may not run on: {problem}"
            )
    return None


def _victim_refusal(
    plan: PreemptionPlan,
    victim: PreemptionVictim,
    *,
    who: Preemptor,
    body: Mapping[str, Any] | None,
    rooms: Collection[str],
    scope: PlanScope,
) -> Refusal | None:
    key = _key(victim)
    if body is None:
        return Refusal("victim_gone", f"victim {key} is gone")
    metadata = body.get("metadata") or {}
    spec = body.get("spec") or {}
    if metadata.get("uid") != victim.pod.uid:
        return Refusal(
            "victim_gone",
            f"victim {key} was recreated (uid {metadata.get('uid')}, the plan names {victim.pod.uid})",
        )
    node = plan.node_of(victim)
    if node not in rooms:
        return Refusal(
            "victim_node",
            f"victim {key} is to be evicted from node {node}, where the plan makes no room "
            f"(it makes room on {', '.join(sorted(rooms))})",
        )
    if spec.get("nodeName") != node:
        return Refusal(
            "victim_node", f"victim {key} is not on node {node} but on {spec.get('nodeName') or 'no node'}"
        )
    if int(spec.get("priority") or 0) >= who.priority:
        return Refusal(
            "victim_priority",
            f"victim {key} has priority {int(spec.get('priority') or 0)}, not lower than "
            f"{who.label}'s {who.priority}",
        )
    if scope.victims is VictimScope.SERVED:
        scheduler = str(spec.get("schedulerName") or "default-scheduler")
        if scheduler not in scope.scheduler_names:
            return Refusal(
                "victim_scope",
                f"victim {key} was scheduled by {scheduler}, which ResourceManager {scope.rm_name} does "
                f"not serve (spec.preemption.victims: Served; set Any to let its plans evict any pod)",
            )
        selected = scope.selects(victim.pod.namespace)
        if selected is not True:
            why = (
                "does not select"
                if selected is False
                else "cannot tell yet (its labels are unknown) whether it selects"
            )
            return Refusal(
                "victim_scope",
                f"victim {key} is in namespace {victim.pod.namespace}, which the namespaceSelector of "
                f"ResourceManager {scope.rm_name} {why} (spec.preemption.victims: Served)",
            )
    return _frees_refusal(victim, key=key, spec=spec, status=body.get("status") or {})


def _frees_refusal(
    victim: PreemptionVictim, *, key: str, spec: Mapping[str, Any], status: Mapping[str, Any]
) -> Refusal | None:
    """A victim must free something, and no more than it holds: the plan's ``frees`` is the room it
    claims its victims make, and the victims' own requests are what makes it real."""
    if not victim.frees:
        return Refusal("frees", f"the plan says evicting victim {key} frees nothing (frees is empty)")
    try:
        holds: dict[str, Decimal] = {**effective_requests(spec=spec, status=status), "pods": Decimal(1)}
    except PodResourcesError as error:
        return Refusal("frees", f"the requests of victim {key} cannot be read: {error}")
    for resource, text in sorted(victim.frees.items()):
        try:
            amount = parse_quantity(text)
        except QuantityError as error:
            return Refusal("frees", f"the plan says victim {key} frees {resource} {text!r}: {error}")
        if amount <= 0:
            return Refusal("frees", f"the plan says victim {key} frees {resource} {text}, which is nothing")
        if amount > holds.get(resource, Decimal(0)):
            return Refusal(
                "frees",
                f"the plan says victim {key} frees {resource} {text}, but it requests "
                f"{holds.get(resource, Decimal(0)).normalize():f}",
            )
    return None


def budgets_exceeded(
    victims: Sequence[Mapping[str, Any]], budgets: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why evicting all of ``victims`` would exceed a PodDisruptionBudget, or None.

    A dry run of each eviction checks each victim alone: two victims under a budget that allows one
    disruption both pass, and the real eviction of the second is refused after the first was
    evicted for nothing. So the plan's victims are counted per budget against its
    ``status.disruptionsAllowed``, as the Eviction API spends them (one per eviction).

    ``victims``: the Pods still to evict, as read now. ``budgets``: the PodDisruptionBudgets
    (policy/v1) of their namespaces. As the Eviction API: a budget selects the pods of its own
    namespace that its selector matches (``{}`` every pod, an absent selector none), and a Pending,
    Succeeded or Failed pod is evicted without a budget check, so it spends nothing.
    """
    for budget in sorted(
        budgets, key=lambda b: (str(b["metadata"].get("namespace")), str(b["metadata"].get("name")))
    ):
        metadata = budget.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "")
        selector = label_selector((budget.get("spec") or {}).get("selector"))
        covered = [
            f"{namespace}/{(pod.get('metadata') or {}).get('name')}"
            for pod in victims
            if (pod.get("metadata") or {}).get("namespace") == namespace
            and (pod.get("status") or {}).get("phase") not in ("Pending", "Succeeded", "Failed")
            and selector.matches(
                {str(k): str(v) for k, v in ((pod.get("metadata") or {}).get("labels") or {}).items()}
            )
        ]
        allowed = int((budget.get("status") or {}).get("disruptionsAllowed") or 0)
        if len(covered) > max(allowed, 0) and len(covered) > 1:
            return (
                f"the plan evicts {len(covered)} pods PodDisruptionBudget {namespace}/{metadata.get('name')} "
                f"covers ({', '.join(covered)}) and it allows {allowed} disruption(s) now"
            )
    return None


def disruption_condition(*, now: datetime.datetime, scheduler_name: str) -> dict[str, Any]:
    """The victim's ``DisruptionTarget`` condition, as kube-scheduler's preemption writes it."""
    return {
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": REASON_PREEMPTED,
        "message": f"{scheduler_name}: preempting to accommodate a higher priority pod",
        "lastTransitionTime": now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def preempted_note(*, preemptor: PodInfo, node: str) -> str:
    """The ``Preempted`` event's note on a victim, kube-scheduler's words."""
    return f"Preempted by pod {preemptor.uid} on node {node}"
