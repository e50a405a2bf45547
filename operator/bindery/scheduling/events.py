"""The cluster events that can make a refused pod schedulable, and what a plugin declares of them.

Like kube-scheduler's ``EnqueueExtensions.EventsToRegister``, the plugin that refused a pod says
which events may lift its refusal (:class:`Requeue`); the queue wakes the pod on those alone and
never names a plugin. A placed-pod event is scoped (:class:`WakeOn`): the plugin computes which
placed pods' changes concern the pod, and each change is described by a :class:`Touch`. This
module imports nothing of Bindery, so that the failure table, the queue and the framework can all
speak of events without importing each other.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

__all__ = [
    "CAPACITY_EVENTS",
    "NO_ROOM",
    "RELEASE_WAKE_WINDOW_SECONDS",
    "ClusterEvent",
    "Requeue",
    "Touch",
    "WakeOn",
    "WakeWindow",
]

#: Releases at one RM within this long wake its pods refused for room once more at most, at the
#: window's end: a tenant releasing reservations in a loop cannot make every parked pod ask the RM
#: again per release. One second, as kube-scheduler flushes its backoff queue every second.
RELEASE_WAKE_WINDOW_SECONDS = 1.0


class ClusterEvent(enum.StrEnum):
    """The events Bindery follows that a plugin may register for."""

    #: A reservation released (the RM has room again), or the ResourceManager reconfigured.
    RELEASE = "Release"
    NODE_ADDED = "NodeAdded"
    NODE_CHANGED = "NodeChanged"
    NODE_DELETED = "NodeDeleted"
    #: A placed pod added, changed or removed, within the scope :attr:`Requeue.placed` gives.
    PLACED_POD = "PlacedPod"
    #: The RM serves again after it refused a pod as unavailable (starting, its mirrors listing).
    RM_READY = "RMReady"


#: What a pod the RM had no room for waits for: capacity that may have freed.
CAPACITY_EVENTS = frozenset({ClusterEvent.RELEASE, ClusterEvent.NODE_ADDED, ClusterEvent.NODE_CHANGED})


@dataclasses.dataclass(frozen=True, slots=True)
class WakeOn:
    """The placed-pod changes that can lift a refusal (:meth:`SchedulingQueue.wake`).

    A change of a placed pod of one of ``namespaces`` (``None``: of any namespace, for terms with a
    namespaceSelector or a namespace list beyond the pod's own), or of a placed pod that carries
    one of ``tags`` (e.g. anti-affinity, which may reach the pod from any namespace).
    ``node_deleted``: a Node deleted may lift it too (a DoNotSchedule topology spread).
    ``hint``: the plugin's queueing hint (kube-scheduler's ``QueueingHintFn``): given a change in
    scope, whether it may lift the refusal; ``None`` (or a hint that raises): any change in scope may.
    """

    namespaces: frozenset[str] | None = frozenset()
    tags: frozenset[str] = frozenset()
    node_deleted: bool = False
    hint: Callable[[Touch], bool] | None = dataclasses.field(default=None, compare=False)

    def covers(self, touch: Touch) -> bool:
        """Whether `touch` is in scope and, by the hint, may lift the refusal."""
        if not (self.namespaces is None or touch.namespace in self.namespaces or touch.tags & self.tags):
            return False
        return self.hinted(touch)

    def hinted(self, touch: Touch) -> bool:
        """The hint's verdict on `touch` (True without a hint, or when it raises: waking a pod for
        nothing costs one cycle, missing a wake-up parks it for minutes)."""
        if self.hint is None:
            return True
        try:
            return bool(self.hint(touch))
        except Exception:
            return True


@dataclasses.dataclass(frozen=True, slots=True)
class Touch:
    """A placed pod added, changed or removed: its namespace and its tags (see :class:`WakeOn`)."""

    namespace: str
    tags: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class Requeue:
    """The events that can make a pod one plugin refused schedulable, as that plugin declared them.

    A release moves only the pods whose refusal declared :attr:`ClusterEvent.RELEASE` (room at the
    RM cures nothing else); a Node added or changed moves any parked pod (the queue's coarse move).
    So these say what the pod *waits* for: with :attr:`ClusterEvent.RELEASE` it stays parked until
    such an event (or the flush); with :attr:`ClusterEvent.PLACED_POD` or
    :attr:`ClusterEvent.NODE_DELETED` until a placed-pod change in ``placed`` or a Node deleted;
    with none of them it comes back on its backoff, as a pod whose events Bindery does not follow.
    """

    events: frozenset[ClusterEvent] = frozenset()
    #: The scope of :attr:`ClusterEvent.PLACED_POD` (ignored without it).
    placed: WakeOn = WakeOn()

    @classmethod
    def no_room(cls) -> Requeue:
        """The RM had no room: wait until capacity may have freed."""
        return NO_ROOM

    @classmethod
    def rm_ready(cls) -> Requeue:
        """The RM was unavailable: try again the moment it serves (or on the backoff)."""
        return RM_READY

    @property
    def until_event(self) -> bool:
        """Parked until capacity may have freed (``SchedulingQueue.done``'s ``until_event``)."""
        return ClusterEvent.RELEASE in self.events

    @property
    def wake_on(self) -> WakeOn | None:
        """The placed-pod and node-deletion wake-ups (``SchedulingQueue.done``'s ``wake_on``)."""
        placed = ClusterEvent.PLACED_POD in self.events
        deleted = ClusterEvent.NODE_DELETED in self.events
        if not placed and not deleted:
            return None
        scope = self.placed if placed else WakeOn()
        return dataclasses.replace(scope, node_deleted=deleted)


#: The RM's "no room", whichever plugin relayed it (see :meth:`Requeue.no_room`).
NO_ROOM = Requeue(events=CAPACITY_EVENTS)
RM_READY = Requeue(events=frozenset({ClusterEvent.RM_READY}))


@dataclasses.dataclass(slots=True)
class WakeWindow:
    """When a burst of one event wakes the pods waiting for it: the first at once, then at most one
    more wake per ``window`` seconds, owed to the end of the window (none is lost, only delayed).

    The caller runs the wake now when :meth:`request` answers 0, arranges one after a positive
    delay, and calls :meth:`fired` when that owed wake runs; ``None``: a wake already owed covers
    this event. Pure: the caller passes the time.
    """

    window: float = RELEASE_WAKE_WINDOW_SECONDS
    #: when the last wake ran
    last: float = float("-inf")
    #: a wake is owed to the end of the current window
    owed: bool = False

    def request(self, *, now: float) -> float | None:
        """An event: 0.0 (wake now), the delay until the owed wake, or None (already owed)."""
        if self.owed:
            return None
        if now - self.last >= self.window:
            self.last = now
            return 0.0
        self.owed = True
        return self.last + self.window - now

    def fired(self, *, now: float) -> None:
        """The owed wake runs now: the next window starts."""
        self.owed = False
        self.last = now
