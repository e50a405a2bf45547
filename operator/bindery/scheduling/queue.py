"""The scheduling queue: which pending pod to schedule next, and when to try a failed one again.

It behaves like kube-scheduler's ``PriorityQueue`` because users compare Bindery with it, except
where one tenant could starve another:

* **Active pods, fair across namespaces.**  Pods ready to be scheduled, highest ``spec.priority``
  first; at equal priority the namespaces take turns (round-robin, one pod each), and within a
  namespace the oldest (creation time) goes first.  kube-scheduler orders by priority then age
  alone, so a tenant with thousands of older pods that never fit keeps a newer pod of another
  namespace from ever being tried.  One entry per pod UID: an update replaces the stored
  :class:`PodInfo`.
* **Backoff.**  A pod whose cycle failed with an error waits ``initial * 2**(attempts-1)``
  seconds, capped (1 s to 10 s by default, per ResourceManager), or longer if the RM asked for it
  (``Retry-After``), at most :data:`MAX_PARKED_SECONDS`.
* **Unschedulable pool.**  A pod the RM found no room for is parked until an event that could make
  it fit: :meth:`SchedulingQueue.released` (a reservation released at its RM: the pods refused for
  room alone), :meth:`SchedulingQueue.move_all_to_active` (a Node added or changed), a
  change of the pod itself that affects placement, the RM's retry hint, or
  :data:`MAX_PARKED_SECONDS` (kube-scheduler's unschedulablePods pool and its
  ``podMaxInUnschedulablePodsDuration``, 5 minutes); never on the backoff timer alone, which made
  every never-fitting pod cost an RM call every 10 s forever.  A moved pod still waits out its
  backoff.  A move that happens while a pod is in flight is remembered (kube-scheduler's
  ``moveRequestCycle``), so a pod that fails right after capacity was freed is not parked past the
  event that could have made it fit.
* **Refused by a plugin that declared its events.**  The plugin that refused a pod says what can
  lift the refusal (:class:`~bindery.scheduling.events.Requeue`, see :meth:`SchedulingQueue.settle`);
  the queue never names a plugin. A pod the inter-pod rules refused (anti-affinity, spread,
  host ports…) is parked in the same pool with a :class:`WakeOn`: the namespaces whose placed pods
  its rules read, and tags for the placed pods that reach it from anywhere (existing pods'
  anti-affinity, host ports, a ReadWriteOncePod claim). :meth:`SchedulingQueue.wake` moves it back
  when such a placed pod is added, changed or removed (kube-scheduler's queueing hints: any change
  in scope wakes it unless the plugin's hint, :attr:`WakeOn.hint`, turns it down; the rules give
  none); node events move it as they
  move every parked pod, and a Node deleted those whose plugin registered Node deletions
  (:meth:`SchedulingQueue.node_deleted`); :data:`MAX_PARKED_SECONDS` caps the wait.  Before, it
  was retried on its backoff alone (1–10 s), forever, whether anything had changed or not.
* **Waiting for the RM to serve.**  A pod the RM refused as unavailable (a 503 while it starts,
  its mirrors still listing; a timeout; an open circuit) waits out its backoff, unless the RM
  turns ready first: :meth:`SchedulingQueue.rm_ready` tries every such pod at once. Without it,
  the pods tried while the RM started waited up to the backoff's cap after it served.
* **In-flight bound.**  At most ``max_in_flight`` pods of one ResourceManager are between
  :meth:`~SchedulingQueue.pop` and :meth:`~SchedulingQueue.done`, so a burst of pods cannot
  overwhelm the RM; waiting pods stay ordered meanwhile.  Optionally at most
  ``max_in_flight_per_namespace`` of them per namespace, so one namespace's cycles (waiting on a
  slow RM) cannot hold every slot; a namespace at its share sits out of the turns until one of its
  cycles ends.
* **Binding apart.**  A pod whose PreBind waits (a volume being provisioned) leaves the in-flight
  budget (:meth:`~SchedulingQueue.binding`) for the binding pool
  (:mod:`bindery.scheduling.binding`) until its cycle ends: a namespace's pods waiting for volumes
  that never come hold no slot and delay no other pod by more than a cycle.

``pop`` is the hot path: it is O(log n) (heaps with lazy deletion: a stale heap item is skipped
when it surfaces, and the heaps are compacted when stale items dominate), never a scan.  Active
pods are kept in one heap per namespace (a *lane*) and the lanes in a heap keyed by their best
pod's priority, then the turn they were last served at.  Time comes from an injectable
:class:`Clock`, so tests drive backoff without sleeping.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import heapq
import itertools
import logging
import time
from typing import Protocol

from bindery.backoff import BackoffPolicy
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.events import CAPACITY_EVENTS, ClusterEvent, Requeue, Touch, WakeOn
from bindery.scheduling.podspec import PodInfo

#: Pods of one RM between reserve and commit at once (spec.maxInFlight's default). Large because
#: the RM client batches the calls of concurrent cycles (`bindery.rm.batching`): 16 in flight made
#: batches of a few operations and bound a 3,000-pod backlog at 140 pods/s, 256 at 326 pods/s
#: (`benchmarks/ceiling.py --max-in-flight N`, benchmarks/PROFILE.md). A pod waiting in PreBind
#: for its volume leaves its slot for the binding pool (`bindery.scheduling.binding`).
DEFAULT_MAX_IN_FLIGHT = 256

__all__ = [
    "MAX_PARKED_SECONDS",
    "BackoffPolicy",
    "Clock",
    "MonotonicClock",
    "QueueClosed",
    "QueuePosition",
    "QueueStats",
    "Requeue",
    "SchedulingQueue",
    "Touch",
    "WakeOn",
]

log = logging.getLogger(__name__)

#: The longest a failed pod waits before it is tried again, whatever the RM's retry hint says; also
#: how long an unschedulable pod stays parked when no event could make it fit (kube-scheduler's
#: ``DefaultPodMaxInUnschedulablePodsDuration``, pkg/scheduler/backend/queue/scheduling_queue.go).
MAX_PARKED_SECONDS = 300.0
#: Placed-pod changes remembered for pods in flight (see ``SchedulingQueue.wake``); a pod that was in
#: flight across more of them than this is backed off instead of parked, as if one had concerned it.
TOUCHES_KEPT = 1024


def _check_budget(max_in_flight: int, per_namespace: int | None) -> None:
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight is {max_in_flight}; it must be at least 1")
    if per_namespace is not None and per_namespace < 1:
        raise ValueError(f"max_in_flight_per_namespace is {per_namespace}; it must be at least 1 (or unset)")


class QueueClosed(Exception):
    """The queue was closed (the operator is stopping or the ResourceManager was removed)."""


class Clock(Protocol):
    """Monotonic time, and a way to wait for an event with a timeout measured on that time."""

    def now(self) -> float: ...

    async def wait(self, event: asyncio.Event, *, delay: float | None) -> None:
        """Return when ``event`` is set or ``delay`` seconds (``None``: never) have passed."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and asyncio timeouts."""

    def now(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, *, delay: float | None) -> None:
        if delay is None:
            await event.wait()
            return
        try:
            async with asyncio.timeout(max(delay, 0.0)):
                await event.wait()
        except TimeoutError:
            pass


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStats:
    active: int
    backoff: int
    unschedulable: int
    in_flight: int
    #: pods whose cycle waits in PreBind apart from the in-flight budget (the binding pool or its queue)
    binding: int = 0
    #: pods moved out of the unschedulable pool, by the event that moved them (since start)
    moved: tuple[tuple[str, int], ...] = ()

    @property
    def pending(self) -> int:
        return self.active + self.backoff + self.unschedulable


