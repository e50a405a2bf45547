"""Each scheduler's ceiling: a backlog bound as fast as it can, a steady stream, sweeps, one plane.

Run:  .venv/bin/python benchmarks/ceiling.py [--nodes 500] [--pods 5000] [--out ceiling-results]
      .venv/bin/python benchmarks/ceiling.py --smoke          (tiny: what CI runs)

One dev control plane (bindery.devcluster's ControlPlane: the launcher the tests and the demo use),
``--nodes`` Nodes (plain Node objects, or ``--kwok`` nodes), and contenders run one at a time:

* ``bindery``: the reference RM (``bindery rm serve --mirror-nodes``, a fresh SQLite file per run;
  with ``--rm-postgres N``, N replicas on a fresh database of a PostgreSQL of its own, behind a
  round-robin proxy when N > 1) and the operator (``bindery run``), each its own process, as deployed;
* ``kube-scheduler``: the binary the repository builds, its default client QPS (50, burst 100);
* ``kube-scheduler qps 5000``: the same with ``--kube-api-qps=5000 --kube-api-burst=5000``;
* ``ceiling``: a minimal binder (this script, ``--ceiling-binder``, its own process) that lists the
  pending pods of its scheduler name and only POSTs a Binding and a Scheduled event per pod at high
  concurrency, round-robin over the nodes: what this apiserver and etcd accept, no decision made.

Backlog mode: the pods are created for a scheduler name nobody serves yet; once all exist the
contender starts, so its rate is its own. Pods/s is taken from the first to the last ``Scheduled``
event's ``eventTime`` (MicroTime, written by every contender). CPU per pod of each process is read
from /proc over the binding window (first bind seen → last bind seen, so process start-up and the
initial list are left out; the start-up is shown apart), apiserver writes per pod from
``apiserver_request_total`` deltas (contender start → writes settled), RSS from /proc at the end.

Steady mode: ``--rate`` pods/s for ``--steady-seconds`` against a contender already serving, and
per-pod time to bind (create sent → bind seen by a watch) p50/p90/p99.

Sweeps: Bindery with a delay proxy (this script, ``--delay-proxy``) in front of the RM adding
``--rm-latency`` ms (default 0,10,50) to every request; memory: the operator's RSS with
``--unrelated-pods`` bound pods of another scheduler in the cluster, and with ``--pending-pods`` of
its own pods that cannot fit (each tried once, then parked).

Issue 19's budgets: ``--shape rules`` gives every backlog pod a hard zone spread and a required
hostname anti-affinity over its group (scheduler_perf's TopologySpreading and
SchedulingPodAntiAffinity) and counts the placements that break them; ``--side-by-side-pods N``
reads the RSS of Bindery's processes and kube-scheduler's, both serving, before and after N bound
pods appear.

Output: a table on stdout, ``OUT/ceiling.json``, ``OUT/ceiling.png`` (bound pods over time per
contender; needs matplotlib: ``pip install -e .[bench]``) and every contender's log in ``OUT/logs``.
Exit status 1 if any pod stayed unbound.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime
import itertools
import json
import math
import os
import pathlib
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import yaml
from aiohttp import web

HERE = pathlib.Path(__file__).resolve().parent
BINDERY = "bindery"
KUBE = "kube-scheduler"
KUBE_FAST = "kube-scheduler qps 5000"
CEILING = "ceiling"
OPERATOR_USER = "bindery-operator"
KUBE_SCHEDULER_USER = "system:kube-scheduler"
POOL_LABEL = "bindery.dev/pool"
POOL = "bench"
BIG_NODE = {"cpu": "64", "memory": "256Gi", "pods": "110"}
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONES = 3  # node i is in zone-(i % 3): what the rules shape spreads over
PLAIN, RULES = "plain", "rules"
CREATE_CONCURRENCY = 32
#: The plane's own processes (name → pid), measured beside every contender's (set by `run`).
PLANE_PROCESSES: dict[str, int] = {}


def say(message: str) -> None:
    print(message, flush=True)


# -- /proc -----------------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return float("nan")


def plane_processes(workdir: pathlib.Path) -> dict[str, int]:
    """etcd and kube-apiserver (and kwok, if any) of the plane: processes naming its directory."""
    marker = str(workdir).encode()
    found: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            name = pathlib.Path(argv[0].decode(errors="replace")).name
            if marker in b" ".join(argv) and name in ("etcd", "kube-apiserver", "kwok"):
                found[name] = int(entry)
    return found


# -- the apiserver, raw (aiohttp + the plane's client certificates) --------------------------------


class Api:
    """A thin raw client: JSON in, JSON out, no models (the driver must stay cheap)."""

    def __init__(self, kubeconfig: pathlib.Path) -> None:
        self.kubeconfig = kubeconfig
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server = cluster["server"]
        context = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
        with tempfile.TemporaryDirectory(prefix="ceiling-api-") as directory:  # ssl loads files only
            cert = pathlib.Path(directory) / "tls.crt"
            key = pathlib.Path(directory) / "tls.key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            context.load_cert_chain(cert, key)
        self._ssl = context
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=256)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=120, sock_connect=10)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def call(
        self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = (200, 201, 202)
    ) -> Any:
        assert self.session is not None
        async with self.session.request(method, self.server + path, json=body) as response:
            data = await response.read()
            if response.status not in ok:
                raise RuntimeError(f"{method} {path} answered HTTP {response.status}: {data[:300]!r}")
            return json.loads(data) if data else None

    async def text(self, path: str) -> str:
        assert self.session is not None
        async with self.session.get(self.server + path) as response:
            return await response.text()

    async def list_all(self, path: str, *, params: str = "") -> tuple[list[dict[str, Any]], str]:
        """Every item, 500 at a time; and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            query = f"limit=500{'&' + params if params else ''}{'&continue=' + token if token else ''}"
            page = await self.call("GET", f"{path}?{query}")
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items, page["metadata"]["resourceVersion"]

    async def watch(
        self, path: str, *, params: str, resource_version: str, seconds: int
    ) -> AsyncIterator[dict[str, Any]]:
        assert self.session is not None
        url = (
            f"{self.server}{path}?watch=1&resourceVersion={resource_version}"
            f"&timeoutSeconds={seconds}&allowWatchBookmarks=false{'&' + params if params else ''}"
        )
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=seconds + 30)
        async with self.session.get(url, timeout=timeout) as response:
            if response.status != 200:
                raise RuntimeError(f"watch {path} answered HTTP {response.status}")
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)


# -- the apiserver's write counter -----------------------------------------------------------------

_WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


async def writes(api: Api) -> dict[str, int]:
    """Successful writes per 'resource/subresource VERB', as the apiserver counts them."""
    totals: dict[str, int] = {}
    for line in (await api.text("/metrics")).splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, value = line[len("apiserver_request_total{") :].rsplit("}", 1)
        labels = dict(part.split("=", 1) for part in labels_text.split('",') if "=" in part)
        labels = {k: v.strip('"') for k, v in labels.items()}
        if labels.get("verb") in _WRITE_VERBS and labels.get("code", "").startswith("2"):
            resource = "/".join(p for p in (labels.get("resource", ""), labels.get("subresource", "")) if p)
            key = f"{resource} {labels['verb']}"
            totals[key] = totals.get(key, 0) + int(float(value))
    return totals


