"""A plan carried out once even when its preemptor's next cycle meets it while the first runs.

After a cycle whose answer carries a plan, the worker calls `done` (the pod is parked) and only then
carries the plan out: reads, dry runs, confirm, evictions. Any release or node event wakes the
parked pod after its backoff, and the RM answers its next reserve with the same plan while it is
active. Both workers then carried the same plan out: a second confirm, a second eviction and
`Preempted` event per victim, or, where a budget allows one disruption, a dry run refused by the
first eviction, which cancelled the plan (the room went back) while its victims were evicted.
And a victim gone before its eviction (the Eviction API's 404) is not reported as preempted.
Against a real apiserver; the RM is a stub that counts confirms and cancels.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.apiserver import answer_of
from bindery.controller import preemption
from bindery.controller.preemption import Preemptions
from bindery.rm.models import PlanState, PreemptionPlan, PreemptionVictim, VictimPod
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from bindery.scheduling.preemption import PlanScope
from tests.operator.conftest import create_pod, events_of, pod_body

log = logging.getLogger(__name__)


class _StubRM:
    """Counts confirms and cancels; a confirm answers after a round trip, as a real RM's does."""

    def __init__(self, plan: PreemptionPlan) -> None:
        self.plan = plan
        self.confirmed: list[str] = []
        self.cancelled: list[str] = []

    async def confirm_preemption(self, plan_id: str, /) -> PreemptionPlan:
        self.confirmed.append(plan_id)
        await asyncio.sleep(0)  # the other worker runs meanwhile
        return self.plan.model_copy(update={"state": PlanState.CONFIRMED})

    async def cancel_preemption(self, plan_id: str, /) -> None:
        self.cancelled.append(plan_id)


async def test_two_cycles_meeting_one_plan_carry_it_out_once(
    *, kube_api: client.ApiClient, namespace: str, uniq: Callable[[str], str]
) -> None:
    node = uniq("node")
    scheduler = uniq("sched")
    victim = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="victim", scheduler_name=scheduler, nodeName=node)
    )
    preemptor_body = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="preemptor", scheduler_name=scheduler)
    )
    preemptor = PodInfo(
        uid=preemptor_body["metadata"]["uid"],
        namespace=namespace,
        name="preemptor",
        scheduler_name=scheduler,
        priority=100,
    )
    plan = PreemptionPlan(
        plan_id="pln-once",
        node=node,
        pod_uid=preemptor.uid,
        victims=[
            PreemptionVictim(
                pod=VictimPod(namespace=namespace, name="victim", uid=victim["metadata"]["uid"]),
                frees={"cpu": "100m"},
            )
        ],
        lease_seconds=60,
        state=PlanState.PROPOSED,
    )
    rm = _StubRM(plan)
    outcomes: list[str] = []
    preemptions = Preemptions(
        api=kube_api,
        rm=rm,
        logger=log,
        count=outcomes.append,
        scope=lambda: PlanScope(rm_name="rm", scheduler_names=frozenset({scheduler})),
        nodes=lambda name: NodeProjection(name=name),
    )

    first, second = await asyncio.gather(
        preemptions.carry_out(preemptor, plan, asked="PreemptLowerPriority"),
        preemptions.carry_out(preemptor, plan, asked="PreemptLowerPriority"),
    )

    assert (first, second) == (True, True)
    preempted = [
        e
        for e in await events_of(kube_api, namespace=namespace, pod_name="victim")
        if e["reason"] == "Preempted"
    ]
    assert len(preempted) == 1, preempted
    assert rm.confirmed == ["pln-once"]
    assert rm.cancelled == []
    assert outcomes.count("victim_evicted") == 1, outcomes


async def test_a_victim_gone_before_its_eviction_gets_no_preempted_event(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A victim deleted by someone else between its DisruptionTarget condition and its eviction
    (the Eviction API answers 404) was not evicted by this plan: the plan goes on, but no
    `Preempted` event says so and `victim_evicted` does not count it."""
    node = uniq("node")
    scheduler = uniq("sched")
    victim = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="victim", scheduler_name=scheduler, nodeName=node)
    )
    preemptor_body = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="preemptor", scheduler_name=scheduler)
    )
    preemptor = PodInfo(
        uid=preemptor_body["metadata"]["uid"],
        namespace=namespace,
        name="preemptor",
        scheduler_name=scheduler,
        priority=100,
    )
    plan = PreemptionPlan(
        plan_id="pln-gone",
        node=node,
        pod_uid=preemptor.uid,
        victims=[
            PreemptionVictim(
                pod=VictimPod(namespace=namespace, name="victim", uid=victim["metadata"]["uid"]),
                frees={"cpu": "100m"},
            )
        ],
        lease_seconds=60,
    )
    real_answer_of = answer_of

    async def deleted_first(api: Any, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
        if path.endswith("/eviction") and not kwargs.get("query"):  # the real eviction, not the dry run
            await client.CoreV1Api(kube_api).delete_namespaced_pod(
                name="victim", namespace=namespace, grace_period_seconds=0
            )
        return await real_answer_of(api, method, path, **kwargs)

    monkeypatch.setattr(preemption, "answer_of", deleted_first)
    outcomes: list[str] = []
    preemptions = Preemptions(
        api=kube_api,
        rm=_StubRM(plan),
        logger=log,
        count=outcomes.append,
        scope=lambda: PlanScope(rm_name="rm", scheduler_names=frozenset({scheduler})),
        nodes=lambda name: NodeProjection(name=name),
    )

    assert await preemptions.carry_out(preemptor, plan, asked="PreemptLowerPriority")

    preempted = [
        e
        for e in await events_of(kube_api, namespace=namespace, pod_name="victim")
        if e["reason"] == "Preempted"
    ]
    assert preempted == []
    assert "victim_evicted" not in outcomes, outcomes
