"""`bindery demo`: everything on this machine, a burst of pods, and where each one went.

Starts a real etcd + kube-apiserver (bindery.devcluster), creates a labelled pool of Nodes, starts
the reference RM (SQLite, mirroring the pool's Nodes) and the operator in this process, creates a
ResourceManager object, then a burst of pods with `schedulerName: bindery`. It shows progress while
they bind and ends with a table (pod, node, time to bind) and two figures: pods bound per second,
and apiserver writes per bound pod, both as the operator counted them and as the apiserver's own
`apiserver_request_total` metric saw them (only the operator writes bindings, events and pod
statuses here, so the metric can be attributed).

The operator runs under its own minted client-certificate identity bound to exactly the ClusterRole
the Helm chart grants (bindery.controller.rbac), so the demo also proves those permissions suffice.
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
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client, config, watch

from bindery.controller.embedded import EmbeddedOperator
from bindery.controller.install import apply_crd, grant_operator
from bindery.controller.options import OperatorOptions
from bindery.controller.runtime import Runtime

POOL_LABEL = "bindery.dev/pool"
POOL = "demo"
NAMESPACE = "bindery-demo"
SYSTEM_NAMESPACE = "bindery-system"
SCHEDULER = "bindery"
OPERATOR_USER = "bindery-operator"
CREATE_CONCURRENCY = 10
STALL_SECONDS = 10.0
WRITE_KEYS = {  # (resource, subresource) the operator writes; nothing else in the demo writes them
    ("pods", "binding"),
    ("events", ""),
    ("pods", "status"),
    ("resourcemanagers", "status"),
}


@dataclasses.dataclass(frozen=True)
class DemoArgs:
    pods: int
    nodes: int
    cpu_per_node: int
    max_in_flight: int


def parse_args(argv: Sequence[str]) -> DemoArgs:
    parser = argparse.ArgumentParser(prog="bindery demo", description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=60, help="pods in the burst (default 60)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes in the pool (default 4)")
    parser.add_argument("--cpu-per-node", type=int, default=8, help="allocatable CPUs per node (default 8)")
    parser.add_argument("--max-in-flight", type=int, default=16, help="the ResourceManager's maxInFlight")
    args = parser.parse_args(list(argv))
    return DemoArgs(
        pods=args.pods, nodes=args.nodes, cpu_per_node=args.cpu_per_node, max_in_flight=args.max_in_flight
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from bindery.devcluster.plane import ControlPlane  # the demo is the only product code using it

    say("starting etcd + kube-apiserver on 127.0.0.1 (first run builds them: several minutes) ...")
    started = time.monotonic()
    with ControlPlane.start() as plane:
        say(f"control plane ready in {time.monotonic() - started:.1f}s at {plane.server}")
        operator_kubeconfig = plane.mint_kubeconfig(user=OPERATOR_USER)
        return asyncio.run(_demo(args=args, admin=plane.kubeconfig, operator_kubeconfig=operator_kubeconfig))


def say(message: str) -> None:
    print(message, flush=True)


async def _demo(*, args: DemoArgs, admin: pathlib.Path, operator_kubeconfig: pathlib.Path) -> int:
    from bindery.refrm.mirror import NodeMirror
    from bindery.refrm.server import serve_reference_rm

    api = await _api_client(admin)
    async with api, contextlib.AsyncExitStack() as stack:
        await apply_crd(api=api)
        await grant_operator(api=api, user=OPERATOR_USER)
        await _namespaces(api)
        nodes = await _nodes(api, args=args)
        say(f"created {len(nodes)} nodes labelled {POOL_LABEL}={POOL}: {', '.join(nodes)}")

        workdir = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bindery-demo-")))
        token = secrets.token_urlsafe(24)
        server = await stack.enter_async_context(
            serve_reference_rm(db_path=workdir / "rm.sqlite", token=token)
        )
        mirror = NodeMirror(api=api, label_selector=f"{POOL_LABEL}={POOL}", on_change=server.rm.set_inventory)
        mirror_task = asyncio.create_task(mirror.run(), name="node mirror")
        stack.callback(mirror_task.cancel)
        say(f"reference RM (SQLite, mirroring {POOL_LABEL}={POOL}) at {server.url}")

        options = OperatorOptions(kubeconfig=operator_kubeconfig, probe_interval=2.0, state_dir=workdir)
        operator = EmbeddedOperator(options=options)
        await operator.start()
        stack.push_async_callback(operator.stop)
        await create_reference_resource_manager(
            api, url=server.url, token=token, max_in_flight=args.max_in_flight
        )
        await _wait_ready(api)
        say(f'ResourceManager "reference" is Ready; operator runs as user "{OPERATOR_USER}"')

        return await _burst(api, args=args, runtime=operator.runtime)


async def _api_client(kubeconfig: pathlib.Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration=configuration)


async def _namespaces(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for name in (NAMESPACE, SYSTEM_NAMESPACE):
        with contextlib.suppress(client.ApiException):
            await core.create_namespace(body={"metadata": {"name": name}})


async def _nodes(api: client.ApiClient, *, args: DemoArgs) -> list[str]:
    from bindery.devcluster.nodes import create_node

    names = [f"pool-{i + 1}" for i in range(args.nodes)]
    for name in names:
        await create_node(
            api,
            name=name,
            capacity={"cpu": str(args.cpu_per_node), "memory": "32Gi", "pods": "110"},
            labels={POOL_LABEL: POOL},
        )
    return names


async def create_reference_resource_manager(
    api: client.ApiClient, *, url: str, token: str, max_in_flight: int
) -> None:
    """The token Secret and the ResourceManager "reference" for a reference RM at `url` (loopback).

    `SYSTEM_NAMESPACE` must exist. Shared by the demo and the kube-scheduler comparison benchmark.
    """
    await client.CoreV1Api(api).create_namespaced_secret(
        namespace=SYSTEM_NAMESPACE,
        body={"metadata": {"name": "reference-rm-token"}, "stringData": {"token": token}},
    )
    await client.CustomObjectsApi(api).create_cluster_custom_object(
        group="bindery.dev",
        version="v1alpha1",
        plural="resourcemanagers",
        body={
            "apiVersion": "bindery.dev/v1alpha1",
            "kind": "ResourceManager",
            "metadata": {"name": "reference"},
            "spec": {
                "schedulerNames": [SCHEDULER],
                "endpoint": url,
                "allowInsecureHTTP": True,  # loopback only
                "auth": {"tokenSecretRef": {"namespace": SYSTEM_NAMESPACE, "name": "reference-rm-token"}},
                "maxInFlight": max_in_flight,
            },
        },
    )


async def _wait_ready(api: client.ApiClient, *, within: float = 60.0) -> None:
    objects = client.CustomObjectsApi(api)
    deadline = time.monotonic() + within
    message = "no status yet"
    while time.monotonic() < deadline:
        rm = await objects.get_cluster_custom_object(
            group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name="reference"
        )
        for cond in (rm.get("status") or {}).get("conditions") or ():
            if cond["type"] == "Ready":
                if cond["status"] == "True":
                    return
                message = f"{cond.get('reason')}: {cond.get('message')}"
        await asyncio.sleep(0.5)
    raise RuntimeError(f'ResourceManager "reference" did not become Ready within {within:g}s ({message})')


def _pod(index: int) -> dict[str, Any]:
    cpu = ("100m", "250m", "500m")[index % 3]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"burst-{index + 1:03d}", "labels": {"app": "bindery-demo"}},
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu}},
                }
            ],
        },
    }


async def _burst(api: client.ApiClient, *, args: DemoArgs, runtime: Runtime) -> int:
    core = client.CoreV1Api(api)
    bound_at: dict[str, tuple[float, str]] = {}
    watcher = asyncio.create_task(_watch_binds(core, bound_at))
    await asyncio.sleep(0.5)  # let the watch start
    metrics_before = await _write_metrics(api)
    writes_before = runtime.writes.snapshot()
    say(f"creating {args.pods} pods with schedulerName: {SCHEDULER} in namespace {NAMESPACE} ...")
    created_at: dict[str, float] = {}
    first = time.monotonic()

    async def create(index: int) -> None:
        body = _pod(index)
        created_at[body["metadata"]["name"]] = time.monotonic()
        await core.create_namespaced_pod(namespace=NAMESPACE, body=body)

    for start in range(0, args.pods, CREATE_CONCURRENCY):  # a burst, as a Job or ReplicaSet would make
        await asyncio.gather(*(create(i) for i in range(start, min(start + CREATE_CONCURRENCY, args.pods))))
    await _wait_for_binds(bound_at, total=args.pods)
    last = max((t for t, _ in bound_at.values()), default=first)
    await asyncio.sleep(1.0)  # the Scheduled events are written right after the binds
    watcher.cancel()
    metrics_after = await _write_metrics(api)
    writes_after = runtime.writes.snapshot()
    _table(created_at, bound_at)
    return _summary(
        pods=args.pods,
        bound=len(bound_at),
        seconds=last - first,
        ours={k: writes_after.get(k, 0) - writes_before.get(k, 0) for k in writes_after},
        apiserver={k: metrics_after.get(k, 0) - metrics_before.get(k, 0) for k in metrics_after},
    )


async def _wait_for_binds(bound_at: dict[str, tuple[float, str]], *, total: int) -> None:
    """Until every pod is bound, or nothing was bound for STALL_SECONDS (the pool is full)."""
    last_change, seen = time.monotonic(), 0
    while len(bound_at) < total and time.monotonic() - last_change < STALL_SECONDS:
        if len(bound_at) != seen:
            last_change, seen = time.monotonic(), len(bound_at)
        _progress(len(bound_at), total)
        await asyncio.sleep(0.25)
    _progress(len(bound_at), total)
    print(flush=True)
    if len(bound_at) < total:
        say(
            f"{total - len(bound_at)} pods stayed Pending: the pool has no room for them "
            "(see `kubectl describe pod`: FailedScheduling from the reference RM)"
        )


async def _watch_binds(core: client.CoreV1Api, bound_at: dict[str, tuple[float, str]]) -> None:
    async with watch.Watch() as stream:
        async for event in stream.stream(core.list_namespaced_pod, namespace=NAMESPACE, timeout_seconds=600):
            raw = event["raw_object"]
            node = (raw.get("spec") or {}).get("nodeName")
            name = raw["metadata"]["name"]
            if node and name not in bound_at:
                bound_at[name] = (time.monotonic(), node)


def _progress(done: int, total: int) -> None:
    width = 40
    filled = width * done // max(total, 1)
    print(f"\r  bound {done:4d}/{total} [{'#' * filled}{'.' * (width - filled)}]", end="", flush=True)


def _table(created_at: dict[str, float], bound_at: dict[str, tuple[float, str]]) -> None:
    say(f"\n{'POD':<12} {'NODE':<10} {'TIME TO BIND':>12}")
    for name in sorted(created_at):
        if name in bound_at:
            moment, node = bound_at[name]
            say(f"{name:<12} {node:<10} {1000 * (moment - created_at[name]):>9.0f} ms")
        else:
            say(f"{name:<12} {'-':<10} {'not bound':>12}")


def _summary(
    *, pods: int, bound: int, seconds: float, ours: dict[str, int], apiserver: dict[tuple[str, str], int]
) -> int:
    say("")
    rate = bound / seconds if seconds > 0 else float("nan")
    say(f"bound {bound}/{pods} pods in {seconds:.2f}s: {rate:.1f} pods/s")
    if bound:
        counted = sum(ours.values())
        detail = ", ".join(f"{k}={v}" for k, v in sorted(ours.items()) if v)
        say(f"apiserver writes per bound pod (counted by the operator): {counted / bound:.2f} ({detail})")
        if bound < pods:
            say(
                "  (these include the FailedScheduling events and conditions of the pods that stayed Pending)"
            )
        seen = sum(apiserver.values())
        detail = ", ".join(
            f"{'/'.join(k for k in key if k)}={v}" for key, v in sorted(apiserver.items()) if v
        )
        say(f"apiserver writes per bound pod (apiserver_request_total): {seen / bound:.2f} ({detail})")
    return 0 if bound == pods else 1


_METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$")


async def _write_metrics(api: client.ApiClient) -> dict[tuple[str, str], int]:
    """Successful writes per (resource, subresource) of the kinds only the operator writes."""
    response = await api.call_api("/metrics", "GET", _preload_content=False, auth_settings=["BearerToken"])
    try:
        text = (await response.read()).decode()
    finally:
        response.release()
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