@dataclasses.dataclass(frozen=True, slots=True)
class QueuePosition:
    """Where one pod is in the queue, for people asking why it waits (`bindery explain`)."""

    #: active, backoff, unschedulable, in-flight or binding
    queue: str
    #: failed attempts so far
    attempts: int
    #: seconds until it is tried again (parked pods); None while active or in flight
    ready_in: float | None
    #: an unschedulable pod also moves as soon as an event could make it fit (capacity released, the
    #: pod changed); ``ready_in`` is then the 5-minute flush or the RM's hint
    waits_for_capacity: bool


class _State(enum.Enum):
    ACTIVE = "active"
    BACKOFF = "backoff"
    UNSCHEDULABLE = "unschedulable"
    IN_FLIGHT = "in-flight"
    #: popped, its cycle waiting in PreBind outside the in-flight budget (see `binding`)
    BINDING = "binding"


@dataclasses.dataclass(eq=False, slots=True)
class _Entry:
    pod: PodInfo
    state: _State
    generation: int = 0
    attempts: int = 0
    backoff_until: float = 0.0
    #: The pop counter value when this pod was last popped (for the move-request check).
    popped_cycle: int = 0
    #: While in flight: the pod changed in a way that affects placement.
    changed_in_flight: bool = False
    #: While in flight: the pod was forgotten; ``done`` drops it.
    forgotten: bool = False
    #: While parked: when it becomes active again (its timer).
    ready_at: float = 0.0
    #: While parked unschedulable after a rules refusal: the placed-pod changes that wake it.
    wake_on: WakeOn | None = None
    #: The events its last refusal declared (a release moves it only if RELEASE is one).
    events: frozenset[ClusterEvent] = frozenset()


