"""What every chaos scenario shares: a seeded churn driver, a pool of nodes with the reference RM
behind a ResourceManager, the settle-and-check step and the one-line report.

Why a churn driver and not a fixed workload: the defects this suite hunts (a reservation leaked by
a crash between two writes, a pod bound twice after a restart, a node filled twice over) only show
when pods come and go *while* the fault happens. The driver creates pods of the served scheduler
name in bursts, deletes random ones (pending ones included, i.e. mid-cycle), cordons and uncordons
a node and replaces a node (deleting its pods first, as kube-controller-manager's pod GC would:
this pool is on the shared plane, which runs no controllers; `test_cluster_chaos.py` churns
Deployments and Jobs on the cluster plane). Every decision comes from one `random.Random(seed)`;
the seed is in every report and failure message so a run can be replayed (timing still varies).

The live load is kept at two thirds of the pool's CPU, so every pod fits once the faults stop:
"settled" means every pod bound, `settled_invariants` holding and `bindery audit` clean for this
test's namespace, ResourceManager and nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from bindery.audit.findings import overcommitted_nodes
from bindery.devcluster.nodes import create_node
from tests.operator.conftest import delete_rm, pod_body
from tests.realrm import RMProcess, audit_findings, double_schedules, serve_with, settled_invariants
from tests.rmproxy import RMFaultProxy, rm_fault_proxy

#: Seconds of faults per scenario: short in CI, `scripts/chaos --minutes N` sets it higher.
SECONDS = float(os.environ.get("BINDERY_CHAOS_SECONDS", "12"))
NODES = 3
NODE_CPU_M = 1200
POD_CPU_M = (100, 200)
POOL_LABEL = "bindery.dev/chaos-pool"
_TRANSIENT = (client.ApiException, aiohttp.ClientError, OSError, TimeoutError)


def chaos_seed() -> int:
    """`BINDERY_CHAOS_SEED` if set, else a fresh random seed (printed in every report)."""
    value = os.environ.get("BINDERY_CHAOS_SEED", "")
    return int(value) if value else random.SystemRandom().randrange(2**31)


def hard_timeout() -> float:
    """Upper bound on one scenario: its faults, settling, checks and process start-ups."""
    return SECONDS + 300.0


@dataclasses.dataclass
class Report:
    scenario: str
    seed: int
    pods: int = 0
    faults: int = 0
    findings: int = -1
    double: int = -1
    overcommitted: int = -1
    settle: float = -1.0
    detail: str = ""

    def line(self) -> str:
        return (
            f"chaos[{self.scenario}] seed={self.seed} pods={self.pods} faults={self.faults} "
            f"findings={self.findings} double={self.double} overcommitted={self.overcommitted} "
            f"settle={self.settle:.1f}s{(' ' + self.detail) if self.detail else ''}"
        )


class Pool:
    """Nodes labelled for this test, the reference RM mirroring exactly them, and the churn."""

    def __init__(
        self,
        *,
        api: client.ApiClient,
        namespace: str,
        rm: RMProcess,
        rm_name: str,
        scheduler: str,
        label: str,
        rng: random.Random,
        unschedulable_share: float = 0.0,
    ) -> None:
        self.api = api
        self.unschedulable_share = unschedulable_share
        self.namespace = namespace
        self.rm = rm
        self.rm_name = rm_name
        self.scheduler = scheduler
        self.label = label
        self.rng = rng
        self.nodes: list[str] = []
        self.created = 0
        self.churn_errors = 0
        self.replaced = 0
        self.proxy: RMFaultProxy | None = None
        self._live: dict[str, int] = {}  # pod name -> CPU millicores (what the driver believes lives)
        self._cordoned: str | None = None
        self._serial = 0

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def add_node(self) -> None:
        self._serial += 1
        name = f"cx-{self.label}-{self._serial}"
        await create_node(
            self.api,
            name=name,
            capacity={"cpu": f"{NODE_CPU_M}m", "memory": "64Gi", "pods": "110"},
            labels={POOL_LABEL: self.label},
        )
        self.nodes.append(name)

    # -- churn ------------------------------------------------------------------------------------

    async def churn(self, *, stop: asyncio.Event) -> None:
        """Seeded churn until `stop` is set; API errors (a restarting apiserver) are counted, not fatal."""
        while not stop.is_set():
            draw = self.rng.random()
            try:
                if draw < 0.55:
                    await self._burst()
                elif draw < 0.85:
                    await self._delete_some()
                elif draw < 0.95:
                    await self._cordon_toggle()
                else:
                    await self._replace_node()
            except _TRANSIENT:
                self.churn_errors += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.rng.uniform(0.2, 0.8))
        await self.restore()

    async def restore(self, *, within: float = 60.0) -> None:
        """Undo what a fault may have left half done: a cordon, a node deleted but not replaced."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self._cordoned is not None or len(self.nodes) < NODES:
            try:
                if self._cordoned is not None:
                    await self.core.patch_node(name=self._cordoned, body={"spec": {"unschedulable": False}})
                    self._cordoned = None
                else:
                    await self.add_node()
            except _TRANSIENT:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(1.0)

    async def _burst(self) -> None:
        budget = len(self.nodes) * NODE_CPU_M * 2 // 3 - sum(self._live.values())
        for _ in range(self.rng.randint(1, 6)):
            if self.rng.random() < self.unschedulable_share:
                # Fits no node: stays pending (queued, conditions written) until the churn deletes it.
                self.created += 1
                name = f"u{self.created:04d}"
                body = pod_body(name=name, scheduler_name=self.scheduler, cpu=f"{2 * NODE_CPU_M}m")
                self._live[name] = 0
                await self.core.create_namespaced_pod(namespace=self.namespace, body=body)
                continue
            cpu = self.rng.choice(POD_CPU_M)
            if cpu > budget:
                return
            self.created += 1
            name = f"c{self.created:04d}"
            body = pod_body(name=name, scheduler_name=self.scheduler, cpu=f"{cpu}m")
            self._live[name] = cpu  # before the call: a create whose answer is lost may have happened
            budget -= cpu
            await self.core.create_namespaced_pod(namespace=self.namespace, body=body)

    async def _delete_some(self) -> None:
        for name in self.rng.sample(sorted(self._live), k=min(len(self._live), self.rng.randint(1, 3))):
            with contextlib.suppress(client.ApiException):
                await self.core.delete_namespaced_pod(
                    name=name, namespace=self.namespace, grace_period_seconds=0
                )
            self._live.pop(name, None)

    async def _cordon_toggle(self) -> None:
        if self._cordoned is not None:
            await self.uncordon_all()
            return
        node = self.rng.choice(self.nodes)
        self._cordoned = node
        await self.core.patch_node(name=node, body={"spec": {"unschedulable": True}})

    async def uncordon_all(self) -> None:
        if self._cordoned is not None:
            await self.core.patch_node(name=self._cordoned, body={"spec": {"unschedulable": False}})
            self._cordoned = None

    async def _replace_node(self) -> None:
        """Delete a node and its pods (pod GC's job), then add a fresh one of the same size."""
        if self._cordoned is not None:
            return
        node = self.rng.choice(self.nodes)
        bound = await self.core.list_namespaced_pod(self.namespace, field_selector=f"spec.nodeName={node}")
        for pod in bound.items:
            with contextlib.suppress(client.ApiException):
                await self.core.delete_namespaced_pod(
                    name=pod.metadata.name, namespace=self.namespace, grace_period_seconds=0
                )
            self._live.pop(pod.metadata.name, None)
        await self.core.delete_node(name=node)
        self.nodes.remove(node)
        self.replaced += 1
        await self.add_node()

    # -- settling -----------------------------------------------------------------------------------

    async def pods(self) -> list[dict[str, Any]]:
        answer = await self.core.list_namespaced_pod(self.namespace, _preload_content=False)
        items: list[dict[str, Any]] = (await answer.json())["items"]
        return items

    async def settle(self, *, report: Report, within: float = 180.0) -> None:
        """Every pod bound, then the invariants and `bindery audit`; fills `report` (fails with it)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        pending: list[str] = []
        while loop.time() - started < within:
            with contextlib.suppress(*_TRANSIENT):
                pending = [
                    p["metadata"]["name"]
                    for p in await self.pods()
                    if not (p.get("spec") or {}).get("nodeName")
                ]
                if not pending:
                    break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(f"{report.line()}: {len(pending)} pods never bound, e.g. {pending[:5]}")
        # A pod scheduled twice stays so: fail at once (with the count) instead of waiting it out.
        doubles = await self.measure(report)
        if doubles:
            raise AssertionError(f"{report.line()}: pods scheduled more than once:\n" + "\n".join(doubles))
        left = max(30.0, within - (loop.time() - started))
        try:
            await settled_invariants(
                api=self.api,
                rm=self.rm,
                namespace=self.namespace,
                scheduler_names=[self.scheduler],
                within=left,
            )
        except AssertionError as exc:
            raise AssertionError(f"{report.line()}: {exc}") from None
        report.settle = loop.time() - started
        await self.measure(report)

    async def measure(self, report: Report) -> list[str]:
        """Fill the report's counts from what the apiserver says now; returns the double schedules."""
        events = await client.EventsV1Api(self.api).list_namespaced_event(
            self.namespace, _preload_content=False
        )
        doubles = double_schedules((await events.json())["items"])
        report.double = len(doubles)
        nodes = await self.core.list_node(label_selector=f"{POOL_LABEL}={self.label}", _preload_content=False)
        bound = await self.core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=", _preload_content=False
        )
        report.overcommitted = len(
            overcommitted_nodes(nodes=(await nodes.json())["items"], pods=(await bound.json())["items"])
        )
        report.pods = self.created
        return doubles

    async def audit(self, *, kubeconfig: pathlib.Path, report: Report) -> list[str]:
        """`bindery audit -o json -n <ns>` as a user runs it; the findings that concern this test."""
        try:
            relevant = await audit_findings(
                kubeconfig=kubeconfig, namespace=self.namespace, rm_name=self.rm_name, nodes=self.nodes
            )
        except AssertionError as exc:
            raise AssertionError(f"{report.line()}: {exc}") from None
        report.findings = len(relevant)
        return relevant


