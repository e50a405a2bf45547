"""A failed eviction takes back the victim's DisruptionTarget condition (issue 35, a Low).

Like kube-scheduler, Bindery marks a victim ``DisruptionTarget=True`` before evicting it, so the
pod's own handlers see why it goes. When the eviction then fails (the apiserver answers 5xx or
does not answer), the pod keeps running: left ``True``, the condition tells its controllers and
every tool that it is about to be disrupted, for nothing. The 5xx is one the apiserver does not
produce on its own, so a proxy in front of the real apiserver (tests/operator/apiproxy.py)
answers the real eviction (not its dry run) with 503.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable

from kubernetes_asyncio import client

from bindery.controller.preemption import Preemptions
from bindery.devcluster.plane import ControlPlane
from bindery.rm.models import PlanState, PreemptionPlan, PreemptionVictim, VictimPod
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from bindery.scheduling.preemption import PlanScope
from tests.conftest import OPERATOR_USER, api_client_for
from tests.operator.apiproxy import serve_api_proxy
from tests.operator.conftest import create_pod, pod_body, read_pod

log = logging.getLogger(__name__)


class _StubRM:
    def __init__(self, plan: PreemptionPlan) -> None:
        self.plan = plan
        self.cancelled: list[str] = []

    async def confirm_preemption(self, plan_id: str, /) -> PreemptionPlan:
        return self.plan.model_copy(update={"state": PlanState.CONFIRMED})

    async def cancel_preemption(self, plan_id: str, /) -> None:
        self.cancelled.append(plan_id)


async def test_a_victim_whose_eviction_failed_is_no_disruption_target(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> None:
    node, scheduler = uniq("node"), uniq("sched")
    victim = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="victim", scheduler_name=scheduler, nodeName=node)
    )
    high = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="high", scheduler_name=scheduler)
    )
    preemptor = PodInfo(
        uid=high["metadata"]["uid"], namespace=namespace, name="high", scheduler_name=scheduler, priority=100
    )
    plan = PreemptionPlan(
        plan_id="pln-503",
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
    rm = _StubRM(plan)
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as proxy:
        proxy.eviction_status = 503
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=proxy.url
        )
        api = await api_client_for(str(kubeconfig))
        try:
            preemptions = Preemptions(
                api=api,
                rm=rm,
                logger=log,
                scope=lambda: PlanScope(rm_name="rm", scheduler_names=frozenset({scheduler})),
                nodes=lambda name: NodeProjection(name=name),
            )
            assert not await preemptions.carry_out(preemptor, plan, asked="PreemptLowerPriority")
        finally:
            await api.close()
    assert proxy.failed_evictions == 1
    assert rm.cancelled == ["pln-503"]
    body = await read_pod(kube_api, namespace=namespace, name="victim")
    assert body["metadata"].get("deletionTimestamp") is None  # not evicted
    targets = [c for c in body["status"].get("conditions") or () if c["type"] == "DisruptionTarget"]
    assert [c["status"] for c in targets] in ([], ["False"]), targets
