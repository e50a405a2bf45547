"""What `bindery audit` reports, decided from plain objects: no I/O here.

Bindery promises that every reservation ends committed to its pod's node or released, and that no
node holds more than it has. These functions check those promises against what the apiserver and
the resource managers say *now*, so an operator's user (and Bindery's own chaos tests) can see a
broken promise without knowing how Bindery works inside:

- **leaked**: an active reservation whose pod is gone, replaced (same name, other UID), finished,
  or bound to another node; or a committed one whose pod is not bound at all. A `reserved`
  reservation of a pod that is still pending is a cycle in flight, not a leak.
- **unreserved**: a bound, running pod of a scheduler name some ResourceManager serves, with no
  active reservation for it on its node at that ResourceManager: capacity the RM does not know is
  used, which it may hand out again.
- **overcommitted**: a node whose bound, non-terminal pods (whoever bound them) request more of a
  resource than its allocatable, counted as kube-scheduler counts them (one `pods` slot each).
- **unexplained**: a pod of a served scheduler name pending longer than a grace period without a
  `PodScheduled=False` condition: nobody told its user why it waits.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
from collections.abc import Collection, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from bindery.podresources import PodResourcesError, effective_requests
from bindery.quantity import QuantityError, format_quantity, parse_quantity
from bindery.rm.models import Reservation, ReservationState

__all__ = [
    "Finding",
    "leaked_reservations",
    "overcommitted_nodes",
    "unexplained_pending",
    "unreserved_pods",
]

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One broken promise: `kind` is one of the module docstring's four words."""

    kind: str
    subject: str
    message: str
    resource_manager: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "message": self.message,
            "resourceManager": self.resource_manager,
        }


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _key(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}"


def _running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def leaked_reservations(
    *, resource_manager: str, reservations: Iterable[Reservation], pods: Iterable[Mapping[str, Any]]
) -> list[Finding]:
    """Active reservations at `resource_manager` that are not held for a live pod on their node."""
    by_name = {(_meta(p).get("namespace"), _meta(p).get("name")): p for p in pods}
    found = []
    for reservation in reservations:
        if not reservation.state.active:
            continue
        pod = by_name.get((reservation.namespace, reservation.name))
        who = f"pod {reservation.namespace}/{reservation.name} ({reservation.pod_uid})"
        node = (pod.get("spec") or {}).get("nodeName") if pod is not None else None
        if pod is None:
            problem = f"{who} no longer exists"
        elif _meta(pod).get("uid") != reservation.pod_uid:
            problem = f"{who} was replaced by another pod of that name ({_meta(pod).get('uid')})"
        elif not _running(pod):
            problem = f"{who} has finished ({(pod.get('status') or {}).get('phase')})"
        elif node and node != reservation.node:
            problem = f"{who} is bound to {node}, not to the reserved node"
        elif not node and reservation.state is ReservationState.COMMITTED:
            problem = f"{who} is committed but not bound to any node"
        else:
            continue
        found.append(
            Finding(
                kind="leaked",
                subject=f"reservation {reservation.id}",
                message=f"{reservation.state.value} on node {reservation.node}, but {problem}",
                resource_manager=resource_manager,
            )
        )
    return found


def unreserved_pods(
    *,
    resource_manager: str,
    scheduler_names: Collection[str],
    reservations: Iterable[Reservation],
    pods: Iterable[Mapping[str, Any]],
) -> list[Finding]:
    """Bound, running pods of `scheduler_names` with no active reservation on their node."""
    held = {(r.pod_uid, r.node) for r in reservations if r.state.active}
    found = []
    for pod in pods:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("schedulerName") not in scheduler_names or not node or not _running(pod):
            continue
        if (_meta(pod).get("uid"), node) in held:
            continue
        found.append(
            Finding(
                kind="unreserved",
                subject=f"pod {_key(pod)}",
                message=(
                    f"bound to {node} with scheduler name {spec.get('schedulerName')!r}, but the resource "
                    "manager holds no reservation for it there"
                ),
                resource_manager=resource_manager,
            )
        )
    return found


def _node_usage(pods: Iterable[Mapping[str, Any]]) -> tuple[dict[str, dict[str, Decimal]], dict[str, int]]:
    used: dict[str, dict[str, Decimal]] = collections.defaultdict(dict)
    counts: collections.Counter[str] = collections.Counter()
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not _running(pod):
            continue
        try:
            requests = effective_requests(spec=pod.get("spec") or {}, status=pod.get("status"))
        except PodResourcesError:
            continue  # the apiserver validated it; a quantity we cannot read is not ours to judge
        requests["pods"] = requests.get("pods", Decimal(0)) + 1
        counts[node] += 1
        for resource, amount in requests.items():
            used[node][resource] = used[node].get(resource, Decimal(0)) + amount
    return used, counts


def overcommitted_nodes(
    *, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[Finding]:
    """Nodes whose bound, non-terminal pods request more than the node's allocatable."""
    used, counts = _node_usage(pods)
    found = []
    for node in nodes:
        name = str(_meta(node).get("name"))
        allocatable: Mapping[str, Any] = (node.get("status") or {}).get("allocatable") or {}
        for resource, amount in sorted(used.get(name, {}).items()):
            if resource not in allocatable:
                continue  # a resource the node does not advertise is not counted by the kubelet either
            try:
                limit = parse_quantity(str(allocatable[resource]))
            except QuantityError:
                continue
            if amount > limit:
                found.append(
                    Finding(
                        kind="overcommitted",
                        subject=f"node {name}",
                        message=(
                            f"{counts[name]} bound pod(s) request {format_quantity(amount)} {resource}; "
                            f"allocatable is {format_quantity(limit)}"
                        ),
                    )
                )
    return found


def unexplained_pending(
    *,
    pods: Iterable[Mapping[str, Any]],
    served: Mapping[str, str],
    now: datetime.datetime,
    grace: datetime.timedelta,
) -> list[Finding]:
    """Pending pods of served names, older than `grace`, with no `PodScheduled=False` condition.

    `served` maps scheduler name → ResourceManager name. Gated and terminating pods wait by design.
    """
    found = []
    for pod in pods:
        spec = pod.get("spec") or {}
        rm_name = served.get(str(spec.get("schedulerName")))
        if rm_name is None or spec.get("nodeName") or spec.get("schedulingGates"):
            continue
        if _meta(pod).get("deletionTimestamp") or not _running(pod):
            continue
        created = _timestamp(_meta(pod).get("creationTimestamp"))
        if created is None or now - created < grace:
            continue
        conditions: Sequence[Mapping[str, Any]] = (pod.get("status") or {}).get("conditions") or ()
        if any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions):
            continue
        found.append(
            Finding(
                kind="unexplained",
                subject=f"pod {_key(pod)}",
                message=(
                    f"pending for {int((now - created).total_seconds())}s with scheduler name "
                    f"{spec.get('schedulerName')!r} and no PodScheduled=False condition saying why"
                ),
                resource_manager=rm_name,
            )
        )
    return found


def _timestamp(value: object) -> datetime.datetime | None:
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    if not isinstance(value, str) or not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
