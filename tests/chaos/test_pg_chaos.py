"""Chaos with Bindery on top of the reference RM's replicas on PostgreSQL (issue 22).

The deployment's shape, as processes: the operator (`bindery run`), two `bindery rm serve --db
postgresql://…` replicas on one database of the project's PostgreSQL (`bindery.devcluster.postgres`),
and a round-robin TCP proxy in front of them (`bindery.devcluster.rrproxy`, a Service's role); the
ResourceManager's endpoint is the proxy. A burst of pods asks for more CPU than the pool has; while
the burst is placed and until every pod is bound, one kind of fault again and again:

- ``replica-kill``: one replica SIGKILLed, started again a moment later (as its Deployment would);
- ``postgres-restart``: PostgreSQL SIGKILLed (no shutdown checkpoint) and started again;
- ``proxy-drop``: the proxy refuses, or cuts after the replica applied the call (a lost answer),
  three new connections in ten, and aborts every open connection every 0.3-1 s.

Then room is freed (bound pods deleted until what remains fits) and the scenario ends when every
pod is bound and these hold, judged by `independent_violations` (SQL on the RM's rows and the
apiserver's pods and events; nothing of the store's code) and by `bindery audit -o json`:

- no pod scheduled twice (its `Scheduled` events), no node overcommitted counted from the pods *and*
  counted from the RM's active rows;
- no reservation lost: each bound pod has exactly one active row, committed, for its UID on its node;
- none doubled: no pod UID with two active rows; none leaked: every active row is a bound pod's.

CI runs ``replica-kill`` with 36 pods for 30 slots (< 60 s); ``BINDERY_PG_CHAOS=full`` runs the
three scenarios with 90 pods for 60 slots each:
``BINDERY_PG_CHAOS=full .venv/bin/pytest tests/chaos/test_pg_chaos.py -s``.
Each prints one line (pods, faults and the pods bound at each, connections per replica, seconds to
settle) with its seed
(``BINDERY_CHAOS_SEED`` replays the choices; timing still varies).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import random
import signal
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.devcluster.postgres import PostgresServer
from bindery.devcluster.rrproxy import RoundRobinProxy, round_robin_proxy
from tests.chaos.harness import chaos_seed
from tests.operator.conftest import delete_rm, pod_body
from tests.pgcheck import active_rows, independent_violations
from tests.realrm import RMProcess, audit_findings, operator_process, serve_with

FULL = os.environ.get("BINDERY_PG_CHAOS", "") == "full"
SCENARIOS = ("replica-kill", "postgres-restart", "proxy-drop") if FULL else ("replica-kill",)
NODES = 6 if FULL else 3
NODE_CPU_M = 1000
POD_CPU_M = 100
#: The pool's room in pods; the burst asks for more, so placements race for the last of it.
ROOM = NODES * NODE_CPU_M // POD_CPU_M
BURST = 90 if FULL else 36
#: Bound pods deleted once the pool is full, so that every remaining pod fits (with 3 to spare).
FREED = BURST - ROOM + 3
POOL_LABEL = "bindery.dev/pgchaos-pool"
REPLICAS = 2
#: Replica or PostgreSQL kills per scenario (the proxy's cuts are not capped).
MAX_FAULTS = 6 if FULL else 3
#: Pods created back to back before a short pause.
WAVE = 6

pytestmark = [pytest.mark.chaos, pytest.mark.controlplane, pytest.mark.timeout(420)]


# -- the stage ------------------------------------------------------------------------------------


class Stage:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        namespace: str,
        db: str,
        replicas: Sequence[RMProcess],
        proxy: RoundRobinProxy,
        nodes: Sequence[str],
        scheduler: str,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.db = db
        self.replicas = replicas
        self.proxy = proxy
        self.nodes = list(nodes)
        self.scheduler = scheduler

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def pods(self) -> list[dict[str, Any]]:
        answer = await self.core.list_namespaced_pod(self.namespace, _preload_content=False)
        items: list[dict[str, Any]] = (await answer.json())["items"]
        return items

    async def bound(self) -> list[dict[str, Any]]:
        return [p for p in await self.pods() if (p.get("spec") or {}).get("nodeName")]

    async def violations(self) -> list[str]:
        events = await client.EventsV1Api(self.api).list_namespaced_event(
            self.namespace, _preload_content=False
        )
        rows = await asyncio.to_thread(active_rows, self.db)
        return independent_violations(
            rows=rows,
            nodes=dict.fromkeys(self.nodes, NODE_CPU_M),
            pods=await self.pods(),
            events=(await events.json())["items"],
            namespace=self.namespace,
        )


@contextlib.asynccontextmanager
async def stage(
    *,
    api: client.ApiClient,
    kubeconfig: pathlib.Path,
    namespace: str,
    db: str,
    postgres: PostgresServer,
    directory: pathlib.Path,
    seed: int,
) -> AsyncIterator[Stage]:
    label = uuid.uuid4().hex[:8]
    rm_name = f"pgchaos-{label}"
    nodes = [f"pg-{label}-{index}" for index in range(NODES)]
    token = uuid.uuid4().hex
    options = ["--db-password-file", str(postgres.password_file)]
    try:
        for name in nodes:
            await create_node(
                api,
                name=name,
                capacity={"cpu": f"{NODE_CPU_M}m", "memory": "64Gi", "pods": "110"},
                labels={POOL_LABEL: label},
            )
        async with contextlib.AsyncExitStack() as stack:
            replicas = [
                await stack.enter_async_context(
                    RMProcess(
                        kubeconfig=kubeconfig,
                        directory=directory / f"rm{index}",
                        node_selector=f"{POOL_LABEL}={label}",
                        db=db,
                        token=token,
                        options=options,
                    )
                )
                for index in range(REPLICAS)
            ]
            proxy = await stack.enter_async_context(
                round_robin_proxy(upstreams=[r.url for r in replicas], seed=seed)
            )
            await serve_with(
                api,
                rm=replicas[0],
                name=rm_name,
                scheduler_names=[rm_name],
                namespace=namespace,
                endpoint=proxy.url,
            )
            yield Stage(
                api=api,
                namespace=namespace,
                db=db,
                replicas=replicas,
                proxy=proxy,
                nodes=nodes,
                scheduler=rm_name,
            )
    finally:
        await delete_rm(api, name=rm_name)
        for name in nodes:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(api).delete_node(name=name)


async def inject(
    scenario: str,
    the_stage: Stage,
    postgres: PostgresServer,
    rng: random.Random,
    *,
    stop: asyncio.Event,
    bound_at: list[int],
) -> None:
    """The scenario's fault, again and again until `stop` (at most `MAX_FAULTS` kills); each one
    ends healthy (the replica or PostgreSQL started again). `bound_at`: pods bound at each fault."""
    proxy = the_stage.proxy
    if scenario == "proxy-drop":
        proxy.drop_rate = 0.3
    try:
        while not stop.is_set() and (scenario == "proxy-drop" or len(bound_at) < MAX_FAULTS):
            bound_at.append(len(await the_stage.bound()))
            if scenario == "replica-kill":
                victim = the_stage.replicas[rng.randrange(REPLICAS)]
                victim.kill(signal.SIGKILL)
                await victim.wait()
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                await victim.start()  # same port, same database, as its Deployment would
            elif scenario == "postgres-restart":
                await asyncio.to_thread(postgres.kill, signal.SIGKILL)
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                await asyncio.to_thread(postgres.restart)
            else:
                assert scenario == "proxy-drop", scenario
                proxy.cut_all()
            pause = rng.uniform(0.3, 1.0) if scenario == "proxy-drop" else rng.uniform(1.0, 3.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=pause)
    finally:
        proxy.drop_rate = 0.0


async def wait_until(what: str, check: Any, *, within: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: object = None
    while loop.time() < deadline:
        last = await check()
        if last is True or last == []:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} not within {within:g}s: {last}")


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_bindery_on_two_rm_replicas_on_postgres_survives(
    *,
    scenario: str,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    postgres: PostgresServer,
    postgres_db: str,
    tmp_path: pathlib.Path,
) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    try:
        async with (
            asyncio.timeout(360),
            stage(
                api=kube_api,
                kubeconfig=controlplane.kubeconfig,
                namespace=namespace,
                db=postgres_db,
                postgres=postgres,
                directory=tmp_path,
                seed=seed,
            ) as the_stage,
            operator_process(
                kubeconfig=operator_kubeconfig, directory=tmp_path / "op", args=["--namespace", namespace]
            ) as operator,
        ):
            logs = [operator.log_path, *(r.log_path for r in the_stage.replicas)]
            started = loop.time()

            async def wave(first: int) -> None:
                for index in range(first, min(first + WAVE, BURST)):
                    body = pod_body(
                        name=f"p{index:03d}", scheduler_name=the_stage.scheduler, cpu=f"{POD_CPU_M}m"
                    )
                    await the_stage.core.create_namespaced_pod(namespace=namespace, body=body)

            # The first wave shows the operator is up; then faults until every pod is bound, while
            # the rest of the burst comes in waves (a wave places in well under a second).
            await wave(0)
            await wait_until("the first pod bound", lambda: _at_least(the_stage, 1), within=120)
            stop = asyncio.Event()
            bound_at: list[int] = []
            faults = asyncio.create_task(
                inject(scenario, the_stage, postgres, rng, stop=stop, bound_at=bound_at)
            )
            try:
                for first in range(WAVE, BURST, WAVE):
                    await asyncio.sleep(rng.uniform(0.3, 0.8))
                    await wave(first)
                await wait_until("the pool full", lambda: _at_least(the_stage, ROOM), within=180)
                # Free room: delete bound pods until every remaining pod fits.
                bound = sorted(p["metadata"]["name"] for p in await the_stage.bound())
                for name in rng.sample(bound, FREED):
                    await the_stage.core.delete_namespaced_pod(
                        name=name, namespace=namespace, grace_period_seconds=0
                    )
                await wait_until("every pod bound", lambda: _all_bound(the_stage), within=180)
            finally:
                stop.set()
                await faults
            await wait_until("every pod bound", lambda: _all_bound(the_stage), within=120)
            await wait_until("the invariants", the_stage.violations, within=90)
            settle = loop.time() - started
            findings = await audit_findings(
                kubeconfig=controlplane.kubeconfig,
                namespace=namespace,
                rm_name=the_stage.scheduler,
                nodes=the_stage.nodes,
            )
            print(
                f"\npgchaos[{scenario}] seed={seed} pods={BURST} freed={FREED} faults={len(bound_at)} "
                f"bound_at_faults={bound_at} proxy_faults={dict(the_stage.proxy.faults)} "
                f"connections={dict(the_stage.proxy.connections)} unreachable={the_stage.proxy.unreachable} "
                f"findings={len(findings)} settle={settle:.1f}s"
            )
            assert findings == [], "bindery audit found:\n" + "\n".join(findings)
    except BaseException:
        _print_logs(locals().get("logs", []))
        raise
    finally:
        if not postgres.running:
            postgres.restart()


async def _at_least(the_stage: Stage, count: int) -> bool | str:
    bound = len(await the_stage.bound())
    return True if bound >= count else f"{bound} bound"


async def _all_bound(the_stage: Stage) -> bool | str:
    pending = [
        p["metadata"]["name"] for p in await the_stage.pods() if not (p.get("spec") or {}).get("nodeName")
    ]
    return True if not pending else f"{len(pending)} pending, e.g. {pending[:5]}"


def _print_logs(logs: Sequence[pathlib.Path]) -> None:
    for path in logs:
        with contextlib.suppress(OSError):
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-40:])
            print(f"--- {path.parent.name}/{path.name} (tail) ---\n{tail}")
