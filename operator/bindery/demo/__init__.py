"""`bindery demo`: a small cluster on this machine, Bindery beside kube-scheduler, and where every
pod went.

Starts a real etcd + kube-apiserver with kube-controller-manager, kube-scheduler and kwok
(bindery.devcluster), and a labelled pool of kwok nodes: kwok plays their kubelets, so pods bound
there turn Running and Job pods complete. kube-scheduler first places a DaemonSet and a Deployment
of the default scheduler on the pool. Then the reference RM (SQLite, mirroring the pool's nodes and
counting every pod on them, whoever placed it) and the operator start in this process, a
ResourceManager object is created, and a Deployment, a Job and a gang with `schedulerName: bindery`
follow. The gang is an Indexed Job whose pods form a PodGroup (the Job controller makes it, with
WorkloadWithJob): Bindery reserves all of its pods in one call to the RM and binds them together.
The user watches Bindery's pods go Pending -> Scheduled -> Running (the Job's -> Succeeded); the
demo ends with where each pod went, what each node holds, pods bound per second, and apiserver
writes per bound pod as the operator counted them (and the Bindings as the apiserver's own
`apiserver_request_total` saw them: only Bindery binds while its pods are placed).

With `--rm slurm` a real Slurm is the resource manager instead (bindery.demo.slurm): the demo
ends with `squeue`'s placeholder jobs beside the pods they hold room for.

The operator runs under its own minted client-certificate identity bound to exactly the ClusterRole
the Helm chart grants (bindery.controller.startup.rbac), so the demo also proves those permissions suffice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import pathlib
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from bindery import apiserver
from bindery.apiserver import ApiClient, client_from, resources
from bindery.apiserver.watching import Event, list_watch
from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.controller.startup.entry import EmbeddedOperator
from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.controller.startup.options import OperatorOptions
from bindery.controller.startup.runtime import Runtime
from bindery.quantity import format_quantity
from bindery.scheduling.queue import DEFAULT_MAX_IN_FLIGHT

POOL_LABEL = "bindery.dev/pool"
POOL = "demo"
NAMESPACE = "bindery-demo"
SYSTEM_NAMESPACE = "bindery-system"
SCHEDULER = "bindery"
OPERATOR_USER = "bindery-operator"
STALL_SECONDS = 10.0
APP_CPU, JOB_CPU = "250m", "500m"
WRITE_KEYS = {("pods", "binding")}  # what only Bindery writes while its pods are placed


@dataclasses.dataclass(frozen=True)
class DemoArgs:
    pods: int
    job_pods: int
    nodes: int
    cpu_per_node: int
    max_in_flight: int
    gang_pods: int = 6
    rm: str = "reference"


def parse_args(argv: Sequence[str]) -> DemoArgs:
    parser = argparse.ArgumentParser(prog="bindery demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rm",
        choices=("reference", "slurm"),
        default="reference",
        help="the resource manager: the reference RM (default), or a real Slurm on loopback behind "
        "the adapter `bindery rm slurm` (needs root; fetches Debian's Slurm once)",
    )
    parser.add_argument(
        "--pods", type=int, help="replicas of Bindery's Deployment (default 48; with --rm slurm 12)"
    )
    parser.add_argument(
        "--job-pods", type=int, help="completions of Bindery's Job (default 12; with --rm slurm 6)"
    )
    parser.add_argument(
        "--gang-pods",
        type=int,
        help="pods of the gang (an Indexed Job forming a PodGroup; 0: none; default 6, with --rm slurm 4)",
    )
    parser.add_argument("--nodes", type=int, default=4, help="kwok nodes in the pool (default 4)")
    parser.add_argument("--cpu-per-node", type=int, default=8, help="allocatable CPUs per node (default 8)")
    parser.add_argument(
        "--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT, help="the ResourceManager's maxInFlight"
    )
    args = parser.parse_args(list(argv))
    # Slurm gives every placeholder job whole CPUs and takes about a second to start one: fewer pods.
    pods, job_pods, gang_pods = (12, 6, 4) if args.rm == "slurm" else (48, 12, 6)
    return DemoArgs(
        pods=pods if args.pods is None else args.pods,
        job_pods=job_pods if args.job_pods is None else args.job_pods,
        nodes=args.nodes,
        gang_pods=gang_pods if args.gang_pods is None else args.gang_pods,
        cpu_per_node=args.cpu_per_node,
        max_in_flight=args.max_in_flight,
        rm=args.rm,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from bindery.devcluster.plane import ControlPlane  # the demo is the only product code using it

    slurm_root: pathlib.Path | None = None
    if args.rm == "slurm":
        from bindery.demo.slurm import SlurmDemoUnavailable, prepare

        try:
            slurm_root = prepare(say=say)
        except SlurmDemoUnavailable as exc:
            print(f"bindery demo: {exc}", file=sys.stderr)
            return 2

    say(
        "starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on 127.0.0.1 "
        "(the first run builds them: several minutes) ..."
    )
    started = time.monotonic()
    with ControlPlane.start(controllers=True, kwok=True, kube_scheduler=True) as plane:
        say(f"cluster ready in {time.monotonic() - started:.1f}s at {plane.server}")
        say(f"  to look around meanwhile: export KUBECONFIG={plane.kubeconfig} PATH={plane.bin_dir}:$PATH")
        operator_kubeconfig = plane.mint_kubeconfig(user=OPERATOR_USER)
        return asyncio.run(
            _demo(
                args=args,
                admin=plane.kubeconfig,
                operator_kubeconfig=operator_kubeconfig,
                slurm_root=slurm_root,
            )
        )


def say(message: str) -> None:
    print(message, flush=True)


async def _demo(
    *,
    args: DemoArgs,
    admin: pathlib.Path,
    operator_kubeconfig: pathlib.Path,
    slurm_root: pathlib.Path | None = None,
) -> int:
    api = await _api_client(admin)
    async with api, contextlib.AsyncExitStack() as stack:
        await apply_crd(api=api)
        await grant_operator(api=api, user=OPERATOR_USER)
        await _namespaces(api)
        nodes = await _nodes(api, args=args)
        say(f"kwok reports {len(nodes)} nodes Ready, labelled {POOL_LABEL}={POOL}: {', '.join(nodes)}")
        workdir = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bindery-demo-")))
        if slurm_root is not None:
            return await _slurm_demo(
                api, stack=stack, args=args, nodes=nodes, root=slurm_root, workdir=workdir,
                operator_kubeconfig=operator_kubeconfig,
            )  # fmt: skip
        await _default_workloads(api, args=args)
        return await _reference_demo(
            api, stack=stack, args=args, nodes=nodes, workdir=workdir, operator_kubeconfig=operator_kubeconfig
        )


async def _reference_demo(
    api: ApiClient,
    *,
    stack: contextlib.AsyncExitStack,
    args: DemoArgs,
    nodes: Sequence[str],
    workdir: pathlib.Path,
    operator_kubeconfig: pathlib.Path,
) -> int:
    from bindery.reference_rm.mirror import MirrorGate, NodeMirror, PodMirror
    from bindery.reference_rm.placement import Policy
    from bindery.reference_rm.server import serve_reference_rm

    token = secrets.token_urlsafe(24)
    server = await stack.enter_async_context(
        # The chart's default policy: a Deployment spreads as kube-scheduler spreads it.
        serve_reference_rm(db_path=workdir / "rm.sqlite", token=token, policy=Policy.SPREAD)
    )
    # Count every pod on the pool, as `bindery rm serve --mirror-nodes` does: kube-scheduler's too.
    gate = MirrorGate(set_inventory=server.rm.set_inventory, set_bound_pods=server.rm.set_bound_pods)
    for mirror in (
        NodeMirror(api=api, label_selector=f"{POOL_LABEL}={POOL}", on_change=gate.nodes),
        PodMirror(api=api, on_change=gate.pods),
    ):
        task = asyncio.create_task(mirror.run(), name=type(mirror).__name__)
        stack.callback(task.cancel)
    say(
        f"reference RM (SQLite, mirroring {POOL_LABEL}={POOL} and every pod on it, policy spread) "
        f"at {server.url}"
    )

    runtime = await _start_operator(stack, kubeconfig=operator_kubeconfig, workdir=workdir)
    await create_reference_resource_manager(
        api, url=server.url, token=token, max_in_flight=args.max_in_flight
    )
    await _wait_ready(api, name="reference")
    say(f'ResourceManager "reference" is Ready; operator runs as user "{OPERATOR_USER}"')

    return await _bindery_workloads(api, args=args, runtime=runtime, nodes=nodes)


async def _slurm_demo(
    api: ApiClient,
    *,
    stack: contextlib.AsyncExitStack,
    args: DemoArgs,
    nodes: Sequence[str],
    root: pathlib.Path,
    workdir: pathlib.Path,
    operator_kubeconfig: pathlib.Path,
) -> int:
    from bindery.demo.slurm import RESOURCE_MANAGER, slurm_stage, squeue_table

    say(
        f"starting Slurm on loopback: munged, slurmctld, {len(nodes)} slurmd named as the pool's nodes "
        f"({args.cpu_per_node} CPUs each), slurmrestd, and the adapter `bindery rm slurm` ..."
    )
    stage = stack.enter_context(
        slurm_stage(
            root=root, workdir=workdir, nodes=nodes, cpus=args.cpu_per_node, labels={POOL_LABEL: POOL}
        )
    )
    say(
        f"Slurm is up (logs in {stage.bed.workdir / 'log'}); its adapter serves the RM contract "
        f"at {stage.url}"
    )
    say("  Slurm owns these nodes: kube-scheduler places nothing on them in this demo")
    runtime = await _start_operator(stack, kubeconfig=operator_kubeconfig, workdir=workdir)
    await _create_resource_manager(
        api, name=RESOURCE_MANAGER, url=stage.url, token=stage.token, max_in_flight=args.max_in_flight
    )
    await _wait_ready(api, name=RESOURCE_MANAGER)
    say(f'ResourceManager "{RESOURCE_MANAGER}" is Ready; operator runs as user "{OPERATOR_USER}"')
    status = await _bindery_workloads(api, args=args, runtime=runtime, nodes=nodes)
    # A finished Job pod's reservation is released when the operator sees it finish, and Slurm then
    # ends its job: give that a moment, so the table shows the steady state, not the hand-over.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        running = {
            f"bindery:{NAMESPACE}/{p['metadata']['name']}"
            for p in (await apiserver.list_all(api, resources.PODS, namespace=NAMESPACE)).items
            if (p.get("status") or {}).get("phase") == "Running"
        }
        jobs = {r["name"] for r in await asyncio.to_thread(stage.bed.squeue) if r["state"] == "RUNNING"}
        if jobs <= running:
            break
        await asyncio.sleep(0.5)
    say("\nsqueue (each running pod holds its room as a placeholder job; finished pods released theirs):")
    for line in await asyncio.to_thread(squeue_table, stage.bed):
        say(f"  {line}")
    return status


async def _start_operator(
    stack: contextlib.AsyncExitStack, *, kubeconfig: pathlib.Path, workdir: pathlib.Path
) -> Runtime:
    options = OperatorOptions(kubeconfig=kubeconfig, probe_interval=2.0, state_dir=workdir)
    operator = EmbeddedOperator(options=options)
    await operator.start()
    stack.push_async_callback(operator.stop)
    return operator.runtime


async def _api_client(kubeconfig: pathlib.Path) -> ApiClient:
    return await client_from(kubeconfig=str(kubeconfig))


async def _namespaces(api: ApiClient) -> None:
    for name in (NAMESPACE, SYSTEM_NAMESPACE):
        with contextlib.suppress(apiserver.Conflict):  # AlreadyExists
            await apiserver.create(api, resources.NAMESPACES, body={"metadata": {"name": name}})


async def _nodes(api: ApiClient, *, args: DemoArgs) -> list[str]:
    """The pool: kwok nodes, returned once kwok reports each Ready (it plays their kubelets)."""
    from bindery.devcluster.nodes import create_kwok_node

    names = [f"pool-{i + 1}" for i in range(args.nodes)]
    for name in names:
        await create_kwok_node(
            api,
            name=name,
            capacity={"cpu": str(args.cpu_per_node), "memory": "32Gi", "pods": "110"},
            labels={POOL_LABEL: POOL},
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = await apiserver.list_all(api, resources.NODES, label_selector=f"{POOL_LABEL}={POOL}")
        ready = [
            n["metadata"]["name"]
            for n in listed.items
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (n.get("status") or {}).get("conditions") or ()
            )
        ]
        if len(ready) == len(names):
            return names
        await asyncio.sleep(0.5)
    raise RuntimeError(f"kwok did not report the nodes {names} Ready within 60s")


def _template(*, app: str, cpu: str, scheduler: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {POOL_LABEL: POOL},
        "containers": [
            {"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": cpu}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def _deployment(name: str, *, replicas: int, cpu: str, scheduler: str | None) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": _template(app=name, cpu=cpu, scheduler=scheduler),
        },
    }


async def _default_workloads(api: ApiClient, *, args: DemoArgs) -> None:
    """What already runs on a real pool: a DaemonSet and a Deployment placed by kube-scheduler."""
    await apiserver.create(
        api,
        resources.DAEMON_SETS,
        namespace=NAMESPACE,
        body={
            "metadata": {"name": "node-agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "node-agent"}},
                "template": _template(app="node-agent", cpu="250m", scheduler=None),
            },
        },
    )
    await apiserver.create(
        api,
        resources.DEPLOYMENTS,
        namespace=NAMESPACE,
        body=_deployment("web", replicas=args.nodes, cpu="1", scheduler=None),
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        items = (await apiserver.list_all(api, resources.PODS, namespace=NAMESPACE)).items
        if len(items) == 2 * args.nodes and all(p["status"].get("phase") == "Running" for p in items):
            say(
                f"kube-scheduler placed a DaemonSet (node-agent, 250m CPU per node) and a Deployment "
                f"(web, {args.nodes} x 1 CPU); kwok runs them"
            )
            return
        await asyncio.sleep(0.5)
    raise RuntimeError("the default scheduler's DaemonSet and Deployment were not Running within 90s")


async def create_reference_resource_manager(
    api: ApiClient, *, url: str, token: str, max_in_flight: int
) -> None:
    """The token Secret and the ResourceManager "reference" for a reference RM at `url` (loopback).

    `SYSTEM_NAMESPACE` must exist. Shared by the demo and the kube-scheduler comparison benchmark.
    """
    await _create_resource_manager(api, name="reference", url=url, token=token, max_in_flight=max_in_flight)


async def _create_resource_manager(
    api: ApiClient, *, name: str, url: str, token: str, max_in_flight: int
) -> None:
    secret = f"{name}-rm-token"
    await apiserver.create(
        api,
        resources.SECRETS,
        namespace=SYSTEM_NAMESPACE,
        body={
            "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
            "stringData": {"token": token},
        },
    )
    await apiserver.create(
        api,
        resources.RESOURCE_MANAGERS,
        body={
            "apiVersion": resources.RESOURCE_MANAGERS.api_version,
            "kind": "ResourceManager",
            "metadata": {"name": name},
            "spec": {
                "schedulerNames": [SCHEDULER],
                "endpoint": url,
                "allowInsecureHTTP": True,  # loopback only
                "auth": {"tokenSecretRef": {"namespace": SYSTEM_NAMESPACE, "name": secret}},
                "maxInFlight": max_in_flight,
            },
        },
    )


async def _wait_ready(api: ApiClient, *, name: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    message = "no status yet"
    while time.monotonic() < deadline:
        rm = await apiserver.get(api, resources.RESOURCE_MANAGERS, name=name)
        for cond in (rm.get("status") or {}).get("conditions") or ():
            if cond["type"] == "Ready":
                if cond["status"] == "True":
                    return
                message = f"{cond.get('reason')}: {cond.get('message')}"
        await asyncio.sleep(0.5)
    raise RuntimeError(f'ResourceManager "{name}" did not become Ready within {within:g}s ({message})')


@dataclasses.dataclass
class _Seen:
    """One of Bindery's pods as the demo's watch saw it."""

    created: float
    kind: str  # "api" (the Deployment), "batch" (the Job) or "gang" (the gang's Job)
    bound: float | None = None
    node: str = ""
    phase: str = "Pending"


async def _bindery_workloads(
    api: ApiClient, *, args: DemoArgs, runtime: Runtime, nodes: Sequence[str]
) -> int:
    seen: dict[str, _Seen] = {}
    watcher = asyncio.create_task(_watch(api, seen))
    await asyncio.sleep(0.5)  # let the watch start
    writes_before, metrics_before = runtime.writes.snapshot(), await _write_metrics(api)
    total = args.pods + args.job_pods + args.gang_pods
    say(
        f"creating a Deployment (api, {args.pods} x {APP_CPU} CPU) and a Job (batch, {args.job_pods} "
        f"completions x {JOB_CPU} CPU) with schedulerName: {SCHEDULER} in namespace {NAMESPACE} ..."
    )
    first = time.monotonic()
    await apiserver.create(
        api,
        resources.DEPLOYMENTS,
        namespace=NAMESPACE,
        body=_deployment("api", replicas=args.pods, cpu=APP_CPU, scheduler=SCHEDULER),
    )
    job = _template(app="batch", cpu=JOB_CPU, scheduler=SCHEDULER)
    job["spec"]["restartPolicy"] = "Never"
    await apiserver.create(
        api,
        resources.JOBS,
        namespace=NAMESPACE,
        body={
            "metadata": {"name": "batch"},
            "spec": {
                "completions": args.job_pods,
                "parallelism": max(1, args.job_pods // 3),
                "backoffLimit": 0,
                "template": job,
            },
        },
    )
    if args.gang_pods > 1:
        say(
            f"creating a gang (an Indexed Job of {args.gang_pods} x {JOB_CPU} CPU, parallelism = "
            "completions: the Job controller gives it a PodGroup, all of its pods or none) ..."
        )
        gang = _template(app="gang", cpu=JOB_CPU, scheduler=SCHEDULER)
        gang["spec"]["restartPolicy"] = "Never"
        await apiserver.create(
            api,
            resources.JOBS,
            namespace=NAMESPACE,
            body={
                "metadata": {"name": "gang"},
                "spec": {
                    "completions": args.gang_pods,
                    "parallelism": args.gang_pods,
                    "completionMode": "Indexed",
                    "backoffLimit": 0,
                    "template": gang,
                },
            },
        )
    await _follow(seen, total=total, pods=args.pods, job_pods=args.job_pods, gang_pods=args.gang_pods)
    await asyncio.sleep(1.0)  # the Scheduled events are written right after the binds
    watcher.cancel()
    writes_after, metrics_after = runtime.writes.snapshot(), await _write_metrics(api)
    _pod_table(seen)
    await _node_table(api, nodes)
    if args.gang_pods > 1:
        await _gang_summary(api, seen)
    bound = [s.bound for s in seen.values() if s.bound is not None]
    return _summary(
        pods=total,
        bound=len(bound),
        seconds=max(bound, default=first) - first,
        ours={k: writes_after.get(k, 0) - writes_before.get(k, 0) for k in writes_after},
        apiserver={k: metrics_after.get(k, 0) - metrics_before.get(k, 0) for k in metrics_after},
    )


def _done(seen: Mapping[str, _Seen], *, pods: int, job_pods: int, gang_pods: int = 0) -> bool:
    running = sum(1 for s in seen.values() if s.kind == "api" and s.phase == "Running")
    succeeded = sum(1 for s in seen.values() if s.kind == "batch" and s.phase == "Succeeded")
    gang = sum(1 for s in seen.values() if s.kind == "gang" and s.phase == "Succeeded")
    return running >= pods and succeeded >= job_pods and gang >= (gang_pods if gang_pods > 1 else 0)


async def _follow(
    seen: dict[str, _Seen], *, total: int, pods: int, job_pods: int, gang_pods: int = 0
) -> None:
    """Progress until the Deployment runs and the Jobs completed, or nothing moved for STALL_SECONDS."""
    last_change, last_state = time.monotonic(), ""
    while (
        not _done(seen, pods=pods, job_pods=job_pods, gang_pods=gang_pods)
        and time.monotonic() - last_change < STALL_SECONDS
    ):
        state = _progress(seen, total=total)
        if state != last_state:
            last_change, last_state = time.monotonic(), state
        await asyncio.sleep(0.25)
    _progress(seen, total=total)
    print(flush=True)
    pending = [name for name, s in seen.items() if s.bound is None]
    if pending:
        say(
            f"{len(pending)} pods stayed Pending: the pool has no room for them "
            "(see `kubectl describe pod`: FailedScheduling says why the RM refused them)"
        )


async def _watch(api: ApiClient, seen: dict[str, _Seen]) -> None:
    async for event in list_watch(api, resources.PODS, namespace=NAMESPACE, watch_seconds=600):
        if not isinstance(event, Event) or event.type == "DELETED":
            continue
        raw = event.object
        spec, name = raw.get("spec") or {}, raw["metadata"]["name"]
        if spec.get("schedulerName") != SCHEDULER:
            continue
        pod = seen.setdefault(
            name, _Seen(created=time.monotonic(), kind=(raw["metadata"].get("labels") or {}).get("app", ""))
        )
        if spec.get("nodeName") and pod.bound is None:
            pod.bound, pod.node = time.monotonic(), spec["nodeName"]
        pod.phase = (raw.get("status") or {}).get("phase") or pod.phase


def _progress(seen: Mapping[str, _Seen], *, total: int) -> str:
    pending = sum(1 for s in seen.values() if s.bound is None)
    scheduled = sum(1 for s in seen.values() if s.bound is not None and s.phase == "Pending")
    running = sum(1 for s in seen.values() if s.phase == "Running")
    succeeded = sum(1 for s in seen.values() if s.phase == "Succeeded")
    state = (
        f"  {len(seen):3d}/{total} created: {pending:3d} Pending, {scheduled:3d} Scheduled, "
        f"{running:3d} Running, {succeeded:3d} Succeeded"
    )
    print(f"\r{state}", end="", flush=True)
    return state


def _pod_table(seen: Mapping[str, _Seen]) -> None:
    say(f"\n{'POD':<24} {'NODE':<8} {'TIME TO BIND':>12}  PHASE")
    for name in sorted(seen):
        pod = seen[name]
        if pod.bound is not None:
            say(f"{name:<24} {pod.node:<8} {1000 * (pod.bound - pod.created):>9.0f} ms  {pod.phase}")
        else:
            say(f"{name:<24} {'-':<8} {'not bound':>12}  {pod.phase}")


async def _node_table(api: ApiClient, nodes: Sequence[str]) -> None:
    """What each node holds now: running pods by who placed them, CPU requested of allocatable."""
    from bindery.podresources import effective_requests

    pods = (await apiserver.list_all(api, resources.PODS, field_selector="spec.nodeName!=")).items
    say(f"\n{'NODE':<8} {'BINDERY':>8} {'DEFAULT':>8} {'CPU REQUESTED':>14}")
    for node in nodes:
        mine = [
            p
            for p in pods
            if p["spec"]["nodeName"] == node
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        ours = sum(1 for p in mine if p["spec"].get("schedulerName") == SCHEDULER)
        cpu = sum(
            (effective_requests(spec=p["spec"], status=p.get("status")).get("cpu", Decimal(0)) for p in mine),
            Decimal(0),
        )
        allocatable = (await apiserver.get(api, resources.NODES, name=node))["status"]["allocatable"]["cpu"]
        say(f"{node:<8} {ours:>8} {len(mine) - ours:>8} {format_quantity(cpu) + ' / ' + allocatable:>14}")


async def _gang_summary(api: ApiClient, seen: Mapping[str, _Seen]) -> None:
    """How the gang went: when its pods were bound, relative to each other, and its PodGroup's status."""
    gang = [s for s in seen.values() if s.kind == "gang" and s.bound is not None]
    groups = await apiserver.list_all(api, resources.PODGROUPS, namespace=NAMESPACE)
    say("")
    for group in groups.items:
        spec = group.get("spec") or {}
        min_count = ((spec.get("schedulingPolicy") or {}).get("gang") or {}).get("minCount")
        condition: Mapping[str, Any] = next(
            (
                c
                for c in (group.get("status") or {}).get("conditions") or ()
                if c["type"] == "PodGroupScheduled"
            ),
            {},
        )
        say(
            f"PodGroup {group['metadata']['name']} (made by the Job controller, minCount {min_count}): "
            f"PodGroupScheduled={condition.get('status', '?')} ({condition.get('reason', '')}: "
            f"{condition.get('message', '')})"
        )
    if gang:
        spread = 1000 * (max(s.bound or 0 for s in gang) - min(s.bound or 0 for s in gang))
        waited = 1000 * (max(s.bound or 0 for s in gang) - max(s.created for s in gang))
        say(
            f"the gang: {len(gang)} pods bound together, within {spread:.0f} ms of each other, "
            f"{waited:.0f} ms after its last pod was created, through one group reservation at the RM"
        )


