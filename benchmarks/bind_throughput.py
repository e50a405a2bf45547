"""Bindery against kube-scheduler: the same burst of pods, the same Nodes, one control plane.

Run:  .venv/bin/python benchmarks/bind_throughput.py [--pods 300] [--nodes 10] [--repeat 3] [--peer-qps Q]

Users judge Bindery against the scheduler they already run, so both schedule the same burst on
one dev control plane (etcd + kube-apiserver on loopback, bindery.devcluster) with the same Nodes:

* kube-scheduler: the binary the repository builds (v1.36.3), its default configuration,
  ``--leader-elect=false``, under its own minted identity ``system:kube-scheduler`` (the
  apiserver's bootstrap RBAC grants it exactly what kube-scheduler needs); pods with
  ``schedulerName: default-scheduler``.
* Bindery: the operator in this process (its own thread and loop, as ``bindery demo`` runs it)
  under its own least-privilege identity, and the reference RM as its own process on loopback
  mirroring the Nodes (``bindery rm serve --mirror-nodes``, as deployed); pods with
  ``schedulerName: bindery``.

Only the scheduler being measured runs during its burst (each is started before and stopped after
it), the pods are deleted between bursts, and the order alternates between repeats. For each burst
it prints wall time from the first pod created to the last pod bound (seen by a watch on
``spec.nodeName``), pods/s, p50/p99 of per-pod time to bind (client-side creation → watch), and
apiserver writes per bound pod from the apiserver's own ``apiserver_request_total`` (deltas by
resource/subresource/verb; the benchmark's own pod creations are left out). Then medians and the
ratios Bindery / kube-scheduler, plus CPU per bound pod of each process (from /proc).

``--peer-qps Q`` adds kube-scheduler with its client rate limit raised (its default, QPS 50 and
burst 100, is what caps it in a burst). ``--profile`` times each step of Bindery's cycle by
wrapping the default plugins' methods from outside (no operator code changes), and
``--pyinstrument REPORT`` samples the operator thread. Figures and findings: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import re
import secrets
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from kubernetes_asyncio import client, config

from bindery.controller.startup.entry import EmbeddedOperator
from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.controller.startup.options import OperatorOptions
from bindery.demo import SYSTEM_NAMESPACE, create_reference_resource_manager
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane, free_port
from bindery.reference_rm.cli import serve_command, served_url

POOL_LABEL = "bindery.dev/pool"
POOL = "bench"
OPERATOR_USER = "bindery-operator"
KUBE_SCHEDULER_USER = "system:kube-scheduler"  # bootstrap RBAC binds system:kube-scheduler to this user
CREATE_CONCURRENCY = 10  # as bindery demo: a burst, as a Job or ReplicaSet controller would make
BURST_TIMEOUT = 120.0
KUBE = "kube-scheduler"
BINDERY = "bindery"


@dataclasses.dataclass(frozen=True)
class Burst:
    """What one scheduler did with one burst."""

    scheduler: str
    pods: int
    bound: int
    create_seconds: float  # first create sent → last create answered
    wall_seconds: float  # first create sent → last bind seen
    ttb_ms: list[float]  # per bound pod, sorted
    writes: dict[tuple[str, str, str], int]  # (resource, subresource, verb) → successful writes
    cpu: dict[str, float]  # component → CPU seconds used from the first create until the writes settled

    @property
    def rate(self) -> float:
        return self.bound / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    @property
    def writes_per_pod(self) -> float:
        return sum(self.writes.values()) / self.bound if self.bound else float("nan")

    def p(self, fraction: float) -> float:
        return percentile(self.ttb_ms, fraction)

    def cpu_ms_per_pod(self, component: str) -> float:
        return 1000 * self.cpu.get(component, float("nan")) / self.bound if self.bound else float("nan")


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def say(message: str) -> None:
    print(message, flush=True)


# -- the apiserver's write counter -------------------------------------------------------------

_METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$")
_WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


async def write_metrics(api: client.ApiClient) -> dict[tuple[str, str, str], int]:
    """Successful writes per (resource, subresource, verb), as the apiserver counts them."""
    response = await api.call_api("/metrics", "GET", _preload_content=False, auth_settings=["BearerToken"])
    try:
        text = (await response.read()).decode()
    finally:
        response.release()
    totals: dict[tuple[str, str, str], int] = {}
    for line in text.splitlines():
        match = _METRIC.match(line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        verb = labels.get("verb", "")
        if verb in _WRITE_VERBS and labels.get("code", "").startswith("2"):
            key = (labels.get("resource", ""), labels.get("subresource", ""), verb)
            totals[key] = totals.get(key, 0) + int(float(match.group("value")))
    return totals


def scheduler_writes(
    before: dict[tuple[str, str, str], int], after: dict[tuple[str, str, str], int]
) -> dict[tuple[str, str, str], int]:
    """The delta, minus the benchmark's own pod creations (nothing else writes in the window)."""
    delta = {key: after[key] - before.get(key, 0) for key in after}
    delta.pop(("pods", "", "POST"), None)
    return {key: value for key, value in delta.items() if value}