#: popped and not done yet: in a cycle, in a slot or waiting apart
_POPPED = (_State.IN_FLIGHT, _State.BINDING)

# (-priority, created, tiebreak, uid, generation)
_ActiveItem = tuple[int, float, int, str, int]
# (ready_at, tiebreak, uid, generation)
_TimerItem = tuple[float, int, str, int]
# (-priority of the lane's best pod, the lane's turn, namespace, version)
_LaneItem = tuple[int, int, str, int]


@dataclasses.dataclass(eq=False, slots=True)
class _Lane:
    """The active pods of one namespace, best first; the lanes take turns at equal priority."""

    namespace: str
    #: when the lane was last served (or joined): the smallest goes first among equal priorities
    turn: int
    heap: list[_ActiveItem] = dataclasses.field(default_factory=list)
    #: its active pods (the heap also holds stale items)
    live: int = 0
    #: the key of its current item in the lanes' heap (None: not in it)
    key: tuple[int, int] | None = None
    version: int = 0


class SchedulingQueue:
    """The queue of one ResourceManager (profile).  Not thread-safe; use it from one event loop."""

    def __init__(
        self,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_in_flight_per_namespace: int | None = None,
        backoff: BackoffPolicy | None = None,
        max_parked_seconds: float = MAX_PARKED_SECONDS,
        clock: Clock | None = None,
    ) -> None:
        _check_budget(max_in_flight, max_in_flight_per_namespace)
        self._max_in_flight = max_in_flight
        self._share = max_in_flight_per_namespace
        #: namespace -> its pods in flight (only namespaces with any)
        self._flying: dict[str, int] = {}
        self._backoff = backoff or BackoffPolicy()
        self._max_parked = max_parked_seconds
        self._clock: Clock = clock or MonotonicClock()
        self._entries: dict[str, _Entry] = {}
        #: namespace -> its active pods; a lane exists while it has any
        self._lanes: dict[str, _Lane] = {}
        #: the lanes with active pods, best first (lazy deletion: a lane's stale items are skipped)
        self._round: list[_LaneItem] = []
        self._turns = itertools.count()
        self._timers: list[_TimerItem] = []
        self._unschedulable: set[str] = set()
        self._counts = {state: 0 for state in _State}
        self._tiebreak = itertools.count()
        self._generations = itertools.count(1)
        self._pops = 0
        self._last_move_cycle = -1
        self._settle_until = 0.0  # a pod failing after a move waits at least this long (see settle)
        self._wakeup = asyncio.Event()
        self._poppers = asyncio.Lock()  # see pop()
        self._closed = False
        #: the rules-refused pods of the unschedulable pool, by what wakes them (see `wake`)
        self._wake_namespace: dict[str, set[str]] = {}
        self._wake_any: set[str] = set()
        self._wake_tag: dict[str, set[str]] = {}
        #: the pods backing off because the RM was unavailable (see `rm_ready`)
        self._unready: set[str] = set()
        #: recent touches, (pop counter when touched, touch): a pod refused while in flight checks
        #: whether one of them could have lifted its refusal (kube-scheduler's in-flight events)
        self._touches: collections.deque[tuple[int, Touch]] = collections.deque(maxlen=TOUCHES_KEPT)
        self._moved: collections.Counter[str] = collections.Counter()

    # -- configuration -------------------------------------------------------------------------

    def reconfigure(
        self, *, max_in_flight: int, backoff: BackoffPolicy, max_in_flight_per_namespace: int | None = None
    ) -> None:
        """Apply a changed ResourceManager spec without losing queued pods or their attempt counts."""
        _check_budget(max_in_flight, max_in_flight_per_namespace)
        self._max_in_flight = max_in_flight
        self._share = max_in_flight_per_namespace
        self._backoff = backoff
        for lane in list(self._lanes.values()):  # a namespace that sat out may take turns again
            self._schedule_lane(lane)
        self._wakeup.set()

    def close(self) -> None:
        """Wake every :meth:`pop` waiter with :class:`QueueClosed`; later pops raise it too."""
        self._closed = True
        self._wakeup.set()

    # -- introspection -------------------------------------------------------------------------

    def stats(self) -> QueueStats:
        return QueueStats(
            active=self._counts[_State.ACTIVE],
            backoff=self._counts[_State.BACKOFF],
            unschedulable=self._counts[_State.UNSCHEDULABLE],
            in_flight=self._counts[_State.IN_FLIGHT],
            binding=self._counts[_State.BINDING],
            moved=tuple(sorted(self._moved.items())),
        )

    def __len__(self) -> int:
        """Pods known to the queue (waiting or in flight)."""
        return len(self._entries)

    def __contains__(self, uid: object) -> bool:
        return uid in self._entries and not self._entries[uid].forgotten

    def attempts(self, uid: str) -> int:
        """How many times the pod failed so far (0 if never or unknown)."""
        entry = self._entries.get(uid)
        return entry.attempts if entry is not None else 0

    def in_flight(self) -> int:
        return self._counts[_State.IN_FLIGHT]

    def now(self) -> float:
        """The queue's clock (what :meth:`ready_since` is measured on)."""
        return self._clock.now()

    def ready_since(self, uid: str) -> float | None:
        """When the pod's last backoff ended (it was due again); None before its first failure."""
        entry = self._entries.get(uid)
        return entry.ready_at if entry is not None and entry.attempts > 0 else None

    def position(self, uid: str) -> QueuePosition | None:
        """Where the pod is and when it is tried next; None if the queue does not hold it."""
        entry = self._entries.get(uid)
        if entry is None or entry.forgotten:
            return None
        parked = entry.state in (_State.BACKOFF, _State.UNSCHEDULABLE)
        return QueuePosition(
            queue=entry.state.value,
            attempts=entry.attempts,
            ready_in=max(entry.ready_at - self._clock.now(), 0.0) if parked else None,
            waits_for_capacity=entry.state is _State.UNSCHEDULABLE,
        )

    def footprint(self) -> int:
        """Items held for pods, stale heap items included: 0 once every pod left (memory checks)."""
        lanes = len(self._lanes) + len(self._round) + sum(len(lane.heap) for lane in self._lanes.values())
        return len(self._entries) + lanes + len(self._timers) + len(self._unschedulable) + len(self._flying)

    # -- producers -----------------------------------------------------------------------------

    def add(self, pod: PodInfo) -> bool:
        """Add a pending pod, or update the stored copy of a known one.

        A pod that may not be scheduled (bound, terminating, gated) is forgotten instead; returns
        whether the pod is (still) queued.  An update that changes where the pod could go moves an
        unschedulable pod back (through its remaining backoff); other updates only replace it.
        """
        if not pod.schedulable:
            self.forget(pod.uid)
            return False
        entry = self._entries.get(pod.uid)
        if entry is None:
            entry = _Entry(pod=pod, state=_State.ACTIVE)
            self._entries[pod.uid] = entry
            self._counts[_State.ACTIVE] += 1
            self._lane(pod.namespace).live += 1
            self._push_active(entry)
            return True
        changed = pod.placement_inputs() != entry.pod.placement_inputs()
        reordered = pod.priority != entry.pod.priority or pod.created != entry.pod.created
        entry.pod = pod
        if entry.state in _POPPED:
            entry.forgotten = False
            entry.changed_in_flight = entry.changed_in_flight or changed
        elif entry.state is _State.ACTIVE and reordered:
            self._push_active(entry)
        elif entry.state is _State.UNSCHEDULABLE and changed:
            self._leave_unschedulable(entry, now=self._clock.now())
        return True

    def forget(self, uid: str) -> None:
        """The pod was deleted or bound (by anyone): drop it.  Unknown UIDs are ignored."""
        entry = self._entries.get(uid)
        if entry is None:
            return
        if entry.state in _POPPED:
            entry.forgotten = True  # ``done`` frees the slot and drops it
            return
        self._remove(entry)

    def move_all_to_active(self, *, reason: str, settle: float = 0.0, event: str = "other") -> int:
        """An event could make parked pods fit: retry every unschedulable pod once its backoff allows.

        ``settle`` (seconds) holds them back a little longer: the RM learns of some events (a Node
        added or changed) through its own watch, and a pod retried before the RM saw the event would
        be refused and parked again, for up to 5 minutes.  ``event`` labels the move in
        :attr:`QueueStats.moved`.  Returns how many pods left the pool.
        """
        now = self._clock.now()
        moved = 0
        for uid in list(self._unschedulable):
            self._leave_unschedulable(self._entries[uid], now=now, not_before=now + settle)
            moved += 1
        self._last_move_cycle = self._pops
        self._settle_until = max(self._settle_until, now + settle)
        if moved:
            self._moved[event] += moved
            log.debug("moved %d unschedulable pods back: %s", moved, reason)
        return moved

    def released(self, *, reason: str, event: str = "released") -> int:
        """A reservation at this queue's RM was released: move back the pods whose refusal declared
        :attr:`~bindery.scheduling.events.ClusterEvent.RELEASE` (refused for room), through their
        remaining backoff. Room at the RM cures no other refusal (inter-pod rules, a plugin's), as
        kube-scheduler wakes a pod only on the events its rejecting plugin registered; a pod in
        flight now still counts the move (see :meth:`move_all_to_active`). Returns how many moved."""
        now = self._clock.now()
        uids = [uid for uid in self._unschedulable if ClusterEvent.RELEASE in self._entries[uid].events]
        for uid in uids:
            self._leave_unschedulable(self._entries[uid], now=now)
        self._last_move_cycle = self._pops
        if uids:
            self._moved[event] += len(uids)
            log.debug("moved %d pods refused for room back: %s", len(uids), reason)
        return len(uids)

    def waiting_for_rm(self) -> int:
        """How many pods back off because the RM was unavailable (`rm_ready` tries them)."""
        return len(self._unready)

    def rm_ready(self, *, event: str = "rm-ready") -> int:
        """The RM serves again: the pods it refused as unavailable are tried now, their backoff
        waived, since what it waited for is over; a pod refused for another reason keeps its own.
        Returns how many moved."""
        uids = list(self._unready)
        for uid in uids:
            self._activate(self._entries[uid])
        if uids:
            self._moved[event] += len(uids)
            log.debug("moved %d pods back: the RM serves again", len(uids))
        return len(uids)

    def retry_within(self, uid: str, seconds: float) -> None:
        """An unschedulable pod parked for longer is tried again after ``seconds`` (never before its
        backoff ends), with no event to wake it: a preemption back-off ending, or victims that
        another scheduler placed, whose deletion releases nothing this process follows."""
        entry = self._entries.get(uid)
        if entry is None or entry.state is not _State.UNSCHEDULABLE:
            return
        at = max(self._clock.now() + seconds, entry.backoff_until)
        if entry.ready_at > at:
            wake_on = entry.wake_on  # re-parking unindexes it: the placed-pod wake-up must survive
            self._park(entry, _State.UNSCHEDULABLE, ready_at=at)
            if wake_on is not None:
                self._index_wake(entry, wake_on)

    def wake(self, touch: Touch, *, event: str = "placed-pod") -> int:
        """A placed pod was added, changed or removed: move back the pods refused by the placement
        rules whose :class:`WakeOn` covers it (through their remaining backoff).  Pods parked for
        other reasons stay.  Returns how many moved."""
        if self._counts[_State.IN_FLIGHT]:
            self._touches.append((self._pops, touch))
        uids = set(self._wake_any)
        uids.update(self._wake_namespace.get(touch.namespace, ()))
        for tag in touch.tags:
            uids.update(self._wake_tag.get(tag, ()))
        uids = {
            uid for uid in uids if (wake_on := self._entries[uid].wake_on) is None or wake_on.hinted(touch)
        }
        if not uids:
            return 0
        now = self._clock.now()
        for uid in uids:
            self._leave_unschedulable(self._entries[uid], now=now)
        self._moved[event] += len(uids)
        log.debug("moved %d rules-refused pods back: %s in %s", len(uids), event, touch.namespace)
        return len(uids)

    def node_deleted(self, *, event: str = "node-deleted") -> int:
        """A Node went away: move back the pods whose refusing plugin declared Node deletions
        (:attr:`WakeOn.node_deleted`: a DoNotSchedule topology spread, whose domain may no longer
        count in the skew's minimum, as kube-scheduler's PodTopologySpread registers them). A
        deletion frees no room for a pod the RM refused, so the others stay. Returns how many moved."""
        uids = [
            uid
            for uid in self._unschedulable
            if (wake_on := self._entries[uid].wake_on) is not None and wake_on.node_deleted
        ]
        now = self._clock.now()
        for uid in uids:
            self._leave_unschedulable(self._entries[uid], now=now)
        if uids:
            self._moved[event] += len(uids)
        return len(uids)

    # -- consumers -----------------------------------------------------------------------------

    def pop_nowait(self) -> PodInfo | None:
        """The next pod to schedule, or ``None`` if none is ready or the in-flight budget is spent."""
        if self._closed:
            raise QueueClosed("the scheduling queue is closed")
        self._release_due(self._clock.now())
        if self._counts[_State.IN_FLIGHT] >= self._max_in_flight:
            return None
        while self._round:
            priority, _, namespace, version = heapq.heappop(self._round)
            lane = self._lanes.get(namespace)
            if lane is None or lane.version != version:
                continue  # a stale item: the lane was rescheduled or emptied since
            lane.key = None
            if self._at_share(namespace):
                continue  # out of the turns until one of its cycles ends (see _set_state)
            head = self._lane_head(lane)
            if head is None:
                continue
            if head[0] != priority:  # its best pod left or changed: queue the lane by its new best
                self._schedule_lane(lane)
                continue
            heapq.heappop(lane.heap)
            entry = self._entries[head[3]]
            lane.turn = next(self._turns)  # to the back of the round among its priority
            self._pops += 1
            entry.popped_cycle = self._pops
            entry.changed_in_flight = False
            self._set_state(entry, _State.IN_FLIGHT)
            if namespace in self._lanes:
                self._schedule_lane(lane)
            return entry.pod
        return None

    async def pop(self) -> PodInfo:
        """Wait for the next pod to schedule; the caller must call :meth:`done` for it.

        Raises :class:`QueueClosed` once :meth:`close` was called.

        One caller at a time waits for the wake-up; the others queue on a lock, which hands over to
        exactly one of them. Bindery runs ``maxInFlight`` workers (256 by default), all idle here at
        low load, and a shared event would wake every one of them for each pod added or finished.
        A pod ready now is taken without the lock: in a backlog no worker waits.
        """
        pod = self.pop_nowait()
        if pod is not None:
            return pod
        async with self._poppers:
            while True:
                pod = self.pop_nowait()
                if pod is not None:
                    return pod
                self._wakeup.clear()
                await self._clock.wait(self._wakeup, delay=self._next_timer_delay())

    def binding(self, uid: str) -> None:
        """The popped pod's cycle waits in PreBind from now on: its in-flight slot goes to the next
        pod (its namespace's share too); :meth:`done` still ends its cycle. Idempotent."""
        entry = self._entries.get(uid)
        if entry is None or entry.state not in _POPPED:
            raise KeyError(f"pod {uid} is not in flight; only a popped pod's cycle may wait apart")
        if entry.state is _State.IN_FLIGHT:
            self._set_state(entry, _State.BINDING)
            self._wakeup.set()

    def settle(
        self, uid: str, *, outcome: Outcome, retry_after: float | None = None, requeue: Requeue | None = None
    ) -> None:
        """:meth:`done`, the pod routed by what the plugin that refused it declared (``requeue``;
        ``None``: no plugin declared anything, and an unschedulable pod comes back on its backoff)."""
        self.done(
            uid,
            outcome=outcome,
            retry_after=retry_after,
            until_event=requeue is not None and requeue.until_event,
            wake_on=requeue.wake_on if requeue is not None else None,
            events=requeue.events if requeue is not None else frozenset(),
        )

    def done(
        self,
        uid: str,
        *,
        outcome: Outcome,
        retry_after: float | None = None,
        until_event: bool = True,
        wake_on: WakeOn | None = None,
        events: frozenset[ClusterEvent] | None = None,
    ) -> None:
        """The cycle of a popped pod ended with ``outcome``; free its in-flight slot and route it.

        ``retry_after`` is the RM's hint (seconds) for when trying again makes sense.
        ``until_event``: an unschedulable pod waits for an event that could make it fit (the RM had
        no room: releases, Nodes and pods are followed). False for refusals whose events Bindery does
        not follow (a plugin's, such as a claim not found yet): those come back on their backoff.
        ``wake_on``: the placement rules refused the pod; it waits for a placed-pod change it covers
        (:meth:`wake`), a node event or the flush, whatever ``until_event`` says.
        ``events``: what the refusing plugin declared (:meth:`released` reads it); ``None``: the
        capacity events if ``until_event``, else none.
        """
        entry = self._entries.get(uid)
        if entry is None or entry.state not in _POPPED:
            raise KeyError(f"pod {uid} is not in flight; call done() once per pop()")
        self._wakeup.set()
        if entry.forgotten or outcome in (Outcome.BOUND, Outcome.DROPPED):
            self._remove(entry)
            return
        now = self._clock.now()
        entry.events = events if events is not None else (CAPACITY_EVENTS if until_event else frozenset())
        entry.attempts += 1
        entry.backoff_until = now + self._backoff.delay(attempts=entry.attempts)
        hinted = now + min(retry_after, self._max_parked) if retry_after else 0.0
        moved_meanwhile = self._last_move_cycle >= entry.popped_cycle or entry.changed_in_flight
        if outcome is Outcome.ERROR:
            self._park(entry, _State.BACKOFF, ready_at=max(entry.backoff_until, hinted))
            if ClusterEvent.RM_READY in entry.events:
                self._unready.add(uid)
        elif outcome is Outcome.UNSCHEDULABLE and wake_on is not None and not retry_after:
            if moved_meanwhile or self._touched_since(entry.popped_cycle, wake_on):
                # The pods the rules read changed while the cycle ran: its verdict may be stale.
                self._park(entry, _State.BACKOFF, ready_at=max(entry.backoff_until, self._settle_until))
            else:
                self._park(entry, _State.UNSCHEDULABLE, ready_at=now + self._max_parked)
                self._index_wake(entry, wake_on)
        elif moved_meanwhile:
            # Capacity may have been freed (or the pod changed) after the RM answered: the RM's
            # "try again in N s" no longer holds, only the backoff does.
            self._park(entry, _State.BACKOFF, ready_at=max(entry.backoff_until, self._settle_until))
        elif retry_after or not until_event:
            self._park(entry, _State.UNSCHEDULABLE, ready_at=max(entry.backoff_until, hinted))
        else:
            # Parked until an event could make it fit (move_all_to_active, a change of the pod), or
            # the flush: retrying a pod nothing changed for only costs the RM a call.
            self._park(entry, _State.UNSCHEDULABLE, ready_at=now + self._max_parked)

    # -- internals -----------------------------------------------------------------------------

    def _set_state(self, entry: _Entry, state: _State) -> None:
        self._counts[entry.state] -= 1
        self._counts[state] += 1
        if entry.state is _State.ACTIVE:
            self._leave_lane(entry)
        if entry.state is _State.IN_FLIGHT:
            self._landed(entry.pod.namespace)
        if state is _State.IN_FLIGHT:
            self._flying[entry.pod.namespace] = self._flying.get(entry.pod.namespace, 0) + 1
        if state is _State.ACTIVE:
            self._lane(entry.pod.namespace).live += 1
        if entry.state is _State.UNSCHEDULABLE:
            self._unschedulable.discard(entry.pod.uid)
            self._unindex_wake(entry)
        if entry.state is _State.BACKOFF:
            self._unready.discard(entry.pod.uid)
        if state is _State.UNSCHEDULABLE:
            self._unschedulable.add(entry.pod.uid)
        entry.state = state

    def _remove(self, entry: _Entry) -> None:
        self._counts[entry.state] -= 1
        self._unschedulable.discard(entry.pod.uid)
        self._unready.discard(entry.pod.uid)
        self._unindex_wake(entry)
        del self._entries[entry.pod.uid]
        entry.generation = -1
        if entry.state is _State.IN_FLIGHT:
            self._landed(entry.pod.namespace)
        if entry.state is _State.ACTIVE:
            self._leave_lane(entry)
            lane = self._lanes.get(entry.pod.namespace)
            if lane is not None:
                self._compact_lane(lane)
        if not self._entries:  # every pod left: drop the stale heap items (they hold pod UIDs)
            self._lanes.clear()
            self._round.clear()
            self._timers.clear()
        waiting = self._counts[_State.BACKOFF] + self._counts[_State.UNSCHEDULABLE]
        if self._entries and len(self._timers) > 64 + 2 * waiting:
            parked = (_State.BACKOFF, _State.UNSCHEDULABLE)
            self._timers = [i for i in self._timers if self._live(i[2], i[3], parked)]
            heapq.heapify(self._timers)

    def _push_active(self, entry: _Entry) -> None:
        # Due from now on if it was moved before its backoff ended (capacity freed, pod changed).
        entry.ready_at = min(entry.ready_at, self._clock.now())
        entry.generation = next(self._generations)
        item = (-entry.pod.priority, entry.pod.created.timestamp(), next(self._tiebreak), entry.pod.uid)
        lane = self._lane(entry.pod.namespace)
        heapq.heappush(lane.heap, (*item, entry.generation))
        self._compact_lane(lane)
        self._schedule_lane(lane)
        self._wakeup.set()

    # -- lanes (the active pods, one heap per namespace) -----------------------------------------

    def _lane(self, namespace: str) -> _Lane:
        """The namespace's lane; a new one joins the round behind the lanes already waiting."""
        lane = self._lanes.get(namespace)
        if lane is None:
            lane = self._lanes[namespace] = _Lane(namespace=namespace, turn=next(self._turns))
        return lane

    def _leave_lane(self, entry: _Entry) -> None:
        """An active pod left the active state (its heap item is stale now); drop an emptied lane."""
        lane = self._lanes.get(entry.pod.namespace)
        if lane is None:
            return
        lane.live -= 1
        if lane.live <= 0:
            del self._lanes[lane.namespace]  # its items in the round are stale with it

    def _lane_head(self, lane: _Lane) -> _ActiveItem | None:
        """The lane's best active pod's item, stale items on top dropped."""
        while lane.heap and not self._live(lane.heap[0][3], lane.heap[0][4], (_State.ACTIVE,)):
            heapq.heappop(lane.heap)
        return lane.heap[0] if lane.heap else None

    def _at_share(self, namespace: str) -> bool:
        return self._share is not None and self._flying.get(namespace, 0) >= self._share

    def _landed(self, namespace: str) -> None:
        """A cycle of the namespace ended: below its share again, its lane takes turns again."""
        left = self._flying.get(namespace, 0) - 1
        if left > 0:
            self._flying[namespace] = left
        else:
            self._flying.pop(namespace, None)
        if not self._counts[_State.IN_FLIGHT]:
            self._touches.clear()  # only pods in flight read them
        lane = self._lanes.get(namespace)
        if lane is not None and lane.key is None:
            self._schedule_lane(lane)

    def _schedule_lane(self, lane: _Lane) -> None:
        """Put the lane into the round under its current key (its best pod's priority, its turn)."""
        if self._at_share(lane.namespace):
            return  # sits out; `_landed` puts it back
        head = self._lane_head(lane)
        if head is None:
            return
        key = (head[0], lane.turn)
        if key == lane.key:
            return
        lane.key = key
        lane.version = next(self._generations)
        heapq.heappush(self._round, (*key, lane.namespace, lane.version))
        if len(self._round) > 64 + 2 * len(self._lanes):
            self._round = [
                (*lane.key, lane.namespace, lane.version)
                for lane in self._lanes.values()
                if lane.key is not None
            ]
            heapq.heapify(self._round)

    def _compact_lane(self, lane: _Lane) -> None:
        if len(lane.heap) > 64 + 2 * lane.live:
            lane.heap = [i for i in lane.heap if self._live(i[3], i[4], (_State.ACTIVE,))]
            heapq.heapify(lane.heap)

    def _park(self, entry: _Entry, state: _State, *, ready_at: float) -> None:
        self._set_state(entry, state)
        entry.ready_at = ready_at
        entry.generation = next(self._generations)
        heapq.heappush(self._timers, (ready_at, next(self._tiebreak), entry.pod.uid, entry.generation))
        self._wakeup.set()  # a waiter may be sleeping until a later deadline
        waiting = self._counts[_State.BACKOFF] + self._counts[_State.UNSCHEDULABLE]
        if len(self._timers) > 64 + 2 * waiting:
            parked = (_State.BACKOFF, _State.UNSCHEDULABLE)
            self._timers = [i for i in self._timers if self._live(i[2], i[3], parked)]
            heapq.heapify(self._timers)

    def _live(self, uid: str, generation: int, states: tuple[_State, ...]) -> bool:
        entry = self._entries.get(uid)
        return entry is not None and entry.generation == generation and entry.state in states

    def _activate(self, entry: _Entry) -> None:
        self._set_state(entry, _State.ACTIVE)
        self._push_active(entry)

    def _leave_unschedulable(self, entry: _Entry, *, now: float, not_before: float = 0.0) -> None:
        ready_at = max(entry.backoff_until, not_before)
        if now < ready_at:
            self._park(entry, _State.BACKOFF, ready_at=ready_at)
        else:
            self._activate(entry)

    def _release_due(self, now: float) -> None:
        parked = (_State.BACKOFF, _State.UNSCHEDULABLE)
        while self._timers and self._timers[0][0] <= now:
            _, _, uid, generation = heapq.heappop(self._timers)
            if self._live(uid, generation, parked):
                self._activate(self._entries[uid])

    def _index_wake(self, entry: _Entry, wake_on: WakeOn) -> None:
        uid = entry.pod.uid
        entry.wake_on = wake_on
        if wake_on.namespaces is None:
            self._wake_any.add(uid)
        else:
            for namespace in wake_on.namespaces:
                self._wake_namespace.setdefault(namespace, set()).add(uid)
        for tag in wake_on.tags:
            self._wake_tag.setdefault(tag, set()).add(uid)

    def _unindex_wake(self, entry: _Entry) -> None:
        wake_on, entry.wake_on = entry.wake_on, None
        if wake_on is None:
            return
        uid = entry.pod.uid
        self._wake_any.discard(uid)
        for index, keys in ((self._wake_namespace, wake_on.namespaces or ()), (self._wake_tag, wake_on.tags)):
            for key in keys:
                bucket = index.get(key)
                if bucket is not None:
                    bucket.discard(uid)
                    if not bucket:
                        del index[key]

    def _touched_since(self, popped_cycle: int, wake_on: WakeOn) -> bool:
        """Whether a placed-pod change `wake_on` covers came after the pop at `popped_cycle`."""
        touches = self._touches
        if len(touches) == touches.maxlen and touches[0][0] >= popped_cycle:
            return True  # older touches were dropped: one of them may have concerned the pod
        for cycle, touch in reversed(touches):
            if cycle < popped_cycle:
                break
            if wake_on.covers(touch):
                return True
        return False

    def _next_timer_delay(self) -> float | None:
        parked = (_State.BACKOFF, _State.UNSCHEDULABLE)
        while self._timers and not self._live(self._timers[0][2], self._timers[0][3], parked):
            heapq.heappop(self._timers)
        if not self._timers:
            return None
        return max(self._timers[0][0] - self._clock.now(), 0.0)
