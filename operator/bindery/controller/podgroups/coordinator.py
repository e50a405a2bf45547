"""Pod groups through the resource manager: the I/O around :mod:`bindery.scheduling.podgroups`.

A profile's pods that name a PodGroup (``spec.schedulingGroup``) never enter its queue: the runner
hands them to its :class:`PodGroupCoordinator`, which keeps one task per group while the group has
pending members. Each pass of that task reads the PodGroup (one GET), counts the members already
placed when the pending ones alone do not reach ``minCount`` (one LIST of the namespace's bound
pods), decides (:func:`bindery.scheduling.podgroups.decide_group`) and acts:

* waiting: every waiting member gets ``FailedScheduling`` and ``PodScheduled=False`` saying why
  (throttled like a cycle's reports); the PodGroup gets ``PodGroupScheduled=False``;
* placing: one ``reserve_group`` for all pending members (all or none at the RM); then every
  member's PreBind checks (the cycle's own plugins) before any Binding, so a member deleted or a
  node found wrong releases the whole group and no member is bound; then the Bindings, in
  parallel, each followed by its ``Scheduled`` event and its commit (the cycle's PostBind plugins).
  The plugins run through the same runners as a pod's cycle (:mod:`bindery.scheduling.points`),
  and a member whose Binding fails is decided as a pod is (:func:`bindery.scheduling.decisions.
  decide`): released and retried alone, dropped silently if gone or bound elsewhere, or, when
  the Binding got no answer, kept and handed to the profile's unconfirmed Bindings (through the
  runner's follow-up, as a cycle's outcome), which commit it the moment it is seen bound.

Every RM call (reserve, renew and release of groups and members, the leftover lookup) goes through
the profile's one RM stack (:class:`bindery.controller.rmstack.RMStack`): measured, and fenced, so
a replica past its renew deadline renews and releases nothing; its recovery then leaves the
group to the leader.

Crash safety: reservations outlive the process, Bindings too. The first pass of each group after
a start looks for member reservations still ``reserved`` for its pending pods (the reconciler
leaves those of pending pods alone and commits those whose pod is bound): it renews their group's
lease and binds those members with them, or, if the group can no longer be renewed, releases it.
So an operator killed between the group reservation and some Bindings ends, after its restart,
with every member bound and committed, or with everything released.

A resource manager without groups (contract v1.0, answering 404) gets the group refused with a
reason on every member; its members are never placed one by one, which would break all-or-nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client as kube

from bindery.controller.metrics import Metrics
from bindery.controller.rmstack import NotLeading, RMStack
from bindery.controller.watches.bound import TERMINAL_PHASES
from bindery.rm.errors import RMError, RMGroupsUnsupported, RMUnschedulable
from bindery.rm.models import Reservation, ReservationGroup, ReservationState
from bindery.scheduling.cycle import CycleOutcome, PluginChain, plugin_chain
from bindery.scheduling.decisions import (
    REASON_SCHEDULER_ERROR,
    REASON_UNSCHEDULABLE,
    Outcome,
    decide,
)
from bindery.scheduling.defaults import COMMIT_FAILED
from bindery.scheduling.framework import CycleContext, Ports, Profile
from bindery.scheduling.lease import lease_from_answer
from bindery.scheduling.podgroups import (
    GROUP,
    PLURAL,
    VERSION,
    GroupStep,
    PodGroupInfo,
    decide_group,
    group_request,
    scheduled_conditions,
    unsupported,
)
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.points import run_bind, run_post_bind, run_pre_bind, run_unreserve
from bindery.scheduling.ports import PodGone
from bindery.scheduling.throttle import EventThrottle
from bindery.scheduling.traced import traced
from bindery.typedefs import Logger

__all__ = ["PodGroupCoordinator"]

log = logging.getLogger(__name__)
#: Bounds of the apiserver calls of a pass.
READ_SECONDS = 10.0
LIST_SECONDS = 30.0
GroupKey = tuple[str, str]
#: A group still short of members (or of its PodGroup) is reported only after this long: a Job's
#: controller creates its pods one request at a time, and kube-scheduler says nothing about pods
#: its PreEnqueue holds back; a group that completes within it costs no write.
REPORT_WAITING_AFTER_SECONDS = 3.0


@dataclasses.dataclass(slots=True)
class _Group:
    """What the coordinator holds for one pod group: its pending members and its task."""

    pending: dict[str, PodInfo] = dataclasses.field(default_factory=dict)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    #: Number of group reservations released so far (a new idempotency key for each new try).
    attempt: int = 0
    #: The first pass after a start looks for reservations left by an earlier process.
    recovered: bool = False
    waiting_since: float | None = None
    backoff: float = 0.0
    #: The RM's last answer was "no room": released capacity is worth a new try at once.
    waits_for_capacity: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class _Member:
    pod: PodInfo
    reservation: Reservation
    #: When the reservation's lease runs out (``profile.clock``), for the unconfirmed Bindings.
    lease_expires: float | None = None


class PodGroupCoordinator:
    """Places the pod groups of one profile (see the module docstring)."""

    def __init__(
        self,
        *,
        profile: Callable[[], Profile],
        ports: Callable[[], Ports],
        rm: Callable[[], RMStack],
        api: kube.ApiClient,
        logger: Logger,
        metrics: Metrics,
        on_released: Callable[[], None],
        on_outcome: Callable[[PodInfo, CycleOutcome], None] = lambda pod, outcome: None,
    ) -> None:
        self._profile = profile
        self._ports = ports
        self._rm = rm
        self._on_outcome = on_outcome
        self._api = api
        self._logger = logger
        self._metrics = metrics
        self._on_released = on_released
        self._groups: dict[GroupKey, _Group] = {}
        self._throttle = EventThrottle()
        self._active = False

    # -- what the runner calls -------------------------------------------------------------------

    def offer(self, pod: PodInfo) -> None:
        assert pod.scheduling_group is not None
        key = (pod.namespace, pod.scheduling_group)
        group = self._groups.setdefault(key, _Group())
        group.pending[pod.uid] = pod
        group.wake.set()
        self._ensure_task(key, group)

    def withdraw(self, uid: str) -> None:
        for group in self._groups.values():
            if group.pending.pop(uid, None) is not None:
                group.wake.set()
        self._throttle.forget(uid)

    def retry(self) -> None:
        """Capacity may have freed: every group the RM found no room for tries again now.

        Only those: a group short of members, or one whose last try failed for another reason
        (PreBind, a Binding), keeps its backoff; else its own release would wake it at once, and a
        group that fails the same way every time would loop without a pause.
        """
        for group in self._groups.values():
            if group.waits_for_capacity:
                group.waits_for_capacity = False
                group.backoff = 0.0
                group.wake.set()

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
            "podgroup_throttle": len(self._throttle),
        }

    # -- one task per group ----------------------------------------------------------------------

    def _ensure_task(self, key: GroupKey, group: _Group) -> None:
        if self._active and (group.task is None or group.task.done()):
            group.task = asyncio.create_task(
                self._run(key, group), name=f"bindery pod group {key[0]}/{key[1]}"
            )

    async def _run(self, key: GroupKey, group: _Group) -> None:
        while self._active and group.pending:
            group.wake.clear()
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

    def _next_backoff(self, group: _Group) -> float:
        profile = self._profile()
        group.backoff = min(
            max(group.backoff * 2, profile.backoff_initial_seconds), profile.backoff_max_seconds
        )
        return group.backoff

    async def _pass(self, key: GroupKey, group: _Group) -> float | None:
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
        except kube.ApiException as error:
            message = (
                f'cannot read the pod\'s PodGroup "{namespace}/{name}" (HTTP {error.status} {error.reason}); '
                "the operator needs get on podgroups.scheduling.k8s.io (the chart grants it) and an "
                "apiserver serving scheduling.k8s.io/v1alpha2"
            )
            await self._report(pending, message, reason=REASON_SCHEDULER_ERROR)
            return self._next_backoff(group)
        info = PodGroupInfo.from_body(body) if body is not None else None
        if not group.recovered:
            group.recovered = True
            if info is not None:
                try:
                    adopted = await self._recover(info, pending)
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
                await self._report(decision.members, decision.message, reason=REASON_UNSCHEDULABLE)
            return self._next_backoff(group)  # no watch on PodGroups: look again
        assert info is not None
        if decision.step is GroupStep.WAIT_FOR_MEMBERS:
            if waited < REPORT_WAITING_AFTER_SECONDS:
                return REPORT_WAITING_AFTER_SECONDS - waited  # a new member wakes the group sooner
            await self._report(decision.members, decision.message, reason=REASON_UNSCHEDULABLE)
            await self._set_condition(
                info, scheduled=False, reason=REASON_UNSCHEDULABLE, message=decision.message
            )
            # A new member wakes the group; a lowered minCount does not (PodGroups are not
            # watched): look again after the backoff, as for a missing PodGroup.
            return self._next_backoff(group)
        batches = [[pod] for pod in decision.members] if decision.each_alone else [list(decision.members)]
        delays = [await self._place(info, group, batch) for batch in batches]
        pending_delays = [d for d in delays if d is not None]
        return min(pending_delays) if pending_delays else None

    # -- placing ---------------------------------------------------------------------------------

    async def _place(self, info: PodGroupInfo, group: _Group, members: Sequence[PodInfo]) -> float | None:
        profile = self._profile()
        started = time.perf_counter()
        group.waits_for_capacity = False
        refusal = unsupported(group=info, members=members)
        if refusal is not None:
            await self._fail(info, members, refusal, reason=REASON_SCHEDULER_ERROR, started=started)
            return profile.backoff_max_seconds
        request = group_request(
            group=info,
            members=members,
            scheduler_name=members[0].scheduler_name,
            ttl_seconds=profile.reservation_ttl_seconds,
            attempt=group.attempt,
        )
        sent_at, sent_at_wall = profile.clock(), datetime.datetime.now(datetime.UTC)
        try:
            reserved = await self._rm().reserve_group(request)
        except RMGroupsUnsupported as error:
            message = (
                f'resource manager "{profile.name}" does not support reservation groups (contract v1.1 '
                f'POST /v1/reservation-groups answered: {error.message}), so pod group "{info.key}" '
                "cannot be placed all or nothing; Bindery never places a group's members one by one. "
                "Upgrade the resource manager to contract v1.1 with groups, or remove "
                "spec.schedulingGroup from the pods"
            )
            await self._fail(info, members, message, reason=REASON_SCHEDULER_ERROR, started=started)
            return profile.backoff_max_seconds
        except RMUnschedulable as error:
            message = (
                f'resource manager "{profile.name}" cannot place pod group "{info.key}" all together '
                f"({len(members)} pods, none placed): {error.message}"
            )
            await self._fail(info, members, message, reason=REASON_UNSCHEDULABLE, started=started)
            group.waits_for_capacity = True
            return self._next_backoff(group)
        except RMError as error:
            message = (
                f'reserving pod group "{info.key}" ({len(members)} pods) at resource manager '
                f'"{profile.name}" failed: {error.message}; retrying'
            )
            await self._fail(info, members, message, reason=REASON_SCHEDULER_ERROR, started=started)
            return self._next_backoff(group)
        pairs = [
            _Member(
                pod=pod,
                reservation=res,
                lease_expires=lease_from_answer(
                    reservation=res,
                    ttl_seconds=profile.reservation_ttl_seconds,
                    sent_at=sent_at,
                    sent_at_wall=sent_at_wall,
                ).expires,
            )
            for pod, res in zip(members, _in_order(reserved, members), strict=True)
        ]
        self._logger.info(
            f"reserved pod group {info.key}: {len(pairs)} members "
            f"({', '.join(f'{m.pod.name}→{m.reservation.node}' for m in pairs)}), group {reserved.id}"
        )
        return await self._bind_all(info, group, pairs, group_id=reserved.id, started=started)

    async def _bind_all(
        self, info: PodGroupInfo, group: _Group, pairs: Sequence[_Member], *, group_id: str, started: float
    ) -> float | None:
        """PreBind every member, then bind them all; a member failing PreBind releases the group."""
        profile, ports = self._profile(), self._ports()
        chain = traced(plugin_chain(profile=profile))  # spans around each plugin, as in a cycle
        contexts = [
            CycleContext(pod=m.pod, profile=profile, ports=ports, reservation=m.reservation) for m in pairs
        ]
        checks = await asyncio.gather(*(run_pre_bind(ctx=ctx, plugins=chain.pre_bind) for ctx in contexts))
        failed = [
            (ctx, failure) for ctx, failure in zip(contexts, checks, strict=True) if failure is not None
        ]
        if failed:
            await self._release_group(group_id, info=info)
            group.attempt += 1
            first_ctx, first = failed[0]
            why = f"member {first_ctx.pod.key}: {first.message}"
            message = (
                f'pod group "{info.key}" was not placed: {why}; released the reservation of all '
                f"{len(pairs)} members (no member was bound) and trying again"
            )
            self._logger.info(f"released reservation group {group_id}: {message}")
            gone = {ctx.pod.uid for ctx, f in failed if decide(failure=f).outcome is Outcome.DROPPED}
            for uid in gone:  # not a member any more: the group waits for its replacement
                group.pending.pop(uid, None)
            await self._fail(
                info,
                [c.pod for c in contexts if c.pod.uid not in gone],
                message,
                reason=REASON_SCHEDULER_ERROR,
                started=started,
            )
            return self._next_backoff(group)
        results = await asyncio.gather(
            *(
                self._bind_one(ctx, chain, lease_expires=m.lease_expires)
                for ctx, m in zip(contexts, pairs, strict=True)
            )
        )
        bound = sum(outcome is Outcome.BOUND for outcome in results)
        for ctx, outcome in zip(contexts, results, strict=True):
            if outcome in (Outcome.BOUND, Outcome.DROPPED):  # bound, or gone or bound elsewhere
                group.pending.pop(ctx.pod.uid, None)
                self._throttle.forget(ctx.pod.uid)
            self._metrics.attempt(
                resource_manager=profile.name,
                uid=ctx.pod.uid,
                outcome=outcome,
                seconds=time.perf_counter() - started,
            )
        group.waiting_since = None
        if bound:
            group.backoff = 0.0
        if bound == len(contexts):
            self._logger.info(f"bound all {bound} members of pod group {info.key}")
            await self._set_condition(
                info, scheduled=True, reason="Scheduled", message=f"{bound} members bound"
            )
            return None
        self._logger.warning(
            f"bound {bound} of {len(contexts)} members of pod group {info.key}; retrying the rest"
        )
        return self._next_backoff(group)

    async def _bind_one(
        self, ctx: CycleContext, chain: PluginChain, *, lease_expires: float | None
    ) -> Outcome:
        """Bind one member with its reservation, then PostBind (event, commit).

        A failure is decided as a pod cycle's is (:func:`bindery.scheduling.decisions.decide`), and
        every outcome goes to the runner's follow-up, which hands an unanswered Binding's
        reservation to the profile's unconfirmed Bindings (committed once the pod is seen bound).
        """
        failure = await run_bind(ctx=ctx, plugins=chain.bind)
        reservation_id = ctx.reservation.id if ctx.reservation is not None else None
        if failure is None:
            await run_post_bind(ctx=ctx, plugins=chain.post_bind)
            self._on_outcome(
                ctx.pod,
                CycleOutcome(
                    outcome=Outcome.BOUND,
                    node=ctx.node,
                    reservation_id=reservation_id,
                    commit_failed=bool(ctx.state.get(COMMIT_FAILED)),
                ),
            )
            return Outcome.BOUND
        decision = decide(failure=failure)
        released = decision.release and ctx.reservation is not None
        if decision.release:
            await run_unreserve(ctx=ctx, plugins=chain.reserve)
        self._on_outcome(
            ctx.pod,
            CycleOutcome(
                outcome=decision.outcome,
                node=ctx.node,
                reservation_id=reservation_id,
                failure=failure,
                decision=decision,
                released=released,
                lease_expires=lease_expires,
            ),
        )
        if released:
            self._on_released()
        if decision.report:
            await self._report(
                [ctx.pod],
                f"binding this member of its pod group failed: {decision.message}; "
                "the members already bound stay bound, this one is retried alone",
                reason=decision.condition_reason,
            )
        return decision.outcome

    # -- crash recovery --------------------------------------------------------------------------

    async def _recover(self, info: PodGroupInfo, pending: Sequence[PodInfo]) -> bool:
        """Bind pending members that still hold a group member reservation from an earlier process."""
        by_uid = {pod.uid: pod for pod in pending}
        names = {pod.scheduler_name for pod in pending}
        left: list[Reservation] = []
        try:
            for scheduler_name in sorted(names):
                reservations = await self._rm().list_reservations(
                    scheduler_name=scheduler_name, state=ReservationState.RESERVED.value
                )
                left.extend(r for r in reservations if r.group_id and r.pod_uid in by_uid)
        except RMError as error:
            self._logger.warning(f"could not look for leftover reservations of pod group {info.key}: {error}")
            return False
        if not left:
            return False
        profile = self._profile()
        adopted = False
        for group_id in sorted({r.group_id for r in left if r.group_id}):
            try:
                sent_at, sent_at_wall = profile.clock(), datetime.datetime.now(datetime.UTC)
                renewed = await self._rm().renew_group(group_id, ttl_seconds=profile.reservation_ttl_seconds)
            except NotLeading:
                raise
            except RMError as error:
                self._logger.warning(
                    f"pod group {info.key}: reservation group {group_id}, left by an earlier process, "
                    f"cannot be renewed ({error}); releasing it and placing the group anew"
                )
                await self._release_group(group_id, info=info)
                continue
            reserved = [r for r in renewed.members if r.state is ReservationState.RESERVED]
            # All or none: adopt the group only if every member is pending here with its reservation
            # or already bound (its commit is the reconciler's). A member deleted or replaced
            # meanwhile (its reservation may be released already), or not offered yet, means the
            # group as reserved can no longer bind whole: release what no bound pod holds, and
            # place the group anew.
            bound = {
                r.pod_uid
                for r in renewed.members
                if not (r.state is ReservationState.RESERVED and r.pod_uid in by_uid)
                and (r.state is ReservationState.COMMITTED or await self._bound_with(r))
            }
            whole = all(
                r.pod_uid in bound or (r.state is ReservationState.RESERVED and r.pod_uid in by_uid)
                for r in renewed.members
            )
            if not whole:
                self._logger.info(
                    f"pod group {info.key}: reservation group {group_id}, left by an earlier process, "
                    "has members that are gone or not pending here; releasing it and placing the "
                    "group anew"
                )
                await self._release_members([r for r in reserved if r.pod_uid not in bound], info=info)
                continue
            pairs = [
                _Member(
                    pod=by_uid[r.pod_uid],
                    reservation=r,
                    lease_expires=lease_from_answer(
                        reservation=r,
                        ttl_seconds=profile.reservation_ttl_seconds,
                        sent_at=sent_at,
                        sent_at_wall=sent_at_wall,
                    ).expires,
                )
                for r in reserved
                if r.pod_uid in by_uid
            ]
            if not pairs:
                continue
            self._logger.info(
                f"pod group {info.key}: binding {len(pairs)} members with reservation group {group_id}, "
                "left reserved by an earlier process"
            )
            group = self._groups.get((info.namespace, info.name)) or _Group()
            await self._bind_all(info, group, pairs, group_id=group_id, started=time.perf_counter())
            adopted = True
        return adopted

    async def _bound_with(self, reservation: Reservation) -> bool:
        """Whether the reservation's pod (same UID) is bound to a node."""
        if not reservation.namespace or not reservation.name:
            return False
        try:
            response = await kube.CoreV1Api(self._api).read_namespaced_pod(
                reservation.name, reservation.namespace, _preload_content=False, _request_timeout=READ_SECONDS
            )
        except kube.ApiException as error:
            if error.status == 404:
                return False
            raise
        try:
            pod = json.loads(await response.read())
        finally:
            response.release()
        return bool(
            (pod.get("metadata") or {}).get("uid") == reservation.pod_uid
            and (pod.get("spec") or {}).get("nodeName")
        )

    async def _release_members(self, reservations: Sequence[Reservation], *, info: PodGroupInfo) -> None:
        released = False
        for reservation in reservations:
            try:
                await self._rm().release(reservation.id, pod_uid=reservation.pod_uid)
                released = True
            except RMError as error:
                self._logger.warning(
                    f"could not release reservation {reservation.id} of pod group {info.key}: {error}; "
                    "it expires by itself"
                )
        if released:
            self._metrics.release(resource_manager=self._profile().name, reason="group")
            self._on_released()

    # -- reads and writes ------------------------------------------------------------------------

    async def _release_group(self, group_id: str, *, info: PodGroupInfo) -> None:
        try:
            released = await self._rm().release_group(group_id)
        except RMError as error:
            self._logger.warning(
                f"could not release reservation group {group_id} of pod group {info.key}: {error}; "
                "its members expire by themselves"
            )
            return
        if not released:
            return  # fenced: this replica no longer leads
        self._metrics.release(resource_manager=self._profile().name, reason="group")
        self._on_released()

    async def _read_group(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            body: Mapping[str, Any] = await kube.CustomObjectsApi(self._api).get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=READ_SECONDS
            )
        except kube.ApiException as error:
            if error.status == 404:
                return None
            raise
        return body

    async def _count_placed(self, *, namespace: str, name: str) -> int:
        """Members of the group bound to a node and not finished (they count towards minCount)."""
        response = await kube.CoreV1Api(self._api).list_namespaced_pod(
            namespace, field_selector="spec.nodeName!=", _preload_content=False, _request_timeout=LIST_SECONDS
        )
        try:
            document = json.loads(await response.read())
        finally:
            response.release()
        count = 0
        for item in document.get("items") or ():
            spec = item.get("spec") or {}
            if (spec.get("schedulingGroup") or {}).get("podGroupName") != name:
                continue
            if (item.get("status") or {}).get("phase") in TERMINAL_PHASES:
                continue
            if (item.get("metadata") or {}).get("deletionTimestamp"):
                continue
            count += 1
        return count

    async def _set_condition(self, info: PodGroupInfo, *, scheduled: bool, reason: str, message: str) -> None:
        conditions = scheduled_conditions(
            group=info,
            scheduled=scheduled,
            reason=reason,
            message=message,
            now=datetime.datetime.now(datetime.UTC),
        )
        if conditions is None:
            return
        try:
            await kube.CustomObjectsApi(self._api).patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                info.namespace,
                PLURAL,
                info.name,
                {"status": {"conditions": conditions}},
                _content_type="application/merge-patch+json",
                _request_timeout=READ_SECONDS,
            )
        except Exception as error:  # status is informative; the next pass writes it again
            self._logger.warning(f"could not write the status of PodGroup {info.key}: {error}")

    async def _fail(
        self, info: PodGroupInfo, members: Sequence[PodInfo], message: str, *, reason: str, started: float
    ) -> None:
        await self._report(members, message, reason=reason)
        await self._set_condition(info, scheduled=False, reason=reason, message=message)
        for pod in members:
            self._metrics.attempt(
                resource_manager=self._profile().name,
                uid=pod.uid,
                outcome=Outcome.UNSCHEDULABLE if reason == REASON_UNSCHEDULABLE else Outcome.ERROR,
                seconds=time.perf_counter() - started,
            )

    async def _report(self, members: Sequence[PodInfo], message: str, *, reason: str) -> None:
        """FailedScheduling (throttled) and PodScheduled=False (if changed) on every member."""
        ports = self._ports()
        await asyncio.gather(*(self._report_one(ports, pod, message, reason) for pod in members))

    async def _report_one(self, ports: Ports, pod: PodInfo, message: str, reason: str) -> None:
        event = self._throttle.admit(uid=pod.uid, key=reason, message=message)
        writes: list[Callable[[], Awaitable[None]]] = []
        if event is not None:
            writes.append(
                functools.partial(
                    ports.events.failed_scheduling, pod=pod, message=event, scheduler_name=pod.scheduler_name
                )
            )
        if pod.unschedulable_condition != (reason, message):
            writes.append(
                functools.partial(
                    ports.conditions.pod_scheduled_false, pod=pod, reason=reason, message=message
                )
            )
        for write in writes:
            try:
                await write()
            except PodGone:
                return
            except Exception as error:
                self._logger.warning(f"could not report pod {pod.key} waiting with its group: {error}")


def _in_order(group: ReservationGroup, members: Sequence[PodInfo]) -> list[Reservation]:
    """The group's reservations in the order of ``members`` (the RM answers in request order; by UID
    to be safe)."""
    by_uid = {r.pod_uid: r for r in group.members}
    return [by_uid[pod.uid] for pod in members]
