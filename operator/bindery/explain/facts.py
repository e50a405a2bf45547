"""Why is this pod where it is: the facts `bindery explain` gathers, joined into one answer (pure).

A pending pod's story is split between the cluster (its condition, its events, its claims) and the
resource manager (the reservation, its state, its lease). Each is read elsewhere (`collect.py`); this
module only joins them, so every verdict is a unit-tested function of what was read.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.podgroups import SCHEDULED_CONDITION, PodGroupInfo
from bindery.scheduling.volumes import SELECTED_NODE

#: The events that tell a pod's scheduling story, newest first in the answer.
SCHEDULING_REASONS = ("FailedScheduling", "Scheduled")
#: The fact `explain` cannot see from outside the operator, said on every pending pod.
QUEUE_UNSEEN = (
    "when the next attempt is due is not visible from outside the operator (its queue); Bindery retries "
    "a pod that found no room when capacity is released or a Node is added or changed (at the latest "
    "after 5 minutes), and an error after its backoff (1 s doubling to 10 s by default)"
)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One FailedScheduling or Scheduled event (a repeated one counts its repeats)."""

    time: str
    reason: str
    message: str
    count: int = 1


@dataclasses.dataclass(frozen=True)
class ReservationView:
    id: str
    state: str
    node: str
    expires_at: str | None


@dataclasses.dataclass(frozen=True)
class ClaimState:
    name: str
    phase: str
    volume: str | None
    selected_node: str | None


@dataclasses.dataclass(frozen=True)
class DeviceClaimState:
    """A DRA ResourceClaim of the pod: the devices allocated to it (from its status), if any."""

    name: str
    #: Missing, Pending (not allocated yet), Allocated
    phase: str
    #: ``driver/pool/device`` of each allocated device
    devices: tuple[str, ...] = ()
    #: how many consumers the claim is reserved for
    reserved_for: int = 0


