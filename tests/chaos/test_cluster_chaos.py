"""Chaos through controllers: on the real-cluster plane (kube-controller-manager, kwok, kube-scheduler),
Bindery's pods come from a Deployment scaled up and down and from Jobs whose pods run and complete,
while the operator and the reference RM are SIGKILLed and restarted at random moments.

Seeded like the rest of the suite (`BINDERY_CHAOS_SEED`, `BINDERY_CHAOS_SECONDS`). The pool also holds
a DaemonSet and a Deployment of the default scheduler, placed first (see tests/cluster for why first).
The load stays within what the pool holds, so once the faults stop everything can settle: the
Deployment at its last scale with every pod Running, every Job complete, and then no pod scheduled
twice, no node overcommitted, every reservation committed to its pod's node or released, and
`bindery audit` clean. One report line per run, like the other scenarios.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import random
import uuid

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.chaos.harness import SECONDS, Report, chaos_seed, hard_timeout
from tests.realrm import audit_findings, invariant_violations
from tests.workloads import (
    Cluster,
    bindery_on,
    default_scheduler_share,
    deployment,
    eventually,
    job,
    kwok_pool,
)

pytestmark = [pytest.mark.chaos, pytest.mark.controlplane, pytest.mark.timeout(int(hard_timeout()) + 60)]

NODES = 3
MAX_REPLICAS = 8  # x 500m, plus two Jobs of parallelism 2 x 250m: well inside the 7.5 CPU left


async def test_chaos_controllers_churn_while_operator_and_rm_are_killed(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    seed = chaos_seed()
    report = Report(scenario="controllers", seed=seed)
    rng = random.Random(seed)
    namespace = cluster_namespace
    pool = uuid.uuid4().hex[:6]
    nodes = await kwok_pool(
        cluster_api, pool=pool, count=NODES, capacity={"cpu": "4", "memory": "8Gi", "pods": "30"}
    )
    view = Cluster(api=cluster_api, namespace=namespace)
    await default_scheduler_share(view, pool=pool, nodes=NODES)
    try:
        async with (
            asyncio.timeout(hard_timeout()),
            bindery_on(
                api=cluster_api,
                cluster=cluster,
                operator_kubeconfig=cluster_operator_kubeconfig,
                namespace=namespace,
                pool=pool,
                directory=tmp_path,
                operator_args=["--namespace", namespace],
            ) as stage,
        ):
            rm, scheduler, rm_name, operator = stage.rm, stage.scheduler, stage.rm_name, stage.operator
            replicas = 2
            await view.apps.create_namespaced_deployment(
                namespace, deployment("api", replicas=replicas, cpu="500m", scheduler=scheduler, pool=pool)
            )
            jobs: list[str] = []
            stop = asyncio.Event()

            async def churn() -> None:
                nonlocal replicas
                while not stop.is_set():
                    action = rng.choice(["scale", "scale", "delete", "job"])
                    try:
                        if action == "scale":
                            replicas = rng.randint(0, MAX_REPLICAS)
                            await view.apps.patch_namespaced_deployment_scale(
                                "api", namespace, {"spec": {"replicas": replicas}}
                            )
                        elif action == "delete":
                            pods = await view.pods("app=api")
                            if pods:  # pending ones too: deleted mid-cycle
                                victim = rng.choice(pods)["metadata"]["name"]
                                await view.core.delete_namespaced_pod(victim, namespace)
                        elif len(jobs) < 6:
                            name = f"batch-{len(jobs)}"
                            await view.batch.create_namespaced_job(
                                namespace,
                                job(
                                    name,
                                    completions=3,
                                    parallelism=2,
                                    cpu="250m",
                                    scheduler=scheduler,
                                    pool=pool,
                                ),
                            )
                            jobs.append(name)
                        report.pods = len(jobs) * 3 + replicas
                    except client.ApiException as exc:
                        if exc.status not in (404, 409):  # a pod already gone, a conflicting write
                            raise
                    await asyncio.sleep(rng.uniform(0.3, 1.2))

            async def faults() -> None:
                while True:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=rng.uniform(2.0, 4.0))
                    if stop.is_set():
                        return
                    if rng.random() < 0.5:
                        operator.kill()
                        await operator.wait()
                        await asyncio.sleep(rng.uniform(0.0, 1.0))
                        await operator.start()
                    else:
                        await rm.restart()
                    report.faults += 1

            tasks = [asyncio.create_task(churn()), asyncio.create_task(faults())]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=SECONDS)
            stop.set()
            await asyncio.gather(*tasks)
            assert report.faults > 0, report.line()

            loop = asyncio.get_running_loop()
            settling = loop.time()
            await eventually(
                lambda: view.running("app=api", replicas),
                within=120,
                what=f"the Deployment at {replicas} Running ({report.line()})",
            )

            async def jobs_complete() -> bool:
                for name in jobs:
                    status = (await view.batch.read_namespaced_job_status(name, namespace)).status
                    if (status.succeeded or 0) < 3:
                        return False
                return True

            await eventually(jobs_complete, within=120, what=f"the Jobs {jobs} complete ({report.line()})")
            lines: list[str] = []

            async def clean() -> bool:
                nonlocal lines
                lines = await invariant_violations(
                    api=cluster_api, rm=rm, namespace=namespace, scheduler_names=[scheduler]
                )
                report.double = len([line for line in lines if "was scheduled" in line])
                report.overcommitted = len([line for line in lines if line.startswith("node ")])
                found = await audit_findings(
                    kubeconfig=cluster.kubeconfig, namespace=namespace, rm_name=rm_name, nodes=nodes
                )
                report.findings = len(found)
                lines += found
                return not lines

            with contextlib.suppress(AssertionError):
                await eventually(clean, within=60, what="the invariants and a clean audit")
            report.settle = loop.time() - settling
            print(f"\n{report.line()}")
            assert not lines, f"{report.line()}:\n" + "\n".join(lines)
            assert report.findings == report.double == report.overcommitted == 0, report.line()
    finally:
        for node in nodes:
            with contextlib.suppress(client.ApiException):
                await view.core.delete_node(node)
