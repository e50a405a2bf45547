"""The soak: steady pod and node churn against a real operator process, sampled every interval.

Why: a scheduler that runs for months must not grow with the number of pods it has *seen*, only
with the number it *holds*. Every interval this prints the operator's resident memory and open file
descriptors (from /proc/PID), its event loop's task count and the entries of its per-pod structures
(both scraped from its metrics: `bindery_asyncio_tasks`, `bindery_per_pod_entries{structure}`).
Over a long run those must stay flat; after the churn stops and every pod is deleted the per-pod
entries must all return to 0.

`scripts/soak --minutes N` runs it on a control plane of its own; `test_soak.py` runs its loop for
about half a minute on the session's plane.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import pathlib
import random
import re
import sys
import tempfile
from collections.abc import Callable

import aiohttp
from kubernetes_asyncio import client

from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.devcluster.plane import ControlPlane
from tests.chaos.harness import Pool, pool
from tests.conftest import OPERATOR_USER, api_client_for
from tests.realrm import OperatorProcess, operator_process

_TASKS = re.compile(r"^bindery_asyncio_tasks (\S+)$", re.MULTILINE)
_PER_POD = re.compile(r'^bindery_per_pod_entries\{structure="([^"]+)"\} (\S+)$', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Sample:
    seconds: float
    rss_kib: int
    fds: int
    tasks: int | None
    per_pod: dict[str, int]
    pods: int
    created: int

    def line(self) -> str:
        tasks = "?" if self.tasks is None else str(self.tasks)
        entries = " ".join(f"{k}={v}" for k, v in sorted(self.per_pod.items())) or "(not exposed)"
        return (
            f"soak t={self.seconds / 60:5.1f}min rss={self.rss_kib / 1024:.1f}MiB fds={self.fds} "
            f"tasks={tasks} pods_now={self.pods} pods_created={self.created} per_pod: {entries}"
        )


def rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    return len(list(pathlib.Path(f"/proc/{pid}/fd").iterdir()))


async def scrape(metrics_url: str) -> tuple[int | None, dict[str, int]]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(metrics_url) as response,
    ):
        text = await response.text()
    tasks = _TASKS.search(text)
    per_pod = {m.group(1): int(float(m.group(2))) for m in _PER_POD.finditer(text)}
    return (int(float(tasks.group(1))) if tasks else None), per_pod


async def sample(*, operator: OperatorProcess, metrics_url: str, the_pool: Pool, seconds: float) -> Sample:
    tasks, per_pod = await scrape(metrics_url)
    pods = len(await the_pool.pods())
    return Sample(
        seconds=seconds,
        rss_kib=rss_kib(operator.pid),
        fds=open_fds(operator.pid),
        tasks=tasks,
        per_pod=per_pod,
        pods=pods,
        created=the_pool.created,
    )


async def soak(
    *,
    api: client.ApiClient,
    admin_kubeconfig: pathlib.Path,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    directory: pathlib.Path,
    seconds: float,
    interval: float,
    seed: int,
    report: Callable[[str], None] = print,
) -> list[Sample]:
    """Churn for `seconds`, a sample every `interval`; then delete every pod and wait (up to 120 s)
    for the per-pod entries to drain to 0. Returns the samples, the drained one last."""
    samples: list[Sample] = []
    report(f"soak seed={seed} for {seconds / 60:.1f} min, a sample every {interval:g} s")
    async with (
        pool(
            api=api,
            kubeconfig=admin_kubeconfig,
            namespace=namespace,
            directory=directory,
            rng=random.Random(seed),
            unschedulable_share=0.25,
        ) as the_pool,
        operator_process(
            kubeconfig=operator_kubeconfig, directory=directory / "op", args=["--namespace", namespace]
        ) as operator,
    ):
        metrics_url = await operator.metrics_url()
        loop = asyncio.get_running_loop()
        started = loop.time()
        stop = asyncio.Event()
        churn = asyncio.create_task(the_pool.churn(stop=stop))
        try:
            while (elapsed := loop.time() - started) < seconds:
                await asyncio.sleep(min(interval, seconds - elapsed))
                samples.append(
                    await sample(
                        operator=operator,
                        metrics_url=metrics_url,
                        the_pool=the_pool,
                        seconds=loop.time() - started,
                    )
                )
                report(samples[-1].line())
        finally:
            stop.set()
            await churn
        await client.CoreV1Api(api).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        deadline = loop.time() + 120
        while True:
            drained = await sample(
                operator=operator, metrics_url=metrics_url, the_pool=the_pool, seconds=loop.time() - started
            )
            if (drained.pods == 0 and not any(drained.per_pod.values())) or loop.time() > deadline:
                break
            await asyncio.sleep(1.0)
        samples.append(drained)
        report(f"{drained.line()} (every pod deleted)")
        if operator.running is False:
            raise AssertionError(f"the operator died during the soak:\n{operator.log()[-3000:]}")
    return samples


async def _main(*, minutes: float, interval: float, seed: int) -> int:
    with tempfile.TemporaryDirectory(prefix="bindery-soak-") as tmp, ControlPlane.start() as plane:
        api = await api_client_for(str(plane.kubeconfig))
        try:
            await apply_crd(api=api)
            await grant_operator(api=api, user=OPERATOR_USER)
            namespace = "soak"
            await client.CoreV1Api(api).create_namespace(body={"metadata": {"name": namespace}})
            samples = await soak(
                api=api,
                admin_kubeconfig=plane.kubeconfig,
                operator_kubeconfig=plane.mint_kubeconfig(user=OPERATOR_USER),
                namespace=namespace,
                directory=pathlib.Path(tmp),
                seconds=minutes * 60,
                interval=interval,
                seed=seed,
            )
        finally:
            await api.close()
    first, last = samples[0], samples[-2] if len(samples) > 1 else samples[0]
    print(f"first sample: {first.line()}\nlast sample:  {last.line()}")
    left = {k: v for k, v in samples[-1].per_pod.items() if v}
    if left:
        print(f"per-pod entries left after every pod was deleted: {left}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/soak", description=__doc__.split("\n\n")[0] if __doc__ else ""
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples (default 60)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_main(minutes=args.minutes, interval=args.interval, seed=seed))
    return 130


if __name__ == "__main__":
    sys.exit(main())
