"""One task per pod group: when to look at a group again, and what each look decides.

A profile's pods that name a PodGroup (``spec.schedulingGroup``) never enter its queue: the runner
hands them to its :class:`PodGroupCoordinator`, which keeps one task per group while the group has
pending members. Each pass of that task reads the PodGroup from the operator's one PodGroup watch
(:mod:`bindery.controller.podgroups.watch`), counts the members already placed, when the pending
ones alone do not reach ``minCount``, from the placed-pod cache, decides
(:func:`bindery.scheduling.podgroups.decide_group`) and acts:

* waiting: every waiting member is told why, and so is the PodGroup
  (:mod:`bindery.controller.podgroups.reporting`); then the group sleeps until something it waits
  for changes: a new member, a member placed or gone, its PodGroup created or changed
  (:meth:`PodGroupCoordinator.changed`). It polls nothing, so a thousand waiting groups cost the
  apiserver nothing. Only when a source is missing (no watch given, the placed-pod cache not
  synced yet) does a pass read the apiserver (a GET, a LIST) and look again after its backoff;
* refused: a group no group reservation can carry (:func:`over_caps`) is told so once, on its
  members and its PodGroup, and waits for a change as a waiting group does;
* placing: all pending members at once (:mod:`bindery.controller.podgroups.placement`).

The first pass after a start, or after a new leadership term, first settles what an earlier
process left reserved for the group (:mod:`bindery.controller.podgroups.recovery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from bindery.apiserver import ApiClient, ApiError, NotFound, get, list_all, resources
from bindery.backoff import BackoffPolicy
from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.placement import Placement
from bindery.controller.podgroups.recovery import Recovery
from bindery.controller.podgroups.reporting import READ_SECONDS, Reporter
from bindery.controller.podgroups.state import GroupState
from bindery.controller.podgroups.watch import PodGroupWatch
from bindery.controller.preemption import Preemptions
from bindery.controller.reservations.fate import TERMINAL_PHASES
from bindery.controller.rmstack import NotLeading, RMStack
from bindery.rm.models import MAX_GROUP_MEMBERS, MAX_GROUP_TOPOLOGY_KEYS
from bindery.scheduling.cycle import CycleOutcome
from bindery.scheduling.decisions import REASON_SCHEDULER_ERROR, REASON_UNSCHEDULABLE
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.podgroups import GANG_WAIT_SECONDS, GroupStep, PodGroupInfo, decide_group
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.preemption import Preemptor
from bindery.scheduling.queue import Touch
from bindery.typedefs import Logger

__all__ = ["REPORT_WAITING_AFTER_SECONDS", "GroupState", "PodGroupCoordinator"]

#: Bound of each page of the LIST of a namespace's bound pods (counting the members already placed).
LIST_SECONDS = 30.0
GroupKey = tuple[str, str]
#: A group still short of members (or of its PodGroup) is reported only after this long: a Job's
#: controller creates its pods one request at a time, and kube-scheduler says nothing about pods
#: its PreEnqueue holds back; a group that completes within it costs no write.
REPORT_WAITING_AFTER_SECONDS = 3.0
#: The event throttle's key of a group refused for the contract's caps (said once per member).
OVER_CAPS_EVENT_KEY = "OverCaps"


class PodGroupCoordinator:
    """Places the pod groups of one profile (see the module docstring)."""

    def __init__(
        self,
        *,
        profile: Callable[[], Profile],
        ports: Callable[[], Ports],
        rm: Callable[[], RMStack],
        api: ApiClient,
        logger: Logger,
        metrics: Metrics,
        on_released: Callable[[], None],
        on_outcome: Callable[[PodInfo, CycleOutcome], None] = lambda pod, outcome: None,
        preemptions: Preemptions | None = None,
        podgroups: PodGroupWatch | None = None,
    ) -> None:
        """`podgroups`: the operator's PodGroup watch (None: each pass GETs the PodGroup and looks
        again after its backoff)."""
        self._profile = profile
        self._podgroups = podgroups
        self._ports = ports
        self._api = api
        self._logger = logger
        self._preemptions = preemptions
        self._groups: dict[GroupKey, GroupState] = {}
        self._active = False
        self._reporter = Reporter(profile=profile, ports=ports, api=api, logger=logger, metrics=metrics)
        self._placement = Placement(
            profile=profile,
            ports=ports,
            rm=rm,
            logger=logger,
            metrics=metrics,
            reporter=self._reporter,
            backoff=self._next_backoff,
            on_released=on_released,
            on_outcome=on_outcome,
            preemptions=preemptions,
        )
        self._recovery = Recovery(
            profile=profile,
            rm=rm,
            api=api,
            logger=logger,
            metrics=metrics,
            placement=self._placement,
            on_released=on_released,
        )

    # -- what the runner calls -------------------------------------------------------------------

    def offer(self, pod: PodInfo) -> None:
        assert pod.scheduling_group is not None
        key = (pod.namespace, pod.scheduling_group)
        group = self._groups.setdefault(key, GroupState())
        group.pending[pod.uid] = pod
        group.wake.set()
        self._ensure_task(key, group)

    def withdraw(self, uid: str) -> None:
        for group in self._groups.values():
            if group.pending.pop(uid, None) is not None:
                group.wake.set()
        self._reporter.throttle.forget(uid)

    def retry(self) -> None:
        """Capacity may have freed: every group the RM found no room for tries again now.

        Only those: a group short of members, or one whose last try failed for another reason
        (PreBind, a Binding), keeps its backoff; else its own release would wake it at once, and a
        group that fails the same way every time would loop without a pause.
        """
        now = time.monotonic()
        for group in self._groups.values():
            if group.waits_for_capacity:
                group.waits_for_capacity = False
                group.failures = 0
                group.wake.set()
            elif group.rules is not None:  # a node changed (its labels may be what a rule reads)
                _wake_after_backoff(group, now)

    def changed(self, *, namespace: str, name: str) -> None:
        """Group `name`'s PodGroup changed, or one of its members was placed or left: a group that
        waits for those looks again (one placing keeps its backoff)."""
        group = self._groups.get((namespace, name))
        if group is None:
            return
        if group.waiting:
            group.wake.set()
        else:
            group.changed = True

    def wake(self, touch: Touch) -> None:
        """A placed pod arrived, changed or left (or a namespace was relabelled): wake the groups
        their members' rules refused that it may concern, as :meth:`SchedulingQueue.wake` does
        refused pods (through what is left of their backoff)."""
        now = time.monotonic()
        for group in self._groups.values():
            rules = group.rules
            if rules is None:
                continue
            if (
                rules.namespaces is None
                or touch.namespace in rules.namespaces
                or not rules.tags.isdisjoint(touch.tags)
            ):
                _wake_after_backoff(group, now)

    def start(self) -> None:
        self._active = True
        for key, group in self._groups.items():
            self._ensure_task(key, group)

    async def pause(self) -> None:
        self._active = False
        tasks = [g.task for g in self._groups.values() if g.task is not None]
        for group in self._groups.values():
            group.task = None
            group.recovered = False  # a new leadership term looks for leftovers again
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def sizes(self) -> dict[str, int]:
        return {
            "podgroup_pending": sum(len(g.pending) for g in self._groups.values()),
            "podgroups": len(self._groups),
            "podgroup_throttle": len(self._reporter.throttle),
        }

    # -- one task per group ----------------------------------------------------------------------

    def _ensure_task(self, key: GroupKey, group: GroupState) -> None:
        if self._active and (group.task is None or group.task.done()):
            group.task = asyncio.create_task(
                self._run(key, group), name=f"bindery pod group {key[0]}/{key[1]}"
            )

    async def _run(self, key: GroupKey, group: GroupState) -> None:
        while self._active and group.pending:
            group.wake.clear()
            group.waiting = group.changed = False
            _forget_rules(group)
            try:
                delay = await self._pass(key, group)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the group's task
                self._logger.exception(f"placing pod group {key[0]}/{key[1]} failed; retrying")
                delay = self._next_backoff(group)
            if group.waiting and group.changed:  # it changed while this pass read it
                delay = 0.0
            if not group.pending:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await group.wake.wait()
        if not group.pending and self._groups.get(key) is group:
            del self._groups[key]
            if self._preemptions is not None:  # else a group recreated under this name inherits it
                self._preemptions.forget(Preemptor.of_group(namespace=key[0], name=key[1], members=()).uid)

    def _next_backoff(self, group: GroupState) -> float:
        profile = self._profile()
        group.failures += 1
        policy = BackoffPolicy(initial=profile.backoff_initial_seconds, maximum=profile.backoff_max_seconds)
        return policy.delay(attempts=group.failures)

    async def _pass(self, key: GroupKey, group: GroupState) -> float | None:
        """One look at the group; returns when to look again (None: when something changes)."""
        namespace, name = key
        ports = self._ports()
        pending = [
            p for uid in list(group.pending) if (p := ports.pods.get(uid)) is not None and p.schedulable
        ]
        for uid in [uid for uid in group.pending if ports.pods.get(uid) is None]:
            group.pending.pop(uid, None)
        if not pending:
            return None
        try:
            found = await self._read_group(namespace=namespace, name=name)
        except ApiError as error:
            if not error.status:  # no answer (a timeout, a reset): the task logs it and backs off
                raise
            message = (
                f'cannot read the pod\'s PodGroup "{namespace}/{name}" (HTTP {error.status} {error.reason}); '
                "the operator needs get, list and watch on podgroups.scheduling.k8s.io (the chart grants "
                "them) and an apiserver serving scheduling.k8s.io/v1alpha2"
            )
            await self._reporter.report(pending, message, reason=REASON_SCHEDULER_ERROR)
            return self._next_backoff(group)
        if isinstance(found, _NotListed):
            self._logger.info(f"pod group {namespace}/{name}: PodGroups not listed yet; looking again")
            return self._next_backoff(group)
        info = found
        watched = self._podgroups is not None
        if not group.recovered:
            group.recovered = True
            if info is not None:
                try:
                    adopted = await self._recovery.recover(info, group, pending)
                except NotLeading as error:  # the leader settles what an earlier process left
                    self._logger.warning(f"pod group {info.key}: {error}; leaving it to the leader")
                    group.recovered = False
                    return self._next_backoff(group)
                if adopted:
                    return 0.0  # look again with what is left pending
        placed = 0
        if info is not None and info.min_count is not None and len(pending) < info.min_count:
            counted = await self._count_placed_cached(
                namespace=namespace, name=name, pending=frozenset(p.uid for p in pending)
            )
            if counted is None:  # no synced cache: a read, and a look again after the backoff
                watched = False
                counted = await self._count_placed(namespace=namespace, name=name)
            placed = counted
        now = time.monotonic()
        if group.waiting_since is None:
            group.waiting_since = now
        decision = decide_group(
            namespace=namespace,
            name=name,
            group=info,
            pending=pending,
            placed=placed,
            waited_seconds=now - group.waiting_since,
        )
        waited = now - group.waiting_since
        if decision.step in (GroupStep.WAIT_FOR_GROUP, GroupStep.WAIT_FOR_MEMBERS):
            group.waiting = True  # from here, a change of what it waits for wakes it
        if decision.step is GroupStep.WAIT_FOR_GROUP:
            if waited < REPORT_WAITING_AFTER_SECONDS:
                return REPORT_WAITING_AFTER_SECONDS - waited  # its PodGroup created wakes it sooner
            await self._reporter.report(decision.members, decision.message, reason=REASON_UNSCHEDULABLE)
            return None if watched else self._next_backoff(group)
        assert info is not None
        if decision.step is GroupStep.WAIT_FOR_MEMBERS:
            if waited < REPORT_WAITING_AFTER_SECONDS:
                return REPORT_WAITING_AFTER_SECONDS - waited  # a new member wakes the group sooner
            await self._reporter.report(decision.members, decision.message, reason=REASON_UNSCHEDULABLE)
            await self._reporter.set_condition(
                info, scheduled=False, reason=REASON_UNSCHEDULABLE, message=decision.message
            )
            if not watched:  # nothing tells it of a lowered minCount or a member placed: poll
                return self._next_backoff(group)
            # Once more when the wait passes kube-scheduler's (the message then says so).
            return GANG_WAIT_SECONDS - waited if waited < GANG_WAIT_SECONDS else None
        refusal = None if decision.each_alone else over_caps(group=info, members=decision.members)
        if refusal is not None:  # every try would fail the same way: say so once, and wait for a change
            group.waiting = True
            await self._reporter.report(
                decision.members, refusal, reason=REASON_UNSCHEDULABLE, event_key=OVER_CAPS_EVENT_KEY
            )
            await self._reporter.set_condition(
                info, scheduled=False, reason=REASON_UNSCHEDULABLE, message=refusal
            )
            return None if watched else self._next_backoff(group)
        batches = [[pod] for pod in decision.members] if decision.each_alone else [list(decision.members)]
        delays = [await self._placement.place(info, group, batch) for batch in batches]
        pending_delays = [d for d in delays if d is not None]
        return min(pending_delays) if pending_delays else None

    # -- reads -----------------------------------------------------------------------------------

    async def _read_group(self, *, namespace: str, name: str) -> PodGroupInfo | _NotListed | None:
        """The PodGroup as the watch holds it (_NOT_LISTED: not listed yet; raises the watch's
        failure), or as a GET reads it without a watch."""
        watch = self._podgroups
        if watch is not None:
            if await watch.wait_synced(READ_SECONDS):
                return watch.get(namespace, name)
            if watch.error is not None and watch.error.status:
                raise watch.error
            return _NOT_LISTED
        try:
            body = await get(
                self._api, resources.PODGROUPS, namespace=namespace, name=name, request_timeout=READ_SECONDS
            )
        except NotFound:
            return None
        return PodGroupInfo.from_body(body)

    async def _count_placed_cached(self, *, namespace: str, name: str, pending: frozenset[str]) -> int | None:
        """:meth:`_count_placed` from the placed-pod cache (None: no cache, or not synced)."""
        placed = self._ports().placed
        if placed is None or not await placed.wait_synced(READ_SECONDS):
            return None
        return sum(
            1
            for pod in placed.in_namespace(namespace)
            if pod.group == name and not pod.terminating and pod.uid not in pending
        )

    async def _count_placed(self, *, namespace: str, name: str) -> int:
        """Members of the group bound to a node and not finished (they count towards minCount)."""
        listing = await list_all(
            self._api,
            resources.PODS,
            namespace=namespace,
            field_selector="spec.nodeName!=",
            request_timeout=LIST_SECONDS,
        )
        count = 0
        for item in listing.items:
            spec = item.get("spec") or {}
            if (spec.get("schedulingGroup") or {}).get("podGroupName") != name:
                continue
            if (item.get("status") or {}).get("phase") in TERMINAL_PHASES:
                continue
            if (item.get("metadata") or {}).get("deletionTimestamp"):
                continue
            count += 1
        return count


def over_caps(*, group: PodGroupInfo, members: Sequence[PodInfo]) -> str | None:
    """Pure: why no group reservation can carry these members (contract v1.1's caps), or None.

    Checked before the request is built: its validation would fail the same way on every try.
    """
    problems = []
    if len(members) > MAX_GROUP_MEMBERS:
        problems.append(
            f"{len(members)} pending members; a group reservation carries at most {MAX_GROUP_MEMBERS}"
        )
    if len(group.topology_keys) > MAX_GROUP_TOPOLOGY_KEYS:
        problems.append(
            f"{len(group.topology_keys)} topology keys; a group reservation carries at most "
            f"{MAX_GROUP_TOPOLOGY_KEYS} (spec.schedulingConstraints.topology)"
        )
    if not problems:
        return None
    return (
        f'pod group "{group.key}" cannot be placed: {"; ".join(problems)}; split the group, or '
        "drop topology keys, then the group is looked at again"
    )


class _NotListed:
    """The PodGroup watch has not listed yet (and says of no failure)."""


_NOT_LISTED = _NotListed()


def _wake_after_backoff(group: GroupState, now: float) -> None:
    """Wake `group` now, or when its backoff ends; once per refusal (the next try sets it again)."""
    group.rules = None
    delay = group.retry_at - now
    if delay <= 0:
        group.wake.set()
    elif group.timer is None:
        group.timer = asyncio.get_running_loop().call_later(delay, group.wake.set)


def _forget_rules(group: GroupState) -> None:
    """A new try begins: an earlier refusal's wake-up no longer applies."""
    group.rules = None
    if group.timer is not None:
        group.timer.cancel()
        group.timer = None
