"""Carrying out an RM's preemption plan (contract v1.2, feature ``preemption``; issue 21).

The RM answers a reserve it cannot place with a plan: a node and the lower-priority pods to evict
there. The cycle stays as it is (the pod is unschedulable, waiting for an event); after it, this
module vets the plan against the apiserver (:func:`bindery.scheduling.preemption.vet`), confirms
it (from then on the RM holds the room for this pod alone), sets the pod's
``status.nominatedNodeName``, and evicts each victim as kube-scheduler does: the ``DisruptionTarget``
condition first, then the Eviction API (which enforces PodDisruptionBudgets, unlike a plain
delete), then the ``Preempted`` event. The victims' deletion wakes the pod, whose next reserve
lands on the held room and binds as any other.

A plan is refused whole, before anything is evicted (each refusal logged with the plan's id,
counted by reason in ``bindery_preemption_plans_refused_total`` and cancelled at the RM):

* when it was not asked for, or does not make sense: the reserve asked for no plan, the node is
  not one the preemptor may run on, a victim is elsewhere, not of lower priority, frees nothing or
  more than it requests, or is not a pod this RM serves
  (:func:`bindery.scheduling.preemption.vet`; an unasked plan is refused before any victim is read);
* when the preemptor's inter-pod rules (pod affinity and anti-affinity, topology spread, host ports)
  would still exclude the plan's node once exactly its victims are gone
  (:func:`bindery.scheduling.placementrules.broken_after_preemption`): the RM chooses victims by
  what they free and may evict the very pod a required pod affinity needs there;
* when a victim's eviction would exceed a PodDisruptionBudget: when the RM says so
  (``violatedBudgets``), when a dry run of every eviction (``dryRun=All``, which checks the
  budgets and changes nothing) is answered ``429``, or when more of the plan's victims fall under
  one budget than its ``status.disruptionsAllowed`` (each dry run checks one victim alone;
  :func:`bindery.scheduling.preemption.budgets_exceeded`). Evicting the first victims and meeting
  the ``429`` on a later one would leave them evicted for nothing.

The preemptor is told why (FailedScheduling, PodScheduled=False), naming the rule or the budget.

A PDB's ``429`` on the real eviction (a budget changed since the dry run) or any other failure
cancels the plan and clears the nomination, so the room goes back and no further victim is evicted
for nothing; the pod is tried again on the next event. A plan
is carried out once: the RM answers the same plan while its victims terminate, and this process
remembers which plans it has carried out or is carrying out (the preemptor, parked meanwhile, may
be woken and meet its plan again before the first worker is done with it).

No loops (volcano#377): a preemptor whose plan was refused or cancelled backs off, per pod, on
:data:`PREEMPTION_BACKOFF` (10 s, doubled per failure, at most 5 minutes). Meanwhile its reserves
ask for no plan (``preemptionPolicy: Never`` to the RM), so no victim is proposed, confirmed or
marked for it; it may still be placed where room appears by itself, and it is tried again when
the back-off ends. Its first plan carried out, or its leaving, forgets the back-off.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from bindery.adapters.events import event_body
from bindery.adapters.eviction import eviction
from bindery.adapters.reads import read_budgets, read_pod
from bindery.apiserver import ApiClient, ApiError, answer_of, list_pages, patch, resources
from bindery.apiserver.api import STRATEGIC_PATCH
from bindery.backoff import Backoff, BackoffPolicy
from bindery.config import ResourceManagerConfig
from bindery.rm.errors import RMError
from bindery.rm.models import PlanState, PreemptionPlan, PreemptionVictim
from bindery.scheduling.nodecheck import NodeCheckMode
from bindery.scheduling.placementrules import broken_after_preemption
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection, PlacedPods
from bindery.scheduling.preemption import (
    PlanScope,
    Preemptor,
    Refusal,
    budgets_exceeded,
    disruption_condition,
    pod_group,
    preempted_note,
    unasked,
    vet,
)
from bindery.typedefs import Logger

__all__ = ["PendingPlan", "PlanClient", "Preemptions", "plan_scope"]

#: Plans remembered as carried out (per runner); the oldest are forgotten past this.
REMEMBERED_PLANS = 10_000
#: After a plan refused or cancelled, how long the preemptor waits before it may preempt again:
#: longer than the queue's (kube-scheduler's 1 s to 10 s), since each try may mark and evict pods.
PREEMPTION_BACKOFF = BackoffPolicy(initial=10.0, maximum=300.0)
#: Preemptors backing off, remembered at most (the oldest are forgotten past this).
REMEMBERED_BACKOFFS = 10_000
_TIMEOUT = 10.0


def plan_scope(
    *, config: ResourceManagerConfig, namespace_labels: Callable[[str], Mapping[str, str] | None] | None
) -> PlanScope:
    """What the ResourceManager's plans may touch: its scheduler names, its namespaceSelector
    (a namespace whose labels are not known yet is not selected: no eviction on a guess), its
    ``spec.preemption.victims`` and its ``spec.nodeCheck``."""
    selector = config.namespace_selector

    def selects(namespace: str) -> bool | None:
        if selector is None:
            return True
        labels = namespace_labels(namespace) if namespace_labels is not None else None
        return None if labels is None else selector.matches(labels)

    return PlanScope(
        rm_name=config.name,
        victims=config.preemption_victims,
        scheduler_names=frozenset(config.scheduler_names),
        selects=selects,
        node_check=NodeCheckMode(config.node_check),
    )


@dataclasses.dataclass(frozen=True)
class _Resumed:
    gone: tuple[PreemptionVictim, ...] = ()
    terminating: tuple[PreemptionVictim, ...] = ()


def _resumed(plan: PreemptionPlan, current: dict[str, dict[str, Any] | None]) -> _Resumed:
    """The victims a plan already confirmed has dealt with: this process (restarted after a
    SIGKILL, or a new leader) meets the plan again in the RM's answer while its victims terminate.
    Gone victims of a confirmed plan (deleted, or recreated under the same name by a StatefulSet)
    were evicted, not moved: the RM holds their room for this pod.
    A victim with a deletionTimestamp is never evicted again, whoever deleted it: a second eviction
    would post a second ``Preempted`` event (kube-scheduler, likewise, does not preempt again while
    a lower-priority pod terminates on the nominated node)."""
    gone: list[PreemptionVictim] = []
    terminating: list[PreemptionVictim] = []
    for victim in plan.victims:
        body = current.get(f"{victim.pod.namespace}/{victim.pod.name}")
        if body is None or (body.get("metadata") or {}).get("uid") != victim.pod.uid:
            if plan.state is PlanState.CONFIRMED:  # deleted, or recreated by its controller
                gone.append(victim)
        elif (body.get("metadata") or {}).get("deletionTimestamp"):
            terminating.append(victim)
    return _Resumed(gone=tuple(gone), terminating=tuple(terminating))


@dataclasses.dataclass(frozen=True)
class PendingPlan:
    """A confirmed plan whose preemptor is not bound yet, for ``bindery explain``: it lives only in
    this memory and in the RM's database, and without it a user sees a Pending pod and evicted pods.

    ``victims``: each victim's ``namespace/name`` and its state in the placed-pod cache (``running``:
    not evicted yet; ``terminating``; ``gone``). ``waits_for``: ``victims`` while any is still on
    the node, then ``reserve`` (its next reserve lands on the held room)."""

    plan_id: str
    node: str
    victims: tuple[tuple[str, str], ...]
    waits_for: str
    lease_left: float


class PlanClient(Protocol):
    async def confirm_preemption(self, plan_id: str, /) -> PreemptionPlan: ...

    async def cancel_preemption(self, plan_id: str, /) -> None: ...


class Preemptions:
    """One runner's preemptions: :meth:`carry_out` after a cycle whose failure carries a plan."""

    def __init__(
        self,
        *,
        api: ApiClient,
        rm: PlanClient,
        logger: Logger,
        count: Callable[[str], None] = lambda outcome: None,
        hostname: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        placed: PlacedPods | None = None,
        scope: Callable[[], PlanScope],
        nodes: Callable[[str], NodeProjection | None],
        refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """``count``: called with each outcome, for ``bindery_preemptions_total``. ``placed``: the
        pods on nodes, to check the preemptor's inter-pod rules with the victims gone. ``scope``:
        what the ResourceManager's plans may touch, now. ``nodes``: the Nodes, by name.
        ``refused``: called with each refusal's reason, for ``bindery_preemption_plans_refused_total``."""
        self._count = count
        self._scope = scope
        self._nodes = nodes
        self._refused = refused
        self._placed = placed
        self._api = api
        self._rm = rm
        self._logger = logger
        self._hostname = hostname or socket.gethostname()
        self._carried: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: Plans a worker is carrying out now (at most one per preemptor: the RM answers its plan).
        self._carrying: set[str] = set()
        self._clock = clock
        #: Preemptors whose last plan failed: their back-off, when they may preempt again, and why.
        self._backoffs: collections.OrderedDict[str, tuple[Backoff, float, str]] = collections.OrderedDict()
        #: Preemptors whose plan was confirmed: the plan and when its lease ends (this clock).
        self._pending: collections.OrderedDict[str, tuple[PreemptionPlan, float]] = collections.OrderedDict()
        #: Tells the preemptor why its plan was not carried out (FailedScheduling, PodScheduled=False);
        #: set by the attempts, which own the pod's reporting.
        self.report: Callable[[PodInfo, str], Awaitable[None]] | None = None

    async def carry_out(self, pod: PodInfo | Preemptor, plan: PreemptionPlan, *, asked: str | None) -> bool:
        """Vet, confirm, nominate, evict; True when every victim was evicted (or already gone), or
        when the plan is being carried out already.

        ``asked``: the ``preemptionPolicy`` the reserve that got the plan carried, as sent to the RM
        (``RMUnschedulable.asked``); a plan to a reserve that asked for none is refused.

        ``pod`` is a pod, or a pod group's pending members (:class:`Preemptor`, feature
        ``group-preemption``): the same steps, each member nominated on the node its room is held on.

        The pod is parked before its plan is carried out, so a release or node event can wake it
        meanwhile, and the RM answers its next reserve with the same plan: that cycle must not carry
        it out a second time (a second confirm, eviction and ``Preempted`` event per victim; or a
        dry run the first eviction made refuse, whose cancel gave the room away mid-eviction)."""
        if plan.plan_id in self._carried or plan.plan_id in self._carrying:
            # Vetted when it was first asked for: the RM answers it again while its victims go.
            if plan.state is PlanState.CONFIRMED and plan.expires_at is not None:
                self._hold(pod.uid, plan)  # a re-confirm (restart, another replica) moved the lease
            return True  # the RM answered the plan again while its victims terminate
        self._carrying.add(plan.plan_id)
        try:
            return await self._carry_out(
                pod if isinstance(pod, Preemptor) else Preemptor.of_pod(pod), plan, asked=asked
            )
        finally:
            self._carrying.discard(plan.plan_id)

    async def _carry_out(self, pod: Preemptor, plan: PreemptionPlan, *, asked: str | None) -> bool:
        self._count("proposed")
        if (refusal := unasked(plan, asked=asked)) is not None:  # nothing read for a plan nobody asked for
            await self._refuse(pod, plan, refusal)
            return False
        try:
            current = {
                f"{v.pod.namespace}/{v.pod.name}": await read_pod(
                    api=self._api, namespace=v.pod.namespace, name=v.pod.name, timeout_seconds=_TIMEOUT
                )
                for v in plan.victims
            }
        except ApiError as error:
            await self._give_up(pod, plan, f"could not read the victims: {error}", nominated=False)
            return False
        resumed = _resumed(plan, current)
        try:
            members = await self._group_members(current)
        except ApiError as error:
            await self._give_up(
                pod, plan, f"could not read the victims' pod groups: {error}", nominated=False
            )
            return False
        refusal = vet(
            plan.model_copy(update={"victims": [v for v in plan.victims if v not in resumed.gone]}),
            preemptor=pod,
            victims=current,
            asked=asked,
            scope=self._scope(),
            nodes=self._nodes,
            group_members=members,
        )
        if refusal is None and self._placed is not None:
            for member, node in self._nominations(pod, plan):
                broken = broken_after_preemption(
                    member,
                    self._placed,
                    node=node,
                    victims=[v.pod.uid for v in plan.victims],
                    names=[f"{v.pod.namespace}/{v.pod.name}" for v in plan.victims],
                )
                if broken is not None:
                    refusal = Refusal("rules", broken)
                    break
        if refusal is None:
            # Only the victims still to evict: a gone one answers 404, a terminating one was
            # already admitted by its budget.
            pending = [v for v in plan.victims if v not in resumed.gone and v not in resumed.terminating]
            try:
                budget = await self._dry_run(plan.model_copy(update={"victims": pending}))
                if budget is None and len(pending) > 1:
                    budget = await self._count_budgets(
                        [body for v in pending if (body := current[f"{v.pod.namespace}/{v.pod.name}"])]
                    )
            except ApiError as error:
                await self._give_up(pod, plan, f"could not check the evictions: {error}", nominated=False)
                return False
            refusal = Refusal("budget", budget) if budget is not None else None
        if refusal is not None:
            await self._refuse(pod, plan, refusal)
            return False
        try:
            confirmed = await self._rm.confirm_preemption(plan.plan_id)
        except RMError as error:
            await self._give_up(pod, plan, f"the RM did not confirm it: {error}", nominated=False)
            return False
        self._hold(pod.uid, confirmed if confirmed.plan_id == plan.plan_id else plan)
        self._remember(plan.plan_id)
        self._count("confirmed")
        evicted = 0
        evict = [v for v in plan.victims if v not in resumed.gone and v not in resumed.terminating]
        if resumed.gone or resumed.terminating:
            done = ", ".join(f"{v.pod.namespace}/{v.pod.name}" for v in (*resumed.gone, *resumed.terminating))
            self._logger.info(
                f"taking up confirmed plan {plan.plan_id} for {pod.label} on node {plan.node}: "
                f"{done} already evicted or terminating"
            )
        if evict:
            victims = ", ".join(f"{v.pod.namespace}/{v.pod.name} on {plan.node_of(v)}" for v in evict)
            self._logger.info(f"preempting {victims} for {pod.label} (plan {plan.plan_id})")
        try:
            for member, node in self._nominations(pod, plan):
                await self._nominate(member, node)
            for victim in evict:
                if not await self._evict(pod, plan, victim):
                    await self._give_up(
                        pod,
                        plan,
                        f"the eviction of {victim.pod.namespace}/{victim.pod.name} was refused by a "
                        "PodDisruptionBudget",
                        nominated=True,
                        evicted=evicted,
                    )
                    return False
                evicted += 1
        except ApiError as error:
            await self._give_up(pod, plan, f"the apiserver failed: {error}", nominated=True, evicted=evicted)
            return False
        self._backoffs.pop(pod.uid, None)
        return True

    async def _refuse(self, pod: Preemptor, plan: PreemptionPlan, refusal: Refusal) -> None:
        """A plan not carried out: counted by reason, then cancelled with the preemptor backing off
        (its reserves ask for no plan until the back-off ends)."""
        self._count("refused")
        self._refused(refusal.reason)
        await self._give_up(pod, plan, refusal.message, nominated=plan.state is PlanState.CONFIRMED)

    def paused(self, uid: str) -> float:
        """Seconds until the pod may preempt again (0 when it may now)."""
        entry = self._backoffs.get(uid)
        return max(entry[1] - self._clock(), 0.0) if entry is not None else 0.0

    def backed_off(self, uid: str) -> tuple[float, str] | None:
        """Seconds until the pod may preempt again and why its last plan failed; None when it may
        preempt now (``bindery explain`` shows it: the back-off lives only in this memory)."""
        entry = self._backoffs.get(uid)
        if entry is None or (left := entry[1] - self._clock()) <= 0:
            return None
        return left, entry[2]

    def forget(self, uid: str) -> None:
        """The pod was bound or left: its back-off and its pending plan end with it."""
        self._backoffs.pop(uid, None)
        self._pending.pop(uid, None)

    def pending(self, uid: str) -> PendingPlan | None:
        """The pod's confirmed plan while its lease runs, with each victim's state as the placed-pod
        cache sees it now; None without one."""
        entry = self._pending.get(uid)
        if entry is None:
            return None
        plan, until = entry
        if (left := until - self._clock()) <= 0:
            return None
        victims = tuple((f"{v.pod.namespace}/{v.pod.name}", self._victim_state(v)) for v in plan.victims)
        waits_for = "victims" if any(state != "gone" for _, state in victims) else "reserve"
        return PendingPlan(
            plan_id=plan.plan_id, node=plan.node, victims=victims, waits_for=waits_for, lease_left=left
        )

    def _victim_state(self, victim: PreemptionVictim) -> str:
        if self._placed is None:
            return "unknown"
        for placed in self._placed.in_namespace(victim.pod.namespace):
            if placed.uid == victim.pod.uid:
                return "terminating" if placed.terminating else "running"
        return "gone"

    def _hold(self, uid: str, plan: PreemptionPlan) -> None:
        """Remember a confirmed plan until its lease ends, by the RM's ``expiresAt`` when it said."""
        if plan.expires_at is not None:
            left = (plan.expires_at - datetime.datetime.now(datetime.UTC)).total_seconds()
        else:
            left = float(plan.lease_seconds)
        self._pending.pop(uid, None)
        self._pending[uid] = (plan, self._clock() + left)
        while len(self._pending) > REMEMBERED_BACKOFFS:
            self._pending.popitem(last=False)

    def _back_off(self, uid: str, why: str) -> float:
        backoff = self._backoffs.pop(uid, (Backoff(PREEMPTION_BACKOFF), 0.0, ""))[0]
        delay = backoff.next()
        self._backoffs[uid] = (backoff, self._clock() + delay, why)
        while len(self._backoffs) > REMEMBERED_BACKOFFS:
            self._backoffs.popitem(last=False)
        return delay

    @staticmethod
    def _nominations(pod: Preemptor, plan: PreemptionPlan) -> list[tuple[PodInfo, str]]:
        """Each pod and the node the plan holds its room on: the plan's node for a pod, each
        member's own for a group (``status.nominatedNodeName``, as kube-scheduler sets it)."""
        if not plan.members:
            return [(member, plan.node) for member in pod.pods]
        nodes = {member.pod_uid: member.node for member in plan.members}
        return [(member, nodes[member.uid]) for member in pod.pods if member.uid in nodes]

    def _remember(self, plan_id: str) -> None:
        self._carried[plan_id] = None
        while len(self._carried) > REMEMBERED_PLANS:
            self._carried.popitem(last=False)

    async def _group_members(self, current: dict[str, dict[str, Any] | None]) -> dict[str, set[str]]:
        """For each pod group a victim belongs to, the UIDs of its members bound now and not
        terminating (one LIST of the bound pods of each namespace concerned; plans without a
        group member read nothing)."""
        groups = {group for body in current.values() if body is not None and (group := pod_group(body))}
        members: dict[str, set[str]] = {group: set() for group in groups}
        for namespace in sorted({group.split("/", 1)[0] for group in groups}):
            async for page in list_pages(
                self._api,
                resources.PODS,
                namespace=namespace,
                field_selector="spec.nodeName!=",
                request_timeout=_TIMEOUT,
            ):
                for body in page.get("items") or ():
                    group = pod_group(body)
                    terminal = (body.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                    leaving = (body.get("metadata") or {}).get("deletionTimestamp")
                    if group in members and not terminal and not leaving:
                        members[group].add(str(body["metadata"]["uid"]))
        return members

    async def _count_budgets(self, victims: list[dict[str, Any]]) -> str | None:
        """Why the victims together would exceed a PodDisruptionBudget that each alone passes (the
        dry run checks them one by one), or None: one LIST of budgets per victims' namespace."""
        budgets: list[dict[str, Any]] = []
        for namespace in sorted({str(body["metadata"]["namespace"]) for body in victims}):
            budgets += await read_budgets(api=self._api, namespace=namespace, timeout_seconds=_TIMEOUT)
        return budgets_exceeded(victims, budgets)

    async def _dry_run(self, plan: PreemptionPlan) -> str | None:
        """Why the Eviction API would refuse one of the victims (a PodDisruptionBudget the RM did not
        know, or one that changed since), or None. Each victim alone: two victims under one budget
        allowing one disruption both pass here, so :meth:`_count_budgets` counts them together."""
        for victim in plan.victims:
            namespace, name = victim.pod.namespace, victim.pod.name
            status, payload = await answer_of(
                self._api,
                "POST",
                resources.PODS.path(namespace=namespace, name=name, subresource="eviction"),
                query={"dryRun": "All"},
                body=eviction(namespace, name, victim.pod.uid),
                request_timeout=_TIMEOUT,
                what=f"checking the eviction of {namespace}/{name}",
            )
            if status == 429:
                return (
                    f"evicting victim {namespace}/{name} on node {plan.node_of(victim)} is refused: "
                    f"{_why(payload)}"
                )
            if status >= 300 and status not in (404, 409):  # gone or recreated: the real eviction says
                raise ApiError(
                    payload.decode(errors="replace")[:500],
                    status=status,
                    what=f"checking the eviction of {namespace}/{name}",
                )
        return None

    async def _give_up(
        self, pod: Preemptor, plan: PreemptionPlan, why: str, *, nominated: bool, evicted: int = 0
    ) -> None:
        """Cancel the plan (the room goes back) and clear the nomination; the pod waits for an event."""
        delay = self._back_off(pod.uid, why)
        self._pending.pop(pod.uid, None)
        self._logger.warning(
            f"not preempting for {pod.label} (plan {plan.plan_id}): {why}; plan cancelled, no new plan "
            f"for {delay:g} s"
        )
        if self.report is not None:
            done = f"{evicted} victim(s) already evicted for it" if evicted else "nothing was evicted for it"
            where = f"on node {plan.node}" if not plan.members else f"for {pod.label}"
            for member in pod.pods:
                try:
                    await self.report(
                        member,
                        f"Preemption {where} is not possible: {why}; {done}. Preemption is tried "
                        f"again in {delay:g} s at the earliest.",
                    )
                except Exception as error:  # reporting is best effort
                    self._logger.warning(f"could not tell pod {member.key} why it preempts nothing: {error}")
        self._carried.pop(plan.plan_id, None)
        self._count("cancelled")
        try:
            await self._rm.cancel_preemption(plan.plan_id)
        except RMError as error:  # the plan's lease ends it anyway
            self._logger.warning(f"cancelling preemption plan {plan.plan_id} failed: {error}")
        if nominated:
            for member in pod.pods:
                try:
                    await self._nominate(member, None)
                except ApiError as error:
                    self._logger.warning(f"clearing the nominated node of pod {member.key} failed: {error}")

    async def clear_nomination(self, pod: PodInfo) -> None:
        """Clear ``status.nominatedNodeName`` that no plan stands behind any more, as kube-scheduler
        clears it when preemption finds nothing: tools reading it must not see a preemption forever."""
        self._logger.info(
            f"clearing nominated node {pod.nominated_node} of pod {pod.key}: no preemption plan holds "
            "room for it there any more"
        )
        try:
            await self._nominate(pod, None)
        except ApiError as error:  # tried again at the pod's next unschedulable answer
            self._logger.warning(f"clearing the nominated node of pod {pod.key} failed: {error}")

    async def _nominate(self, pod: PodInfo, node: str | None) -> None:
        await patch(
            self._api,
            resources.PODS,
            namespace=pod.namespace,
            name=pod.name,
            subresource="status",
            body={"status": {"nominatedNodeName": node}},
            request_timeout=_TIMEOUT,
        )

    async def _evict(self, pod: Preemptor, plan: PreemptionPlan, victim: PreemptionVictim) -> bool:
        """One victim; False when a PodDisruptionBudget refuses (429). Gone already counts as done."""
        namespace, name, uid = victim.pod.namespace, victim.pod.name, victim.pod.uid
        now = datetime.datetime.now(datetime.UTC)
        condition = disruption_condition(now=now, scheduler_name=pod.scheduler_name)
        try:
            await patch(
                self._api,
                resources.PODS,
                namespace=namespace,
                name=name,
                subresource="status",
                body={"metadata": {"uid": uid}, "status": {"conditions": [condition]}},
                content_type=STRATEGIC_PATCH,
                request_timeout=_TIMEOUT,
            )
        except ApiError as error:
            if error.status == 404:
                return True
            raise
        path = resources.PODS.path(namespace=namespace, name=name, subresource="eviction")
        try:
            status, payload = await answer_of(
                self._api,
                "POST",
                path,
                body=eviction(namespace, name, uid),
                request_timeout=_TIMEOUT,
                what=f"evicting {namespace}/{name}",
            )
        except ApiError as error:  # a timeout or a dropped connection: not evicted, as far as known
            await self._not_a_target(victim, condition, f"the eviction failed: {error}")
            raise
        if status == 429:  # the pod stays: it is no disruption target after all
            await self._not_a_target(victim, condition, "eviction refused by a PodDisruptionBudget")
            return False
        if status in (404, 409):  # gone, or recreated (the uid precondition): not evicted by this plan
            return True
        if status >= 300:
            await self._not_a_target(victim, condition, f"the eviction failed: HTTP {status}")
            raise ApiError(
                payload.decode(errors="replace")[:500], status=status, what=f"evicting {namespace}/{name}"
            )
        self._count("victim_evicted")
        node = plan.node_of(victim)
        await self._event(pod.pod_on(plan, node), node, namespace=namespace, name=name, uid=uid)
        return True

    async def _not_a_target(self, victim: PreemptionVictim, condition: dict[str, Any], why: str) -> None:
        """Take back ``DisruptionTarget`` from a victim whose eviction did not happen: the pod keeps
        running, and tools (and its own controllers) must not see it as about to go. kube-scheduler
        leaves the condition to the disruption controller's two-minute cleanup; Bindery knows at
        once. Best effort: a failure is logged and the controller's cleanup remains."""
        namespace, name, uid = victim.pod.namespace, victim.pod.name, victim.pod.uid
        cleared = {**condition, "status": "False", "message": why[:1000]}
        try:
            await patch(
                self._api,
                resources.PODS,
                namespace=namespace,
                name=name,
                subresource="status",
                body={"metadata": {"uid": uid}, "status": {"conditions": [cleared]}},
                content_type=STRATEGIC_PATCH,
                request_timeout=_TIMEOUT,
            )
        except ApiError as error:
            self._logger.warning(
                f"could not clear DisruptionTarget on {namespace}/{name}, which was not evicted: {error}"
            )

    async def _event(self, pod: PodInfo, node: str, *, namespace: str, name: str, uid: str) -> None:
        victim = PodInfo(uid=uid, namespace=namespace, name=name, scheduler_name=pod.scheduler_name)
        body: dict[str, Any] = event_body(
            pod=victim,
            resource_version=None,
            scheduler_name=pod.scheduler_name,
            hostname=self._hostname,
            type_="Normal",
            reason="Preempted",
            action="Preempting",
            note=preempted_note(preemptor=pod, node=node),
            now=datetime.datetime.now(datetime.UTC),
        )
        body["related"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        }
        status, payload = await answer_of(
            self._api,
            "POST",
            resources.EVENTS_V1.path(namespace=namespace),
            body=body,
            request_timeout=_TIMEOUT,
            what="Preempted event not written",
        )
        if status >= 300:  # an event is worth a log line, not a failed preemption
            self._logger.warning(
                f"Preempted event of {namespace}/{name} not written (HTTP {status}): "
                f"{json.dumps(payload.decode(errors='replace')[:200])}"
            )


def _why(payload: bytes) -> str:
    """The budget's own words from a 429 Status (``details.causes``: "The disruption budget X needs
    4 healthy pods and has 4 currently"), else its message."""
    try:
        status = json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace")[:300]
    causes = [
        str(cause["message"])
        for cause in (status.get("details") or {}).get("causes") or ()
        if cause.get("message")
    ]
    return "; ".join(causes) or str(status.get("message") or "HTTP 429")[:300]