async def settled_writes(api: Api, *, within: float = 15.0) -> dict[str, int]:
    """Events trail the binds (kube-scheduler sends them from a broadcaster): wait until quiet."""
    deadline = time.monotonic() + within
    last = await writes(api)
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = await writes(api)
        if now == last:
            return now
        last = now
    return last


#: Writes in a measured window that are not the contender's: this script's pods, Bindery's token
#: Secret and ResourceManager, and the kube-apiserver's own identity Lease (renewed every 10 s).
HARNESS_WRITES = (
    "pods POST",
    "secrets POST",
    "secrets DELETE",
    "resourcemanagers POST",
    "resourcemanagers DELETE",
    "leases PUT",
)


def write_delta(before: dict[str, int], after: dict[str, int], *, ignore: tuple[str, ...]) -> dict[str, int]:
    delta = {key: after[key] - before.get(key, 0) for key in after if key not in ignore}
    return {key: value for key, value in delta.items() if value}


# -- pods ------------------------------------------------------------------------------------------


def pod_body(
    *,
    name: str,
    scheduler_name: str,
    index: int,
    node: str | None = None,
    cpu: str | None = None,
    shape: str = PLAIN,
    groups: int = 1,
) -> dict[str, Any]:
    """One benchmark pod; ``shape`` RULES adds the inter-pod rules of scheduler_perf's
    TopologySpreading and SchedulingPodAntiAffinity: a hard zone spread (maxSkew 1) and a required
    hostname anti-affinity, both over the pod's group (``app: g<index % groups>``)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "requests": {
                        "cpu": cpu or ("100m", "250m", "500m")[index % 3],
                        "memory": ("64Mi", "128Mi", "256Mi")[index % 3],
                    }
                },
            }
        ],
    }
    metadata: dict[str, Any] = {"name": name}
    if shape == RULES:
        group = f"g{index % groups}"
        metadata["labels"] = {"app": group}
        selector = {"matchLabels": {"app": group}}
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": ZONE_LABEL,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector,
            }
        ]
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": selector, "topologyKey": HOSTNAME_LABEL}
                ]
            }
        }
    elif shape != PLAIN:
        raise ValueError(f"unknown pod shape {shape!r}: {PLAIN} or {RULES}")
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def rule_groups(*, pods: int, nodes: int) -> int:
    """Groups of at most half the nodes each, so one pod per node and an even zone spread both fit."""
    return max(1, math.ceil(pods / max(1, nodes // 2)))


async def create_pods(api: Api, *, namespace: str, bodies: list[dict[str, Any]]) -> float:
    started = time.monotonic()
    queue = iter(bodies)

    async def worker() -> None:
        for body in queue:
            await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", body)

    await asyncio.gather(*(worker() for _ in range(CREATE_CONCURRENCY)))
    return time.monotonic() - started


async def create_namespace(api: Api, name: str) -> None:
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})


async def delete_pods(api: Api, *, namespace: str) -> None:
    """Grace period 0: no kubelet runs, so a graceful delete of a bound pod would never finish.

    Deleting tens of thousands of pods outlasts the apiserver's 60 s request timeout (504), and its
    answer (every deleted pod) may be cut short, dropped with the connection, or outlast this
    client's 120 s; what it deleted stays deleted, so the collection delete is repeated until one
    completes.
    """
    for _ in range(20):
        try:
            await api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
            break
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, TimeoutError):
            continue  # cut short, dropped, or past the client's 120 s
        except RuntimeError as error:
            if "HTTP 504" not in str(error):
                raise
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        page = await api.call("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")
        if not page["items"]:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the pods of namespace {namespace} were not deleted within 120s")


async def scheduled_times(api: Api, *, namespace: str) -> list[float]:
    """eventTime of every Scheduled event in the namespace, as POSIX seconds, sorted."""
    items, _ = await api.list_all(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
    times = []
    for event in items:
        if event.get("reason") == "Scheduled" and event.get("eventTime"):
            moment = datetime.datetime.fromisoformat(event["eventTime"].replace("Z", "+00:00"))
            times.append(moment.timestamp())
    return sorted(times)


class BindWatch:
    """Follows the binds of a namespace (a raw watch); snapshots CPU at the first and last bind."""

    def __init__(self, api: Api, *, namespace: str, on_first: Callable[[], None]) -> None:
        self.api = api
        self.namespace = namespace
        self.bound_at: dict[str, float] = {}  # pod name → time.time() the bind was seen
        self._on_first = on_first
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        page = await self.api.call("GET", f"/api/v1/namespaces/{self.namespace}/pods?limit=1")
        version = page["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._run(version))

    async def _run(self, version: str) -> None:
        """Follow the binds; a watch the apiserver ends is resumed from the last version seen."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        for _ in range(100):
            async for event in self.api.watch(
                path, params="fieldSelector=spec.nodeName!%3D", resource_version=version, seconds=1800
            ):
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"the bind watch failed: {event.get('object')}")
                pod = event.get("object") or {}
                metadata = pod.get("metadata") or {}
                version = metadata.get("resourceVersion") or version
                name = metadata.get("name")
                if name and name not in self.bound_at:
                    if not self.bound_at:
                        self._on_first()
                    self.bound_at[name] = time.time()

    async def wait(self, count: int, *, within: float) -> bool:
        deadline = time.monotonic() + within
        while len(self.bound_at) < count and time.monotonic() < deadline:
            if self._task is not None and self._task.done():
                self._task.result()  # raises what ended the watch
                raise RuntimeError("the bind watch ended early")
            await asyncio.sleep(0.1)
        return len(self.bound_at) >= count

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# -- contenders ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Serving:
    """A contender's processes while it serves: label → pid."""

    processes: dict[str, int]
    scheduler_name: str


Starter = Callable[[str], contextlib.AbstractAsyncContextManager[Serving]]


async def spawn(
    argv: list[str], *, log: pathlib.Path, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )


async def stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=20)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


def read_lines(path: pathlib.Path) -> list[str]:
    """The lines of a small file (a log, a /proc entry); none if it does not exist (yet)."""
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


async def wait_for_line(
    log: pathlib.Path, marker: str, process: asyncio.subprocess.Process, *, within: float
) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for line in read_lines(log):
            if marker in line:
                return line
        if process.returncode is not None:
            break
        await asyncio.sleep(0.1)
    tail = "\n".join(read_lines(log)[-20:])
    raise RuntimeError(f"{log.name}: never printed {marker!r} (exit {process.returncode}):\n{tail}")


