"""The operator SIGKILLed between confirming a preemption plan and binding its preemptor (issue 21).

Two 4-CPU nodes each hold two 2-CPU pods of priority 10; a 4-CPU pod of priority 100000 arrives, so
the reference RM (its own process, ``--mirror-nodes``) names both pods of one node as victims. The
victims carry a finalizer of this test: evicted, they stay Terminating, and the preemptor cannot
bind (the RM counts a terminating pod's requests until it is gone, as kube-scheduler does). That
pins the crash between "plan confirmed and victims evicted" and "preemptor bound" without racing a
log line: the operator (``bindery run`` as its own process) is SIGKILLed once both victims carry
their deletionTimestamp and ``Preempted`` event, and started again.

A second test stops it earlier, between the RM's confirm and its answer (the RM-side proxy of
``tests/rmproxy.py`` holds the answer while the test SIGKILLs the operator): nothing is nominated or
evicted yet, the RM holds the room. A third kills the leader of two replicas under leader
election after evicting: the standby, once leader, must take the plan up as a restart does.

Required afterwards: the restarted operator takes the plan up where the dead one left it (it does
not evict the victims a second time, nor pick new ones); once the finalizers go, the preemptor is
bound on the plan's node; no pod is bound twice, no node overcommitted, every reservation committed
to its pod's node or released (the harness's invariants and ``bindery audit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import create_pod, eventually, pod_body, read_pod, resource_manager
from tests.operator.test_leader_processes import _leader, grant_lease, replica
from tests.realrm import (
    RMProcess,
    audit_findings,
    operator_process,
    settled_invariants,
)
from tests.rmproxy import RMFaultProxy, rm_fault_proxy

POOL = "bindery.dev/test-pool"
HOLD = "bindery.dev/test-hold"  # keeps an evicted victim Terminating until the test lets it go
LOW, HIGH = 10, 100_000

pytestmark = pytest.mark.timeout(300)


class Stage:
    def __init__(
        self, *, api: client.ApiClient, namespace: str, token: str, rm: RMProcess, proxy: RMFaultProxy
    ) -> None:
        self.proxy = proxy  # between the operator and the RM; faults off, used to hold one answer
        self.api = api
        self.namespace = namespace
        self.token = token
        self.rm = rm
        self.scheduler = f"sched-{token}"
        self.rm_name = f"rm-{token}"
        self.nodes = [f"pc-{token}-{i}" for i in range(2)]

    async def create(self, name: str, *, priority: str, cpu: str, hold: bool = False) -> dict[str, Any]:
        body = pod_body(
            name=name,
            scheduler_name=self.scheduler,
            cpu=cpu,
            nodeSelector={POOL: self.token},
            priorityClassName=f"pc-{self.token}-{priority}",
            terminationGracePeriodSeconds=0,
        )
        if hold:
            body["metadata"]["finalizers"] = [HOLD]

        async def admitted() -> dict[str, Any] | None:  # the priority plugin caches PriorityClasses
            try:
                return await create_pod(self.api, namespace=self.namespace, body=body)
            except client.ApiException as exc:
                if exc.status == 403 and "PriorityClass" in str(exc.body):
                    return None
                raise

        created: dict[str, Any] = await eventually(admitted, what=f"pod {name} admitted")
        return created

    async def pods(self) -> dict[str, dict[str, Any]]:
        listed = await client.CoreV1Api(self.api).list_namespaced_pod(
            namespace=self.namespace, _preload_content=False
        )
        return {p["metadata"]["name"]: p for p in (await listed.json())["items"]}

    async def preempted_events(self) -> dict[str, int]:
        """``Preempted`` events per victim name."""
        listed = await client.EventsV1Api(self.api).list_namespaced_event(
            namespace=self.namespace, _preload_content=False
        )
        counts: dict[str, int] = {}
        for event in (await listed.json())["items"]:
            if event.get("reason") == "Preempted":
                name = (event.get("regarding") or {}).get("name", "")
                counts[name] = counts.get(name, 0) + 1
        return counts

    async def release(self, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(self.api).patch_namespaced_pod(
                    name=name, namespace=self.namespace, body={"metadata": {"finalizers": None}}
                )


@contextlib.asynccontextmanager
async def stage_of(
    *, controlplane: ControlPlane, api: client.ApiClient, namespace: str, directory: pathlib.Path
) -> AsyncIterator[Stage]:
    token = uuid.uuid4().hex[:8]
    scheduling = client.SchedulingV1Api(api)
    classes = {"low": LOW, "high": HIGH}
    stage: Stage | None = None
    try:
        for name, value in classes.items():
            await scheduling.create_priority_class(
                body={"metadata": {"name": f"pc-{token}-{name}"}, "value": value}
            )
        async with (
            RMProcess(
                kubeconfig=controlplane.kubeconfig,
                directory=directory / "rm",
                node_selector=f"{POOL}={token}",
            ) as rm,
            rm_fault_proxy(upstream=rm.url, seed=0, rate=0) as proxy,
        ):
            stage = Stage(api=api, namespace=namespace, token=token, rm=rm, proxy=proxy)
            for node in stage.nodes:
                await create_node(
                    api,
                    name=node,
                    capacity={"cpu": "4", "memory": "16Gi", "pods": "110"},
                    labels={POOL: token},
                )
            secret = f"rm-token-{token}"
            await client.CoreV1Api(api).create_namespaced_secret(
                namespace=namespace,
                body={
                    "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
                    "stringData": {"token": rm.token},
                },
            )
            async with resource_manager(
                api,
                name=stage.rm_name,
                scheduler_names=[stage.scheduler],
                endpoint=proxy.url,
                auth={"tokenSecretRef": {"namespace": namespace, "name": secret}},
                backoff={"initialSeconds": 0.2, "maxSeconds": 1},
            ):
                yield stage
    finally:
        if stage is not None:
            await stage.release([f"low-{i}" for i in range(4)])
            for node in stage.nodes:
                with contextlib.suppress(client.ApiException):
                    await client.CoreV1Api(api).delete_node(name=node)
        for name in classes:
            with contextlib.suppress(client.ApiException):
                await scheduling.delete_priority_class(name=f"pc-{token}-{name}")


LOW_PODS = [f"low-{i}" for i in range(4)]


async def fill(stage: Stage) -> dict[str, str]:
    """The four low pods (held by the finalizer once evicted), bound two per node: name -> node."""
    for name in LOW_PODS:
        await stage.create(name, priority="low", cpu="2", hold=True)

    async def all_bound() -> dict[str, str] | None:
        pods = await stage.pods()
        nodes = {n: (pods.get(n, {}).get("spec") or {}).get("nodeName") for n in LOW_PODS}
        return {n: str(v) for n, v in nodes.items() if v} if all(nodes.values()) else None

    placed: dict[str, str] = await eventually(all_bound, within=60, what="the four low pods bound")
    return placed


async def terminating(stage: Stage) -> list[str]:
    pods = await stage.pods()
    return sorted(n for n in LOW_PODS if pods[n]["metadata"].get("deletionTimestamp"))


async def finish(stage: Stage, *, controlplane: ControlPlane, node: str) -> list[str]:
    """Let the victims go once the restarted operator has evicted (or taken up) what it must; then
    the preemptor bound on ``node``, one ``Preempted`` event per victim, the invariants and the
    audit clean. Returns the victims."""

    victims: list[str] = await eventually(
        lambda: _evicted_with_events(stage), within=60, what="two victims evicted"
    )
    await stage.release(victims)
    bound = await eventually(
        lambda: _node_of(stage, "high"), within=60, what="the preemptor bound after the restart"
    )
    assert bound == node
    await settled_invariants(
        api=stage.api, rm=stage.rm, namespace=stage.namespace, scheduler_names=[stage.scheduler]
    )
    events = await stage.preempted_events()
    assert events == dict.fromkeys(victims, 1), f"Preempted events per victim: {events}"
    left = sorted((await stage.pods()).keys())
    assert left == sorted({*LOW_PODS, "high"} - set(victims)), left
    findings = await audit_findings(
        kubeconfig=controlplane.kubeconfig,
        namespace=stage.namespace,
        rm_name=stage.rm_name,
        nodes=stage.nodes,
    )
    assert not findings, findings
    return victims


async def test_operator_sigkilled_after_evicting_resumes_the_plan_and_binds_the_preemptor(
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
        placed = await fill(stage)
        await stage.create("high", priority="high", cpu="4")

        victims = await eventually(lambda: _evicted_with_events(stage), within=60, what="two victims evicted")
        plan_id = (await operator.wait_for_log(r"\(plan (pln-[0-9a-f]+)\)")).group(1)
        operator.kill()
        await operator.wait()
        assert placed[victims[0]] == placed[victims[1]], (victims, placed)
        assert not await _node_of(stage, "high")

        await operator.start()
        # The restarted operator meets the plan again: the RM answers it to the preemptor's reserve
        # while the victims terminate. It must say it takes the plan up, then evict nobody.
        await operator.wait_for_log(re.escape(plan_id), within=60)
        assert await finish(stage, controlplane=controlplane, node=placed[victims[0]]) == victims
        evicting = [line for line in operator.log().splitlines() if "preempting" in line]
        assert not evicting, f"the restarted operator evicted again: {evicting}"


async def test_operator_sigkilled_between_the_rms_confirm_and_its_answer_carries_out_the_plan_after_restart(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    """The RM has confirmed (its room is held), the operator never heard it: nothing nominated,
    nothing evicted. The proxy holds the confirm's answer while the test SIGKILLs the operator."""
    confirmed = asyncio.Event()
    answer = asyncio.Event()

    async def hold_the_first_confirm(method: str, path: str) -> None:
        if path.endswith(":confirm") and not confirmed.is_set():
            confirmed.set()
            await answer.wait()

    async with (
        stage_of(controlplane=controlplane, api=kube_api, namespace=namespace, directory=tmp_path) as stage,
        operator_process(
            kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--namespace", namespace]
        ) as operator,
    ):
        stage.proxy.answered = hold_the_first_confirm
        placed = await fill(stage)
        await stage.create("high", priority="high", cpu="4")
        try:
            await asyncio.wait_for(confirmed.wait(), timeout=60)
            operator.kill()
            await operator.wait()
        finally:
            answer.set()  # to a dead connection
        assert await terminating(stage) == [], "evicted before the confirm was answered"
        plan = re.findall(
            r"confirmed plan (pln-[0-9a-f]+) \(pod uid \S+, node (\S+)\)", stage.rm.log_path.read_text()
        )
        assert len(plan) == 1, plan
        await operator.start()
        victims = await finish(stage, controlplane=controlplane, node=plan[0][1])
        assert {placed[v] for v in victims} == {plan[0][1]}