def _summary(
    *, pods: int, bound: int, seconds: float, ours: dict[str, int], apiserver: dict[tuple[str, str], int]
) -> int:
    say("")
    rate = bound / seconds if seconds > 0 else float("nan")
    say(
        f"bound {bound}/{pods} pods in {seconds:.2f}s: {rate:.1f} pods/s "
        "(the controllers create them meanwhile)"
    )
    if bound:
        counted = sum(ours.values())
        detail = ", ".join(f"{k}={v}" for k, v in sorted(ours.items()) if v)
        say(f"apiserver writes per bound pod (counted by the operator): {counted / bound:.2f} ({detail})")
        if bound < pods:
            say(
                "  (these include the FailedScheduling events and conditions of the pods that stayed Pending)"
            )
        seen = sum(apiserver.values())
        say(f"Bindings per bound pod (apiserver_request_total): {seen / bound:.2f}")
    return 0 if bound == pods else 1


_METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$")


async def _write_metrics(api: ApiClient) -> dict[tuple[str, str], int]:
    """Successful writes per (resource, subresource) of the kinds only the operator writes."""
    _, body = await apiserver.answer_of(api, "GET", "/metrics", accept="text/plain")
    text = body.decode()
    totals: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        match = _METRIC.match(line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        key = (labels.get("resource", ""), labels.get("subresource", ""))
        written = labels.get("verb") in ("POST", "PATCH", "PUT") and labels.get("code", "").startswith("2")
        if written and key in WRITE_KEYS:
            totals[key] = totals.get(key, 0) + int(float(match.group("value")))
    return totals


if __name__ == "__main__":
    sys.exit(main())
