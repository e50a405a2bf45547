"""Issue 21's preemption scenario under kube-scheduler and under Bindery, side by side.

    python -m tests.placement.preemption_side_by_side               # one run each; a Markdown table
    python -m tests.placement.preemption_side_by_side --repeat 5    # every run's time, and the median

The scenario (the issue's): two 4-CPU kwok nodes filled by four 2-CPU pods of PriorityClass
``value: 10``; then one 2-CPU pod of ``value: 100000``. kube-scheduler serves ``default-scheduler``;
Bindery a name of its own (the reference RM as a process with ``--mirror-nodes``, ``bindery run``
under the operator's least-privilege identity), each on a kwok pool and in a namespace of its own.

Starts its own cluster plane (kube-controller-manager, kwok, kube-scheduler). Per run: the outcome
(the preemptor's node), the victims (low pods deleted or terminating) and the seconds from the
preemptor's create sent to its ``nodeName`` seen (polled every 0.1 s). A figure, never asserted:
``tests/placement/test_preemption_side_by_side.py`` asserts the outcomes only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import pathlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from kubernetes_asyncio import client

from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.devcluster.plane import ControlPlane
from tests.conftest import OPERATOR_USER, api_client_for
from tests.gangs.scenarios import resource_manager_ready
from tests.workloads import POOL, bindery_on, eventually, kwok_pool

KUBE_SCHEDULER = "default-scheduler"
LOW, HIGH = 10, 100_000
LOW_PODS = 4
NODE_CAPACITY = {"cpu": "4", "memory": "16Gi", "pods": "110"}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One run: where the preemptor went, which low pods were evicted, from which nodes, how fast."""

    scheduler: str
    node: str | None
    victims: dict[str, str]  # victim name -> the node it was bound to
    seconds: float | None  # create sent -> nodeName seen; None if not bound in time

    def describe(self) -> str:
        if self.node is None:
            return f"preemptor NOT bound; {len(self.victims)} evicted"
        same = all(node == self.node for node in self.victims.values())
        where = "from the preemptor's node" if same else f"from {sorted(set(self.victims.values()))}"
        return f"bound, {len(self.victims)} victim(s) of priority {LOW} evicted {where}"


@contextlib.asynccontextmanager
async def priority_classes(api: client.ApiClient) -> AsyncIterator[dict[str, str]]:
    """``low`` and ``high`` PriorityClasses of their own (cluster-scoped), deleted afterwards."""
    token = uuid.uuid4().hex[:6]
    names = {"low": f"pre-{token}-low", "high": f"pre-{token}-high"}
    scheduling = client.SchedulingV1Api(api)
    for key, value in (("low", LOW), ("high", HIGH)):
        await scheduling.create_priority_class(body={"metadata": {"name": names[key]}, "value": value})
    try:
        yield names
    finally:
        for name in names.values():
            with contextlib.suppress(client.ApiException):
                await scheduling.delete_priority_class(name=name)


def _pod(name: str, *, scheduler: str, pool: str, priority_class: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": name.split("-", maxsplit=1)[0]}},
        "spec": {
            "schedulerName": scheduler,
            "priorityClassName": priority_class,
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": "registry.invalid/app:1", "resources": {"requests": {"cpu": "2"}}}
            ],
        },
    }


async def _create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    """Create, retrying while the priority admission plugin's cache does not know the class yet."""

    async def admitted() -> bool:
        try:
            await client.CoreV1Api(api).create_namespaced_pod(namespace, body)
        except client.ApiException as exc:
            if exc.status == 403 and "PriorityClass" in str(exc.body):
                return False
            raise
        return True

    await eventually(admitted, within=30, what=f"pod {body['metadata']['name']} admitted", every=0.1)