def device_claim_states(claims: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[DeviceClaimState]:
    """Pure: (name, ResourceClaim or None) → what the claim says of its devices."""
    states: list[DeviceClaimState] = []
    for name, claim in claims:
        if claim is None:
            states.append(DeviceClaimState(name=name, phase="Missing"))
            continue
        status = claim.get("status") or {}
        allocation = status.get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or ()
        states.append(
            DeviceClaimState(
                name=name,
                phase="Allocated" if allocation else "Pending",
                devices=tuple(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}" for r in results),
                reserved_for=len(status.get("reservedFor") or ()),
            )
        )
    return states


@dataclasses.dataclass(frozen=True)
class GroupState:
    """A pod group member's group, as the apiserver shows it (kube-scheduler's PodGroup)."""

    name: str
    #: ``None``: the PodGroup does not exist (yet), or could not be read.
    min_count: int | None
    members: int
    bound: int
    topology: tuple[str, ...] = ()
    #: ``PodGroupScheduled``: status, reason and message, when written.
    condition: dict[str, str] | None = None
    found: bool = True


@dataclasses.dataclass
class Explanation:
    pod: str
    uid: str
    scheduler_name: str
    resource_manager: str | None
    phase: str
    node: str | None
    verdict: str
    condition: dict[str, str] | None = None
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    reservations: list[ReservationView] = dataclasses.field(default_factory=list)
    claims: list[ClaimState] = dataclasses.field(default_factory=list)
    #: The pod's DRA ResourceClaims and the devices chosen for them.
    device_claims: list[DeviceClaimState] = dataclasses.field(default_factory=list)
    group: GroupState | None = None
    seconds_to_bind: float | None = None
    #: The operator's view of the pod in its queue (served at /debug/queue/NS/NAME), as served.
    queue: dict[str, Any] | None = None
    #: When the next attempt is due, in words, from `queue`.
    next_attempt: str | None = None
    unseen: list[str] = dataclasses.field(default_factory=list)
    #: How the inter-pod rules shape the request, one line per rule (bindery.podrules).
    placement_rules: list[str] = dataclasses.field(default_factory=list)
    #: ``status.nominatedNodeName``: Bindery is preempting pods on that node for this one.
    nominated_node: str | None = None
    #: The pod's last preemption plan failed: until when it asks for none, and why, in words.
    preemption: str | None = None
    #: The confirmed preemption plan the pod waits on (queue view's ``preemption_plan``), in words.
    preemption_plan: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _timestamp(value: object) -> datetime.datetime | None:
    if isinstance(value, str) and value:
        try:
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def attempts_of(events: Sequence[Mapping[str, Any]], *, limit: int = 5) -> list[Attempt]:
    """Pure: the pod's scheduling events (core/v1 shape), newest first."""
    found = []
    for event in events:
        if event.get("reason") not in SCHEDULING_REASONS:
            continue
        series = event.get("series") or {}
        time = str(
            series.get("lastObservedTime")
            or event.get("lastTimestamp")
            or event.get("eventTime")
            or event.get("firstTimestamp")
            or ""
        )
        count = int(series.get("count") or event.get("count") or 1)
        found.append(
            Attempt(
                time=time, reason=str(event["reason"]), message=str(event.get("message") or ""), count=count
            )
        )
    found.sort(key=lambda a: a.time, reverse=True)
    return found[:limit]


def claim_states(claims: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[ClaimState]:
    """Pure: (name, claim or None) → what the claim says."""
    states = []
    for name, claim in claims:
        if claim is None:
            states.append(ClaimState(name=name, phase="Missing", volume=None, selected_node=None))
            continue
        annotations = (claim.get("metadata") or {}).get("annotations") or {}
        states.append(
            ClaimState(
                name=name,
                phase=str((claim.get("status") or {}).get("phase") or "Pending"),
                volume=(claim.get("spec") or {}).get("volumeName") or None,
                selected_node=annotations.get(SELECTED_NODE),
            )
        )
    return states


def group_state(
    *, name: str, podgroup: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> GroupState:
    """Pure: the group ``name`` from its PodGroup (None: not found) and the namespace's pods.

    Members are the pods naming the group in ``spec.schedulingGroup`` that have not finished, as
    kube-scheduler's GangScheduling counts them toward ``minCount``.
    """
    members = [
        p
        for p in pods
        if ((p.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") == name
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    bound = sum(1 for p in members if (p.get("spec") or {}).get("nodeName"))
    if podgroup is None:
        return GroupState(name=name, min_count=None, members=len(members), bound=bound, found=False)
    info = PodGroupInfo.from_body(podgroup)
    condition = next((c for c in info.conditions if c.get("type") == SCHEDULED_CONDITION), None)
    return GroupState(
        name=name,
        min_count=info.min_count,
        members=len(members),
        bound=bound,
        topology=info.topology_keys,
        condition={k: str(condition.get(k) or "") for k in ("status", "reason", "message")}
        if condition
        else None,
    )


def explain(
    *,
    pod: Mapping[str, Any],
    resource_manager: str | None,
    events: Sequence[Mapping[str, Any]],
    reservations: Sequence[ReservationView] | None,
    claims: Sequence[tuple[str, Mapping[str, Any] | None]] = (),
    device_claims: Sequence[tuple[str, Mapping[str, Any] | None]] = (),
    rm_problem: str | None = None,
    queue: Mapping[str, Any] | None = None,
    queue_problem: str | None = None,
    group: GroupState | None = None,
    placement_rules: Sequence[str] = (),
) -> Explanation:
    """Pure: the answer for `pod`, from what was read. `reservations` None: the RM could not be asked
    (`rm_problem` says why); `queue` None: the operator's queue could not be read (`queue_problem`)."""
    metadata: Mapping[str, Any] = pod.get("metadata") or {}
    spec: Mapping[str, Any] = pod.get("spec") or {}
    status: Mapping[str, Any] = pod.get("status") or {}
    key = f"{metadata.get('namespace')}/{metadata.get('name')}"
    scheduler_name = str(spec.get("schedulerName") or "default-scheduler")
    node = spec.get("nodeName") or None
    condition = next((c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), None)
    answer = Explanation(
        pod=key,
        uid=str(metadata.get("uid") or ""),
        scheduler_name=scheduler_name,
        resource_manager=resource_manager,
        phase=str(status.get("phase") or "Pending"),
        node=node,
        verdict="",
        condition={
            k: str(condition.get(k) or "") for k in ("status", "reason", "message", "lastTransitionTime")
        }
        if condition
        else None,
        attempts=attempts_of(events),
        reservations=list(reservations or ()),
        claims=claim_states(claims),
        device_claims=device_claim_states(device_claims),
        group=group,
        placement_rules=list(placement_rules),
        nominated_node=str(status.get("nominatedNodeName") or "") or None,
    )
    if rm_problem is not None:
        answer.unseen.append(f"the resource manager's view: {rm_problem}")
    if resource_manager is None:
        answer.verdict = (
            f'no ResourceManager serves scheduler name "{scheduler_name}": Bindery does not schedule this pod'
            + ("; kube-scheduler does" if scheduler_name == "default-scheduler" else "")
        )
        return answer
    if node:
        answer.verdict = _bound_verdict(answer, metadata, condition)
        return answer
    if queue is not None:
        answer.queue = dict(queue)
        answer.next_attempt = next_attempt(queue)
        answer.preemption = preemption_backoff(queue)
        answer.preemption_plan = preemption_plan(queue)
    else:
        answer.unseen.append(
            f"the operator's queue: {queue_problem or 'not asked'}; so {QUEUE_UNSEEN}"
            if queue_problem
            else QUEUE_UNSEEN
        )
    answer.verdict = _pending_verdict(answer, metadata, spec)
    return answer


_WAITS_FOR = {
    "victims": "waits for its victims to terminate",
    "reserve": "its victims are gone; waits for its next reserve, which lands on the held room",
}


def preemption_plan(queue: Mapping[str, Any]) -> str | None:
    """Pure: the operator's confirmed plan for the pod, in words, or None without one.

    Between the evictions and the bind the pod is Pending with a nominated node; the plan (which
    pods go, whether they are still terminating, how long the RM holds the room) is known only to
    the operator and the RM."""
    plan = queue.get("preemption_plan")
    if not isinstance(plan, Mapping):
        return None
    victims = ", ".join(
        f"{v.get('pod')} ({v.get('state')})" for v in plan.get("victims") or () if isinstance(v, Mapping)
    )
    waits = _WAITS_FOR.get(str(plan.get("waits_for")), f"waits for {plan.get('waits_for')}")
    return _of_group(queue) + (
        f"plan {plan.get('id')} on node {plan.get('node')}, victims {victims or 'none listed'}; {waits}; "
        f"the RM holds the room until {plan.get('lease_until')} "
        f"(in {float(plan.get('lease_seconds') or 0):.1f} s)"
    )


def _of_group(queue: Mapping[str, Any]) -> str:
    """A pod group preempts as a whole: its member's answer carries the group's back-off or plan."""
    group = queue.get("preemption_group")
    return f"its pod group {group} (it preempts as a whole): " if group else ""


def preemption_backoff(queue: Mapping[str, Any]) -> str | None:
    """Pure: the operator's back-off after a failed preemption plan, in words, or None without one.

    Meanwhile the pod's reserves ask the RM for no plan (so nothing is evicted for it), and it is
    still placed if room appears by itself; without this line a user sees only "Unschedulable"."""
    backoff = queue.get("preemption_backoff")
    if not isinstance(backoff, Mapping):
        return None
    return _of_group(queue) + (
        f"backed off until {backoff.get('until')} (in {float(backoff.get('seconds') or 0):.1f} s): no "
        f"victims are asked for it before then, because {backoff.get('reason') or 'no reason given'}"
    )


def next_attempt(queue: Mapping[str, Any]) -> str:
    """Pure: the operator's /debug/queue answer for one pod → when it is tried next, in words."""
    where = queue.get("queue")
    attempts = int(queue.get("attempts") or 0)
    failed = f"after {attempts} failed attempt{'s' if attempts != 1 else ''}"
    due = queue.get("next_attempt_in_seconds")
    when = (
        f"next attempt in {float(due):.1f} s (at {queue.get('next_attempt_at')})"
        if due is not None
        else "next attempt time unknown"
    )
    if where is None:
        text = f"in no queue of the operator: {queue.get('message') or 'no reason given'}"
    elif where == "active":
        text = f"in the active queue {failed}: tried as soon as a worker is free"
    elif where == "in-flight":
        text = f"being scheduled right now (attempt {attempts + 1})"
    elif where == "backoff":
        text = f"backing off {failed}: {when}"
    else:
        sooner = "or sooner when capacity is released or a Node changes"
        text = f"parked as unschedulable {failed}: {when}, {sooner}"
    if not queue.get("leading", True):
        text += " (a standby replica's view: the leader's queue was not reached)"
    return text


def _bound_verdict(
    answer: Explanation, metadata: Mapping[str, Any], condition: Mapping[str, Any] | None
) -> str:
    created = _timestamp(metadata.get("creationTimestamp"))
    bound_at = (
        _timestamp((condition or {}).get("lastTransitionTime"))
        if (condition or {}).get("status") == "True"
        else None
    )
    if created and bound_at:
        answer.seconds_to_bind = max(0.0, (bound_at - created).total_seconds())
    reservation_id = ((metadata.get("annotations") or {}).get(RESERVATION_ANNOTATION)) or None
    held = next((r for r in answer.reservations if r.id == reservation_id), None)
    if reservation_id is None:
        return (
            f"bound to {answer.node}, without a Bindery reservation (bound by someone else, or before "
            "Bindery served its name)"
        )
    if held is None:
        state = "not active at the resource manager (released, expired, or the RM could not be asked)"
    else:
        state = f"{held.state} on {held.node}"
    took = (
        f" {answer.seconds_to_bind:.1f} s after it was created" if answer.seconds_to_bind is not None else ""
    )
    return f"bound to {answer.node}{took}, with reservation {reservation_id} ({state})"


def _pending_verdict(answer: Explanation, metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    if metadata.get("deletionTimestamp"):
        return "being deleted: Bindery no longer schedules it"
    if spec.get("schedulingGates"):
        gates = ", ".join(str(g.get("name")) for g in spec["schedulingGates"])
        return f"held by scheduling gates ({gates}): Bindery schedules it once they are removed"
    missing = [c.name for c in answer.claims if c.phase == "Missing"]
    if missing:
        return f"waiting for claim(s) {', '.join(missing)}, which do not exist"
    active = [r for r in answer.reservations if r.state in ("reserved", "committed")]
    provisioning = [c for c in answer.claims if c.phase != "Bound" and c.selected_node]
    if active and provisioning:
        names = ", ".join(f"{c.name} (on {c.selected_node})" for c in provisioning)
        return f"reserved on {active[0].node}; waiting for its volume(s) to be provisioned: {names}"
    if active:
        return f"reserved on {active[0].node} ({active[0].state}); the Binding is on its way or being settled"
    if answer.nominated_node:
        return (
            f"preempting lower-priority pods on {answer.nominated_node}: the resource manager holds "
            "the room they free for this pod, which is tried again once they are gone"
        )
    cond = answer.condition
    if cond and cond.get("status") == "False":
        kind = "no room" if cond.get("reason") == "Unschedulable" else "an error"
        return f"not scheduled yet ({cond.get('reason')}, {kind}): {cond.get('message')}"
    return "not tried yet, or no attempt has been reported: it waits in Bindery's queue"


def render(answer: Explanation) -> str:
    """The human answer: the verdict first, then the facts it rests on."""
    lines = [
        f"Pod:               {answer.pod} ({answer.uid})",
        f"Scheduler name:    {answer.scheduler_name}"
        + (f" (ResourceManager {answer.resource_manager})" if answer.resource_manager else " (not served)"),
        f"Phase:             {answer.phase}" + (f" on {answer.node}" if answer.node else ""),
        f"Why:               {answer.verdict}",
    ]
    if answer.condition:
        c = answer.condition
        lines.append(f"PodScheduled:      {c['status']} {c['reason']} {c['message']}".rstrip())
    if answer.attempts:
        lines.append("Attempts (newest first):")
        lines += [
            f"  {a.time}  {a.reason}{f' (x{a.count})' if a.count > 1 else ''}: {a.message}"
            for a in answer.attempts
        ]
    if answer.reservations:
        lines.append("At the resource manager:")
        lines += [
            f"  {r.id}  {r.state} on {r.node}" + (f", lease until {r.expires_at}" if r.expires_at else "")
            for r in answer.reservations
        ]
    elif answer.resource_manager and not any("resource manager" in u for u in answer.unseen):
        lines.append("At the resource manager: no active reservation")
    if answer.placement_rules:
        lines.append("Placement rules:")
        lines += [f"  {rule}" for rule in answer.placement_rules]
    if answer.claims:
        lines.append("Claims:")
        lines += [
            f"  {c.name}  {c.phase}"
            + (f", volume {c.volume}" if c.volume else "")
            + (f", selected node {c.selected_node}" if c.selected_node else "")
            for c in answer.claims
        ]
    if answer.device_claims:
        lines.append("Device claims:")
        lines += [
            f"  {c.name}  {c.phase}"
            + (f", devices {', '.join(c.devices)}" if c.devices else "")
            + (f", reserved for {c.reserved_for} pod(s)" if c.reserved_for else "")
            for c in answer.device_claims
        ]
    if answer.group is not None:
        g = answer.group
        if not g.found:
            lines.append(
                f"Pod group:         {g.name}: no PodGroup of that name (yet); "
                f"{g.members} member(s) exist, {g.bound} bound"
            )
        else:
            need = f"minCount {g.min_count}" if g.min_count is not None else "basic policy (no gang)"
            lines.append(
                f"Pod group:         {g.name}: {need}, {g.members} member(s) exist, {g.bound} bound"
                + (f", all on one value of {', '.join(g.topology)}" if g.topology else "")
            )
            if g.condition:
                c = g.condition
                lines.append(f"PodGroupScheduled: {c['status']} {c['reason']} {c['message']}".rstrip())
    if answer.nominated_node:
        lines.append(
            f"Nominated node:    {answer.nominated_node} (preemption; see the victims' Preempted events)"
        )
    if answer.next_attempt:
        lines.append(f"Operator queue:    {answer.next_attempt}")
    if answer.preemption:
        lines.append(f"Preemption:        {answer.preemption}")
    if answer.preemption_plan:
        lines.append(f"Preemption plan:   {answer.preemption_plan}")
    lines += [f"Not seen:          {u}" for u in answer.unseen]
    return "\n".join(lines)
