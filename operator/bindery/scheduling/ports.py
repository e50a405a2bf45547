"""The ports through which the scheduling core observes and changes the cluster.

The scheduling core makes decisions; :mod:`bindery.adapters` performs them against the apiserver.  The
boundary is drawn so that the success path of a scheduling cycle is visibly cheap: the lookups
(:class:`NodeLookup`, :class:`PodLookup`) are synchronous because they must be answered from memory
(Kopf indexes fed by the watches), never by a request; the writers are the only coroutines, and a
successful cycle calls exactly two of them (:meth:`Binder.bind` and :meth:`EventSink.scheduled`).

The exceptions at the bottom are the only ones the writers may raise; anything else is a bug in the
adapter and is reported as a scheduler error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bindery.podrules.model import AffinityTerm, PlacedPod
    from bindery.scheduling.inflight import InFlight
    from bindery.scheduling.podspec import PodInfo

__all__ = [
    "BindConflict",
    "BindError",
    "Binder",
    "ConditionWriter",
    "DeviceAccess",
    "DeviceConflict",
    "DeviceError",
    "EventSink",
    "NodeLookup",
    "NodeProjection",
    "PlacedPods",
    "PodGone",
    "PodLookup",
    "VolumeAccess",
    "VolumeError",
]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeProjection:
    """The few fields of a Node the pre-bind checks need, small enough to index every Node in memory."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    unschedulable: bool = False
    deleting: bool = False

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> NodeProjection:
        """Project a Node in Kubernetes JSON shape (as a Kopf handler or index receives it)."""
        metadata: Mapping[str, Any] = body.get("metadata") or {}
        spec: Mapping[str, Any] = body.get("spec") or {}
        return cls(
            name=str(metadata.get("name") or ""),
            labels={str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
            taints=tuple(dict(taint) for taint in spec.get("taints") or ()),
            unschedulable=bool(spec.get("unschedulable", False)),
            deleting=metadata.get("deletionTimestamp") is not None,
        )


class NodeLookup(Protocol):
    """Nodes by name, answered from memory (a Kopf index on Nodes), never by an API read."""

    def get(self, name: str) -> NodeProjection | None: ...


class PlacedPods(Protocol):
    """The pods on nodes (bound by anyone, or assumed by a cycle of this process), from a watch.

    What kube-scheduler's inter-pod filters read (bindery.podrules.filters.PlacedView), plus the
    assume cache: a pod whose reservation names a node is counted there until the watch sees it
    bound, or its cycle fails and forgets it.
    """

    @property
    def in_flight(self) -> InFlight: ...

    async def wait_synced(self, seconds: float) -> bool:
        """Wait (bounded) until the watch listed every pod on a node; whether it has."""
        ...

    def in_namespace(self, namespace: str) -> Iterable[PlacedPod]: ...

    def label_groups(self, namespace: str) -> Iterable[tuple[Mapping[str, str], Iterable[PlacedPod]]]: ...

    def namespaces(self) -> Iterable[str]: ...

    def on_node(self, node: str) -> Iterable[PlacedPod]:
        """The pods on `node`."""
        ...

    def lowest_priority(self) -> int | None:
        """The lowest ``spec.priority`` of any pod on a node; None when there is none."""
        ...

    def with_anti_affinity(self) -> Iterable[PlacedPod]: ...

    def anti_affinity_toward(self, namespace: str) -> Iterable[PlacedPod]: ...

    def anti_affinity_groups_toward(
        self, namespace: str
    ) -> Iterable[tuple[str, tuple[AffinityTerm, ...], Iterable[PlacedPod]]]: ...

    def with_host_ports(self) -> Iterable[PlacedPod]: ...

    def preferring_toward(self, namespace: str) -> Iterable[PlacedPod]:
        """The pods whose affinity or preferred terms may select a pod of `namespace` (a superset)."""
        ...

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels (for namespaceSelector), or None while unknown."""
        ...

    def service_selectors(self, namespace: str) -> Iterable[Mapping[str, str]]:
        """The selectors of the namespace's Services (for default spreading); none while unknown."""
        ...

    def nodes(self) -> Sequence[NodeProjection]:
        """Every node the node watch knows."""
        ...

    def assume(self, pod: PlacedPod) -> None: ...

    def forget(self, uid: str) -> None:
        """Drop an assumed pod (its cycle failed); a pod the watch saw bound stays."""
        ...


class PodLookup(Protocol):
    """Pending pods by UID, answered from the pod watch.

    Returns the current copy while the pod exists and is still unbound; ``None`` once it was
    deleted or left the watch's ``spec.nodeName=`` selector (bound by anyone).
    """

    def get(self, uid: str) -> PodInfo | None: ...


class Binder(Protocol):
    """Binds a pod by POSTing a Binding to ``pods/{name}/binding``.

    The Binding must carry ``metadata.uid = pod.uid`` (so a recreated pod of the same name is not
    bound by mistake) and ``annotations`` in its metadata (the apiserver copies them onto the pod).

    Raises :class:`BindConflict` on 409, :class:`PodGone` on 404, :class:`BindError` otherwise.
    ``timeout`` (seconds) bounds the request (the cycle derives it from the reservation's lease);
    ``None`` leaves the adapter's own limit.
    """

    async def bind(  # `timeout`: the Binding's own bound, derived from the lease
        self,
        *,
        pod: PodInfo,
        node: str,
        annotations: Mapping[str, str],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None: ...


class EventSink(Protocol):
    """Writes events.k8s.io/v1 Events as kube-scheduler does (reportingController = scheduler name)."""

    async def scheduled(
        self,
        *,
        pod: PodInfo,
        node: str,
        scheduler_name: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Normal ``Scheduled``, action ``Binding``, note ``Successfully assigned <ns>/<name> to <node>``.

        ``timeout`` bounds the request (the reservation is committed after it); ``None`` leaves the
        adapter's own limit.
        """
        ...

    async def failed_scheduling(self, *, pod: PodInfo, message: str, scheduler_name: str) -> None:
        """Warning ``FailedScheduling``, action ``Scheduling``, note = ``message``."""
        ...


class ConditionWriter(Protocol):
    """Sets the ``PodScheduled`` condition through the ``pods/status`` subresource.

    May raise :class:`PodGone` if the pod no longer exists; the caller treats that as harmless.
    """

    async def pod_scheduled_false(self, *, pod: PodInfo, reason: str, message: str) -> None: ...

    async def pod_scheduled_true(self, *, pod: PodInfo) -> None:
        """Restore ``True`` (as the Binding set it) over a ``False`` written by a failed attempt."""
        ...


class VolumeAccess(Protocol):
    """Claims, volumes and storage classes, for the VolumeBinding plugin (a pod with claims only).

    Unlike the lookups above these read the apiserver: only pods that use PersistentVolumeClaims pay
    for it, and a claim's binding must be seen as it is now, not as a cache last heard. Objects are
    in Kubernetes JSON shape; ``None`` means not found. Writers raise :class:`VolumeError`.
    """

    async def claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    async def volume(self, name: str) -> Mapping[str, Any] | None: ...

    async def volumes(self) -> list[Mapping[str, Any]]:
        """Every PersistentVolume (the candidates for an unbound WaitForFirstConsumer claim)."""
        ...

    async def storage_class(self, name: str) -> Mapping[str, Any] | None: ...

    async def csi_nodes(self) -> list[Mapping[str, Any]]:
        """Every CSINode (its drivers' ``allocatable.count``: NodeVolumeLimits)."""
        ...

    async def all_claims(self) -> list[Mapping[str, Any]]:
        """Every PersistentVolumeClaim (the volumes of the pods already on nodes: NodeVolumeLimits)."""
        ...

    async def bind_volume(self, *, volume: Mapping[str, Any], claim: Mapping[str, Any]) -> None:
        """Pre-bind a static PV to the claim (its ``spec.claimRef``), as kube-scheduler does; the
        PV controller completes the binding. Fails if the PV changed since it was read."""
        ...

    async def select_node(self, *, claim: Mapping[str, Any], node: str | None) -> None:
        """Set (``node``) or remove (``None``) the claim's ``volume.kubernetes.io/selected-node``
        annotation, which tells its provisioner where to create the volume."""
        ...


class DeviceAccess(Protocol):
    """ResourceClaims and DeviceClasses (``resource.k8s.io/v1``), for the DynamicResources plugin.

    Read from the apiserver, as claims and volumes are: only pods with ``spec.resourceClaims`` pay
    for it, and a claim's allocation must be seen as it is now. Objects are in Kubernetes JSON
    shape; ``None`` means not found. Writes are full updates guarded by the body's
    ``metadata.resourceVersion``: :class:`DeviceConflict` when the claim changed since it was read
    (the caller reads it again and redoes its change), :class:`DeviceError` otherwise.
    """

    async def claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    async def device_class(self, name: str) -> Mapping[str, Any] | None: ...

    async def update_claim(self, claim: Mapping[str, Any]) -> Mapping[str, Any]:
        """Write the claim's metadata and spec (its finalizers); answers the claim as stored."""
        ...

    async def update_claim_status(self, claim: Mapping[str, Any]) -> Mapping[str, Any]:
        """Write the claim's status (allocation, reservedFor); answers the claim as stored."""
        ...


class DeviceError(Exception):
    """A claim or class could not be read or written; ``message`` is a sentence for the pod's event."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DeviceConflict(DeviceError):
    """The claim changed since it was read (HTTP 409): read it again and redo the change."""


class VolumeError(Exception):
    """A claim or volume could not be read or written; ``message`` is a sentence for the pod's event."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BindError(Exception):
    """The Binding could not be created for a reason other than a conflict or a missing pod.

    ``message`` is a complete sentence for the pod's ``FailedScheduling`` event, used verbatim:
    what was attempted (pod, node) and what the apiserver answered (status code and message).

    ``status`` is the HTTP status of the apiserver's answer; ``None`` means there was no answer
    (timeout, connection reset), so the Binding may or may not have been applied.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class BindConflict(Exception):
    """409 Conflict on the Binding.

    ``current_node`` is the node the pod is already assigned to when the apiserver says so (``pod
    X is already assigned to node "n1"``), else ``None`` (UID precondition failed, the pod is being
    deleted, or has scheduling gates).  When it is set, ``pod_uid`` and ``reservation_id`` say who
    holds the pod there: its UID and its ``bindery.dev/reservation-id`` annotation, as read after
    the conflict.  A conflict naming the node we chose is a lost response (success) only if the pod
    carries our reservation and UID; otherwise another scheduler, or a stale cycle, bound it.
    ``message`` goes into the pod's event verbatim.
    """

    def __init__(
        self,
        message: str = "the apiserver refused the Binding (409 Conflict)",
        *,
        current_node: str | None = None,
        pod_uid: str | None = None,
        reservation_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.current_node = current_node
        self.pod_uid = pod_uid
        self.reservation_id = reservation_id


class PodGone(Exception):
    """The pod no longer exists (404), or exists with another UID; there is nobody left to schedule."""

    def __init__(self, message: str = "the pod no longer exists") -> None:
        super().__init__(message)
        self.message = message
