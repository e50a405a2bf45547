"""One task per pod group: when to look at a group again, and what each look decides.

A profile's pods that name a PodGroup (``spec.schedulingGroup``) never enter its queue: the runner
hands them to its :class:`PodGroupCoordinator`, which keeps one task per group while the group has
pending members. Each pass of that task reads the PodGroup (one GET), counts the members already
placed when the pending ones alone do not reach ``minCount`` (one LIST of the namespace's bound
pods), decides (:func:`bindery.scheduling.podgroups.decide_group`) and acts:

* waiting: every waiting member is told why, and so is the PodGroup
  (:mod:`bindery.controller.podgroups.reporting`); a new member wakes the group, anything else
  (a PodGroup created or changed: PodGroups are not watched) is seen after the group's backoff;
* placing: all pending members at once (:mod:`bindery.controller.podgroups.placement`).

The first pass after a start, or after a new leadership term, first settles what an earlier
process left reserved for the group (:mod:`bindery.controller.podgroups.recovery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from bindery.backoff import BackoffPolicy
from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.placement import Placement
from bindery.controller.podgroups.recovery import Recovery
from bindery.controller.podgroups.reporting import READ_SECONDS, Reporter
from bindery.controller.preemption import Preemptions
from bindery.controller.rmstack import NotLeading, RMStack
from bindery.controller.watches.bound import TERMINAL_PHASES
from bindery.k8s import ApiClient, ApiError, NotFound, get, list_all, resources
from bindery.scheduling.cycle import CycleOutcome
from bindery.scheduling.decisions import REASON_SCHEDULER_ERROR, REASON_UNSCHEDULABLE
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.podgroups import GroupStep, PodGroupInfo, decide_group
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.preemption import Preemptor
from bindery.scheduling.queue import Touch, WakeOn
from bindery.typedefs import Logger

__all__ = ["REPORT_WAITING_AFTER_SECONDS", "GroupState", "PodGroupCoordinator"]

#: Bound of each page of the LIST of a namespace's bound pods (counting the members already placed).
LIST_SECONDS = 30.0
GroupKey = tuple[str, str]
#: A group still short of members (or of its PodGroup) is reported only after this long: a Job's
#: controller creates its pods one request at a time, and kube-scheduler says nothing about pods
#: its PreEnqueue holds back; a group that completes within it costs no write.
REPORT_WAITING_AFTER_SECONDS = 3.0


@dataclasses.dataclass(slots=True)
class GroupState:
    """What the coordinator holds for one pod group: its pending members and its task.

    Placement and recovery update it too (the try count, the backoff, members bound or gone).
    """

    pending: dict[str, PodInfo] = dataclasses.field(default_factory=dict)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    #: Number of group reservations released so far (a new idempotency key for each new try).
    attempt: int = 0
    #: The first pass after a start looks for reservations left by an earlier process.
    recovered: bool = False
    waiting_since: float | None = None
    #: Consecutive failed passes: the backoff's count (the profile's BackoffPolicy gives the wait).
    failures: int = 0
    #: The RM's last answer was "no room": released capacity is worth a new try at once.
    waits_for_capacity: bool = False
    #: The members' inter-pod rules refused the last try: the placed-pod changes that may lift that
    #: (:meth:`PodGroupCoordinator.wake`), and when the try's backoff ends (no wake comes sooner).
    rules: WakeOn | None = None
    retry_at: float = 0.0
    timer: asyncio.TimerHandle | None = None


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
    ) -> None:
        self._profile = profile
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
            _forget_rules(group)
            try:
                delay = await self._pass(key, group)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the group's task
                self._logger.exception(f"placing pod group {key[0]}/{key[1]} failed; retrying")
                delay = self._next_backoff(group)
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
            body = await self._read_group(namespace=namespace, name=name)
        except ApiError as error:
            if not error.status:  # no answer (a timeout, a reset): the task logs it and backs off
                raise
            message = (
                f'cannot read the pod\'s PodGroup "{namespace}/{name}" (HTTP {error.status} {error.reason}); '
                "the operator needs get on podgroups.scheduling.k8s.io (the chart grants it) and an "
                "apiserver serving scheduling.k8s.io/v1alpha2"
            )
            await self._reporter.report(pending, message, reason=REASON_SCHEDULER_ERROR)
            return self._next_backoff(group)
        info = PodGroupInfo.from_body(body) if body is not None else None
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
            placed = await self._count_placed(namespace=namespace, name=name)
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
        if decision.step is GroupStep.WAIT_FOR_GROUP:
            if waited >= REPORT_WAITING_AFTER_SECONDS:
                await self._reporter.report(decision.members, decision.message, reason=REASON_UNSCHEDULABLE)
            return self._next_backoff(group)  # no watch on PodGroups: look again
        assert info is not None
        if decision.step is GroupStep.WAIT_FOR_MEMBERS:
            if waited < REPORT_WAITING_AFTER_SECONDS:
                return REPORT_WAITING_AFTER_SECONDS - waited  # a new member wakes the group sooner
            await self._reporter.report(decision.members, decision.message, reason=REASON_UNSCHEDULABLE)
            await self._reporter.set_condition(
                info, scheduled=False, reason=REASON_UNSCHEDULABLE, message=decision.message
            )
            # A new member wakes the group; a lowered minCount does not (PodGroups are not
            # watched): look again after the backoff, as for a missing PodGroup.
            return self._next_backoff(group)
        batches = [[pod] for pod in decision.members] if decision.each_alone else [list(decision.members)]
        delays = [await self._placement.place(info, group, batch) for batch in batches]
        pending_delays = [d for d in delays if d is not None]
        return min(pending_delays) if pending_delays else None

    # -- reads -----------------------------------------------------------------------------------

    async def _read_group(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await get(
                self._api, resources.PODGROUPS, namespace=namespace, name=name, request_timeout=READ_SECONDS
            )
        except NotFound:
            return None

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
