"""The operator SIGKILLed after evicting for a gang preemptor (issue 21, item 4).

The crash test of ``test_preemption_crash.py``, with a pod group as the preemptor: two 4-CPU nodes
each hold two 2-CPU pods of priority 10 (kept Terminating once evicted by the test's finalizer), and
a priority-100000 group of two 2-CPU members arrives, so the group's plan names two victims. Once
both are Terminating with their ``Preempted`` event the operator (``bindery run``, its own process)
is SIGKILLed and started again. The restarted operator must take the group's plan up (the RM answers
it again to the group's reserve), evict nobody a second time, and bind both members once the
victims are gone, with the harness's invariants and ``bindery audit`` clean.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.gangs.scenarios import pod_group
from tests.operator.conftest import create_pod, eventually, pod_body
from tests.operator.test_preemption_crash import LOW_PODS, Stage, fill, stage_of, terminating
from tests.realrm import audit_findings, operator_process, settled_invariants

pytestmark = pytest.mark.timeout(300)

MEMBERS = ["train-0", "train-1"]


async def _create_group(stage: Stage) -> None:
    await client.CustomObjectsApi(stage.api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", stage.namespace, "podgroups", pod_group("train", min_count=2)
    )
    for name in MEMBERS:
        body = pod_body(
            name=name,
            scheduler_name=stage.scheduler,
            cpu="2",
            nodeSelector={"bindery.dev/test-pool": stage.token},
            priorityClassName=f"pc-{stage.token}-high",
            terminationGracePeriodSeconds=0,
            schedulingGroup={"podGroupName": "train"},
        )

        async def admitted(body: dict[str, Any] = body) -> dict[str, Any] | None:
            try:
                return await create_pod(stage.api, namespace=stage.namespace, body=body)
            except client.ApiException as exc:  # the priority plugin caches PriorityClasses
                if exc.status == 403 and "PriorityClass" in str(exc.body):
                    return None
                raise

        await eventually(admitted, what=f"member {name} admitted")


async def _evicted_with_events(stage: Stage) -> list[str] | None:
    gone = await terminating(stage)
    events = await stage.preempted_events()
    return gone if len(gone) == 2 and all(events.get(n) for n in gone) else None


async def _members_bound(stage: Stage) -> dict[str, str] | None:
    pods = await stage.pods()
    nodes = {n: (pods.get(n, {}).get("spec") or {}).get("nodeName") for n in MEMBERS}
    return {n: str(v) for n, v in nodes.items() if v} if all(nodes.values()) else None


async def test_operator_sigkilled_after_evicting_for_a_gang_takes_the_plan_up_and_binds_every_member(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    async with (
        stage_of(controlplane=controlplane, api=kube_api, namespace=namespace, directory=tmp_path) as stage,
        operator_process(
            kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--namespace", namespace]
        ) as operator,
    ):
        await fill(stage)
        await _create_group(stage)
        victims = await eventually(lambda: _evicted_with_events(stage), within=60, what="two victims evicted")
        plan_id = (await operator.wait_for_log(r"\(plan (pln-[0-9a-f]+)\)")).group(1)
        operator.kill()
        await operator.wait()
        assert await _members_bound(stage) is None

        await operator.start()
        await operator.wait_for_log(re.escape(plan_id), within=60)  # the plan taken up, not a new one
        await stage.release(victims)
        bound = await eventually(lambda: _members_bound(stage), within=60, what="both members bound")
        assert len(bound) == 2, bound
        await settled_invariants(
            api=stage.api, rm=stage.rm, namespace=stage.namespace, scheduler_names=[stage.scheduler]
        )
        events = await stage.preempted_events()
        assert events == dict.fromkeys(victims, 1), f"Preempted events per victim: {events}"
        left = sorted((await stage.pods()).keys())
        assert left == sorted({*LOW_PODS, *MEMBERS} - set(victims)), left
        findings = await audit_findings(
            kubeconfig=controlplane.kubeconfig,
            namespace=stage.namespace,
            rm_name=stage.rm_name,
            nodes=stage.nodes,
        )
        assert not findings, findings
        evicting = [line for line in operator.log().splitlines() if "preempting" in line]
        assert not evicting, f"the restarted operator evicted again: {evicting}"
