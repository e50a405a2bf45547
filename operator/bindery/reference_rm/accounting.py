"""What the pods this RM did not place consume on the nodes it mirrors: pure accounting, no I/O.

Why: on a shared cluster the nodes the RM mirrors also run pods that kube-scheduler, the DaemonSet
controller, the kubelet (static pods) or another scheduler put there.  An RM that compares only its
own reservations with ``status.allocatable`` hands out capacity those pods already use: two 4-CPU
nodes each running a 3-CPU pod were given two more 2-CPU pods each.  So the capacity in use on a node
is the RM's own active reservations plus every other non-terminal pod bound to it, each counted the
way kube-scheduler's ``NodeInfo`` counts it (:func:`bindery.podresources.effective_requests` plus one
``pods`` slot).

A pod Bindery bound with one of this RM's reservations is already counted by that reservation and
must not count twice. What such a pod grew past its reservation (an in-place resize: kube-scheduler
counts the larger of its spec and what the kubelet allocated) counts on top; a pod that shrank keeps
its reservation's size until the reservation is released.  Such a pod is recognised by the
``bindery.dev/reservation-id`` annotation only when the named reservation is active, was made
for this very pod (same UID) and holds the pod's node: a tenant who copies another pod's
annotation onto their own pod gains nothing, their pod counts.

The mirror (I/O, :mod:`bindery.reference_rm.mirror`) keeps an immutable :class:`ClusterPods` snapshot and
hands it to the store's single writer, which resolves the claims against its reservations with
:func:`foreign_usage` inside the same serialized step that places the next reservation.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bindery.podresources import effective_requests
from bindery.quantity import format_quantity

__all__ = [
    "RESERVATION_ANNOTATION",
    "BoundPod",
    "ClusterPods",
    "Foreign",
    "NodePods",
    "bound_pod",
    "describe_foreign",
    "foreign_usage",
    "in_use",
]

#: The annotation Bindery's binder puts on a pod it binds (``bindery.scheduling.framework`` spells
#: the same string; the reference RM may not import the scheduler, it speaks only the contract).
RESERVATION_ANNOTATION = "bindery.dev/reservation-id"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_ONE_POD: Mapping[str, Decimal] = {"pods": Decimal(1)}


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A non-terminal pod bound to a node: what it consumes there and which reservation it names."""

    uid: str
    key: str  # namespace/name, for messages
    node: str
    usage: Mapping[str, Decimal]  # effective requests plus one ``pods`` slot
    reservation_id: str | None = None
    priority: int = 0  # spec.priority: what preemption (contract v1.2) compares
    #: metadata.labels, sorted: what a PodDisruptionBudget's selector matches when choosing victims.
    labels: tuple[tuple[str, str], ...] = ()
    #: ``namespace/podGroupName`` of a pod group member (``spec.schedulingGroup``): preemption
    #: evicts a group whole or not at all.
    group: str | None = None


def bound_pod(obj: Mapping[str, Any]) -> BoundPod | None:
    """A Pod (Kubernetes JSON shape) as accounting input; None when it occupies nothing.

    Unbound pods and terminal pods (phase Succeeded or Failed) occupy nothing, like in
    kube-scheduler's cache.  A pod being deleted still runs until the kubelet is done with it, so it
    counts.  Raises :class:`bindery.podresources.PodResourcesError` on an unparsable quantity.
    """
    metadata: Mapping[str, Any] = obj.get("metadata") or {}
    spec: Mapping[str, Any] = obj.get("spec") or {}
    status: Mapping[str, Any] = obj.get("status") or {}
    node = spec.get("nodeName")
    if not node or status.get("phase") in _TERMINAL_PHASES:
        return None
    usage = {
        name: amount
        for name, amount in effective_requests(spec=spec, status=status).items()
        if amount != 0 and name != "pods"
    }
    usage.update(_ONE_POD)
    claim = (metadata.get("annotations") or {}).get(RESERVATION_ANNOTATION)
    return BoundPod(
        uid=str(metadata.get("uid") or ""),
        key=f"{metadata.get('namespace', '')}/{metadata.get('name', '')}",
        node=str(node),
        usage=usage,
        reservation_id=str(claim) if claim else None,
        priority=int(spec.get("priority") or 0),
        labels=tuple(sorted((str(k), str(v)) for k, v in (metadata.get("labels") or {}).items())),
        group=f"{metadata.get('namespace', '')}/{group}"
        if (group := (spec.get("schedulingGroup") or {}).get("podGroupName"))
        else None,
    )


def _add(target: dict[str, Decimal], usage: Mapping[str, Decimal]) -> None:
    for name, amount in usage.items():
        target[name] = target.get(name, Decimal(0)) + amount


@dataclass(frozen=True)
class Foreign:
    """What pods not accounted by this RM's reservations use on one node."""

    usage: Mapping[str, Decimal]
    count: int


@dataclass(frozen=True)
class NodePods:
    """The pods bound to one node: those that name no reservation, summed once when the snapshot is
    made (they count whatever the store holds), and those that do, resolved at each placement."""

    unclaimed: Foreign
    claims: tuple[BoundPod, ...] = ()
    #: Every pod, claimed or not: the candidates of a preemption plan (contract v1.2).
    members: tuple[BoundPod, ...] = field(default=(), compare=False)

    @property
    def count(self) -> int:
        return self.unclaimed.count + len(self.claims)

    @classmethod
    def of(cls, pods: Iterable[BoundPod]) -> NodePods:
        usage: dict[str, Decimal] = {}
        count = 0
        claims = []
        members = tuple(pods)
        for pod in members:
            if pod.reservation_id:
                claims.append(pod)
            else:
                _add(usage, pod.usage)
                count += 1
        return cls(unclaimed=Foreign(usage=usage, count=count), claims=tuple(claims), members=members)