async def _pods(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    response = await client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    return {p["metadata"]["name"]: p for p in (await response.json())["items"]}


async def scenario(
    api: client.ApiClient,
    *,
    namespace: str,
    scheduler: str,
    pool: str,
    classes: dict[str, str],
    within: float = 120.0,
) -> Outcome:
    """Fill the pool with the low pods, then time the high one; see the module docstring."""
    low = [f"low-{i}" for i in range(LOW_PODS)]
    for name in low:
        await _create(
            api, namespace, _pod(name, scheduler=scheduler, pool=pool, priority_class=classes["low"])
        )

    async def low_bound() -> dict[str, str] | None:
        pods = await _pods(api, namespace)
        nodes = {n: (pods.get(n, {}).get("spec") or {}).get("nodeName") for n in low}
        return {n: str(v) for n, v in nodes.items() if v} if all(nodes.values()) else None

    placed: dict[str, str] = await eventually(low_bound, within=60, what=f"{scheduler} binding the low pods")
    body = _pod("high", scheduler=scheduler, pool=pool, priority_class=classes["high"])
    started = time.monotonic()
    await _create(api, namespace, body)
    node: str | None = None
    seconds: float | None = None
    while time.monotonic() - started < within:
        pod = (await _pods(api, namespace)).get("high", {})
        if (pod.get("spec") or {}).get("nodeName"):
            seconds = time.monotonic() - started
            node = str(pod["spec"]["nodeName"])
            break
        await asyncio.sleep(0.1)
    pods = await _pods(api, namespace)
    victims = {n: placed[n] for n in low if n not in pods or pods[n]["metadata"].get("deletionTimestamp")}
    return Outcome(scheduler=scheduler, node=node, victims=victims, seconds=seconds)


@contextlib.asynccontextmanager
async def fresh_namespace(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"pre-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace(body={"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(name)


async def under_kube_scheduler(api: client.ApiClient, *, namespace: str) -> Outcome:
    pool = uuid.uuid4().hex[:6]
    nodes = await kwok_pool(api, pool=pool, count=2, capacity=NODE_CAPACITY)
    try:
        async with priority_classes(api) as classes:
            return await scenario(
                api, namespace=namespace, scheduler=KUBE_SCHEDULER, pool=pool, classes=classes
            )
    finally:
        await _delete_nodes(api, nodes)


async def under_bindery(
    api: client.ApiClient,
    *,
    plane: ControlPlane,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    directory: pathlib.Path,
) -> Outcome:
    pool = uuid.uuid4().hex[:6]
    nodes = await kwok_pool(api, pool=pool, count=2, capacity=NODE_CAPACITY)  # before the RM starts
    try:
        async with (
            priority_classes(api) as classes,
            bindery_on(
                api=api,
                cluster=plane,
                operator_kubeconfig=operator_kubeconfig,
                namespace=namespace,
                pool=pool,
                directory=directory,
            ) as bindery,
        ):
            await resource_manager_ready(api, bindery.rm_name)
            found = await scenario(
                api, namespace=namespace, scheduler=bindery.scheduler, pool=pool, classes=classes
            )
            return dataclasses.replace(found, scheduler="Bindery (reference RM)")
    finally:
        await _delete_nodes(api, nodes)


async def _delete_nodes(api: client.ApiClient, nodes: Sequence[str]) -> None:
    for node in nodes:
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(api).delete_node(node)


def table(runs: Sequence[Sequence[Outcome]]) -> str:
    """One row per scheduler: the first run's outcome and victims, every run's time and the median."""
    lines = [
        "| scheduler | outcome | victims chosen | preemptor created -> bound |",
        "|---|---|---|---|",
    ]
    for outcomes in runs:
        if not outcomes:
            continue
        first = outcomes[0]
        others = [o.describe() for o in outcomes[1:] if o.describe() != first.describe()]
        outcome = first.describe() + (f" ({len(others)} runs otherwise: {others[0]})" if others else "")
        victims = ", ".join(f"{name} on {node}" for name, node in sorted(first.victims.items())) or "none"
        times = [o.seconds for o in outcomes if o.seconds is not None]
        if not times:
            timing = "not bound"
        elif len(times) == 1:
            timing = f"{times[0]:.2f} s"
        else:
            timing = f"median {statistics.median(times):.2f} s ({', '.join(f'{t:.2f}' for t in times)})"
        lines.append(f"| {first.scheduler} | {outcome} | {victims} | {timing} |")
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per scheduler (every time and the median)"
    )
    args = parser.parse_args(argv)
    kube: list[Outcome] = []
    ours: list[Outcome] = []
    with (
        ControlPlane.start(controllers=True, kwok=True, kube_scheduler=True) as plane,
        tempfile.TemporaryDirectory() as tmp,
    ):
        api = await api_client_for(str(plane.kubeconfig))
        try:
            await apply_crd(api=api)
            await grant_operator(api=api, user=OPERATOR_USER)
            operator_kubeconfig = plane.mint_kubeconfig(user=OPERATOR_USER)
            for _ in range(args.repeat):
                async with fresh_namespace(api) as namespace:
                    kube.append(await under_kube_scheduler(api, namespace=namespace))
                async with fresh_namespace(api) as namespace:
                    ours.append(
                        await under_bindery(
                            api,
                            plane=plane,
                            operator_kubeconfig=operator_kubeconfig,
                            namespace=namespace,
                            directory=pathlib.Path(tmp) / namespace,
                        )
                    )
        finally:
            await api.close()
    print(table([kube, ours]))
    return 0 if all(o.node is not None for o in (*kube, *ours)) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
