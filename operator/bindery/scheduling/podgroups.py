"""Pod groups: the pure decisions, apart from the I/O in :mod:`bindery.controller.podgroups`.

Kubernetes 1.36's Workload API (``scheduling.k8s.io/v1alpha2``) groups pods: a pod names its
PodGroup in ``spec.schedulingGroup.podGroupName``; a PodGroup with ``spec.schedulingPolicy.gang``
must get ``minCount`` members placed together or none. kube-scheduler's GangScheduling plugin holds
such pods out of its queue until ``minCount`` members exist (PreEnqueue), then lets each assumed
member wait at Permit until ``minCount`` of them are assumed, and binds them all. Bindery does the
same with one atomic call: once ``minCount`` members exist, it asks the resource manager for every
pending member in one reservation group (contract v1.1, ``POST /v1/reservation-groups``), which
reserves all of them or none. So unlike kube-scheduler no member ever holds capacity while the
others wait, and there is nothing to time out and give back.

The semantics, matching kube-scheduler's where it has an answer:

* **Waiting for members.** Until ``minCount`` members exist (pending + already placed), none is
  placed; each waiting member gets ``FailedScheduling`` and ``PodScheduled=False`` saying how many
  exist. kube-scheduler's wait at Permit times out after 5 minutes (:data:`GANG_WAIT_SECONDS`)
  and frees what the members assumed; Bindery holds nothing while waiting, so after that time it
  only says so in the message and keeps waiting, as kube-scheduler's PreEnqueue does.
* **Members arriving after the gang is placed** are placed on their own (a group of one): the
  quorum counts members already bound, as kube-scheduler's Permit counts scheduled pods.
* **A member deleted mid-group** (after the group reservation, before its Binding): no Binding is
  sent for any member; the whole group reservation is released and the group is tried again with
  the members that remain. A member deleted after its Binding stays deleted; the others run on.
* **One member's Binding failing** (after its group passed every check): that member's
  reservation is released and it is retried alone, like kube-scheduler, which unreserves the one
  pod whose binding failed; the members already bound stay bound.
* **The PodGroup's status**: the ``PodGroupScheduled`` condition as kube-scheduler writes it:
  ``True``/``Scheduled`` once placed, ``False``/``Unschedulable`` (or ``SchedulerError``) with the
  reason otherwise, ``observedGeneration`` set, and never regressed from ``True`` to ``False``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from bindery.rm.models import (
    GroupIdentity,
    GroupMemberRequest,
    ReservationGroupRequest,
    TopologyConstraint,
)
from bindery.scheduling.podspec import PodInfo, reservation_request

__all__ = [
    "GANG_WAIT_SECONDS",
    "SCHEDULED_CONDITION",
    "GroupDecision",
    "GroupStep",
    "PodGroupInfo",
    "decide_group",
    "group_key",
    "group_request",
    "scheduled_conditions",
    "unsupported",
]

#: kube-scheduler's GangScheduling ``permitTimeoutDuration``: how long members wait for a quorum.
GANG_WAIT_SECONDS = 300.0
SCHEDULED_CONDITION = "PodGroupScheduled"


def group_key(pod: PodInfo) -> tuple[str, str] | None:
    """``(namespace, podGroupName)`` of a group member; ``None`` for a pod of no group."""
    return (pod.namespace, pod.scheduling_group) if pod.scheduling_group else None


@dataclasses.dataclass(frozen=True, slots=True)
class PodGroupInfo:
    """The fields of a PodGroup that scheduling reads."""

    namespace: str
    name: str
    uid: str | None = None
    generation: int | None = None
    #: ``spec.schedulingPolicy.gang.minCount``; ``None`` for the basic policy (no gang).
    min_count: int | None = None
    #: ``spec.schedulingConstraints.topology[].key``: all members on one value of each.
    topology_keys: tuple[str, ...] = ()
    conditions: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodGroupInfo:
        metadata: Mapping[str, Any] = body.get("metadata") or {}
        spec: Mapping[str, Any] = body.get("spec") or {}
        gang = (spec.get("schedulingPolicy") or {}).get("gang")
        topology = (spec.get("schedulingConstraints") or {}).get("topology") or ()
        return cls(
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            uid=str(metadata["uid"]) if metadata.get("uid") else None,
            generation=int(metadata["generation"]) if metadata.get("generation") else None,
            min_count=int(gang.get("minCount") or 1) if isinstance(gang, Mapping) else None,
            topology_keys=tuple(str(t["key"]) for t in topology if isinstance(t, Mapping) and t.get("key")),
            conditions=tuple(dict(c) for c in (body.get("status") or {}).get("conditions") or ()),
        )


class GroupStep(enum.StrEnum):
    #: The PodGroup does not exist (yet): kube-scheduler's PreEnqueue keeps the pods out too.
    WAIT_FOR_GROUP = "WaitForGroup"
    #: Fewer than minCount members exist: none is placed.
    WAIT_FOR_MEMBERS = "WaitForMembers"
    #: Reserve these members at once (all or none).
    PLACE = "Place"


@dataclasses.dataclass(frozen=True, slots=True)
class GroupDecision:
    step: GroupStep
    #: PLACE: the members of the one group reservation; else the members to tell why they wait.
    members: tuple[PodInfo, ...]
    message: str = ""
    #: PLACE of a basic-policy group: each member on its own (groups of one), no all-or-nothing.
    each_alone: bool = False


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest}s"


def decide_group(
    *,
    namespace: str,
    name: str,
    group: PodGroupInfo | None,
    pending: Sequence[PodInfo],
    placed: int,
    waited_seconds: float = 0.0,
    wait_seconds: float = GANG_WAIT_SECONDS,
) -> GroupDecision:
    """Pure: what to do with the pending members of one pod group now.

    ``placed``: members bound and not finished (they count towards ``minCount``, as kube-scheduler's
    scheduled pods do). ``waited_seconds``: since the oldest pending member was first seen waiting.
    """
    members = tuple(sorted(pending, key=lambda pod: (pod.created, pod.name)))
    if group is None:
        return GroupDecision(
            step=GroupStep.WAIT_FOR_GROUP,
            members=members,
            message=(
                f'waiting for the pod\'s pod group "{name}" to exist in namespace "{namespace}" '
                f"(spec.schedulingGroup.podGroupName): its members are placed together once it does; "
                f"create the PodGroup, or remove spec.schedulingGroup from the pod"
            ),
        )
    if group.min_count is None:
        return GroupDecision(step=GroupStep.PLACE, members=members, each_alone=True)
    present = placed + len(members)
    if present >= group.min_count:
        return GroupDecision(step=GroupStep.PLACE, members=members)
    missing = group.min_count - present
    message = (
        f'pod group "{group.key}" needs minCount={group.min_count} members before any is placed '
        f"(all or nothing); {present} exist ({len(members)} pending, {placed} placed), waiting for "
        f"{missing} more"
    )
    if waited_seconds >= wait_seconds:
        message += (
            f"; still waiting after {_duration(waited_seconds)} (kube-scheduler gives up its gang wait "
            f"after {_duration(wait_seconds)}); create the missing pods or lower minCount"
        )
    return GroupDecision(step=GroupStep.WAIT_FOR_MEMBERS, members=members, message=message)


def unsupported(*, group: PodGroupInfo, members: Sequence[PodInfo]) -> str | None:
    """Pure: why these members cannot be placed as a group by Bindery yet, or ``None``.

    Volume binding (PreFilter narrowing the nodes to where the claims' volumes are, then PreBind)
    is per pod; a group reservation has no such step yet, so members with PersistentVolumeClaims
    are refused rather than bound without their volumes being checked.
    """
    with_devices = [pod.key for pod in members if pod.device_claims]
    if with_devices:  # the DynamicResources plugin is per pod: a group member would bind unallocated
        return (
            f'pod group "{group.key}" has members with DRA resource claims ({", ".join(with_devices[:3])}'
            f"{', ...' if len(with_devices) > 3 else ''}); Bindery does not allocate devices for pod "
            "groups yet, so it does not place the group; use pods without claims in groups, or no group"
        )
    with_claims = [pod.key for pod in members if pod.claims]
    if not with_claims:
        return None
    return (
        f'pod group "{group.key}" has members with PersistentVolumeClaims ({", ".join(with_claims[:3])}'
        f"{', ...' if len(with_claims) > 3 else ''}); Bindery does not bind volumes for pod groups yet, "
        "so it does not place the group; use pods without claims in groups, or no group"
    )


def idempotency_key(*, group: PodGroupInfo, members: Iterable[PodInfo], attempt: int) -> str:
    """One key per (group, member set, attempt): a retry after a lost answer replays the same group."""
    digest = hashlib.sha256()
    digest.update(f"{group.uid or group.key}|{attempt}|".encode())
    for uid in sorted(pod.uid for pod in members):
        digest.update(uid.encode())
    return f"podgroup-{digest.hexdigest()[:40]}"


def group_request(
    *,
    group: PodGroupInfo,
    members: Sequence[PodInfo],
    scheduler_name: str,
    ttl_seconds: int,
    attempt: int,
    node_terms: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    preferred_terms: Sequence[Sequence[tuple[int, Mapping[str, Any]]]] | None = None,
    preemption_policy: Literal["PreemptLowerPriority", "Never"] | None = None,
) -> ReservationGroupRequest:
    """The contract v1.1 request reserving every member of ``members`` or none.

    ``node_terms``: per member, the nodeSelectorTerms to send instead of its own required node
    affinity (its inter-pod rules ANDed in, see :func:`bindery.scheduling.placementrules.member_node_terms`).
    ``preferred_terms``: per member, the ``(weight, nodeSelectorTerm)`` preferences to send instead of
    its own (its soft inter-pod rules added, see
    :func:`bindery.scheduling.placementrules.member_preferences`).
    """
    requests = [
        reservation_request(
            pod=pod,
            ttl_seconds=ttl_seconds,
            required_node_affinity=None if node_terms is None else node_terms[i],
            preferred_node_affinity=None if preferred_terms is None else preferred_terms[i],
        )
        for i, pod in enumerate(members)
    ]
    return ReservationGroupRequest(
        group=GroupIdentity(
            namespace=group.namespace, name=group.name, uid=group.uid, scheduler_name=scheduler_name
        ),
        members=[
            GroupMemberRequest(pod=request.pod, resources=request.resources, placement=request.placement)
            for request in requests
        ],
        topology=[TopologyConstraint(key=key) for key in group.topology_keys],
        idempotency_key=idempotency_key(group=group, members=members, attempt=attempt),
        ttl_seconds=ttl_seconds,
        preemption_policy=preemption_policy,
    )


def scheduled_conditions(
    *,
    group: PodGroupInfo,
    scheduled: bool,
    reason: str,
    message: str,
    now: datetime,
) -> list[dict[str, Any]] | None:
    """Pure: the PodGroup's conditions with ``PodGroupScheduled`` set, or ``None`` if unchanged.

    As kube-scheduler's ``updatePodGroupCondition``: a ``True`` condition is never regressed to
    ``False`` (extra members failing do not unschedule the group), ``observedGeneration`` is the
    group's generation, and ``lastTransitionTime`` moves only when the status does.
    """
    status = "True" if scheduled else "False"
    current = next((c for c in group.conditions if c.get("type") == SCHEDULED_CONDITION), None)
    if current is not None and current.get("status") == "True" and not scheduled:
        return None
    wanted = {
        "type": SCHEDULED_CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": group.generation or 0,
    }
    if current is not None and all(current.get(k) == v for k, v in wanted.items()):
        return None
    transition = (
        current.get("lastTransitionTime")
        if current is not None and current.get("status") == status and current.get("lastTransitionTime")
        else now.strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    others = [dict(c) for c in group.conditions if c.get("type") != SCHEDULED_CONDITION]
    return [*others, {**wanted, "lastTransitionTime": transition}]