async def settled_metrics(api: client.ApiClient, *, within: float = 10.0) -> dict[tuple[str, str, str], int]:
    """Events trail the binds (kube-scheduler sends them from a broadcaster): wait until quiet."""
    deadline = time.monotonic() + within
    last = await write_metrics(api)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await write_metrics(api)
        if now == last:
            return now
        last = now
    return last


# -- CPU accounting from /proc (Linux) ---------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")
CPU_PLANE = "apiserver+etcd"
CPU_SCHEDULER = "scheduler"  # the kube-scheduler process, or the operator's threads in this process
CPU_RM = "reference RM"
CPU_DRIVER = "benchmark driver"  # this process's main thread: creates pods, watches binds


def _stat_cpu(path: str) -> float:
    """utime + stime of a /proc stat file, in seconds (0 if it is gone)."""
    try:
        with open(path) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu(pids: list[int]) -> float:
    return sum(_stat_cpu(f"/proc/{pid}/stat") for pid in pids)


def thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process, by thread id."""
    return {int(tid): _stat_cpu(f"/proc/self/task/{tid}/stat") for tid in os.listdir("/proc/self/task")}


def plane_pids(plane: ControlPlane) -> list[int]:
    """etcd and kube-apiserver: the processes whose command line names the plane's directory."""
    marker = str(plane.workdir).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if marker in pathlib.Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
    return pids


@dataclasses.dataclass
class CpuProbe:
    """Cumulative CPU seconds per component; threads are summed per id so new threads count fully."""

    plane: list[int]
    scheduler_pid: int | None = None  # kube-scheduler; None = the operator threads of this process
    rm_pid: int | None = None

    def sample(self) -> tuple[dict[str, float], dict[int, float]]:
        totals = {CPU_PLANE: process_cpu(self.plane)}
        if self.scheduler_pid is not None:
            totals[CPU_SCHEDULER] = process_cpu([self.scheduler_pid])
        if self.rm_pid is not None:
            totals[CPU_RM] = process_cpu([self.rm_pid])
        return totals, thread_cpu()

    def delta(
        self,
        before: tuple[dict[str, float], dict[int, float]],
        after: tuple[dict[str, float], dict[int, float]],
    ) -> dict[str, float]:
        used = {key: after[0][key] - before[0].get(key, 0.0) for key in after[0]}
        main = threading.main_thread().native_id
        threads = {tid: value - before[1].get(tid, 0.0) for tid, value in after[1].items()}
        used[CPU_DRIVER] = threads.pop(main, 0.0) if main is not None else 0.0
        if self.scheduler_pid is None:
            used[CPU_SCHEDULER] = sum(threads.values())
        return used


# -- one burst ---------------------------------------------------------------------------------


def pod_body(*, name: str, scheduler_name: str, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bind-bench"}},
        "spec": {
            "schedulerName": scheduler_name,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {
                            "cpu": ("100m", "250m", "500m")[index % 3],
                            "memory": ("64Mi", "128Mi", "256Mi")[index % 3],
                        }
                    },
                }
            ],
        },
    }