class Plane:
    """What every contender needs of the plane: its binaries, kubeconfigs, a work directory."""

    def __init__(
        self, plane: Any, workdir: pathlib.Path, api: Api, *, postgres: Any = None, rm_replicas: int = 1
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.api = api
        #: a bindery.devcluster.postgres.PostgresServer for the reference RM's replicas, or None: SQLite
        self.postgres = postgres
        self.rm_replicas = rm_replicas
        self.operator_kubeconfig = plane.mint_kubeconfig(user=OPERATOR_USER)
        self.kube_scheduler_kubeconfig = plane.mint_kubeconfig(user=KUBE_SCHEDULER_USER)
        self.runs = itertools.count(1)

    @contextlib.asynccontextmanager
    async def kube_scheduler(self, scheduler_name: str, *, qps: int | None) -> AsyncIterator[Serving]:
        from bindery.devcluster.plane import free_port

        assert scheduler_name == "default-scheduler"
        port = free_port()
        limits = [] if qps is None else [f"--kube-api-qps={qps}", f"--kube-api-burst={qps}"]
        log = self.workdir / f"kube-scheduler-{next(self.runs)}.log"
        process = await spawn(
            [
                str(self.plane.bin_dir / "kube-scheduler"),
                f"--kubeconfig={self.kube_scheduler_kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--authentication-skip-lookup=true",
                f"--cert-dir={self.workdir / 'kube-scheduler-certs'}",
                "--v=1",
                *limits,
            ],
            log=log,
        )
        try:
            yield Serving(processes={"kube-scheduler": process.pid}, scheduler_name=scheduler_name)
        finally:
            await stop(process)

    @contextlib.asynccontextmanager
    async def ceiling(self, scheduler_name: str, *, concurrency: int) -> AsyncIterator[Serving]:
        log = self.workdir / f"ceiling-{next(self.runs)}.log"
        process = await spawn(
            [
                sys.executable,
                str(HERE / "ceiling.py"),
                "--ceiling-binder",
                "--kubeconfig",
                str(self.plane.kubeconfig),
                "--scheduler-name",
                scheduler_name,
                "--concurrency",
                str(concurrency),
            ],
            log=log,
        )
        try:
            yield Serving(processes={"ceiling binder": process.pid}, scheduler_name=scheduler_name)
        finally:
            await stop(process)

    @contextlib.asynccontextmanager
    async def bindery(
        self,
        scheduler_name: str,
        *,
        latency_ms: float = 0.0,
        max_in_flight: int = 16,
        profiler: list[str] | None = None,
        rm_options: tuple[str, ...] = (),
    ) -> AsyncIterator[Serving]:
        """A fresh reference RM (own SQLite, or replicas on a fresh PostgreSQL database behind a
        round-robin proxy), a delay proxy if asked, the ResourceManager, the operator."""
        from bindery.reference_rm.cli import serve_command, served_url

        run = next(self.runs)
        token = secrets.token_urlsafe(24)
        token_file = self.workdir / f"rm-token-{run}"
        token_file.write_text(token)
        options = [
            "--mirror-nodes",
            "--node-selector",
            f"{POOL_LABEL}={POOL}",
            "--kubeconfig",
            str(self.plane.kubeconfig),
            "--log-level",
            "WARNING",
            *rm_options,
        ]
        db: pathlib.Path | str = self.workdir / f"rm-{run}.sqlite"
        if self.postgres is not None:
            db = await asyncio.to_thread(self.postgres.create_database, f"ceiling_{run}")
            options += ["--db-password-file", str(self.postgres.password_file)]
        processes: list[asyncio.subprocess.Process] = []
        try:
            pids: dict[str, int] = {}
            urls = []
            for replica in range(1, self.rm_replicas + 1):
                rm_log = self.workdir / f"rm-{run}-{replica}.log"
                rm = await spawn(serve_command(db=db, token_file=token_file, options=options), log=rm_log)
                processes.append(rm)
                urls.append(served_url((await wait_for_line(rm_log, "http://", rm, within=60)).encode()))
                pids["reference RM" if self.rm_replicas == 1 else f"reference RM {replica}"] = rm.pid
            url = urls[0]
            if len(urls) > 1:
                from bindery.devcluster.rrproxy import BANNER

                proxy_log = self.workdir / f"rr-proxy-{run}.log"
                proxy = await spawn(
                    [sys.executable, "-m", "bindery.devcluster.rrproxy", *urls], log=proxy_log
                )
                processes.append(proxy)
                url = (await wait_for_line(proxy_log, BANNER, proxy, within=30)).rsplit(" ", 1)[-1]
                pids["round-robin proxy"] = proxy.pid
            if latency_ms:
                proxy_log = self.workdir / f"delay-proxy-{run}.log"
                proxy = await spawn(
                    [
                        sys.executable,
                        str(HERE / "ceiling.py"),
                        "--delay-proxy",
                        "--upstream",
                        url,
                        "--delay-ms",
                        str(latency_ms),
                    ],
                    log=proxy_log,
                )
                processes.append(proxy)
                url = (await wait_for_line(proxy_log, "delay proxy at ", proxy, within=30)).rsplit(" ", 1)[-1]
                pids["delay proxy"] = proxy.pid
            await self._resource_manager(
                url=url, token=token, scheduler_name=scheduler_name, max_in_flight=max_in_flight
            )
            operator_log = self.workdir / f"operator-{run}.log"
            argv = [sys.executable, "-m", "bindery", "run", "--kubeconfig", str(self.operator_kubeconfig)]
            operator = await spawn([*(profiler or []), *argv], log=operator_log)
            processes.append(operator)
            pids["bindery operator"] = operator.pid
            if profiler:  # py-spy record: the operator is its child
                await asyncio.sleep(1.0)
                children = " ".join(
                    read_lines(pathlib.Path(f"/proc/{operator.pid}/task/{operator.pid}/children"))
                ).split()
                pids["bindery operator"] = int(children[0]) if children else operator.pid
            yield Serving(processes=pids, scheduler_name=scheduler_name)
        finally:
            for process in reversed(processes):
                if process is processes[-1] and profiler:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pids["bindery operator"], signal.SIGTERM)  # py-spy writes when its child ends
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(process.wait(), timeout=60)
                await stop(process)
            with contextlib.suppress(RuntimeError):
                await self.api.call(
                    "DELETE", "/apis/bindery.dev/v1alpha1/resourcemanagers/reference", ok=(200, 202, 404)
                )

    async def _resource_manager(
        self, *, url: str, token: str, scheduler_name: str, max_in_flight: int
    ) -> None:
        namespace = "bindery-system"
        await self.api.call(
            "DELETE", f"/api/v1/namespaces/{namespace}/secrets/reference-rm-token", ok=(200, 404)
        )
        await self.api.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/secrets",
            {
                # bindery.controller.secrets.CREDENTIALS_LABEL: the Secret is meant for an RM
                "metadata": {"name": "reference-rm-token", "labels": {"bindery.dev/credentials": "true"}},
                "stringData": {"token": token},
            },
        )
        await self.api.call(
            "POST",
            "/apis/bindery.dev/v1alpha1/resourcemanagers",
            {
                "apiVersion": "bindery.dev/v1alpha1",
                "kind": "ResourceManager",
                "metadata": {"name": "reference"},
                "spec": {
                    "schedulerNames": [scheduler_name],
                    "endpoint": url,
                    "allowInsecureHTTP": True,
                    "auth": {"tokenSecretRef": {"namespace": namespace, "name": "reference-rm-token"}},
                    "maxInFlight": max_in_flight,
                },
            },
        )


@dataclasses.dataclass(frozen=True)
class Contender:
    label: str
    scheduler_name: str  # what its pods ask for
    start: Starter


def contenders(plane: Plane, *, names: list[str], max_in_flight: int, concurrency: int) -> list[Contender]:
    known = {
        BINDERY: Contender(BINDERY, "bindery-bench", lambda n: plane.bindery(n, max_in_flight=max_in_flight)),
        KUBE: Contender(KUBE, "default-scheduler", lambda n: plane.kube_scheduler(n, qps=None)),
        KUBE_FAST: Contender(KUBE_FAST, "default-scheduler", lambda n: plane.kube_scheduler(n, qps=5000)),
        CEILING: Contender(CEILING, "ceiling", lambda n: plane.ceiling(n, concurrency=concurrency)),
    }
    return [known[name] for name in names]


# -- one backlog run -------------------------------------------------------------------------------


