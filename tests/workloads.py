"""Workloads and stage for the real-cluster suites (tests/cluster, the controller scenarios of
tests/chaos): Deployments, DaemonSets and Jobs on a labelled pool of kwok nodes, reads of their pods,
and Bindery (the reference RM mirroring the pool, the operator, a served name) on that pool."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_kwok_node
from bindery.devcluster.plane import ControlPlane
from tests.realrm import OperatorProcess, RMProcess, operator_process, serve_with

T = TypeVar("T")
POOL = "bindery.dev/cluster-pool"


async def eventually(
    check: Callable[[], Awaitable[T | None]], *, within: float, what: str, every: float = 0.3
) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: T | None = None
    while loop.time() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {within:g}s waiting for {what}; last value: {last!r}")


def template(*, labels: Mapping[str, str], cpu: str, scheduler: str | None, pool: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {POOL: pool},
        "containers": [
            {"name": "main", "image": "registry.invalid/app:1", "resources": {"requests": {"cpu": cpu}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def deployment(name: str, *, replicas: int, cpu: str, scheduler: str | None, pool: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": template(labels=labels, cpu=cpu, scheduler=scheduler, pool=pool),
        },
    }


def daemonset(name: str, *, cpu: str, pool: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": template(labels=labels, cpu=cpu, scheduler=None, pool=pool),
        },
    }


def job(
    name: str, *, completions: int, parallelism: int, cpu: str, scheduler: str, pool: str
) -> dict[str, Any]:
    body = template(labels={"job": name}, cpu=cpu, scheduler=scheduler, pool=pool)
    body["spec"]["restartPolicy"] = "Never"
    return {
        "metadata": {"name": name},
        "spec": {"completions": completions, "parallelism": parallelism, "backoffLimit": 0, "template": body},
    }


class Cluster:
    """Reads of one namespace on the cluster plane."""

    def __init__(self, *, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.namespace = namespace

    async def pods(self, label: str) -> list[dict[str, Any]]:
        response = await self.core.list_namespaced_pod(
            self.namespace, label_selector=label, _preload_content=False
        )
        items: list[dict[str, Any]] = (await response.json())["items"]
        return [p for p in items if not (p["metadata"].get("deletionTimestamp"))]

    async def running(self, label: str, count: int) -> bool:
        """Whether exactly `count` pods of `label` exist and all are Running (a bool, not the pods: with
        `count` 0 an empty list would read as "not yet" to `eventually`)."""
        pods = await self.pods(label)
        return len(pods) == count and all((p.get("status") or {}).get("phase") == "Running" for p in pods)


@dataclasses.dataclass(frozen=True)
class Bindery:
    rm: RMProcess
    scheduler: str
    rm_name: str
    operator: OperatorProcess


@contextlib.asynccontextmanager
async def bindery_on(
    *,
    api: client.ApiClient,
    cluster: ControlPlane,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    pool: str,
    directory: pathlib.Path,
    operator_args: Sequence[str] = (),
    **spec: Any,
) -> AsyncIterator[Bindery]:
    """The reference RM mirroring the pool, the operator (`bindery run` with `operator_args`) and a
    ResourceManager serving a scheduler name of its own (extra `spec` fields go into its spec).

    The RM's token Secret lives in a namespace of its own (as in the chart's install): the test
    deletes the workload namespace and the operator must still reach the RM to release.
    """
    token = uuid.uuid4().hex[:6]
    scheduler, rm_name, system = f"bindery-{token}", f"rm-{token}", f"sys-{token}"
    core = client.CoreV1Api(api)
    await core.create_namespace(body={"metadata": {"name": system}})
    async with (
        RMProcess(kubeconfig=cluster.kubeconfig, directory=directory, node_selector=f"{POOL}={pool}") as rm,
        operator_process(kubeconfig=operator_kubeconfig, directory=directory, args=operator_args) as operator,
    ):
        await serve_with(api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=system, **spec)
        try:
            yield Bindery(rm=rm, scheduler=scheduler, rm_name=rm_name, operator=operator)
        finally:
            with contextlib.suppress(client.ApiException):
                await client.CustomObjectsApi(api).delete_cluster_custom_object(
                    group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=rm_name
                )
            with contextlib.suppress(client.ApiException):
                await core.delete_namespace(system)


async def kwok_pool(
    api: client.ApiClient, *, pool: str, count: int, capacity: Mapping[str, str]
) -> list[str]:
    """`count` kwok nodes labelled `POOL=pool`, returned once kwok reports every one Ready."""
    nodes = [f"kwok-{pool}-{i}" for i in range(count)]
    for node in nodes:
        await create_kwok_node(api, name=node, capacity=capacity, labels={POOL: pool})
    core = client.CoreV1Api(api)

    async def ready() -> bool:
        listed = await core.list_node(label_selector=f"{POOL}={pool}")
        return len(listed.items) == count and all(
            any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            for n in listed.items
        )

    await eventually(ready, within=60, what="kwok reporting the nodes Ready")
    return nodes


async def default_scheduler_share(view: Cluster, *, pool: str, nodes: int) -> None:
    """What already runs on a real pool, placed by kube-scheduler before Bindery's pods: a DaemonSet
    of 0.5 CPU per node and a Deployment of 3 x 1 CPU, returned once all of it is Running."""
    namespace = view.namespace
    await view.apps.create_namespaced_daemon_set(namespace, daemonset("agent", cpu="500m", pool=pool))
    await view.apps.create_namespaced_deployment(
        namespace, deployment("web", replicas=3, cpu="1", scheduler=None, pool=pool)
    )
    await eventually(lambda: view.running("app=agent", nodes), within=90, what="the DaemonSet's pods Running")
    await eventually(lambda: view.running("app=web", 3), within=90, what="the default Deployment Running")
