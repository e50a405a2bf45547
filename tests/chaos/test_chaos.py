"""Chaos scenarios: seeded churn of pods and nodes while one kind of fault hits a real process.

Each scenario runs the churn and its fault for `BINDERY_CHAOS_SECONDS` (12 s in CI; `scripts/chaos
--minutes N` sets more), stops the fault, lets things settle and then requires: every pod bound,
`settled_invariants` (no pod scheduled twice, no node overcommitted, every reservation committed to
its pod's node or released) and `bindery audit -o json` clean for this test's namespace, RM and
nodes. It prints one line per scenario (pods, faults, findings, double binds, overcommitted nodes,
seconds to settle) with the seed; `BINDERY_CHAOS_SEED=<seed>` replays the same random choices.

The faults: the operator SIGKILLed at random moments and restarted; the reference RM SIGKILLed and
restarted (same port, same database); the kube-apiserver restarted with etcd kept (a plane of the
scenario's own, so the session's plane stays up); a proxy between operator and RM injecting every
fault kind of `tests.rmproxy`; two replicas with leader election whose leader is SIGSTOPped past
its lease, then SIGCONTed (with one Lease, and with a Lease per ResourceManager).

Pods made by Deployments and Jobs, pods that run and complete: `test_cluster_chaos.py`, on the
cluster plane (kube-controller-manager, kwok, kube-scheduler). Namespace deletion: tests/cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.devcluster.plane import ControlPlane
from tests.chaos.harness import SECONDS, Pool, Report, chaos_seed, check, hard_timeout, pool
from tests.conftest import OPERATOR_USER, api_client_for
from tests.operator.conftest import eventually, now
from tests.operator.test_leader_processes import grant_lease
from tests.realrm import OperatorProcess, operator_process
from tests.rmproxy import KINDS

pytestmark = [pytest.mark.chaos, pytest.mark.controlplane, pytest.mark.timeout(int(hard_timeout()) + 60)]

LEASE_ARGS = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1"]
LEASE_SECONDS = 4.0


async def pause(stop: asyncio.Event, seconds: float) -> bool:
    """Wait `seconds` or until `stop`; True if stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()