@dataclass(frozen=True)
class ClusterPods:
    """An immutable snapshot of the bound, non-terminal pods per node, as the pod mirror last saw them."""

    nodes: Mapping[str, NodePods] = field(default_factory=dict)

    @classmethod
    def of(cls, pods: Iterable[BoundPod]) -> ClusterPods:
        by_node: dict[str, list[BoundPod]] = {}
        for pod in pods:
            by_node.setdefault(pod.node, []).append(pod)
        return cls(nodes={node: NodePods.of(members) for node, members in by_node.items()})

    def with_node(self, node: str, pods: Iterable[BoundPod]) -> ClusterPods:
        """A copy where ``node`` holds exactly ``pods`` (copy-on-write: other nodes are shared)."""
        entry = NodePods.of(pods)
        nodes = dict(self.nodes)
        if entry.count:
            nodes[node] = entry
        else:
            nodes.pop(node, None)
        return ClusterPods(nodes=nodes)

    @functools.cached_property
    def claimed(self) -> tuple[str, ...]:
        """The reservation ids the bound pods name (computed once per snapshot, not per reserve)."""
        return tuple(self.claimed_reservations())

    def claimed_reservations(self) -> list[str]:
        """The reservation ids the bound pods name; the store looks up which are its active ones."""
        return sorted(
            {pod.reservation_id for e in self.nodes.values() for pod in e.claims if pod.reservation_id}
        )


def foreign_usage(
    pods: ClusterPods,
    *,
    owners: Mapping[str, tuple[str, str]],
    held: Mapping[str, Mapping[str, Decimal]] | None = None,
) -> dict[str, Foreign]:
    """Per node, the usage of the pods that no active reservation of this RM already counts.

    ``owners`` maps each of this RM's *active* reservation ids to the ``(pod UID, node)`` it was made
    for.  A pod counts unless it names one of them, with its own UID, on its own node. ``held``
    maps reservation ids to what they hold: a pod its reservation counts adds what it uses beyond
    that (grown by an in-place resize).
    """
    result: dict[str, Foreign] = {}
    for node, entry in pods.nodes.items():
        counted = []
        grown: dict[str, Decimal] = {}
        for pod in entry.claims:
            if pod.reservation_id is None or owners.get(pod.reservation_id) != (pod.uid, pod.node):
                counted.append(pod)
            elif held is not None and pod.reservation_id in held:
                _add(grown, _beyond(pod.usage, held[pod.reservation_id]))
        if counted or grown:
            usage = dict(entry.unclaimed.usage)
            for pod in counted:
                _add(usage, pod.usage)
            _add(usage, grown)
            result[node] = Foreign(usage=usage, count=entry.unclaimed.count + len(counted))
        elif entry.unclaimed.count:
            result[node] = entry.unclaimed  # immutable by convention: shared, not copied
    return result


def _beyond(usage: Mapping[str, Decimal], reserved: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """What ``usage`` has beyond ``reserved``, per resource (the ``pods`` slot is the reservation's)."""
    return {
        name: amount - reserved.get(name, Decimal(0))
        for name, amount in usage.items()
        if name != "pods" and amount > reserved.get(name, Decimal(0))
    }


def in_use(
    own: Mapping[str, Mapping[str, Decimal]], foreign: Mapping[str, Foreign]
) -> dict[str, dict[str, Decimal]]:
    """The capacity in use per node: this RM's reservations plus the foreign pods."""
    total = {node: dict(bucket) for node, bucket in own.items()}
    for node, entry in foreign.items():
        _add(total.setdefault(node, {}), entry.usage)
    return total


def describe_foreign(
    *, foreign: Mapping[str, Foreign], short: Mapping[str, Sequence[str]], max_nodes: int = 3
) -> str:
    """One sentence naming what other pods use on nodes that lacked room, e.g.
    ``Pods this RM did not place use node n1: 3 cpu (1 pod); node n2: 3 cpu (1 pod).``

    ``short`` maps each node that lacked room to the resource names it lacked; only nodes where
    foreign pods use one of those are named, at most ``max_nodes`` of them.  Empty if none.
    """
    parts = []
    for node in sorted(short):
        entry = foreign.get(node)
        if entry is None:
            continue
        names = [name for name in short[node] if name != "pods" and entry.usage.get(name, Decimal(0)) > 0]
        if not names and "pods" not in short[node]:
            continue
        pods = f"{entry.count} pod{'' if entry.count == 1 else 's'}"
        amounts = ", ".join(f"{format_quantity(entry.usage[name])} {name}" for name in names)
        parts.append(f"node {node}: {amounts} ({pods})" if amounts else f"node {node}: {pods}")
    if not parts:
        return ""
    shown = "; ".join(parts[:max_nodes])
    more = len(parts) - max_nodes
    if more > 0:
        shown += f"; and {more} more node{'' if more == 1 else 's'}"
    return f"Pods this RM did not place use {shown}."