async def watch_binds(
    api: client.ApiClient, *, namespace: str, resource_version: str, bound_at: dict[str, float]
) -> None:
    """Record when each pod is first seen with spec.nodeName (raw JSON lines: cheap to parse)."""
    core = client.CoreV1Api(api)
    response = await core.list_namespaced_pod(
        namespace=namespace,
        watch=True,
        resource_version=resource_version,
        allow_watch_bookmarks=False,
        timeout_seconds=int(BURST_TIMEOUT) + 60,
        _preload_content=False,
    )
    try:
        async for line in response.content:
            event = json.loads(line)
            pod = event.get("object") or {}
            if (pod.get("spec") or {}).get("nodeName"):
                bound_at.setdefault(pod["metadata"]["name"], time.monotonic())
    finally:
        response.release()


async def burst(
    api: client.ApiClient, *, scheduler: str, scheduler_name: str, namespace: str, pods: int, cpu: CpuProbe
) -> Burst:
    core = client.CoreV1Api(api)
    listing = await core.list_namespaced_pod(namespace=namespace, _preload_content=False)
    resource_version = json.loads(await listing.read())["metadata"]["resourceVersion"]
    listing.release()
    bound_at: dict[str, float] = {}
    watcher = asyncio.create_task(
        watch_binds(api, namespace=namespace, resource_version=resource_version, bound_at=bound_at)
    )
    await asyncio.sleep(0.3)  # the watch is open (it starts from the listed resourceVersion anyway)
    before = await write_metrics(api)
    created_at: dict[str, float] = {}

    async def create(index: int) -> None:
        name = f"p-{index:04d}"
        created_at[name] = time.monotonic()
        response = await core.create_namespaced_pod(
            namespace=namespace,
            body=pod_body(name=name, scheduler_name=scheduler_name, index=index),
            _preload_content=False,
        )
        response.release()

    cpu_before = cpu.sample()
    first = time.monotonic()
    for start in range(0, pods, CREATE_CONCURRENCY):
        await asyncio.gather(*(create(i) for i in range(start, min(start + CREATE_CONCURRENCY, pods))))
    created = time.monotonic()
    deadline = first + BURST_TIMEOUT
    while len(bound_at) < pods and time.monotonic() < deadline and not watcher.done():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    if watcher.done() and watcher.exception() is not None:
        raise RuntimeError(f"the bind watch failed: {watcher.exception()}")
    last = max(bound_at.values(), default=first)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    after = await settled_metrics(api)
    cpu_after = cpu.sample()
    ttb = sorted(1000 * (bound_at[name] - created_at[name]) for name in bound_at if name in created_at)
    if len(bound_at) < pods:
        say(f"  ! {scheduler}: only {len(bound_at)}/{pods} pods bound within {BURST_TIMEOUT:g}s")
    return Burst(
        scheduler=scheduler,
        pods=pods,
        bound=len(bound_at),
        create_seconds=created - first,
        wall_seconds=last - first,
        ttb_ms=ttb,
        writes=scheduler_writes(before, after),
        cpu=cpu.delta(cpu_before, cpu_after),
    )


async def delete_pods(api: client.ApiClient, *, namespace: str) -> None:
    """Grace period 0: no kubelet runs, so a graceful delete of a bound pod would never finish."""
    core = client.CoreV1Api(api)
    await core.delete_collection_namespaced_pod(namespace=namespace, grace_period_seconds=0)
    for _ in range(200):
        listing = await core.list_namespaced_pod(namespace=namespace, _preload_content=False)
        items = json.loads(await listing.read())["items"]
        listing.release()
        if not items:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"pods in namespace {namespace} were not deleted within 20s")


