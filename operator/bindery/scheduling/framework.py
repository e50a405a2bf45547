"""The scheduler framework's extension points, narrowed to what a binding pipeline needs.

Bindery does not filter or score nodes (the resource manager places pods), so of kube-scheduler's
framework only PreFilter and the binding-cycle extension points remain: PreFilter, Reserve/Unreserve,
PreBind, Bind and PostBind. PreFilter runs before anything is reserved: it may find the pod
unschedulable outright (a missing volume claim), and it may narrow the nodes the RM may pick
(:meth:`CycleContext.require_nodes`, e.g. to where the pod's volumes are), and weigh them
(:meth:`CycleContext.prefer_nodes`, the soft inter-pod rules). The built-in steps are
the default plugins of these points (see :mod:`bindery.scheduling.defaults` and
:mod:`bindery.scheduling.volumes`); a ResourceManager can add PreBind and PostBind plugins, extra
Reserve plugins, or replace the Bind plugin, by entry-point name (see
:mod:`bindery.scheduling.registry`).

The interfaces are deliberately narrow: a plugin receives one :class:`CycleContext` (the pod, the
profile, the reservation, the ports) and returns a :class:`Status`; it never sees the queue and
cannot touch other pods.  The semantics follow kube-scheduler:

* PreFilter plugins run in order; the first non-success status fails the cycle before any
  reservation exists (nothing to undo).
* Reserve plugins run in order; if one fails, *every* Reserve plugin's ``unreserve`` runs in
  reverse order, including those whose ``reserve`` never ran, so ``unreserve`` must be idempotent
  and must cope with nothing to undo.  The same unreserve runs on any later failure.
* PreBind plugins run in order; the first non-success status fails the cycle.
* Bind plugins run in order until one does not return ``SKIP``.
* PostBind plugins run after a successful bind; they are informational and cannot change the
  outcome (an exception is logged and ignored).
* A PreBind plugin about to wait (a volume being provisioned, later a device's binding conditions)
  first awaits :meth:`CycleContext.wait_apart`: the pod leaves the scheduling budget for the
  binding pool (:class:`BindingGate`), as kube-scheduler's binding cycle runs apart from its
  scheduling cycle, so that its wait holds back no other pod. The rest of the cycle (the wait, the
  other PreBind plugins, Bind, PostBind, or Unreserve) runs there, in the same order.

A plugin that raises is treated as if it returned an ``ERROR`` status naming it.

A plugin that refuses pods may also say which cluster events can make such a pod schedulable
(:class:`EnqueueExtensions`, kube-scheduler's ``EventsToRegister``): the cycle asks the plugin named
by the failure and records its answer on it, and the queue wakes the pod from that alone, so
neither the queue nor the controller knows any plugin by name.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from bindery.scheduling.events import ClusterEvent, Requeue
from bindery.scheduling.nodecheck import NodeCheckMode
from bindery.scheduling.queue import DEFAULT_MAX_IN_FLIGHT

if TYPE_CHECKING:
    from bindery.rm.models import Reservation, ReservationRequest
    from bindery.scheduling.decisions import Failure
    from bindery.scheduling.podspec import PodInfo
    from bindery.scheduling.ports import (
        Binder,
        ConditionWriter,
        DeviceAccess,
        EventSink,
        NodeLookup,
        PlacedPods,
        PodLookup,
        VolumeAccess,
    )

__all__ = [
    "RESERVATION_ANNOTATION",
    "BindPlugin",
    "BindingGate",
    "ClusterEvent",
    "Code",
    "CycleContext",
    "EnqueueExtensions",
    "GroupMemberReserve",
    "PluginChain",
    "PluginSet",
    "Ports",
    "PostBindPlugin",
    "PreBindPlugin",
    "PreFilterPlugin",
    "Profile",
    "Requeue",
    "ReservationClient",
    "ReservePlugin",
    "Status",
]

#: The annotation the Binding carries (and the apiserver copies onto the pod): which reservation
#: holds the pod's capacity, so the RM's view can be reconciled with the cluster after a crash.
RESERVATION_ANNOTATION = "bindery.dev/reservation-id"


class Code(enum.StrEnum):
    SUCCESS = "Success"
    #: The pod does not fit (reported as ``Unschedulable``, retried when capacity may have freed).
    UNSCHEDULABLE = "Unschedulable"
    #: Something failed (reported as ``SchedulerError``, retried after backoff).
    ERROR = "Error"
    #: Bind plugins only: "not mine, ask the next Bind plugin".
    SKIP = "Skip"


@dataclasses.dataclass(frozen=True, slots=True)
class Status:
    """The result of one plugin call."""

    code: Code = Code.SUCCESS
    message: str = ""
    #: The built-in plugins attach a precise classification (RM unavailable, bind conflict, ...);
    #: third-party plugins leave it ``None`` and are classified by ``code``.
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    @classmethod
    def success(cls) -> Status:
        return _SUCCESS

    @classmethod
    def unschedulable(cls, message: str) -> Status:
        return cls(code=Code.UNSCHEDULABLE, message=message)

    @classmethod
    def error(cls, message: str) -> Status:
        return cls(code=Code.ERROR, message=message)

    @classmethod
    def skip(cls) -> Status:
        return cls(code=Code.SKIP)

    @classmethod
    def failed(cls, failure: Failure) -> Status:
        """A failure already classified by :mod:`bindery.scheduling.decisions`."""
        return cls(code=Code.ERROR, message=failure.message, failure=failure)


_SUCCESS = Status()


class ReservationClient(Protocol):
    """What the cycle needs of the RM client (:class:`bindery.rm.client.ResourceManagerClient`).

    Raises the errors of :mod:`bindery.rm.errors`.  Every caller passes the pod's UID to commit and
    release (contract v1.1): the RM then refuses to touch a reservation of another pod, which is what
    keeps a pod that copied someone's reservation annotation from freeing their capacity.
    """

    async def reserve(self, request: ReservationRequest, /) -> Reservation: ...

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation: ...

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None: ...

    async def renew(self, reservation_id: str, /, *, pod_uid: str, ttl_seconds: int) -> Reservation: ...

    async def list_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None, pod_uid: str | None = None
    ) -> list[Reservation]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Ports:
    """The cluster-side ports one scheduling cycle uses (implemented by :mod:`bindery.adapters`)."""

    nodes: NodeLookup
    pods: PodLookup
    binder: Binder
    events: EventSink
    conditions: ConditionWriter
    #: Claims, volumes and storage classes (the VolumeBinding plugin); ``None`` where no adapter is
    #: wired, and then a pod with claims fails with an error rather than binding without volumes.
    volumes: VolumeAccess | None = None
    #: ResourceClaims and DeviceClasses (the DynamicResources plugin); ``None`` where no adapter is
    #: wired, and then a pod with DRA claims fails with an error rather than binding unallocated.
    devices: DeviceAccess | None = None
    #: Pods on nodes, for the inter-pod rules (PodPlacementRules); ``None`` where no watch is wired,
    #: and then those rules are not evaluated.
    placed: PlacedPods | None = None


@runtime_checkable
class PreFilterPlugin(Protocol):
    @property
    def name(self) -> str: ...

    async def pre_filter(self, *, ctx: CycleContext) -> Status:
        """Before reserving: unschedulable outright, or narrow the nodes (`ctx.require_nodes`)."""
        ...


@runtime_checkable
class ReservePlugin(Protocol):
    @property
    def name(self) -> str: ...

    async def reserve(self, *, ctx: CycleContext) -> Status: ...

    async def unreserve(self, *, ctx: CycleContext) -> None:
        """Undo ``reserve``; must be idempotent and must tolerate ``reserve`` never having run."""
        ...


@runtime_checkable
class PreBindPlugin(Protocol):
    @property
    def name(self) -> str: ...

    async def pre_bind(self, *, ctx: CycleContext) -> Status: ...


@runtime_checkable
class BindPlugin(Protocol):
    @property
    def name(self) -> str: ...

    async def bind(self, *, ctx: CycleContext) -> Status:
        """Bind ``ctx.pod`` to ``ctx.node``; ``Status.skip()`` passes the pod to the next Bind plugin."""
        ...


@runtime_checkable
class PostBindPlugin(Protocol):
    @property
    def name(self) -> str: ...

    async def post_bind(self, *, ctx: CycleContext) -> None: ...


@runtime_checkable
class EnqueueExtensions(Protocol):
    """Optional, beside any extension point: the events that can make a pod this plugin refused
    schedulable (kube-scheduler's ``EventsToRegister``; its ``QueueingHintFn`` is the placed-pod
    scope's optional ``hint``).

    Called once per refusal with the refused pod and the failure the plugin caused; returns the
    events to wait for, with the placed-pod scope the plugin computes for this pod, or ``None``
    (the pod comes back on its backoff). A plugin without this method gets ``None``.
    """

    @property
    def name(self) -> str: ...

    def events_to_register(self, *, pod: PodInfo, failure: Failure) -> Requeue | None: ...


@runtime_checkable
class GroupMemberReserve(Protocol):
    """Optional, for a Reserve plugin whose bookkeeping a pod group's members need too.

    A pod group's members are reserved at the RM together, so the group path skips the Reserve
    point; a plugin that also assumes a pod it let through (the inter-pod rules' in-flight view)
    does so here, for every member before their PreBind, and forgets it when the group fails.
    """

    @property
    def name(self) -> str: ...

    async def reserve_member(self, *, ctx: CycleContext) -> None: ...

    async def unreserve_member(self, *, ctx: CycleContext) -> None:
        """Undo ``reserve_member``; idempotent."""
        ...


class BindingGate(Protocol):
    """Where a cycle goes to wait apart from scheduling (:meth:`CycleContext.wait_apart`).

    ``enter`` moves the pod out of the in-flight budget and returns once the binding pool admits it
    (a failure status if it cannot wait any more: the pod gone, its lease lost); ``leave`` frees its
    place when the cycle ends, whatever happened (it must tolerate a pod never admitted).
    """

    async def enter(self, *, ctx: CycleContext) -> Status: ...

    def leave(self, *, ctx: CycleContext) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class PluginSet:
    """The plugins a ResourceManager enables *in addition to* the defaults (or, for Bind, instead)."""

    pre_filter: tuple[PreFilterPlugin, ...] = ()
    reserve: tuple[ReservePlugin, ...] = ()
    pre_bind: tuple[PreBindPlugin, ...] = ()
    #: ``None``: the default binder.  Otherwise these replace it (tried in order until one does
    #: not skip).
    bind: tuple[BindPlugin, ...] | None = None
    post_bind: tuple[PostBindPlugin, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class PluginChain:
    """The plugins of every extension point, defaults included, in the order they run."""

    pre_filter: tuple[PreFilterPlugin, ...]
    reserve: tuple[ReservePlugin, ...]
    pre_bind: tuple[PreBindPlugin, ...]
    bind: tuple[BindPlugin, ...]
    post_bind: tuple[PostBindPlugin, ...]

    def plugins(self) -> list[object]:
        """Every plugin of the chain once, in the order of the points."""
        seen: dict[int, object] = {}
        for plugin in (*self.pre_filter, *self.reserve, *self.pre_bind, *self.bind, *self.post_bind):
            seen.setdefault(id(plugin), plugin)
        return list(seen.values())

    def requeue_of(self, *, pod: PodInfo, failure: Failure) -> Requeue | None:
        """What the plugin that caused `failure` declares can make `pod` schedulable (None: it
        declares nothing, or no plugin of the chain has that name)."""
        for plugin in self.plugins():
            if isinstance(plugin, EnqueueExtensions) and plugin.name == failure.plugin:
                return plugin.events_to_register(pod=pod, failure=failure)
        return None

    def group_members(self) -> list[GroupMemberReserve]:
        """The Reserve plugins that hold a pod group's members too (see :class:`GroupMemberReserve`)."""
        return [plugin for plugin in self.reserve if isinstance(plugin, GroupMemberReserve)]


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """The runtime configuration of one ResourceManager: everything a cycle needs besides the ports."""

    #: The ResourceManager's name (appears in messages: ``resource manager "gpu-pool" chose ...``).
    name: str
    scheduler_names: frozenset[str]
    client: ReservationClient
    reservation_ttl_seconds: int = 60
    node_check: NodeCheckMode = NodeCheckMode.FULL
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 10.0
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    plugins: PluginSet = PluginSet()
    #: The monotonic clock reservation leases are measured on (see bindery.scheduling.lease).
    clock: Callable[[], float] = time.monotonic
    #: How long PreBind waits for the pod's volume claims to be bound (kube-scheduler's
    #: VolumeBinding ``bindTimeoutSeconds``, 600 by default).
    volume_bind_timeout_seconds: float = 600.0


@dataclasses.dataclass(eq=False, slots=True)
class CycleContext:
    """Everything one scheduling cycle of one pod knows; plugins read it, the Reserve step fills it."""

    pod: PodInfo
    profile: Profile
    ports: Ports
    #: Set by the RM reservation (default Reserve plugin); ``None`` until then.
    reservation: Reservation | None = None
    #: Scratch space for plugins to pass data between extension points (like kube-scheduler's
    #: CycleState); key by plugin name to avoid collisions.
    state: dict[str, object] = dataclasses.field(default_factory=dict)
    #: Node constraints from PreFilter plugins, each a list of nodeSelectorTerms (ORed); all of them
    #: and the pod's own required node affinity must hold (see `required_node_terms`).
    node_constraints: list[tuple[Mapping[str, Any], ...]] = dataclasses.field(default_factory=list)
    #: Weighted node preferences from PreFilter plugins, added to the pod's own preferred node
    #: affinity (contract v1.2 ``placement.preferredNodeAffinity``; see `preferred_node_terms`).
    node_preferences: list[tuple[int, Mapping[str, Any]]] = dataclasses.field(default_factory=list)
    #: Where a waiting PreBind plugin sends the pod (``None``: it waits in its scheduling slot, as a
    #: pod group's members and the tests' bare cycles do).
    gate: BindingGate | None = None
    #: The cycle went to wait apart (`wait_apart` was called): the gate's `leave` ends it.
    apart: bool = False

    async def wait_apart(self) -> Status:
        """Call before a wait of unbounded length in PreBind: leave the scheduling budget for the
        binding pool, queued while the pool is full. Success: the caller may wait now. Once per
        cycle; a second call returns at once."""
        if self.gate is None or self.apart:
            return Status.success()
        self.apart = True
        return await self.gate.enter(ctx=self)

    def require_nodes(self, terms: Sequence[Mapping[str, Any]]) -> None:
        """Only nodes matching one of `terms` (nodeSelectorTerms) will do; the RM is told so."""
        self.node_constraints.append(tuple(terms))

    def required_node_terms(self) -> list[dict[str, Any]]:
        """The pod's required node affinity ANDed with every PreFilter constraint, as nodeSelectorTerms.

        Terms are ORed and requirements within a term ANDed, so ANDing two lists of terms is their
        cross product with the requirements of each pair merged (empty: no constraint at all).
        """
        combined: list[dict[str, Any]] = [dict(term) for term in self.pod.affinity_terms]
        for terms in self.node_constraints:
            combined = and_terms(combined, terms)
        return combined

    def prefer_nodes(self, terms: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        """Nodes matching a term score its weight (1..100) with the RM; soft: the RM may ignore them,
        and an RM without contract v1.2's ``node-preferences`` never receives them."""
        self.node_preferences.extend(terms)

    def preferred_node_terms(self) -> list[tuple[int, Mapping[str, Any]]]:
        """The pod's own preferred node affinity, then every PreFilter preference."""
        return [*self.pod.preferred_terms, *self.node_preferences]

    @property
    def node(self) -> str | None:
        """The node the RM chose, once reserved."""
        return self.reservation.node if self.reservation is not None else None

    @property
    def scheduler_name(self) -> str:
        return self.pod.scheduler_name


def and_terms(left: Sequence[Mapping[str, Any]], right: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pure: nodeSelectorTerms matching a node iff one of `left` and one of `right` match it.

    An empty list is no constraint, so it is the identity on either side.
    """
    if not left:
        return [dict(term) for term in right]
    if not right:
        return [dict(term) for term in left]
    return [
        {
            key: [*(a.get(key) or ()), *(b.get(key) or ())]
            for key in ("matchExpressions", "matchFields")
            if a.get(key) or b.get(key)
        }
        for a in left
        for b in right
    ]
