"""The pods whose cycles run now and have not named a node yet: who waits for whom.

Two related pods in flight at once would each be judged against a cache without the other, so a
later related cycle waits (bounded) for the earlier one to name its node, or, among one group's
pods spread over domains, only until it was sent to a domain. It sits below the plugin that uses
it (:mod:`bindery.scheduling.placementrules`) and beside the ports, which name it as the
placed-pod cache's assume view.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bindery.podrules.filters import Narrowed
from bindery.podrules.model import NO_SOFT, AffinityTerm, PlacedPod, PodRules, SoftRules
from bindery.scheduling.podspec import PodInfo

__all__ = ["STALE_SECONDS", "WAIT_SECONDS", "InFlight"]

log = logging.getLogger(__name__)

#: The longest a pod waits for related earlier in-flight pods to name their nodes; then it goes on
#: with what is known (an earlier cycle stuck this long is itself waiting for a slow RM).
WAIT_SECONDS = 30.0
#: An in-flight entry older than this is ignored by waiters (a cycle that ended without settling).
STALE_SECONDS = 120.0
#: Pods remembered as "not narrowed again" (:meth:`InFlight.narrowed_refused`).
_UNNARROWED = 10_000


@dataclasses.dataclass(eq=False, slots=True)
class _Cycle:
    uid: str
    namespace: str
    labels: Mapping[str, str]
    rules: PodRules
    seq: int
    started: float
    claims: frozenset[str] = frozenset()
    soft: SoftRules = NO_SOFT
    #: the cycles waiting for this one (registered by :meth:`InFlight.wait`, released by settle)
    waiters: list[_Waiter] | None = None
    #: the cycles of its group waiting for its domain or its node, whichever comes first
    domain_waiters: list[_Waiter] | None = None
    group: _Group | None = None
    #: where its request was narrowed to (a domain of its group's ``narrow_key``), before the RM answers
    region: Narrowed | None = None
    #: the pod as its group's later cycles count it meanwhile (on the region's anchor node)
    anchored: PlacedPod | None = None
    #: the later cycles that counted it in its region (placed as if it were there before them)
    counted_by: set[str] | None = None


@dataclasses.dataclass(eq=False, slots=True)
class _Waiter:
    """A cycle waiting for `remaining` earlier cycles to settle: one wake-up when the last does,
    not one per settled cycle (a Deployment's burst waits for ~20 pods each)."""

    remaining: int
    done: asyncio.Future[None]


#: What :func:`_related` and :func:`_share_claims` read of a cycle: namespace, label set, rules, soft
#: rules and claims. Cycles with equal signatures relate to every other cycle alike.
_Signature = tuple[str, frozenset[tuple[str, str]], PodRules, SoftRules, frozenset[str]]


@dataclasses.dataclass(eq=False, slots=True)
class _Group:
    """The in-flight cycles of one signature (a Deployment's pods share one), in the order they
    started: relatedness is decided once per pair of groups, not once per pair of pods."""

    id: int
    signature: _Signature
    #: a cycle of the group (maybe settled since): the signature as :func:`_related` reads it
    sample: _Cycle
    #: whether the relation reads namespace labels (a namespaceSelector term): never memoized, as
    #: a namespace's labels may change between two cycles
    reads_namespaces: bool
    members: dict[str, _Cycle] = dataclasses.field(default_factory=dict)
    #: other group's id → whether this group's cycles depend on that group's (while both exist)
    related: dict[int, bool] = dataclasses.field(default_factory=dict)
    #: the key of its DoNotSchedule spread over its own pods when its cycles may go on once the
    #: earlier ones are sent to a domain of it (:func:`_narrow_key`); None: they wait for nodes
    narrow_key: str | None = None
    #: the keys of its required anti-affinity over its own pods (excluded around such domains)
    anti_keys: tuple[str, ...] = ()


def _reads_namespaces(rules: PodRules, soft: SoftRules) -> bool:
    """Whether a term of `rules` or `soft` may read a namespace's labels (AffinityTerm.in_scope)."""
    for term in (
        *rules.affinity,
        *rules.anti_affinity,
        *(w.term for w in soft.affinity),
        *(w.term for w in soft.anti_affinity),
    ):
        selector = term.namespace_selector
        if selector is not None and not selector.nothing and not selector.empty:
            return True
    return False


class InFlight:
    """The pods whose cycles run now and have not named a node yet, in the order they started.

    Cycles are grouped by signature (:data:`_Signature`): a backlog of one Deployment's pods is one
    group, so a new pod decides relatedness once per group instead of once per in-flight pod (that
    was O(in-flight) rule matches per pod, 11 % of the operator's CPU on issue 19's rules backlog).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._cycles: dict[str, _Cycle] = {}
        self._groups: dict[_Signature, _Group] = {}
        #: the groups with required anti-affinity (plain pods check only these)
        self._anti: dict[_Signature, _Group] = {}
        self._seq = itertools.count()
        self._group_ids = itertools.count()
        self._clock = clock
        self.waits = 0  #: pods that waited (tests and the benchmark read it)
        #: pods whose narrowed request the RM refused (bounded): not narrowed again
        self._unnarrowed: collections.OrderedDict[str, None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._cycles)

    def begin(self, pod: PodInfo, *, soft: bool = True) -> _Cycle:
        """`soft` False: the pod's soft rules are not scored (its RM takes no preferences), so it
        waits for nobody on their account."""
        cycle = _Cycle(
            uid=pod.uid,
            namespace=pod.namespace,
            labels=pod.labels,
            rules=pod.rules,
            seq=next(self._seq),
            started=self._clock(),
            claims=frozenset(pod.claims),
            soft=pod.soft if soft else NO_SOFT,
        )
        self.settle(pod.uid)  # a previous cycle of the same pod that never settled
        self._cycles[pod.uid] = cycle
        signature: _Signature = (
            cycle.namespace,
            frozenset(cycle.labels.items()),
            cycle.rules,
            cycle.soft,
            cycle.claims,
        )
        group = self._groups.get(signature)
        if group is None:
            narrow_key, anti_keys = _narrow_key(cycle)
            group = _Group(
                id=next(self._group_ids),
                signature=signature,
                sample=cycle,
                reads_namespaces=_reads_namespaces(cycle.rules, cycle.soft),
                narrow_key=narrow_key,
                anti_keys=anti_keys,
            )
            self._groups[signature] = group
            if cycle.rules.anti_affinity:
                self._anti[signature] = group
        group.members[pod.uid] = cycle  # seq order: a pod's new cycle was settled out above
        cycle.group = group
        return cycle

    def settle(self, uid: str) -> None:
        """The pod's node is known (assumed), or its cycle ended without one."""
        cycle = self._cycles.pop(uid, None)
        if cycle is None:
            return
        group = cycle.group
        if group is not None:
            group.members.pop(uid, None)
            if not group.members:
                self._groups.pop(group.signature, None)
                self._anti.pop(group.signature, None)
                for other in self._groups.values():
                    other.related.pop(group.id, None)
        _count_down(cycle.waiters)
        _count_down(cycle.domain_waiters)
        cycle.domain_waiters = None

    def place(self, uid: str, region: Narrowed, anchored: PlacedPod) -> None:
        """The pod's request was narrowed to `domain` of its group's ``narrow_key``: the later
        cycles of its group may go on, counting it there (it is assumed on a node of it)."""
        cycle = self._cycles.get(uid)
        if cycle is None:
            return
        cycle.region = region
        cycle.anchored = anchored
        _count_down(cycle.domain_waiters)
        cycle.domain_waiters = None

    def unplace(self, uid: str) -> None:
        """The pod's narrowed request was refused and it is reserved anew without: later cycles
        wait for its node again (those that counted it in its region wait for it before PreBind)."""
        cycle = self._cycles.get(uid)
        if cycle is not None:
            cycle.region = None
            cycle.anchored = None

    def placing(self, cycle: _Cycle) -> list[_Cycle]:
        """The earlier cycles of `cycle`'s group sent to a domain whose node is not known yet."""
        group = cycle.group
        if group is None or group.narrow_key is None:
            return []
        now = self._clock()
        found: list[_Cycle] = []
        for other in group.members.values():
            if other.seq >= cycle.seq:
                break
            if other.region is not None and now - other.started < STALE_SECONDS:
                found.append(other)
        return found

    def followed(self, cycle: _Cycle) -> int:
        """How many later cycles of `cycle`'s group are in flight (they would wait for its node)."""
        group = cycle.group
        if group is None:
            return 0
        return sum(1 for other in group.members.values() if other.seq > cycle.seq)

    def narrowed_refused(self, uid: str) -> None:
        """The RM refused the pod's narrowed request: its next cycles are not narrowed (the domain
        chosen for it may be full while others have room)."""
        self._unnarrowed[uid] = None
        while len(self._unnarrowed) > _UNNARROWED:
            self._unnarrowed.popitem(last=False)

    def may_narrow(self, uid: str) -> bool:
        return uid not in self._unnarrowed

    async def wait_nodes(self, cycles: Sequence[_Cycle], *, seconds: float = WAIT_SECONDS) -> None:
        """Wait (bounded) until each of `cycles` settled: its node is known or its cycle failed."""
        pending = [other for other in cycles if self._cycles.get(other.uid) is other]
        if not pending:
            return
        waiter = _Waiter(remaining=len(pending), done=asyncio.get_running_loop().create_future())
        for other in pending:
            if other.waiters is None:
                other.waiters = []
            other.waiters.append(waiter)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await waiter.done

    def may_be_awaited(self, cycle: _Cycle, *, namespace_labels: Any) -> bool:
        """Whether a cycle may wait for `cycle`'s node: it states rules, soft rules or claims that
        relate it to other pods, a cycle waits for it already, or the pods of a group in flight
        with rules relate to it (a Deployment's later pods would wait for it). A cycle that begins
        after this is asked, of a group not in flight now, is not foreseen: its wait may then take
        one batch's round trip more."""
        if cycle.rules or cycle.claims or cycle.soft is not NO_SOFT or cycle.waiters or cycle.domain_waiters:
            return True
        mine = cycle.group
        if mine is None:
            return True
        return any(
            group is not mine
            and bool(group.sample.rules or group.sample.claims or group.sample.soft is not NO_SOFT)
            and _groups_related(group, mine, namespace_labels)
            for group in self._groups.values()
        )

    def earlier_related(self, cycle: _Cycle, *, namespace_labels: Any) -> list[_Cycle]:
        mine = cycle.group
        if mine is None:  # not begun here: nothing to compare against
            return []
        now = self._clock()
        pool = (
            self._groups.values()
            if cycle.rules or cycle.claims or cycle.soft is not NO_SOFT
            else self._anti.values()
        )
        found: list[_Cycle] = []
        contributing = 0
        for group in pool:
            if not _groups_related(mine, group, namespace_labels):
                continue
            before = len(found)
            for other in group.members.values():
                if other.seq >= cycle.seq:
                    break  # members are in seq order
                if now - other.started < STALE_SECONDS:
                    found.append(other)
            contributing += len(found) > before
        if contributing > 1:
            found.sort(key=lambda other: other.seq)
        return found

    async def wait(self, cycle: _Cycle, *, namespace_labels: Any, seconds: float = WAIT_SECONDS) -> int:
        """Wait until every earlier related pod settled (bounded); how many were waited for."""
        others = self.earlier_related(cycle, namespace_labels=namespace_labels)
        if not others:
            return 0
        self.waits += 1
        # One future for all of them, counted down as they settle: no task per awaited pod
        # (asyncio.wait's tasks were a visible share of a burst's CPU), one wake-up. An earlier
        # cycle of the pod's own group whose domain is enough (`_narrow_key`) is awaited until it
        # has one, or is not awaited at all when it has one already.
        mine = cycle.group
        narrows = mine is not None and mine.narrow_key is not None
        awaited = 0
        waiter = _Waiter(remaining=0, done=asyncio.get_running_loop().create_future())
        for other in others:
            if narrows and other.group is mine:
                if other.region is not None:
                    continue
                if other.domain_waiters is None:
                    other.domain_waiters = []
                other.domain_waiters.append(waiter)
            else:
                if other.waiters is None:
                    other.waiters = []
                other.waiters.append(waiter)
            awaited += 1
        if not awaited:
            return len(others)
        waiter.remaining = awaited
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await waiter.done
        pending = waiter.remaining
        if pending:
            log.info(
                "pod %s waited %g s for %d related pods to be placed; going on",
                cycle.uid,
                seconds,
                pending,
            )
        return len(others)


def _no_labels(namespace: str) -> None:
    return None


def _narrow_key(cycle: _Cycle) -> tuple[str | None, tuple[str, ...]]:
    """Whether the cycles of `cycle`'s group may go on before the earlier ones of the group have
    nodes, once those were sent to one domain each: the key of those domains (None: they wait for
    nodes, as any other related cycle), and the keys of the group's anti-affinity over itself.

    Among a group's own pods that is sound when their rules toward each other are only a
    DoNotSchedule spread over one key (a zone), pod affinity over that key, and pod anti-affinity
    over any key: a pod counted in its zone is counted exactly by the spread and the affinity, and
    the anti-affinity is kept by excluding every node of its zone (:func:`in_flight_exclusions`).
    Host ports, claims, a spread or affinity over another key (the hostname) need the node itself.
    Soft rules count the pod on one node of its zone until its node is known: a preference only.
    """
    rules = cycle.rules
    if rules.host_ports or cycle.claims or _reads_namespaces(rules, cycle.soft):
        return None, ()

    def selects_own(term: AffinityTerm) -> bool:
        return term.matches(
            namespace=cycle.namespace,
            labels=cycle.labels,
            owner_namespace=cycle.namespace,
            namespace_labels=_no_labels,
        )

    spread_keys = {
        c.topology_key for c in rules.spread if not c.selector.empty and c.selector.matches(cycle.labels)
    }
    if len(spread_keys) != 1:
        return None, ()
    [key] = spread_keys
    if any(selects_own(term) and term.topology_key != key for term in rules.affinity):
        return None, ()
    anti_keys = tuple(sorted({term.topology_key for term in rules.anti_affinity if selects_own(term)}))
    return key, anti_keys


def _count_down(waiters: list[_Waiter] | None) -> None:
    for waiter in waiters or ():
        waiter.remaining -= 1
        if waiter.remaining == 0 and not waiter.done.done():
            waiter.done.set_result(None)


def _groups_related(mine: _Group, theirs: _Group, namespace_labels: Any) -> bool:
    """Whether cycles of `mine` depend on cycles of `theirs` (:func:`_related` or shared claims),
    memoized per pair while both groups exist unless the answer reads namespace labels."""
    if mine.reads_namespaces or theirs.reads_namespaces:
        return _related(mine.sample, theirs.sample, namespace_labels) or _share_claims(
            mine.sample, theirs.sample
        )
    known = mine.related.get(theirs.id)
    if known is None:
        known = _related(mine.sample, theirs.sample, namespace_labels) or _share_claims(
            mine.sample, theirs.sample
        )
        mine.related[theirs.id] = known
    return known


def _related(me: _Cycle, other: _Cycle, namespace_labels: Any) -> bool:
    """Whether `me`'s placement may depend on where the earlier `other` goes."""
    rules = me.rules
    for term in (*rules.affinity, *rules.anti_affinity):
        if term.matches(
            namespace=other.namespace,
            labels=other.labels,
            owner_namespace=me.namespace,
            namespace_labels=namespace_labels,
        ):
            return True
    if other.namespace == me.namespace and any(c.selector.matches(other.labels) for c in rules.spread):
        return True
    if _prefers(me, other, namespace_labels):
        return True
    for term in other.rules.anti_affinity:  # symmetry: its anti-affinity may refuse me
        if term.matches(
            namespace=me.namespace,
            labels=me.labels,
            owner_namespace=other.namespace,
            namespace_labels=namespace_labels,
        ):
            return True
    return any(mine.conflicts(theirs) for mine in rules.host_ports for theirs in other.rules.host_ports)


def _prefers(me: _Cycle, other: _Cycle, namespace_labels: Any) -> bool:
    """Whether `me`'s soft rules count `other` (its preferred terms select it, or its spread does):
    without waiting, a burst of a Deployment's pods would all see the same counts and land together."""
    soft = me.soft
    if soft is NO_SOFT:
        return False
    for weighted in (*soft.affinity, *soft.anti_affinity):
        if weighted.term.matches(
            namespace=other.namespace,
            labels=other.labels,
            owner_namespace=me.namespace,
            namespace_labels=namespace_labels,
        ):
            return True
    if other.namespace != me.namespace:
        return False
    if any(c.selector.matches(other.labels) for c in soft.spread):
        return True
    return not soft.spread and soft.default_spread is not None and soft.default_spread.matches(other.labels)


def _share_claims(me: _Cycle, other: _Cycle) -> bool:
    """Whether both pods use a claim: if it is ReadWriteOncePod only the first may have it."""
    return other.namespace == me.namespace and not me.claims.isdisjoint(other.claims)
