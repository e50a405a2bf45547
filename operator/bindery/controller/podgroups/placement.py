"""Placing a pod group: one reservation for every member, every member's PreBind, then the Bindings.

* one ``reserve_group`` for all pending members (all or none at the RM);
* then every member's PreBind checks (the cycle's own plugins) before any Binding, so a member
  deleted or a node found wrong releases the whole group and no member is bound;
* then the Bindings, in parallel, each followed by its ``Scheduled`` event and its commit (the
  cycle's PostBind plugins).

The plugins run through the same runners as a pod's cycle (:mod:`bindery.scheduling.points`), and
a member whose Binding fails is decided as a pod is (:func:`bindery.scheduling.decisions.decide`):
released and retried alone, dropped silently if gone or bound elsewhere, or, when the Binding got
no answer, kept and handed to the profile's unconfirmed Bindings (through the runner's follow-up,
as a cycle's outcome), which commit it the moment it is seen bound.

Every RM call (reserve and release of groups and members) goes through the profile's one RM stack
(:class:`bindery.controller.rmstack.RMStack`): measured, and fenced, so a replica past its renew
deadline releases nothing.

A resource manager without groups (contract v1.0, answering 404) gets the group refused with a
reason on every member; its members are never placed one by one, which would break all-or-nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.reporting import Reporter
from bindery.controller.preemption import Preemptions
from bindery.controller.rmstack import RMStack
from bindery.rm.errors import RMError, RMGroupsUnsupported, RMUnschedulable
from bindery.rm.models import Reservation, ReservationGroup
from bindery.scheduling.cycle import CycleOutcome, PluginChain, plugin_chain
from bindery.scheduling.decisions import (
    REASON_SCHEDULER_ERROR,
    REASON_UNSCHEDULABLE,
    Failure,
    FailureKind,
    Outcome,
    Stage,
    decide,
)
from bindery.scheduling.defaults import COMMIT_FAILED
from bindery.scheduling.framework import CycleContext, Ports, Profile
from bindery.scheduling.lease import lease_from_answer
from bindery.scheduling.nodecheck import NodeCheckMode, check_rules
from bindery.scheduling.placementrules import (
    MemberPreferences,
    member_node_terms,
    member_preferences,
    members_wake_on,
    rules_verdict,
)
from bindery.scheduling.podgroups import PodGroupInfo, group_request, unsupported
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.points import run_bind, run_post_bind, run_pre_bind, run_unreserve
from bindery.scheduling.preemption import Preemptor
from bindery.scheduling.traced import traced
from bindery.typedefs import Logger

if TYPE_CHECKING:
    from bindery.controller.podgroups.state import GroupState

__all__ = ["Member", "Placement"]

#: Members scored for their soft rules between two yields to the event loop.
PREFERENCES_SLICE = 16

#: A group its members' rules refused is looked at again when a placed pod, a node or a namespace
#: changes where the rules read (PodGroupCoordinator.wake, .retry), else after this long (a safety
#: net; it was polled every backoff, up to 10 s, before).
RULES_RECHECK_SECONDS = 60.0

#: While a group's plan is carried out, how soon its reserve is tried again (victims placed by
#: another scheduler release no reservation, so no event may come).
PLAN_POLL_SECONDS = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """A pending member and the reservation it is bound with."""

    pod: PodInfo
    reservation: Reservation
    #: When the reservation's lease runs out (``profile.clock``), for the unconfirmed Bindings.
    lease_expires: float | None = None


class Placement:
    """Reserves, checks and binds the pod groups of one profile (see the module docstring)."""

    def __init__(
        self,
        *,
        profile: Callable[[], Profile],
        ports: Callable[[], Ports],
        rm: Callable[[], RMStack],
        logger: Logger,
        metrics: Metrics,
        reporter: Reporter,
        backoff: Callable[[GroupState], float],
        on_released: Callable[[], None],
        on_outcome: Callable[[PodInfo, CycleOutcome], None],
        preemptions: Preemptions | None = None,
    ) -> None:
        self._profile = profile
        self._ports = ports
        self._rm = rm
        self._logger = logger
        self._metrics = metrics
        self._reporter = reporter
        #: The coordinator's: the group's next delay, doubled from the last one.
        self._backoff = backoff
        self._on_released = on_released
        self._on_outcome = on_outcome
        #: The runner's preemption step, the pods' own: a group preempts through it as a pod does.
        self._preemptions = preemptions

    async def place(self, info: PodGroupInfo, group: GroupState, members: Sequence[PodInfo]) -> float | None:
        """Reserve `members` together, then bind them; returns when to look again (None: when
        something changes)."""
        profile = self._profile()
        started = time.perf_counter()
        group.waits_for_capacity = False
        refusal = unsupported(group=info, members=members)
        if refusal is not None:
            await self._reporter.fail(info, members, refusal, reason=REASON_SCHEDULER_ERROR, started=started)
            return profile.backoff_max_seconds
        node_terms, refusal = member_node_terms(members, self._ports().placed)
        if refusal is not None:  # the members' inter-pod rules leave no node: nothing is reserved
            message = f'pod group "{info.key}" was not placed: {refusal}'
            # As a refused pod: woken by a change that may lift the refusal, once its backoff is over.
            # Armed before the report, whose API calls yield to the watch: a change meanwhile wakes it.
            delay = self._backoff(group)
            group.rules = members_wake_on(members)
            group.retry_at = time.monotonic() + delay
            await self._reporter.fail(info, members, message, reason=REASON_UNSCHEDULABLE, started=started)
            return max(delay, RULES_RECHECK_SECONDS)
        request = group_request(
            group=info,
            members=members,
            scheduler_name=members[0].scheduler_name,
            ttl_seconds=profile.reservation_ttl_seconds,
            attempt=group.attempt,
            node_terms=node_terms,
            preferred_terms=await self._preferences(members),
            preemption_policy=self._preemption_policy(info, members),
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
            await self._reporter.fail(info, members, message, reason=REASON_SCHEDULER_ERROR, started=started)
            return profile.backoff_max_seconds
        except RMUnschedulable as error:
            message = (
                f'resource manager "{profile.name}" cannot place pod group "{info.key}" all together '
                f"({len(members)} pods, none placed): {error.message}"
            )
            group.waits_for_capacity = True  # before the report: a release meanwhile wakes the group
            await self._reporter.fail(info, members, message, reason=REASON_UNSCHEDULABLE, started=started)
            return await self._preempt(info, group, members, error)
        except RMError as error:
            message = (
                f'reserving pod group "{info.key}" ({len(members)} pods) at resource manager '
                f'"{profile.name}" failed: {error.message}; retrying'
            )
            await self._reporter.fail(info, members, message, reason=REASON_SCHEDULER_ERROR, started=started)
            return self._backoff(group)
        pairs = [
            Member(
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
        return await self.bind_all(info, group, pairs, group_id=reserved.id, started=started)

    async def _preferences(self, members: Sequence[PodInfo]) -> list[MemberPreferences] | None:
        """Each member's preferences with its soft inter-pod rules, for an RM that takes node
        preferences (as PreFilter adds them for a single pod); None for any other RM, whose client
        drops them anyway, so the scoring is not paid for. Scored a slice at a time, yielding to
        the event loop between slices: a large gang of unlike members costs seconds."""
        known = getattr(self._profile().client, "takes_node_preferences", None)
        if known is not None and not known():
            return None
        placed = self._ports().placed
        memo: dict[tuple[object, ...], MemberPreferences] = {}
        found: list[MemberPreferences] = []
        added = False
        for start in range(0, len(members), PREFERENCES_SLICE):
            part = members[start : start + PREFERENCES_SLICE]
            scored = member_preferences(part, placed, memo=memo)
            added = added or scored is not None
            found.extend(scored if scored is not None else (member.preferred_terms for member in part))
            if start + PREFERENCES_SLICE < len(members):
                await asyncio.sleep(0)
        return found if added else None

    def _preemption_policy(
        self, info: PodGroupInfo, members: Sequence[PodInfo]
    ) -> Literal["PreemptLowerPriority", "Never"] | None:
        """What the group's reserve asks of preemption: a plan, unless a member says ``Never`` or the
        group backs off after a failed plan (as a pod does); nothing without a preemption step."""
        if self._preemptions is None:
            return None
        who = Preemptor.of_group(namespace=info.namespace, name=info.name, members=members)
        if who.never() is not None or self._preemptions.paused(who.uid):
            return "Never"
        return "PreemptLowerPriority"

    async def _preempt(
        self, info: PodGroupInfo, group: GroupState, members: Sequence[PodInfo], error: RMUnschedulable
    ) -> float:
        """After "no room": carry out the plan the RM proposed for the whole group, through the same
        step as a pod's plan; then look again soon (the victims' release wakes the group too, but
        victims another scheduler placed release nothing). Without a plan, clear nominations no
        plan stands behind, and wait as before (no sooner than the preemption back-off ends)."""
        delay = self._backoff(group)
        if self._preemptions is None:
            return delay
        who = Preemptor.of_group(namespace=info.namespace, name=info.name, members=members)
        if error.plan is not None:
            if await self._preemptions.carry_out(who, error.plan, asked=error.asked):
                return min(delay, PLAN_POLL_SECONDS)
        else:
            for pod in members:
                if pod.nominated_node:
                    await self._preemptions.clear_nomination(pod)
        if pause := self._preemptions.paused(who.uid):
            return min(delay, pause)
        return delay

    async def bind_all(
        self, info: PodGroupInfo, group: GroupState, pairs: Sequence[Member], *, group_id: str, started: float
    ) -> float | None:
        """PreBind every member, then bind them all; a member failing PreBind releases the group."""
        profile, ports = self._profile(), self._ports()
        plain = plugin_chain(profile=profile)
        chain = traced(plain)  # spans around each plugin, as in a cycle
        # The Reserve plugins that hold members too (the inter-pod rules' assume and forget; their
        # PreFilter is member_node_terms): the chain's own instances, as a pod's cycle runs them.
        holders = plain.group_members()
        contexts = [
            CycleContext(pod=m.pod, profile=profile, ports=ports, reservation=m.reservation) for m in pairs
        ]
        # Every member assumed on its node first, so that NodeCheck's second look at the inter-pod
        # rules sees the other members too (a rule between members was not sent to the RM).
        for ctx in contexts:
            for holder in holders:
                await holder.reserve_member(ctx=ctx)
        checks = await asyncio.gather(*(run_pre_bind(ctx=ctx, plugins=chain.pre_bind) for ctx in contexts))
        checks = [
            check if check is not None else _rules_recheck(ctx, plugin=holders[0].name if holders else "")
            for ctx, check in zip(contexts, checks, strict=True)
        ]
        failed = [
            (ctx, failure) for ctx, failure in zip(contexts, checks, strict=True) if failure is not None
        ]
        if failed:
            for ctx in contexts:
                for holder in reversed(holders):
                    await holder.unreserve_member(ctx=ctx)
            await self.release_group(group_id, info=info)
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
            await self._reporter.fail(
                info,
                [c.pod for c in contexts if c.pod.uid not in gone],
                message,
                reason=REASON_SCHEDULER_ERROR,
                started=started,
            )
            return self._backoff(group)
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
                self._reporter.throttle.forget(ctx.pod.uid)
            self._metrics.attempt(
                resource_manager=profile.name,
                uid=ctx.pod.uid,
                outcome=outcome,
                seconds=time.perf_counter() - started,
            )
        group.waiting_since = None
        if bound:
            group.failures = 0
            if self._preemptions is not None:
                self._preemptions.forget(
                    Preemptor.of_group(namespace=info.namespace, name=info.name, members=()).uid
                )
        if bound == len(contexts):
            self._logger.info(f"bound all {bound} members of pod group {info.key}")
            await self._reporter.set_condition(
                info, scheduled=True, reason="Scheduled", message=f"{bound} members bound"
            )
            return None
        self._logger.warning(
            f"bound {bound} of {len(contexts)} members of pod group {info.key}; retrying the rest"
        )
        return self._backoff(group)

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
            await self._reporter.report(
                [ctx.pod],
                f"binding this member of its pod group failed: {decision.message}; "
                "the members already bound stay bound, this one is retried alone",
                reason=decision.condition_reason,
            )
        return decision.outcome

    async def release_group(self, group_id: str, *, info: PodGroupInfo) -> None:
        """Release every member's reservation of the group (logged, not raised, if it fails: the
        members' leases run out by themselves)."""
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


def _in_order(group: ReservationGroup, members: Sequence[PodInfo]) -> list[Reservation]:
    """The group's reservations in the order of ``members`` (the RM answers in request order; by UID
    to be safe)."""
    by_uid = {r.pod_uid: r for r in group.members}
    return [by_uid[pod.uid] for pod in members]


def _rules_recheck(ctx: CycleContext, *, plugin: str) -> Failure | None:
    """The inter-pod rules again for a member on its node, every member assumed, whatever the
    ``nodeCheck`` mode (``Full``: NodeCheck did it). Rules between members were never sent to the RM
    (member_node_terms refuses the selecting ones; host ports between members remain), so without
    this look a group is bound against them silently. `plugin`: the failure is the rules' (the
    chain's member holder), named as the cycle's would be."""
    placed = ctx.ports.placed
    if placed is None or ctx.node is None or ctx.profile.node_check is NodeCheckMode.FULL:
        return None
    verdict = rules_verdict(ctx.pod, placed)
    problem = None if verdict is None else check_rules(verdict, node_name=ctx.node, rm_name=ctx.profile.name)
    if problem is None:
        return None
    return Failure(kind=FailureKind.NODE_CHECK, message=problem, stage=Stage.PRE_BIND, plugin=plugin)