@dataclasses.dataclass
class Backlog:
    contender: str
    pods: int
    bound: int
    create_seconds: float
    startup_seconds: float  # contender started → first bind
    rate: float  # pods/s, first → last Scheduled eventTime
    bind_seconds: float  # first → last Scheduled eventTime
    writes_per_pod: float
    writes: dict[str, int]
    cpu_ms_per_pod: dict[str, float]  # process → CPU ms per pod over the binding window
    startup_cpu_s: dict[str, float]  # process → CPU s from its start to the first bind
    rss_mb: dict[str, float]
    timeline: list[float]  # seconds since the first bind, per bound pod (sorted)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


async def backlog(
    api: Api,
    *,
    label: str,
    start: Starter,
    scheduler_name: str,
    pods: int,
    namespace: str,
    within: float,
    shape: str = PLAIN,
    groups: int = 1,
) -> Backlog:
    await create_namespace(api, namespace)
    bodies = [
        pod_body(name=f"p-{i:05d}", scheduler_name=scheduler_name, index=i, shape=shape, groups=groups)
        for i in range(pods)
    ]
    create_seconds = await create_pods(api, namespace=namespace, bodies=bodies)
    before = await writes(api)
    cpu_at_first: dict[str, float] = {}
    serving: Serving | None = None

    def first_bind() -> None:
        if serving is not None:
            cpu_at_first.update({name: cpu_seconds(pid) for name, pid in measured().items()})

    def measured() -> dict[str, int]:
        assert serving is not None
        return {**serving.processes, **PLANE_PROCESSES}

    watch = BindWatch(api, namespace=namespace, on_first=first_bind)
    await watch.start()
    started = time.time()
    try:
        async with start(scheduler_name) as serving:
            all_bound = await watch.wait(pods, within=within)
            cpu_at_last = {name: cpu_seconds(pid) for name, pid in measured().items()}
            rss = {name: rss_mb(pid) for name, pid in serving.processes.items()}
            after = await settled_writes(api)
    finally:
        await watch.stop()
    if not all_bound:
        say(f"  ! {label}: only {len(watch.bound_at)}/{pods} pods bound within {within:g}s")
    bound = len(watch.bound_at)
    times = await scheduled_times(api, namespace=namespace)
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    window_pods = max(bound - 1, 1)
    delta = write_delta(before, after, ignore=HARNESS_WRITES)
    seen = sorted(watch.bound_at.values())
    result = Backlog(
        contender=label,
        pods=pods,
        bound=bound,
        create_seconds=create_seconds,
        startup_seconds=(seen[0] - started) if seen else float("nan"),
        rate=(len(times) - 1) / span if span and span > 0 else float("nan"),
        bind_seconds=span,
        writes_per_pod=sum(delta.values()) / bound if bound else float("nan"),
        writes=delta,
        cpu_ms_per_pod={
            name: 1000 * (cpu_at_last[name] - cpu_at_first.get(name, 0.0)) / window_pods
            for name in cpu_at_last
        },
        startup_cpu_s={name: cpu_at_first[name] for name in rss if name in cpu_at_first},
        rss_mb=rss,
        timeline=[t - times[0] for t in times],
    )
    if shape == RULES:
        result.extra["rule_violations"] = await rule_violations(api, namespace=namespace)
    await delete_pods(api, namespace=namespace)
    return result


async def rule_violations(api: Api, *, namespace: str) -> int:
    """Bound pods breaking their group's rules, counted from the pods and nodes alone: two of a group
    on one node (anti-affinity), and zones of a group more than 1 apart (spread)."""
    nodes, _ = await api.list_all("/api/v1/nodes")
    zone = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(ZONE_LABEL) for n in nodes}
    pods, _ = await api.list_all(f"/api/v1/namespaces/{namespace}/pods")
    per_node: dict[tuple[str, str], int] = {}
    per_zone: dict[str, dict[str, int]] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        group = (pod["metadata"].get("labels") or {}).get("app", "")
        per_node[group, node] = per_node.get((group, node), 0) + 1
        zones = per_zone.setdefault(group, {f"zone-{z}": 0 for z in range(ZONES)})
        zones[zone.get(node) or ""] = zones.get(zone.get(node) or "", 0) + 1
    crowded = sum(count - 1 for count in per_node.values() if count > 1)
    skewed = sum(1 for zones in per_zone.values() if max(zones.values()) - min(zones.values()) > 1)
    return crowded + skewed


# -- steady rate -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Steady:
    contender: str
    rate: float
    pods: int
    bound: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


async def steady(
    api: Api, *, label: str, start: Starter, scheduler_name: str, rate: float, seconds: float, namespace: str
) -> Steady:
    await create_namespace(api, namespace)
    pods = max(1, int(rate * seconds))
    watch = BindWatch(api, namespace=namespace, on_first=lambda: None)
    await watch.start()
    created: dict[str, float] = {}
    try:
        async with start(scheduler_name):
            # Serving once a first pod is bound (the same path as the measured ones; not measured).
            warmup = pod_body(name="warmup", scheduler_name=scheduler_name, index=0)
            await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", warmup)
            if not await watch.wait(1, within=90):
                raise RuntimeError(f"{label} bound no warm-up pod within 90s")
            t0 = time.monotonic()

            async def one(index: int) -> None:
                name = f"s-{index:05d}"
                await asyncio.sleep(max(0.0, t0 + index / rate - time.monotonic()))
                created[name] = time.time()
                body = pod_body(name=name, scheduler_name=scheduler_name, index=index)
                await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", body)

            await asyncio.gather(*(one(i) for i in range(pods)))
            await watch.wait(pods + 1, within=60)
    finally:
        await watch.stop()
    latencies = [1000 * (watch.bound_at[n] - created[n]) for n in watch.bound_at if n in created]
    await delete_pods(api, namespace=namespace)
    return Steady(
        contender=label,
        rate=rate,
        pods=pods,
        bound=len(latencies),
        p50_ms=percentile(latencies, 0.5),
        p90_ms=percentile(latencies, 0.9),
        p99_ms=percentile(latencies, 0.99),
        max_ms=max(latencies, default=float("nan")),
    )


# -- the ceiling binder (its own process) ----------------------------------------------------------


async def ceiling_binder(*, kubeconfig: pathlib.Path, scheduler_name: str, concurrency: int) -> None:
    """List + watch the pending pods of `scheduler_name`; POST a Binding and a Scheduled event each."""
    async with Api(kubeconfig) as api:
        nodes, _ = await api.list_all("/api/v1/nodes", params=f"labelSelector={POOL_LABEL}%3D{POOL}")
        names = itertools.cycle(sorted(n["metadata"]["name"] for n in nodes))
        selector = f"fieldSelector=spec.schedulerName%3D{scheduler_name},spec.nodeName%3D"
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        seen: set[str] = set()
        host = os.uname().nodename

        def offer(pod: dict[str, Any]) -> None:
            uid = pod["metadata"]["uid"]
            if uid not in seen and not pod["spec"].get("nodeName"):
                seen.add(uid)
                queue.put_nowait(pod)

        async def bind(pod: dict[str, Any]) -> None:
            meta = pod["metadata"]
            namespace, name, node = meta["namespace"], meta["name"], next(names)
            await api.call(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name, "uid": meta["uid"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                },
            )
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            await api.call(
                "POST",
                f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
                {
                    "apiVersion": "events.k8s.io/v1",
                    "kind": "Event",
                    "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
                    "eventTime": now,
                    "reportingController": scheduler_name,
                    "reportingInstance": f"{scheduler_name}-{host}",
                    "action": "Binding",
                    "reason": "Scheduled",
                    "regarding": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "namespace": namespace,
                        "name": name,
                        "uid": meta["uid"],
                    },
                    "note": f"Successfully assigned {namespace}/{name} to {node}",
                    "type": "Normal",
                },
            )

        async def worker() -> None:
            while True:
                pod = await queue.get()
                try:
                    await bind(pod)
                except Exception as exc:  # a benchmark binder: say it and go on
                    print(f"binding {pod['metadata']['name']} failed: {exc}", flush=True)

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        items, version = await api.list_all("/api/v1/pods", params=selector)
        for pod in items:
            offer(pod)
        print(f"ceiling binder serving {scheduler_name!r}: {len(items)} pending", flush=True)
        while True:
            async for event in api.watch(
                "/api/v1/pods", params=selector, resource_version=version, seconds=1800
            ):
                pod = event.get("object") or {}
                version = (pod.get("metadata") or {}).get("resourceVersion") or version
                if event.get("type") in ("ADDED", "MODIFIED"):
                    offer(pod)
        for task in workers:
            task.cancel()


