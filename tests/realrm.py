"""Real processes for tests that must survive what a cluster does to them: the reference RM and the
operator each as its own OS process, and the invariants every scenario ends with.

Why processes and not the in-test fakes: crash safety is only proven by SIGKILL and SIGSTOP of a
real process, and a leak check only means something when the RM really stores reservations. The
reference RM runs `bindery rm serve --mirror-nodes` against the test plane, so its inventory is the
plane's Node objects; the operator runs `bindery run` with a kubeconfig of the caller's choice.

`invariant_violations` is what "nothing leaked, nothing stolen" means, read from the apiserver and
the RM alone:

- no pod has more than one `Scheduled` event (bound twice, or reported twice);
- no node has more requested by its bound, non-terminal pods (every namespace, whoever bound
  them) than its allocatable;
- every active reservation of the namespace is committed to its pod's node (the pod exists with
  that UID, bound there, not finished) or reserved for a pod that is still pending;
- every bound pod of a served scheduler name has an active reservation on its node.

The last three are `bindery audit`'s own checks (`bindery.audit.findings`), so the suites test the
product's definition of a leak, not a second one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any, Self

from kubernetes_asyncio import client

from bindery.audit.findings import leaked_reservations, overcommitted_nodes, unreserved_pods
from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.reference_rm.cli import serve_command, served_url
from bindery.rm.client import ResourceManagerClient
from bindery.rm.models import Reservation, ReservationState

TERMINAL = ("Succeeded", "Failed")
_METRICS = re.compile(rb"serving Prometheus metrics at (http://\S+/metrics)")


class ProcessError(AssertionError):
    """A process of the harness did not start, or died when it should not have."""


def _tail(path: pathlib.Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class RMProcess:
    """The reference RM as its own process, mirroring the plane's Nodes (optionally a labelled pool).

    The first start picks a free port; `restart()` comes back on the same one, so a
    ResourceManager object pointing at `url` stays valid across a SIGKILL.
    """

    def __init__(
        self,
        *,
        kubeconfig: pathlib.Path,
        directory: pathlib.Path,
        node_selector: str = "",
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        db: str | None = None,
        token: str | None = None,
    ) -> None:
        self.directory = directory
        self._env = {**os.environ, **env} if env else None  # e.g. OTEL_* for the tracing test
        directory.mkdir(parents=True, exist_ok=True)
        self.token = token or uuid.uuid4().hex  # replicas on one database share theirs
        self.token_file = directory / "rm-token"
        self.token_file.write_text(self.token)
        #: The operator's token of `bindery rm serve --admin-token-file`: what :meth:`revoke` uses.
        self.admin_token_file = directory / "rm-admin-token"
        self.admin_token_file.write_text(uuid.uuid4().hex)
        self.log_path = directory / "rm.log"
        #: a PostgreSQL URL for replicas on one database; else a SQLite file of this process's own
        self._db: pathlib.Path | str = db or directory / "rm.sqlite"
        self._options = [
            "--mirror-nodes",
            "--kubeconfig",
            str(kubeconfig),
            *(["--node-selector", node_selector] if node_selector else []),
            "--admin-token-file",
            str(self.admin_token_file),
            *options,
        ]
        self._listen = "127.0.0.1:0"
        self._process: asyncio.subprocess.Process | None = None
        self.url = ""

    async def start(self) -> None:
        argv = serve_command(db=self._db, token_file=self.token_file, options=self._options)
        argv[argv.index("--listen") + 1] = self._listen
        with self.log_path.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *argv, stdout=subprocess.PIPE, stderr=log, start_new_session=True, env=self._env
            )
        assert self._process.stdout is not None
        try:
            banner = await asyncio.wait_for(self._process.stdout.readline(), timeout=60)
        except TimeoutError:
            banner = b""
        if not banner:
            raise ProcessError(f"the reference RM did not start:\n{_tail(self.log_path)}")
        self.url = served_url(banner)
        self._listen = self.url.removeprefix("http://")

    @property
    def pid(self) -> int:
        assert self._process is not None, "RMProcess.start() was not called"
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.running:
            assert self._process is not None
            self._process.send_signal(signum)

    async def wait(self, *, within: float = 30) -> int:
        assert self._process is not None
        return await asyncio.wait_for(self._process.wait(), timeout=within)

    async def restart(self) -> None:
        """SIGKILL (if running) and start again on the same port with the same database."""
        if self.running:
            self.kill()
            await self.wait()
        await self.start()

    async def stop(self) -> None:
        if not self.running:
            return
        self.kill(signal.SIGTERM)
        try:
            await self.wait(within=15)
        except TimeoutError:
            self.kill()
            await self.wait()

    def client(self, **options: Any) -> ResourceManagerClient:
        return ResourceManagerClient(
            base_url=self.url, token_file=self.token_file, allow_insecure_http=True, **options
        )

    async def revoke(self, reservation_id: str, *, reason: str) -> None:
        """Take a reservation back as the RM's operator would (`bindery rm revoke`, its own process)."""
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "bindery.reference_rm.cli", "revoke", "--url", self.url),
            *("--admin-token-file", str(self.admin_token_file), "--reason", reason, reservation_id),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, output.decode()

    async def reservations(self, *, active: bool = True) -> list[Reservation]:
        """What the RM holds (by default only reserved and committed reservations)."""
        async with self.client() as rm:
            items = await rm.list_reservations()
        return [r for r in items if r.state.active] if active else items

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class OperatorProcess:
    """`bindery run` as its own process (its own session, so signals reach it alone)."""

    def __init__(
        self,
        *,
        kubeconfig: pathlib.Path,
        directory: pathlib.Path,
        args: Sequence[str] = (),
        name: str = "op",
        env: Mapping[str, str] | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._env = dict(env or {})
        self.log_path = directory / f"{name}.log"
        self._argv = [
            sys.executable,
            "-m",
            "bindery",
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--metrics-addr",
            "127.0.0.1:0",
            *args,
        ]
        self._process: asyncio.subprocess.Process | None = None
        self._log_offset = 0

    async def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self._env}
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self._argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    @property
    def pid(self) -> int:
        assert self._process is not None, "OperatorProcess.start() was not called"
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def log(self) -> str:
        """What this run of the process has written so far."""
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    async def wait_for_log(self, pattern: str, *, within: float = 60) -> re.Match[str]:
        """The first match of `pattern` in this run's log; fails with the log's tail if none comes."""
        compiled = re.compile(pattern)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while loop.time() < deadline:
            match = compiled.search(self.log())
            if match is not None:
                return match
            if not self.running:
                break
            await asyncio.sleep(0.1)
        raise ProcessError(f"operator log never matched {pattern!r}:\n{_tail(self.log_path)}")

    async def metrics_url(self, *, within: float = 60) -> str:
        return (await self.wait_for_log(_METRICS.pattern.decode(), within=within)).group(1)

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.running:
            assert self._process is not None
            self._process.send_signal(signum)

    def pause(self) -> None:
        self.kill(signal.SIGSTOP)

    def resume(self) -> None:
        self.kill(signal.SIGCONT)

    async def wait(self, *, within: float = 30) -> int:
        assert self._process is not None
        return await asyncio.wait_for(self._process.wait(), timeout=within)

    async def stop(self) -> None:
        if not self.running:
            return
        self.resume()  # a stopped process cannot act on SIGTERM
        self.kill(signal.SIGTERM)
        try:
            await self.wait(within=30)
        except TimeoutError:
            self.kill()
            await self.wait()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