async def drive(the_pool: Pool, *, faults: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
    """Churn and faults together for `SECONDS`; both end in a healthy state before this returns."""
    stop = asyncio.Event()
    churn = asyncio.create_task(the_pool.churn(stop=stop))
    injecting = asyncio.create_task(faults(stop))
    try:
        await pause(stop, SECONDS)
    finally:
        stop.set()
        await injecting
        await churn


async def test_chaos_operator_sigkilled_and_restarted(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    seed = chaos_seed()
    report = Report(scenario="operator-kill", seed=seed)
    rng = random.Random(seed + 1)
    async with (
        asyncio.timeout(hard_timeout()),
        pool(
            api=kube_api,
            kubeconfig=controlplane.kubeconfig,
            namespace=namespace,
            directory=tmp_path,
            rng=random.Random(seed),
        ) as the_pool,
        operator_process(
            kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--namespace", namespace]
        ) as operator,
    ):

        async def faults(stop: asyncio.Event) -> None:
            while not await pause(stop, rng.uniform(2.0, 5.0)):
                operator.kill()
                await operator.wait()
                report.faults += 1
                await asyncio.sleep(rng.uniform(0.0, 1.0))
                await operator.start()

        await drive(the_pool, faults=faults)
        assert report.faults > 0, report.line()
        await check(
            the_pool=the_pool,
            report=report,
            admin_kubeconfig=controlplane.kubeconfig,
            logs=[operator.log_path, the_pool.rm.log_path],
        )


async def test_chaos_reference_rm_sigkilled_and_restarted(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    seed = chaos_seed()
    report = Report(scenario="rm-kill", seed=seed)
    rng = random.Random(seed + 1)
    async with (
        asyncio.timeout(hard_timeout()),
        pool(
            api=kube_api,
            kubeconfig=controlplane.kubeconfig,
            namespace=namespace,
            directory=tmp_path,
            rng=random.Random(seed),
        ) as the_pool,
        operator_process(
            kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--namespace", namespace]
        ) as operator,
    ):
        rm = the_pool.rm

        async def faults(stop: asyncio.Event) -> None:
            while not await pause(stop, rng.uniform(1.5, 4.0)):
                rm.kill()
                await rm.wait()
                report.faults += 1
                await asyncio.sleep(rng.uniform(0.0, 2.0))
                await rm.start()

        await drive(the_pool, faults=faults)
        assert report.faults > 0, report.line()
        await check(
            the_pool=the_pool,
            report=report,
            admin_kubeconfig=controlplane.kubeconfig,
            logs=[operator.log_path, rm.log_path],
        )


async def test_chaos_apiserver_restarted_with_etcd_kept(tmp_path: pathlib.Path) -> None:
    seed = chaos_seed()
    report = Report(scenario="apiserver-restart", seed=seed)
    rng = random.Random(seed + 1)
    with ControlPlane.start() as plane:
        api = await api_client_for(str(plane.kubeconfig))
        try:
            await apply_crd(api=api)
            await grant_operator(api=api, user=OPERATOR_USER)
            operator_kubeconfig = plane.mint_kubeconfig(user=OPERATOR_USER)
            namespace = "chaos"
            await client.CoreV1Api(api).create_namespace(body={"metadata": {"name": namespace}})
            async with (
                asyncio.timeout(hard_timeout()),
                pool(
                    api=api,
                    kubeconfig=plane.kubeconfig,
                    namespace=namespace,
                    directory=tmp_path,
                    rng=random.Random(seed),
                ) as the_pool,
                operator_process(
                    kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--namespace", namespace]
                ) as operator,
            ):

                async def faults(stop: asyncio.Event) -> None:
                    while not await pause(stop, rng.uniform(1.0, 4.0)):
                        await asyncio.to_thread(plane.restart_apiserver, down_seconds=rng.uniform(0.5, 4.0))
                        report.faults += 1

                await drive(the_pool, faults=faults)
                assert report.faults > 0, report.line()
                report.detail = f"churn_errors={the_pool.churn_errors}"
                await check(
                    the_pool=the_pool,
                    report=report,
                    admin_kubeconfig=plane.kubeconfig,
                    logs=[operator.log_path, the_pool.rm.log_path],
                )
        finally:
            await api.close()


async def test_chaos_rm_fault_proxy_injects_every_fault_kind(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    seed = chaos_seed()
    report = Report(scenario="rm-proxy", seed=seed)
    async with (
        asyncio.timeout(hard_timeout()),
        pool(
            api=kube_api,
            kubeconfig=controlplane.kubeconfig,
            namespace=namespace,
            directory=tmp_path,
            rng=random.Random(seed),
            proxy_seed=seed + 1,
        ) as the_pool,
        operator_process(
            kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--namespace", namespace]
        ) as operator,
    ):
        proxy = the_pool.proxy
        assert proxy is not None

        async def faults(stop: asyncio.Event) -> None:
            proxy.rate = 0.35
            await stop.wait()
            proxy.rate = 0.0

        await drive(the_pool, faults=faults)
        report.faults = proxy.injected
        report.detail = f"requests={proxy.requests} " + ",".join(f"{k}={proxy.faults[k]}" for k in KINDS)
        assert all(proxy.faults[kind] for kind in KINDS), (
            f"not every fault kind was injected: {report.line()}"
        )
        await check(
            the_pool=the_pool,
            report=report,
            admin_kubeconfig=controlplane.kubeconfig,
            logs=[operator.log_path, the_pool.rm.log_path],
        )


def leading(process: OperatorProcess) -> bool:
    log = process.log()
    return process.running and log.rfind("became the leader") > log.rfind("stopped leading")


@pytest.mark.parametrize("per_rm", [False, True], ids=["one-lease", "lease-per-resource-manager"])
async def test_chaos_leader_sigstopped_past_its_lease(
    *,
    per_rm: bool,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    seed = chaos_seed()
    report = Report(scenario="leader-freeze-per-rm" if per_rm else "leader-freeze", seed=seed)
    rng = random.Random(seed + 1)
    lease = f"chaos-{seed}"
    # a Lease per ResourceManager: the pool's profile is led under `chaos-<seed>-<its name>`
    await grant_lease(kube_api, namespace=namespace, lease_name=None if per_rm else lease)
    args = ["--namespace", namespace, "--leader-elect", "--lease-namespace", namespace, "--lease-name", lease]
    if per_rm:
        args.append("--lease-per-resource-manager")
    async with (
        asyncio.timeout(hard_timeout()),
        pool(
            api=kube_api,
            kubeconfig=controlplane.kubeconfig,
            namespace=namespace,
            directory=tmp_path,
            rng=random.Random(seed),
        ) as the_pool,
        operator_process(
            kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=[*args, *LEASE_ARGS], name="one"
        ) as one,
        operator_process(
            kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=[*args, *LEASE_ARGS], name="two"
        ) as two,
    ):
        replicas = (one, two)
        await eventually(
            lambda: now(any(leading(r) for r in replicas)), within=60, what="a leader among the replicas"
        )

        async def revive() -> None:
            """A replica that exited (a woken leader may) comes back, as its Deployment would bring it."""
            for replica in replicas:
                if not replica.running:
                    await replica.wait()
                    await replica.start()

        async def faults(stop: asyncio.Event) -> None:
            while not await pause(stop, rng.uniform(1.0, 3.0)):
                await revive()
                leader = next((r for r in replicas if leading(r)), None)
                if leader is None:
                    continue
                leader.pause()
                report.faults += 1
                await asyncio.sleep(LEASE_SECONDS + rng.uniform(0.5, 3.0))
                leader.resume()
            await revive()

        await drive(the_pool, faults=faults)
        assert report.faults > 0, report.line()
        await check(
            the_pool=the_pool,
            report=report,
            admin_kubeconfig=controlplane.kubeconfig,
            logs=[one.log_path, two.log_path, the_pool.rm.log_path],
        )