@contextlib.asynccontextmanager
async def pool(
    *,
    api: client.ApiClient,
    kubeconfig: pathlib.Path,
    namespace: str,
    directory: pathlib.Path,
    rng: random.Random,
    proxy_seed: int | None = None,
    unschedulable_share: float = 0.0,
) -> AsyncIterator[Pool]:
    """`NODES` fresh nodes, the reference RM (its own process) mirroring them, a ResourceManager
    serving a fresh scheduler name: at the RM, or with `proxy_seed` at an `RMFaultProxy` in front
    of it (faults off until the test sets its `rate`)."""
    label = uuid.uuid4().hex[:8]
    rm_name = f"chaos-{label}"
    made: Pool | None = None
    try:
        async with RMProcess(
            kubeconfig=kubeconfig, directory=directory / "rm", node_selector=f"{POOL_LABEL}={label}"
        ) as rm:
            made = Pool(
                api=api,
                namespace=namespace,
                rm=rm,
                rm_name=rm_name,
                scheduler=rm_name,
                label=label,
                rng=rng,
                unschedulable_share=unschedulable_share,
            )
            for _ in range(NODES):
                await made.add_node()
            async with contextlib.AsyncExitStack() as stack:
                spec: dict[str, Any] = {}
                if proxy_seed is not None:
                    made.proxy = await stack.enter_async_context(
                        rm_fault_proxy(upstream=rm.url, seed=proxy_seed, rate=0.0)
                    )
                    spec["endpoint"] = made.proxy.url
                await serve_with(
                    api, rm=rm, name=rm_name, scheduler_names=[rm_name], namespace=namespace, **spec
                )
                yield made
    finally:
        await delete_rm(api, name=rm_name)
        for node in made.nodes if made is not None else ():
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(api).delete_node(name=node)


async def check(
    *,
    the_pool: Pool,
    report: Report,
    admin_kubeconfig: pathlib.Path,
    logs: Sequence[pathlib.Path] = (),
) -> None:
    """Settle, audit, print the report line and assert it is all zeros."""
    try:
        await the_pool.settle(report=report)
        findings = await the_pool.audit(kubeconfig=admin_kubeconfig, report=report)
    except AssertionError:
        _print_logs(logs)
        raise
    print(f"\n{report.line()}")
    if findings or report.double or report.overcommitted:
        _print_logs(logs)
    assert not findings, f"{report.line()}: bindery audit found:\n" + "\n".join(findings)
    assert report.double == 0, report.line()
    assert report.overcommitted == 0, report.line()


def _print_logs(logs: Sequence[pathlib.Path]) -> None:
    for path in logs:
        with contextlib.suppress(OSError):
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-60:])
            print(f"--- {path.name} (tail) ---\n{tail}")