@contextlib.asynccontextmanager
async def operator_process(
    *,
    kubeconfig: pathlib.Path,
    directory: pathlib.Path,
    args: Sequence[str] = (),
    name: str = "op",
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[OperatorProcess]:
    """An OperatorProcess for the `async with` block; its log is printed if the block fails."""
    process = OperatorProcess(kubeconfig=kubeconfig, directory=directory, args=args, name=name, env=env)
    await process.start()
    try:
        yield process
    except BaseException:
        print(f"--- {name} log (tail) ---\n{_tail(process.log_path, 80)}")
        raise
    finally:
        await process.stop()


async def serve_with(
    api: client.ApiClient,
    *,
    rm: RMProcess,
    name: str,
    scheduler_names: Sequence[str],
    namespace: str,
    **spec: Any,
) -> dict[str, Any]:
    """Create the token Secret (in `namespace`) and a ResourceManager for `rm`; returns the object.

    The caller deletes the ResourceManager (cluster-scoped); the Secret goes with the namespace.
    """
    secret = f"{name}-token"
    await client.CoreV1Api(api).create_namespaced_secret(
        namespace=namespace,
        body={
            "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
            "stringData": {"token": rm.token},
        },
    )
    body = {
        "apiVersion": "bindery.dev/v1alpha1",
        "kind": "ResourceManager",
        "metadata": {"name": name},
        "spec": {
            "schedulerNames": list(scheduler_names),
            "endpoint": rm.url,
            "allowInsecureHTTP": True,
            "auth": {"tokenSecretRef": {"namespace": namespace, "name": secret}},
            **spec,
        },
    }
    created: dict[str, Any] = await client.CustomObjectsApi(api).create_cluster_custom_object(
        group="bindery.dev", version="v1alpha1", plural="resourcemanagers", body=body
    )
    return created


@dataclasses.dataclass(frozen=True)
class Scene:
    """A labelled node of its own, the reference RM mirroring it, the operator, and a served name."""

    rm: RMProcess
    operator: OperatorProcess
    node: str
    scheduler: str
    rm_name: str


@contextlib.asynccontextmanager
async def scene(
    api: client.ApiClient,
    *,
    admin_kubeconfig: pathlib.Path,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    directory: pathlib.Path,
    capacity: Mapping[str, str] | None = None,
) -> AsyncIterator[Scene]:
    """The usual stage of a process test; the ResourceManager and the node are deleted afterwards."""
    from bindery.devcluster.nodes import create_node

    token = uuid.uuid4().hex[:8]
    node, scheduler, rm_name = f"scene-{token}", f"sched-{token}", f"rm-{token}"
    await create_node(
        api,
        name=node,
        capacity=dict(capacity or {"cpu": "4", "memory": "8Gi", "pods": "20"}),
        labels={"bindery.dev/test-pool": token},
    )
    try:
        async with (
            RMProcess(
                kubeconfig=admin_kubeconfig,
                directory=directory,
                node_selector=f"bindery.dev/test-pool={token}",
            ) as rm,
            operator_process(kubeconfig=operator_kubeconfig, directory=directory) as operator,
        ):
            await serve_with(api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=namespace)
            yield Scene(rm=rm, operator=operator, node=node, scheduler=scheduler, rm_name=rm_name)
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CustomObjectsApi(api).delete_cluster_custom_object(
                group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=rm_name
            )
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(api).delete_node(name=node)


# -- invariants ----------------------------------------------------------------------------------


def reservation_violations(
    *,
    reservations: Sequence[Reservation],
    pods: Sequence[Mapping[str, Any]],
    namespace: str,
    scheduler_names: Collection[str],
) -> list[str]:
    """Pure: `bindery audit`'s leaked and unreserved findings for one namespace, plus reservations
    left `reserved` under a pod that is already bound (settled means committed by then)."""
    mine = [r for r in reservations if r.namespace == namespace and r.state.active]
    findings = leaked_reservations(resource_manager="rm", reservations=mine, pods=pods)
    findings += unreserved_pods(
        resource_manager="rm", scheduler_names=scheduler_names, reservations=mine, pods=pods
    )
    lines = [f"{f.subject}: {f.message}" for f in findings]
    by_uid = {pod["metadata"]["uid"]: pod for pod in pods}
    for reservation in mine:
        bound_to = (by_uid.get(reservation.pod_uid, {}).get("spec") or {}).get("nodeName")
        if reservation.state is ReservationState.RESERVED and bound_to == reservation.node:
            lines.append(
                f"reservation {reservation.id}: still reserved although pod {namespace}/{reservation.name} "
                f"is bound to {bound_to}"
            )
    return lines


def double_schedules(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """Pure: pods with more than one `Scheduled` event (events.k8s.io objects)."""
    counts = collections.Counter(
        (e.get("regarding") or {}).get("uid") for e in events if e.get("reason") == "Scheduled"
    )
    names = {(e.get("regarding") or {}).get("uid"): (e.get("regarding") or {}).get("name") for e in events}
    return [f"pod {names[uid]} ({uid}) was scheduled {n} times" for uid, n in counts.items() if n > 1]


async def invariant_violations(
    *, api: client.ApiClient, rm: RMProcess, namespace: str, scheduler_names: Collection[str]
) -> list[str]:
    """Everything in the module docstring that does not hold right now, one line each."""
    core = client.CoreV1Api(api)
    everywhere = await core.list_pod_for_all_namespaces(
        field_selector="spec.nodeName!=", _preload_content=False
    )
    ours = await core.list_namespaced_pod(namespace, _preload_content=False)
    nodes = await core.list_node(_preload_content=False)
    events = await client.EventsV1Api(api).list_namespaced_event(namespace, _preload_content=False)
    bound_pods: list[dict[str, Any]] = (await everywhere.json())["items"]
    pods: list[dict[str, Any]] = (await ours.json())["items"]
    lines = double_schedules((await events.json())["items"])
    overcommitted = overcommitted_nodes(nodes=(await nodes.json())["items"], pods=bound_pods)
    lines += [f"{f.subject}: {f.message}" for f in overcommitted]
    lines += reservation_violations(
        reservations=await rm.reservations(), pods=pods, namespace=namespace, scheduler_names=scheduler_names
    )
    return lines


async def settled_invariants(
    *,
    api: client.ApiClient,
    rm: RMProcess,
    namespace: str,
    scheduler_names: Collection[str],
    within: float = 60.0,
) -> float:
    """Wait until every invariant holds; returns the seconds it took. Fails with the last violations.

    Reserved reservations of pending pods are allowed, so "settled" also needs every pod of
    `scheduler_names` in `namespace` bound or the caller's own proof that it cannot be.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    lines: list[str] = []
    while loop.time() - started < within:
        lines = await invariant_violations(
            api=api, rm=rm, namespace=namespace, scheduler_names=scheduler_names
        )
        if not lines:
            return loop.time() - started
        await asyncio.sleep(0.5)
    raise AssertionError(f"invariants still violated after {within:g}s:\n" + "\n".join(lines))


async def audit_findings(
    *, kubeconfig: pathlib.Path, namespace: str, rm_name: str, nodes: Collection[str]
) -> list[str]:
    """`bindery audit -o json -n <namespace>` as a user runs it: the findings and gaps that concern
    this namespace, this RM or these nodes (other tests share the plane), one line each."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bindery",
        "audit",
        "-o",
        "json",
        "-n",
        namespace,
        "--kubeconfig",
        str(kubeconfig),
        "--grace",
        "600",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    try:
        document = json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(
            f"bindery audit exited {process.returncode} without JSON: {err.decode()[-2000:]}"
        ) from None
    mine = {f"node {n}" for n in nodes}
    relevant = [
        f"{f['kind']}: {f['subject']}: {f['message']}"
        for f in document["findings"]
        if f.get("resourceManager") == rm_name
        or f["subject"].startswith(f"pod {namespace}/")
        or f["subject"] in mine
    ]
    relevant += [f"gap: {gap}" for gap in document["gaps"] if rm_name in gap]
    return relevant