# -- the delay proxy (its own process) -------------------------------------------------------------


async def delay_proxy(*, upstream: str, delay_ms: float) -> None:
    """Forward every request to `upstream` after `delay_ms`: an RM farther away, nothing else changed."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=60),
        auto_decompress=False,
    )
    hop = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}

    async def handle(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay_ms / 1000)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        body = await request.read()
        async with session.request(
            request.method, upstream + request.path_qs, headers=headers, data=body or None
        ) as up:
            payload = await up.read()
            kept = {k: v for k, v in up.headers.items() if k.lower() not in hop}
            return web.Response(status=up.status, headers=kept, body=payload)

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"delay proxy at http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


# -- memory ----------------------------------------------------------------------------------------


async def pending_attempted(api: Api, *, namespace: str, count: int, within: float) -> int:
    """Poll until `count` pods of the namespace have a FailedScheduling event (each was tried)."""
    deadline = time.monotonic() + within
    tried = 0
    while time.monotonic() < deadline:
        items, _ = await api.list_all(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
        tried = len({e["regarding"]["name"] for e in items if e.get("reason") == "FailedScheduling"})
        if tried >= count:
            return tried
        await asyncio.sleep(2.0)
    return tried


async def memory_sweep(api: Api, plane: Plane, args: Args, nodes: list[str]) -> dict[str, Any]:
    """The operator's RSS after a small backlog: alone, beside unrelated bound pods; with its own pending."""
    start = plane.bindery
    out: dict[str, Any] = {}
    small = args.memory_backlog
    base = await backlog(
        api,
        label=BINDERY,
        start=start,
        scheduler_name="bindery-mem",
        pods=small,
        namespace="mem-base",
        within=120,
    )
    out["baseline"] = {"backlog": small, "rss_mb": base.rss_mb}
    say(f"  memory: baseline (a backlog of {small}): operator RSS {base.rss_mb['bindery operator']:.1f} MB")
    if args.unrelated_pods:
        await create_namespace(api, "unrelated")
        bodies = [
            pod_body(
                name=f"u-{i:05d}", scheduler_name="default-scheduler", index=i, node=nodes[i % len(nodes)]
            )
            for i in range(args.unrelated_pods)
        ]
        took = await create_pods(api, namespace="unrelated", bodies=bodies)
        say(f"  memory: {args.unrelated_pods} unrelated bound pods created in {took:.1f}s")
        with_unrelated = await backlog(
            api,
            label=BINDERY,
            start=start,
            scheduler_name="bindery-mem",
            pods=small,
            namespace="mem-unrelated",
            within=120,
        )
        grew = with_unrelated.rss_mb["bindery operator"] - base.rss_mb["bindery operator"]
        out["unrelated"] = {
            "pods": args.unrelated_pods,
            "rss_mb": with_unrelated.rss_mb,
            "operator_growth_mb": grew,
        }
        say(
            f"  memory: with them: operator RSS {with_unrelated.rss_mb['bindery operator']:.1f} MB "
            f"({grew:+.1f} MB)"
        )
        await delete_pods(api, namespace="unrelated")
    if args.pending_pods:
        namespace = "mem-pending"
        await create_namespace(api, namespace)
        bodies = [
            pod_body(name=f"q-{i:05d}", scheduler_name="bindery-mem", index=i, cpu="1000")  # fits no node
            for i in range(args.pending_pods)
        ]
        await create_pods(api, namespace=namespace, bodies=bodies)
        async with start("bindery-mem") as serving:
            tried = await pending_attempted(
                api, namespace=namespace, count=args.pending_pods, within=60 + args.pending_pods / 20
            )
            rss = {name: rss_mb(pid) for name, pid in serving.processes.items()}
        grew = rss["bindery operator"] - base.rss_mb["bindery operator"]
        out["pending"] = {
            "pods": args.pending_pods,
            "tried": tried,
            "rss_mb": rss,
            "operator_growth_mb": grew,
        }
        say(
            f"  memory: {args.pending_pods} own pending pods ({tried} tried): operator RSS "
            f"{rss['bindery operator']:.1f} MB ({grew:+.1f} MB)"
        )
        await delete_pods(api, namespace=namespace)
    return out


async def steady_rss(pids: dict[str, int], *, within: float = 60.0) -> dict[str, float]:
    """RSS of each process once three samples 2 s apart agree within 1 MB (or after `within` s)."""
    deadline = time.monotonic() + within
    samples: list[dict[str, float]] = []
    while True:
        samples.append({name: rss_mb(pid) for name, pid in pids.items()})
        recent = samples[-3:]
        if len(recent) == 3 and all(
            max(s[name] for s in recent) - min(s[name] for s in recent) <= 1.0 for name in pids
        ):
            return recent[-1]
        if time.monotonic() >= deadline:
            return recent[-1]
        await asyncio.sleep(2.0)


async def bind_both(api: Api, *, namespace: str, count: int, scheduler_names: list[str]) -> None:
    """`count` pods for each scheduler name, and wait until every one is bound: both are serving
    and have read the cluster up to this point."""
    await create_namespace(api, namespace)
    watch = BindWatch(api, namespace=namespace, on_first=lambda: None)
    await watch.start()
    try:
        bodies = [
            pod_body(name=f"w{n}-{i:04d}", scheduler_name=name, index=i)
            for n, name in enumerate(scheduler_names)
            for i in range(count)
        ]
        await create_pods(api, namespace=namespace, bodies=bodies)
        if not await watch.wait(len(bodies), within=120 + len(bodies) / 10):
            raise RuntimeError(f"only {len(watch.bound_at)}/{len(bodies)} pods bound in {namespace}")
    finally:
        await watch.stop()


