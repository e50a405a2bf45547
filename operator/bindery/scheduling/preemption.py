"""Preemption decisions (contract v1.2, feature ``preemption``), free of I/O.

The RM proposes a plan with its Unschedulable answer; before anything is evicted Bindery vets it
against the cluster as it is now, because the RM's view of the pods may be a moment old: a victim
deleted and recreated under the same name is another pod, one that moved is no longer in the way,
one whose priority is not lower would not be evicted by kube-scheduler either. What the apiserver
is told (the victims' ``DisruptionTarget`` condition, the ``Preempted`` event) is shaped here as
kube-scheduler shapes it (``pkg/scheduler/framework/preemption``), so that tools reading those
keep working. The I/O is :mod:`bindery.controller.preemption`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from bindery.podrules.parse import label_selector
from bindery.rm.models import PreemptionPlan
from bindery.scheduling.podspec import PodInfo

__all__ = [
    "DISRUPTION_TARGET",
    "Preemptor",
    "budgets_exceeded",
    "disruption_condition",
    "pod_group",
    "preempted_note",
    "vet",
]

DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTED = "PreemptionByScheduler"


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
    group_members: Mapping[str, Collection[str]] | None = None,
) -> str | None:
    """Why the plan must not be carried out, or None when it may.

    ``victims``: each victim's current Pod by ``namespace/name`` (None when it is gone).
    ``group_members``: for each pod group a victim belongs to, the UIDs of its members bound now
    and not terminating; a plan that evicts some of them and not the others would break the gang
    (a gang with one member gone is of no use: its job waits or fails), so it is refused. A plan
    naming a victim a PodDisruptionBudget protects (``violatedBudgets``, from an RM that follows
    budgets) is refused whole: Bindery evicts through the Eviction API, which would refuse that
    victim, and evicting the others first would be evicting them for nothing.
    """
    who = preemptor if isinstance(preemptor, Preemptor) else Preemptor.of_pod(preemptor)
    if (never := who.never()) is not None:
        return f"pod {never.key} has preemptionPolicy Never"
    if plan.pod_uid != who.uid:
        return f"the plan is for pod uid {plan.pod_uid}, not {who.label} (uid {who.uid})"
    if plan.members and {member.pod_uid for member in plan.members} != {pod.uid for pod in who.pods}:
        return f"the plan holds room for other pods than the pending members of {who.label}"
    for victim in plan.victims:
        key = f"{victim.pod.namespace}/{victim.pod.name}"
        body = victims.get(key)
        if body is None:
            return f"victim {key} is gone"
        metadata = body.get("metadata") or {}
        spec = body.get("spec") or {}
        if metadata.get("uid") != victim.pod.uid:
            return f"victim {key} was recreated (uid {metadata.get('uid')}, the plan names {victim.pod.uid})"
        node = plan.node_of(victim)
        if spec.get("nodeName") != node:
            return f"victim {key} is not on node {node} but on {spec.get('nodeName') or 'no node'}"
        if int(spec.get("priority") or 0) >= who.priority:
            return (
                f"victim {key} has priority {int(spec.get('priority') or 0)}, not lower than "
                f"{who.label}'s {who.priority}"
            )
    planned = {victim.pod.uid for victim in plan.victims}
    for group, members in sorted((group_members or {}).items()):
        kept = sorted(set(members) - planned)
        if kept and set(members) & planned:
            return (
                f"the plan evicts part of pod group {group} only ({len(kept)} bound member(s) would stay), "
                "which would break the gang; a group is evicted whole or not at all"
            )
    for victim in plan.victims:
        # Checked last, after every victim is known to be current: the Eviction API would answer
        # 429 for this one, possibly after others were evicted for nothing.
        if victim.violated_budgets:
            budgets = ", ".join(f"{victim.pod.namespace}/{name}" for name in victim.violated_budgets)
            plural = "s" if len(victim.violated_budgets) > 1 else ""
            where = plan.node_of(victim)
            return (
                f"evicting victim {victim.pod.namespace}/{victim.pod.name} on node {where} would "
                f"exceed PodDisruptionBudget{plural} {budgets}, and every node needs such a victim"
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