# -- the two schedulers --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def kube_scheduler(
    plane: ControlPlane, workdir: pathlib.Path, *, qps: int | None
) -> AsyncIterator[int]:
    """The built kube-scheduler, no leader election; ready when /readyz is. Yields its pid.

    ``qps`` None keeps its default client rate limit (QPS 50, burst 100); otherwise QPS and a
    burst of twice that, through the (deprecated, still honoured) --kube-api-qps/--kube-api-burst.
    """
    kubeconfig = plane.mint_kubeconfig(user=KUBE_SCHEDULER_USER)
    port = free_port()
    limits = [] if qps is None else [f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"]
    log_path = workdir / "kube-scheduler.log"
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            str(plane.bin_dir / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--authentication-skip-lookup=true",
            f"--cert-dir={workdir / 'kube-scheduler-certs'}",
            "--v=1",
            *limits,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        await asyncio.to_thread(_wait_scheduler_ready, process, port, log_path)
        yield process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


def _wait_scheduler_ready(process: asyncio.subprocess.Process, port: int, log: pathlib.Path) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate, on loopback
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(
                f"kube-scheduler exited with code {process.returncode}; its log: {log}\n"
                + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            )
        url = f"https://127.0.0.1:{port}/readyz"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, context=context, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"kube-scheduler was not ready within 60s; see {log}")


@dataclasses.dataclass
class ReferenceRM:
    url: str
    token: str
    pid: int


@contextlib.asynccontextmanager
async def reference_rm(plane: ControlPlane, workdir: pathlib.Path) -> AsyncIterator[ReferenceRM]:
    """`bindery rm serve --mirror-nodes` as its own process, as deployed beside the operator."""
    token = secrets.token_urlsafe(24)
    token_file = workdir / "rm-token"
    token_file.write_text(token)
    mirror = [
        "--mirror-nodes",
        "--node-selector",
        f"{POOL_LABEL}={POOL}",
        "--kubeconfig",
        str(plane.kubeconfig),
    ]
    process = await asyncio.create_subprocess_exec(
        *serve_command(
            db=workdir / "rm.sqlite", token_file=token_file, options=[*mirror, "--log-level", "WARNING"]
        ),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=60)
        if not line:
            raise RuntimeError("the reference RM exited before serving; run it by hand to see why")
        yield ReferenceRM(url=served_url(line), token=token, pid=process.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def install_bindery(api: client.ApiClient, *, rm: ReferenceRM, max_in_flight: int) -> None:
    await apply_crd(api=api)
    await grant_operator(api=api, user=OPERATOR_USER)
    core = client.CoreV1Api(api)
    await core.create_namespace(body={"metadata": {"name": SYSTEM_NAMESPACE}})
    await create_reference_resource_manager(api, url=rm.url, token=rm.token, max_in_flight=max_in_flight)


@contextlib.asynccontextmanager
async def bindery_operator(
    operator_kubeconfig: pathlib.Path, workdir: pathlib.Path, sampler: Sampler | None
) -> AsyncIterator[int | None]:
    """The operator in its own thread and loop (bindery.controller.startup.entry), scheduling when yielded."""
    options = OperatorOptions(kubeconfig=operator_kubeconfig, probe_interval=30.0, state_dir=workdir)
    operator = EmbeddedOperator(options=options) if sampler is None else SampledOperator(options, sampler)
    await operator.start()
    try:
        deadline = time.monotonic() + 60
        while not _bindery_serving(operator):
            if time.monotonic() > deadline:
                raise RuntimeError('Bindery did not start serving ResourceManager "reference" within 60s')
            await asyncio.sleep(0.1)
        yield None  # its threads are in this process: CpuProbe counts every thread but the main one
    finally:
        await operator.stop()


def _bindery_serving(operator: EmbeddedOperator) -> bool:
    with contextlib.suppress(KeyError):
        runner = operator.runtime.runners.get("reference")
        return runner is not None and runner.active and runner.reachable is True
    return False


# -- optional: where Bindery's cycle spends its time --------------------------------------------


class StepTimer:
    """Wraps the default plugins' methods (class attributes) to time each step of every cycle."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self._originals: list[tuple[Any, str, Any]] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from bindery.controller import attempt
        from bindery.scheduling import cycle, defaults

        steps = [
            (defaults.ResourceManagerReservation, "reserve", "reserve (RM POST /reservations)"),
            (defaults.PodStillPending, "pre_bind", "pre-bind PodStillPending"),
            (defaults.NodeCheck, "pre_bind", "pre-bind NodeCheck"),
            (defaults.DefaultBinder, "bind", "bind (POST pods/binding)"),
            (defaults.ScheduledEvent, "post_bind", "post-bind Scheduled event"),
            (defaults.CommitReservation, "post_bind", "post-bind commit (RM)"),
        ]
        for cls, attribute, label in steps:
            self._wrap_method(cls, attribute, label)
        original_schedule_one = cycle.schedule_one
        setattr(attempt, "schedule_one", self._timed(original_schedule_one, "whole cycle (schedule_one)"))  # noqa: B010
        try:
            yield
        finally:
            setattr(attempt, "schedule_one", original_schedule_one)  # noqa: B010
            for cls, attribute, original in self._originals:
                setattr(cls, attribute, original)

    def _wrap_method(self, cls: Any, attribute: str, label: str) -> None:
        original = getattr(cls, attribute)
        self._originals.append((cls, attribute, original))
        setattr(cls, attribute, self._timed(original, label))

    def _timed(self, function: Callable[..., Awaitable[Any]], label: str) -> Callable[..., Awaitable[Any]]:
        samples = self.samples.setdefault(label, [])

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await function(*args, **kwargs)
            finally:
                samples.append(1000 * (time.perf_counter() - started))

        return timed

    def report(self) -> None:
        say("\nBindery cycle steps (wall time per call, all bursts; includes waiting for the loop/GIL):")
        say(f"  {'step':<34} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
        for label, values in self.samples.items():
            ordered = sorted(values)
            if ordered:
                say(
                    f"  {label:<34} {len(ordered):>6} {percentile(ordered, 0.5):>8.1f} "
                    f"{percentile(ordered, 0.99):>8.1f} {statistics.fmean(ordered):>8.1f}"
                )


class Sampler:
    """pyinstrument (wall-clock sampling) of the operator's thread, over all of its Bindery runs.

    The operator thread runs one asyncio loop, so time the loop waits for I/O shows up as the
    selector's ``select``; everything else is CPU the operator's Python spends (or GIL waits).
    """

    def __init__(self, *, output: pathlib.Path) -> None:
        self.output = output
        self.profilers: list[Any] = []

    def profiler(self) -> Any:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001, async_mode="disabled")
        self.profilers.append(profiler)
        return profiler

    def report(self) -> None:
        if not self.profilers:
            return
        with self.output.open("w") as out:
            for number, profiler in enumerate(self.profilers, 1):
                out.write(f"===== operator thread, Bindery run {number}: call tree =====\n")
                out.write(profiler.output_text(show_all=False, short_mode=False))
                out.write(f"\n===== operator thread, Bindery run {number}: self time by function =====\n")
                out.write(profiler.output_text(flat=True, flat_time="self"))
        say(f"pyinstrument profile of the operator thread (call trees, self time): {self.output}")


class SampledOperator(EmbeddedOperator):
    """The embedded operator with a pyinstrument profiler running in its thread for its whole life."""

    def __init__(self, options: OperatorOptions, sampler: Sampler) -> None:
        super().__init__(options=options)
        self._profiler = sampler.profiler()

    def _main(self) -> None:
        self._profiler.start()
        try:
            super()._main()
        finally:
            self._profiler.stop()


# -- reporting -----------------------------------------------------------------------------------


def describe_writes(writes: dict[tuple[str, str, str], int], bound: int) -> str:
    parts = [
        f"{'/'.join(p for p in (resource, sub) if p)} {verb}={count / max(bound, 1):.2f}"
        for (resource, sub, verb), count in sorted(writes.items())
    ]
    return ", ".join(parts) or "none"


def print_burst(result: Burst) -> None:
    say(
        f"  {result.scheduler:<22} bound {result.bound}/{result.pods} in {result.wall_seconds:6.2f}s "
        f"({result.rate:6.1f} pods/s; creating took {result.create_seconds:.2f}s)  "
        f"time to bind p50 {result.p(0.5):5.0f} ms  p99 {result.p(0.99):5.0f} ms"
    )
    cpu = ", ".join(f"{name} {result.cpu_ms_per_pod(name):.1f}" for name in sorted(result.cpu))
    writes = describe_writes(result.writes, result.bound)
    say(f"  {'':<22} writes per bound pod {result.writes_per_pod:.2f}: {writes}")
    say(f"  {'':<22} CPU ms per bound pod: {cpu}")


Row = tuple[str, Callable[[Burst], float], str]
ROWS: list[Row] = [
    ("wall time s (first create → last bind)", lambda r: r.wall_seconds, "{:.2f}"),
    ("pods/s", lambda r: r.rate, "{:.1f}"),
    ("time to bind p50 ms", lambda r: r.p(0.5), "{:.0f}"),
    ("time to bind p99 ms", lambda r: r.p(0.99), "{:.0f}"),
    ("apiserver writes per bound pod", lambda r: r.writes_per_pod, "{:.2f}"),
    ("scheduler CPU ms per pod", lambda r: r.cpu_ms_per_pod(CPU_SCHEDULER), "{:.1f}"),
    ("reference RM CPU ms per pod", lambda r: r.cpu_ms_per_pod(CPU_RM), "{:.1f}"),
    ("apiserver+etcd CPU ms per pod", lambda r: r.cpu_ms_per_pod(CPU_PLANE), "{:.1f}"),
    ("driver CPU ms per pod (creates, watch)", lambda r: r.cpu_ms_per_pod(CPU_DRIVER), "{:.1f}"),
    ("creating the burst s", lambda r: r.create_seconds, "{:.2f}"),
]


def print_table(results: list[Burst], *, labels: list[str], args: Args) -> None:
    def median(label: str, value: Callable[[Burst], float]) -> float:
        return statistics.median(value(r) for r in results if r.scheduler == label)

    peers = [label for label in labels if label != BINDERY]
    header = [*labels, *(f"Bindery / {peer}" for peer in peers)]
    repeats = sum(1 for r in results if r.scheduler == BINDERY)
    say(
        f"\nmedians of {repeats} repeats: {args.pods} pods, {args.nodes} nodes, "
        f"Bindery maxInFlight {args.max_in_flight}, {os.cpu_count()} CPUs"
    )
    say("| " + " | ".join(["", *header]) + " |")
    say("|---|" + "---:|" * len(header))
    for label, value, fmt in ROWS:
        cells = [fmt.format(median(name, value)) for name in labels]
        ours = median(BINDERY, value)
        for peer in peers:
            theirs = median(peer, value)
            cells.append(f"{ours / theirs:.2f}x" if theirs and not math.isnan(theirs) else "-")
        say("| " + " | ".join([label, *cells]) + " |")


# -- main ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Args:
    pods: int
    nodes: int
    repeat: int
    max_in_flight: int
    peer_qps: int
    profile: bool
    pyinstrument: pathlib.Path | None


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=300, help="pods per burst (default 300)")
    parser.add_argument(
        "--nodes", type=int, default=10, help="Nodes (64 CPU, 256Gi, 110 pods each; default 10)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="bursts per scheduler, alternating (default 3)")
    parser.add_argument(
        "--max-in-flight", type=int, default=16, help="the ResourceManager's maxInFlight (CRD default 16)"
    )
    parser.add_argument(
        "--peer-qps",
        type=int,
        default=0,
        help="also run kube-scheduler with this client QPS (burst 2x) beside its default 50/100; 0 = no",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also time each step of Bindery's cycle (wrapping its default plugins)",
    )
    parser.add_argument(
        "--pyinstrument",
        type=pathlib.Path,
        metavar="REPORT",
        help="sample the operator thread with pyinstrument (about doubles its CPU) and write REPORT",
    )
    a = parser.parse_args()
    return Args(
        pods=a.pods,
        nodes=a.nodes,
        repeat=a.repeat,
        max_in_flight=a.max_in_flight,
        peer_qps=a.peer_qps,
        profile=a.profile,
        pyinstrument=a.pyinstrument,
    )


async def api_client(kubeconfig: pathlib.Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration=configuration)


@dataclasses.dataclass(frozen=True)
class Contender:
    label: str
    scheduler_name: str
    start: Callable[[], contextlib.AbstractAsyncContextManager[int | None]]


def contenders(
    args: Args, plane: ControlPlane, workdir: pathlib.Path, sampler: Sampler | None
) -> list[Contender]:
    operator_kubeconfig = plane.mint_kubeconfig(user=OPERATOR_USER)
    chosen = [
        Contender(KUBE, "default-scheduler", lambda: kube_scheduler(plane, workdir, qps=None)),
        Contender(BINDERY, BINDERY, lambda: bindery_operator(operator_kubeconfig, workdir, sampler)),
    ]
    if args.peer_qps:
        qps = args.peer_qps
        chosen.insert(
            1,
            Contender(
                f"{KUBE} qps {qps}", "default-scheduler", lambda: kube_scheduler(plane, workdir, qps=qps)
            ),
        )
    return chosen


async def run(args: Args, plane: ControlPlane, workdir: pathlib.Path, sampler: Sampler | None) -> list[Burst]:
    api = await api_client(plane.kubeconfig)
    results: list[Burst] = []
    async with api, contextlib.AsyncExitStack() as stack:
        for index in range(args.nodes):
            await create_node(
                api,
                name=f"node-{index + 1:02d}",
                capacity={"cpu": "64", "memory": "256Gi", "pods": "110"},
                labels={POOL_LABEL: POOL},
            )
        rm = await stack.enter_async_context(reference_rm(plane, workdir))
        await install_bindery(api, rm=rm, max_in_flight=args.max_in_flight)
        core = client.CoreV1Api(api)
        everyone = contenders(args, plane, workdir, sampler)
        for round_ in range(args.repeat):
            order = everyone if round_ % 2 == 0 else everyone[::-1]
            say(f"round {round_ + 1}/{args.repeat}:")
            for number, contender in enumerate(order):
                namespace = f"bench-{round_ + 1}-{number + 1}"
                await core.create_namespace(body={"metadata": {"name": namespace}})
                async with contender.start() as scheduler_pid:
                    # Only the measured scheduler runs; the RM idles (it only mirrors Nodes) otherwise.
                    probe = CpuProbe(plane=plane_pids(plane), scheduler_pid=scheduler_pid, rm_pid=rm.pid)
                    result = await burst(
                        api,
                        scheduler=contender.label,
                        scheduler_name=contender.scheduler_name,
                        namespace=namespace,
                        pods=args.pods,
                        cpu=probe,
                    )
                    await delete_pods(api, namespace=namespace)  # Bindery releases while it runs
                print_burst(result)
                results.append(result)
    return results


def main() -> int:
    args = parse_args()
    say(f"starting etcd + kube-apiserver on 127.0.0.1 ({os.cpu_count()} CPUs) ...")
    timer = StepTimer()
    sampler = Sampler(output=args.pyinstrument) if args.pyinstrument else None
    with tempfile.TemporaryDirectory(prefix="bind-bench-") as directory, ControlPlane.start() as plane:
        say(f"control plane at {plane.server}; {args.nodes} nodes, bursts of {args.pods} pods")
        with timer.installed() if args.profile else contextlib.nullcontext():
            results = asyncio.run(run(args, plane, pathlib.Path(directory), sampler))
    labels = list(dict.fromkeys(r.scheduler for r in results))
    labels.sort(key=lambda label: label == BINDERY)  # peers first, Bindery last
    print_table(results, labels=labels, args=args)
    if args.profile:
        timer.report()
    if sampler is not None:
        sampler.report()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    say(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {stamp}")
    return 0 if all(r.bound == r.pods for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