async def all_running(api: Api, *, namespace: str, within: float) -> bool:
    """Poll (one pod a page) until no pod of the namespace is outside phase Running."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        page = await api.call(
            "GET", f"/api/v1/namespaces/{namespace}/pods?limit=1&fieldSelector=status.phase!%3DRunning"
        )
        if not page["items"]:
            return True
        await asyncio.sleep(5.0)
    return False


async def side_by_side_memory(api: Api, plane: Plane, args: Args, nodes: list[str]) -> dict[str, Any]:
    """Issue 19's memory budget: Bindery (operator + reference RM) and kube-scheduler serving at
    once, each RSS before and after `--side-by-side-pods` bound pods appear in the cluster.

    Both are warmed first (a small backlog each, so what a first bind allocates is in the "before"),
    and after the pods exist each binds another small backlog, so both have read them; RSS is taken
    once it holds still. The bound pods are another scheduler's (`nodeName` set at creation): both
    keep every bound pod, since each pod's rules may concern any of them.
    """
    count = args.side_by_side_pods
    warm = max(10, min(args.memory_backlog, 200))
    names = ["default-scheduler", "bindery-side"]
    async with (
        plane.kube_scheduler("default-scheduler", qps=5000) as kube,
        plane.bindery("bindery-side", max_in_flight=args.max_in_flight) as bindery,
    ):
        pids = {**kube.processes, **bindery.processes}
        await bind_both(api, namespace="side-warm", count=warm, scheduler_names=names)
        before = await steady_rss(pids)
        say("  side by side, before: " + ", ".join(f"{k} {v:.1f} MB" for k, v in before.items()))
        await create_namespace(api, "side-bound")
        bodies = [
            pod_body(name=f"b-{i:06d}", scheduler_name="someone-else", index=i, node=nodes[i % len(nodes)])
            for i in range(count)
        ]
        took = await create_pods(api, namespace="side-bound", bodies=bodies)
        say(f"  side by side: {count} bound pods created in {took:.1f}s")
        if args.kwok:  # kwok runs them: both read each pod again with its status
            running = await all_running(api, namespace="side-bound", within=120 + count / 50)
            say(f"  side by side: kwok reports them Running: {running}")
        await bind_both(api, namespace="side-after", count=warm, scheduler_names=names)
        after = await steady_rss(pids)
        peak = {name: rss_mb(pid, "VmHWM") for name, pid in pids.items()}
        say("  side by side, after: " + ", ".join(f"{k} {v:.1f} MB" for k, v in after.items()))
    for namespace in ("side-warm", "side-bound", "side-after"):
        await delete_pods(api, namespace=namespace)
    growth = {name: after[name] - before[name] for name in pids}
    return {
        "pods": count,
        "warm_backlog": warm,
        "before_mb": before,
        "after_mb": after,
        "peak_mb": peak,
        "growth_mb": growth,
    }


# -- output ----------------------------------------------------------------------------------------


def fmt(value: float, spec: str = "{:.1f}") -> str:
    return "-" if math.isnan(value) else spec.format(value)


def print_backlog_table(results: list[Backlog]) -> None:
    names = [r.contender for r in results]
    ceiling = next((r for r in results if r.contender == CEILING), None)
    fast = next((r for r in results if r.contender == KUBE_FAST), None)
    rows: list[tuple[str, Callable[[Backlog], str]]] = [
        ("pods bound", lambda r: f"{r.bound}/{r.pods}"),
        ("pods/s (first → last Scheduled)", lambda r: fmt(r.rate)),
        ("× ceiling", lambda r: fmt(r.rate / ceiling.rate, "{:.2f}") if ceiling else "-"),
        ("× kube-scheduler qps 5000", lambda r: fmt(r.rate / fast.rate, "{:.2f}") if fast else "-"),
        ("start → first bind s", lambda r: fmt(r.startup_seconds, "{:.2f}")),
        ("apiserver writes per pod", lambda r: fmt(r.writes_per_pod, "{:.2f}")),
    ]
    processes = list(dict.fromkeys(p for r in results for p in r.cpu_ms_per_pod))
    for process in processes:
        rows.append(
            (
                f"CPU ms/pod: {process}",
                lambda r, p=process: fmt(r.cpu_ms_per_pod.get(p, float("nan")), "{:.2f}"),
            )
        )
    for process in dict.fromkeys(p for r in results for p in r.rss_mb):
        rows.append((f"RSS MB: {process}", lambda r, p=process: fmt(r.rss_mb.get(p, float("nan")))))
    if any("rule_violations" in r.extra for r in results):
        rows.append(("rule violations (checked here)", lambda r: str(r.extra.get("rule_violations", "-"))))
    say("| backlog | " + " | ".join(names) + " |")
    say("|---|" + "---:|" * len(names))
    for label, cell in rows:
        say(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")


def plot(results: list[Backlog], path: pathlib.Path, *, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("(no plot: matplotlib is not installed; pip install -e '.[bench]')")
        return False
    figure, axes = plt.subplots(figsize=(8, 5))
    for result in results:
        if result.timeline:
            axes.step(
                result.timeline,
                range(1, len(result.timeline) + 1),
                where="post",
                label=f"{result.contender} ({fmt(result.rate)} pods/s)",
            )
    axes.set_xlabel("seconds since the contender's first Scheduled event")
    axes.set_ylabel("pods bound")
    axes.set_title(title)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


# -- main ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Args:
    nodes: int
    pods: int
    contenders: list[str]
    kwok: bool
    max_in_flight: int
    concurrency: int
    rate: float
    steady_seconds: float
    steady_contenders: list[str]
    rm_latency: list[float]
    sweep_pods: int
    memory_backlog: int
    unrelated_pods: int
    pending_pods: int
    out: pathlib.Path
    py_spy: pathlib.Path | None
    rm_postgres: int
    shape: str
    side_by_side_pods: int


def parse_args(argv: list[str]) -> Args:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--nodes", type=int, default=500, help="Nodes of 64 CPU / 256Gi / 110 pods (default 500)"
    )
    parser.add_argument("--pods", type=int, default=5000, help="backlog per contender (default 5000)")
    parser.add_argument(
        "--contenders",
        default=",".join([CEILING, KUBE_FAST, KUBE, BINDERY]),
        help=f"comma-separated, run in this order (default: all of {CEILING},{KUBE_FAST},{KUBE},{BINDERY})",
    )
    parser.add_argument(
        "--kwok", action="store_true", help="kwok nodes (the plane runs kwok) instead of plain Nodes"
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="Bindery's ResourceManager maxInFlight (default 256, as the CRD)",
    )
    parser.add_argument("--concurrency", type=int, default=64, help="the ceiling binder's concurrent binds")
    parser.add_argument("--rate", type=float, default=20.0, help="steady mode: pods per second (default 20)")
    parser.add_argument("--steady-seconds", type=float, default=15.0, help="steady mode: seconds (0 = skip)")
    parser.add_argument(
        "--steady-contenders", default=",".join([KUBE_FAST, KUBE, BINDERY]), help="who runs the steady mode"
    )
    parser.add_argument(
        "--rm-latency", default="0,10,50", help="ms added in front of the RM, swept (empty = skip)"
    )
    parser.add_argument(
        "--sweep-pods", type=int, default=2000, help="backlog per RM-latency run (default 2000)"
    )
    parser.add_argument(
        "--memory-backlog", type=int, default=500, help="backlog of the memory runs (0 = skip them)"
    )
    parser.add_argument(
        "--unrelated-pods", type=int, default=10000, help="bound pods of another scheduler (memory)"
    )
    parser.add_argument(
        "--pending-pods", type=int, default=2000, help="Bindery's own pods that fit nowhere (memory)"
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path("ceiling-results"), help="JSON and PNG here"
    )
    parser.add_argument(
        "--py-spy",
        type=pathlib.Path,
        metavar="SVG",
        help="profile the operator of Bindery's backlog run with `py-spy record` (.svg flamegraph, "
        ".json speedscope, else collapsed stacks)",
    )
    parser.add_argument(
        "--rm-postgres",
        type=int,
        default=0,
        metavar="REPLICAS",
        help="Bindery's reference RM as this many replicas on a PostgreSQL of its own (fsync on), "
        "behind a round-robin proxy when more than one (default 0: one RM on SQLite)",
    )
    parser.add_argument(
        "--shape",
        choices=[PLAIN, RULES],
        default=PLAIN,
        help=f"backlog pods: {PLAIN} (default) or {RULES}: each with a hard zone spread and a required "
        "hostname anti-affinity over its group (scheduler_perf's TopologySpreading and "
        "SchedulingPodAntiAffinity shapes); the RM-latency sweep and steady mode stay plain",
    )
    parser.add_argument(
        "--side-by-side-pods",
        type=int,
        default=0,
        help="memory: Bindery and kube-scheduler serving at once, RSS of each before and after this "
        "many bound pods are created (0 = skip)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes for CI (for the sizes above left at their defaults)"
    )
    a = parser.parse_args(argv)
    if a.smoke:  # a size given on the command line wins: tests/benchmarks narrows the smoke that way
        tiny = {
            "nodes": 4,
            "pods": 30,
            "rate": 10.0,
            "steady_seconds": 1.0,
            "sweep_pods": 20,
            "rm_latency": "0,10",
            "memory_backlog": 10,
            "unrelated_pods": 40,
            "pending_pods": 10,
            "side_by_side_pods": 40,
        }
        for name, value in tiny.items():
            if getattr(a, name) == parser.get_default(name):
                setattr(a, name, value)
    return Args(
        nodes=a.nodes,
        pods=a.pods,
        contenders=[c for c in a.contenders.split(",") if c],
        kwok=a.kwok,
        max_in_flight=a.max_in_flight,
        concurrency=a.concurrency,
        rate=a.rate,
        steady_seconds=a.steady_seconds,
        steady_contenders=[c for c in a.steady_contenders.split(",") if c],
        rm_latency=[float(x) for x in a.rm_latency.split(",") if x.strip()],
        sweep_pods=a.sweep_pods,
        memory_backlog=a.memory_backlog,
        unrelated_pods=a.unrelated_pods,
        pending_pods=a.pending_pods,
        out=a.out,
        py_spy=a.py_spy,
        rm_postgres=a.rm_postgres,
        shape=a.shape,
        side_by_side_pods=a.side_by_side_pods,
    )


async def make_nodes(api: Api, *, count: int, kwok: bool) -> list[str]:
    from kubernetes_asyncio import client, config

    from bindery.devcluster.nodes import create_kwok_node, create_node

    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(api.kubeconfig), client_configuration=configuration)
    names = [f"node-{i + 1:04d}" for i in range(count)]
    async with client.ApiClient(configuration=configuration) as kube:
        make = create_kwok_node if kwok else create_node
        gate = asyncio.Semaphore(16)

        async def one(index: int, name: str) -> None:
            labels = {POOL_LABEL: POOL, ZONE_LABEL: f"zone-{index % ZONES}"}
            async with gate:
                await make(kube, name=name, capacity=BIG_NODE, labels=labels)

        await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    return names


async def run(args: Args, plane: Any, workdir: pathlib.Path) -> dict[str, Any]:
    report: dict[str, Any] = {"nodes": args.nodes, "pods": args.pods, "kwok": args.kwok}
    with contextlib.ExitStack() as stack:
        return await _run(args, plane, workdir, report, stack)


async def _run(
    args: Args, plane: Any, workdir: pathlib.Path, report: dict[str, Any], stack: contextlib.ExitStack
) -> dict[str, Any]:
    async with Api(plane.kubeconfig) as api:
        started = time.monotonic()
        nodes = await make_nodes(api, count=args.nodes, kwok=args.kwok)
        say(f"{len(nodes)} nodes in {time.monotonic() - started:.1f}s")
        await install_bindery(plane)
        await create_namespace(api, "bindery-system")
        PLANE_PROCESSES.update(plane_processes(plane.workdir))
        postgres = None
        if args.rm_postgres:
            from bindery.devcluster.postgres import PostgresServer

            postgres = await asyncio.to_thread(PostgresServer.start, durable=True)
            stack.callback(postgres.stop)
            report["rm_backend"] = f"PostgreSQL x {args.rm_postgres}"
            say(f"Bindery's reference RM: {args.rm_postgres} replica(s) on PostgreSQL (fsync on)")
        else:
            report["rm_backend"] = "SQLite"
        bench = Plane(plane, workdir, api, postgres=postgres, rm_replicas=max(1, args.rm_postgres))
        everyone = contenders(
            bench, names=args.contenders, max_in_flight=args.max_in_flight, concurrency=args.concurrency
        )
        within = 120 + args.pods / 25
        results: list[Backlog] = []
        groups = rule_groups(pods=args.pods, nodes=args.nodes)
        report["shape"] = args.shape
        shaped = "" if args.shape == PLAIN else f" with rules ({groups} groups, each spread and anti-affine)"
        say(f"\nbacklog: {args.pods} pods{shaped} waiting on {args.nodes} nodes, then the contender starts")
        for number, contender in enumerate(everyone, 1):
            start = contender.start
            if contender.label == BINDERY and args.py_spy is not None:
                start = profiled(bench, args)
            result = await backlog(
                api,
                label=contender.label,
                start=start,
                scheduler_name=contender.scheduler_name,
                pods=args.pods,
                namespace=f"backlog-{number}",
                within=within,
                shape=args.shape,
                groups=groups,
            )
            results.append(result)
            cpu = ", ".join(f"{k} {v:.2f}" for k, v in result.cpu_ms_per_pod.items())
            say(
                f"  {contender.label:<24} {result.bound}/{result.pods} bound, {fmt(result.rate)} pods/s over "
                f"{fmt(result.bind_seconds, '{:.2f}')}s, writes/pod {fmt(result.writes_per_pod, '{:.2f}')}; "
                f"CPU ms/pod: {cpu}"
            )
        report["backlog"] = [dataclasses.asdict(r) for r in results]
        sweep: list[dict[str, Any]] = []
        if args.rm_latency and BINDERY in args.contenders:
            say(f"\nRM latency sweep: Bindery, backlogs of {args.sweep_pods} pods")
            for number, latency in enumerate(args.rm_latency, 1):
                result = await backlog(
                    api,
                    label=f"{BINDERY} +{latency:g} ms",
                    start=lambda n, ms=latency: bench.bindery(
                        n, latency_ms=ms, max_in_flight=args.max_in_flight
                    ),
                    scheduler_name="bindery-bench",
                    pods=args.sweep_pods,
                    namespace=f"latency-{number}",
                    within=120 + args.sweep_pods / 10,
                )
                sweep.append(
                    {"latency_ms": latency, "rate": result.rate, "bound": result.bound, "pods": result.pods}
                )
                say(f"  +{latency:g} ms: {result.bound}/{result.pods} bound, {fmt(result.rate)} pods/s")
        report["rm_latency"] = sweep
        steadies: list[Steady] = []
        if args.steady_seconds > 0:
            say(f"\nsteady: {args.rate:g} pods/s for {args.steady_seconds:g}s against a serving contender")
            chosen = contenders(
                bench,
                names=[c for c in args.steady_contenders if c in args.contenders],
                max_in_flight=args.max_in_flight,
                concurrency=args.concurrency,
            )
            for number, contender in enumerate(chosen, 1):
                result_s = await steady(
                    api,
                    label=contender.label,
                    start=contender.start,
                    scheduler_name=contender.scheduler_name,
                    rate=args.rate,
                    seconds=args.steady_seconds,
                    namespace=f"steady-{number}",
                )
                steadies.append(result_s)
                say(
                    f"  {contender.label:<24} {result_s.bound}/{result_s.pods} bound; time to bind p50 "
                    f"{fmt(result_s.p50_ms, '{:.0f}')} p90 {fmt(result_s.p90_ms, '{:.0f}')} "
                    f"p99 {fmt(result_s.p99_ms, '{:.0f}')} ms"
                )
        report["steady"] = [dataclasses.asdict(s) for s in steadies]
        if args.memory_backlog and BINDERY in args.contenders:
            say("\nmemory")
            report["memory"] = await memory_sweep(api, bench, args, nodes)
        if args.side_by_side_pods:
            say(f"\nmemory, side by side: Bindery and kube-scheduler, {args.side_by_side_pods} bound pods")
            report["side_by_side"] = await side_by_side_memory(api, bench, args, nodes)
    report["_results"] = results
    report["_steady"] = steadies
    return report


def profiled(bench: Plane, args: Args) -> Starter:
    """Bindery with its operator run under `py-spy record` (raw = collapsed stacks, else by suffix)."""
    assert args.py_spy is not None
    out = args.py_spy.resolve()
    kind = {".svg": "flamegraph", ".json": "speedscope"}.get(out.suffix, "raw")
    binary = pathlib.Path(sys.executable).parent / "py-spy"
    spy = [
        str(binary) if binary.exists() else "py-spy",
        "record",
        "--format",
        kind,
        "-o",
        str(out),
        "--rate",
        "200",
        "--nonblocking",  # sample without pausing the operator: its rate stays close to an unprofiled run
        "--",
    ]
    return lambda n: bench.bindery(n, max_in_flight=args.max_in_flight, profiler=spy)


async def install_bindery(plane: Any) -> None:
    from kubernetes_asyncio import client, config

    from bindery.controller.startup.install import apply_crd, grant_operator

    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration=configuration) as kube:
        await apply_crd(api=kube)
        await grant_operator(api=kube, user=OPERATOR_USER)


def summary(report: dict[str, Any], args: Args) -> None:
    results: list[Backlog] = report.pop("_results")
    steadies: list[Steady] = report.pop("_steady")
    backlog_pods = f"{args.pods} pods on " if results else ""
    say(f"\n== {backlog_pods}{args.nodes} {'kwok ' if args.kwok else ''}nodes, {os.cpu_count()} CPUs ==")
    if results:
        print_backlog_table(results)
    if steadies:
        say(f"\n| steady {args.rate:g} pods/s | bound | p50 ms | p90 ms | p99 ms | max ms |")
        say("|---|---:|---:|---:|---:|---:|")
        for s in steadies:
            say(
                f"| {s.contender} | {s.bound}/{s.pods} | "
                + " | ".join(fmt(v, "{:.0f}") for v in (s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms))
                + " |"
            )
    if report.get("rm_latency"):
        zero = next((row["rate"] for row in report["rm_latency"] if row["latency_ms"] == 0), float("nan"))
        say("\n| RM latency ms | pods/s | × 0 ms |")
        say("|---:|---:|---:|")
        for row in report["rm_latency"]:
            say(f"| {row['latency_ms']:g} | {fmt(row['rate'])} | {fmt(row['rate'] / zero, '{:.2f}')} |")
    memory = report.get("memory") or {}
    if memory:
        say("\n| memory (operator RSS) | MB | growth MB |")
        say("|---|---:|---:|")
        say(
            f"| backlog of {memory['baseline']['backlog']} | "
            f"{fmt(memory['baseline']['rss_mb']['bindery operator'])} | |"
        )
        for key, label in (("unrelated", "unrelated bound pods"), ("pending", "own pending pods")):
            if key in memory:
                row = memory[key]
                say(
                    f"| + {row['pods']} {label} | {fmt(row['rss_mb']['bindery operator'])} | "
                    f"{row['operator_growth_mb']:+.1f} |"
                )
    side = report.get("side_by_side")
    if side:
        say(f"\n| RSS MB, {side['pods']} bound pods appear | before | after | growth | peak |")
        say("|---|---:|---:|---:|---:|")
        for name in side["growth_mb"]:
            say(
                f"| {name} | {fmt(side['before_mb'][name])} | {fmt(side['after_mb'][name])} | "
                f"{side['growth_mb'][name]:+.1f} | {fmt(side['peak_mb'][name])} |"
            )
        kube = side["growth_mb"].get("kube-scheduler", float("nan"))
        operator = side["growth_mb"].get("bindery operator", float("nan"))
        if kube and not math.isnan(kube):
            say(f"operator growth / kube-scheduler growth: {operator / kube:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
    ).stdout.strip()
    report.update({"when": stamp, "commit": commit, "cpus": os.cpu_count(), "python": sys.version.split()[0]})
    (args.out / "ceiling.json").write_text(json.dumps(report, indent=1, default=str))
    title = f"backlog of {args.pods} pods, {args.nodes} nodes ({commit}, {stamp})"
    plotted = bool(results) and plot(results, args.out / "ceiling.png", title=title)
    say(f"\n{args.out / 'ceiling.json'}" + (f", {args.out / 'ceiling.png'}" if plotted else ""))
    say(f"commit {commit}, {stamp}, {os.cpu_count()} CPUs, Python {report['python']}")


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--ceiling-binder":
        helper = argparse.ArgumentParser()
        helper.add_argument("--kubeconfig", type=pathlib.Path, required=True)
        helper.add_argument("--scheduler-name", required=True)
        helper.add_argument("--concurrency", type=int, default=64)
        h = helper.parse_args(argv[1:])
        asyncio.run(
            ceiling_binder(
                kubeconfig=h.kubeconfig, scheduler_name=h.scheduler_name, concurrency=h.concurrency
            )
        )
        return 0
    if argv and argv[0] == "--delay-proxy":
        helper = argparse.ArgumentParser()
        helper.add_argument("--upstream", required=True)
        helper.add_argument("--delay-ms", type=float, required=True)
        h = helper.parse_args(argv[1:])
        asyncio.run(delay_proxy(upstream=h.upstream, delay_ms=h.delay_ms))
        return 0
    args = parse_args(argv)
    from bindery.devcluster.plane import ControlPlane

    say(
        f"starting etcd + kube-apiserver{' + kwok' if args.kwok else ''} on 127.0.0.1 "
        f"({os.cpu_count()} CPUs) ..."
    )
    with (
        tempfile.TemporaryDirectory(prefix="ceiling-") as directory,
        ControlPlane.start(kwok=args.kwok) as plane,
    ):
        try:
            report = asyncio.run(run(args, plane, pathlib.Path(directory)))
            summary(report, args)
        finally:  # the contenders' logs outlive the run: why a pod was retried is in them
            logs = args.out / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            for log in pathlib.Path(directory).glob("*.log"):
                shutil.copy(log, logs / log.name)
    backlog_ok = all(r["bound"] == r["pods"] for r in report.get("backlog", []))
    steady_ok = all(s["bound"] == s["pods"] for s in report.get("steady", []))
    sweep_ok = all(s["bound"] == s["pods"] for s in report.get("rm_latency", []))
    return 0 if backlog_ok and steady_ok and sweep_ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