async def test_leader_sigkilled_after_evicting_the_standby_takes_up_the_plan(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> None:
    """The same crash with two replicas under leader election: the standby, leader after the
    lease, meets the plan the dead leader confirmed and evicts nobody again."""
    lease = uniq("lease")
    await grant_lease(kube_api, namespace=namespace, lease_name=lease)
    async with (
        stage_of(controlplane=controlplane, api=kube_api, namespace=namespace, directory=tmp_path) as stage,
        replica(
            kubeconfig=operator_kubeconfig, directory=tmp_path, name="first", namespace=namespace, lease=lease
        ) as first,
        replica(
            kubeconfig=operator_kubeconfig,
            directory=tmp_path,
            name="second",
            namespace=namespace,
            lease=lease,
        ) as second,
    ):
        leader = await _leader(first, second)
        standby = second if leader is first else first
        placed = await fill(stage)
        await stage.create("high", priority="high", cpu="4")
        plan_id = (await leader.wait_for_log(r"\(plan (pln-[0-9a-f]+)\)")).group(1)
        victims = await eventually(
            lambda: _evicted_with_events(stage), within=60, what="two victims evicted by the leader"
        )
        leader.kill()
        await leader.wait()
        await standby.wait_for_log("became the leader", within=60)
        await standby.wait_for_log(re.escape(plan_id), within=60)
        assert await finish(stage, controlplane=controlplane, node=placed[victims[0]]) == victims
        evicting = [line for line in standby.log().splitlines() if "preempting" in line]
        assert not evicting, f"the new leader evicted again: {evicting}"


async def _evicted_with_events(stage: Stage) -> list[str] | None:
    """The victims once both are Terminating and have their Preempted event."""
    gone = await terminating(stage)
    events = await stage.preempted_events()
    return gone if len(gone) == 2 and all(events.get(n) for n in gone) else None


async def _node_of(stage: Stage, name: str) -> str | None:
    pod = await read_pod(stage.api, namespace=stage.namespace, name=name)
    node = pod["spec"].get("nodeName")
    return str(node) if node else None
