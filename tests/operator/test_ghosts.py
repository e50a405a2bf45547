"""No ghosts, bounded memory (issue 8, item 6).

A pod that vanished while the unbound-pod watch was down must not stay queued, be retried for
ever and collect FailedScheduling events. Kopf's watch relisted and gave no DELETED for it (the
runtime's sweep dropped the "ghost"); bindery.apiserver.watching diffs the relist and delivers that
DELETED, and the sweep stays as the second line. The operator talks to the apiserver through the
test proxy (tests/operator/apiproxy.py), which can blind it to pod lists and watches while the test
deletes a pod.

And whatever comes and goes, the operator's per-pod memory comes back to empty: 5,000 pods created
and deleted leave nothing behind in any per-pod structure (`Runtime.per_pod_sizes()`).
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.startup.runtime import Runtime
from bindery.controller.watches.unbound import unbound_pods_selector
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.queue import SchedulingQueue
from bindery.scheduling.throttle import EventThrottle
from tests.conftest import OPERATOR_USER
from tests.operator.apiproxy import ApiProxy, serve_api_proxy
from tests.operator.conftest import (
    Bindery,
    create_pod,
    delete_rm,
    events_of,
    eventually,
    node_of,
    now,
    pod_body,
)
from tests.realrm import RMProcess, serve_with

POOL_LABEL = "bindery.dev/test-pool"
FAST = {"backoff": {"initialSeconds": 0.2, "maxSeconds": 1}, "reconcileIntervalSeconds": 5}


@pytest.fixture
async def pool(kube_api: client.ApiClient, uniq: Callable[[str], str]) -> tuple[str, str]:
    """A 2-CPU node of a pool of the test's own: (node name, label selector of the pool)."""
    name = uniq("pool")
    node = uniq("n")
    capacity = {"cpu": "2", "memory": "8Gi", "pods": "110"}
    await create_node(kube_api, name=node, labels={POOL_LABEL: name}, capacity=capacity)
    return node, f"{POOL_LABEL}={name}"


@pytest.fixture
async def ref_rm(
    controlplane: ControlPlane, tmp_path: pathlib.Path, pool: tuple[str, str]
) -> AsyncIterator[RMProcess]:
    async with RMProcess(
        kubeconfig=controlplane.kubeconfig, directory=tmp_path / "rm", node_selector=pool[1]
    ) as rm:
        yield rm


@pytest.fixture
async def proxied(
    controlplane: ControlPlane, operator_kubeconfig: pathlib.Path, tmp_path: pathlib.Path
) -> AsyncIterator[tuple[ApiProxy, Bindery]]:
    """The operator (least-privilege identity) talking to the apiserver through the proxy."""
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as served:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=served.url
        )
        operator = Bindery(kubeconfig=kubeconfig)
        await operator.start()
        try:
            yield served, operator
        finally:
            await operator.stop()


def _known(runtime: Runtime, rm_name: str, uid: str) -> bool:
    """Whether the operator still remembers the pod: in its pod map or its RM's queue."""
    runner = runtime.runners.get(rm_name)
    return uid in runtime.pods.uids() or (runner is not None and uid in runner.queue)


async def _failed_scheduling(api: client.ApiClient, namespace: str, name: str) -> int:
    return sum(
        1
        for e in await events_of(api, namespace=namespace, pod_name=name)
        if e["reason"] == "FailedScheduling"
    )


@pytest.mark.controlplane
async def test_a_pod_deleted_while_the_watch_was_blind_is_dropped(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    proxied: tuple[ApiProxy, Bindery],
    ref_rm: RMProcess,
    uniq: Callable[[str], str],
) -> None:
    proxy, operator = proxied
    name, scheduler = uniq("rm"), uniq("sched")
    await serve_with(kube_api, rm=ref_rm, name=name, scheduler_names=[scheduler], namespace=namespace, **FAST)
    try:
        body = pod_body(name="ghost", scheduler_name=scheduler, cpu="3")  # never fits the 2-CPU node
        ghost = (await create_pod(kube_api, namespace=namespace, body=body))["metadata"]["uid"]
        await eventually(
            lambda: _failed_scheduling(kube_api, namespace, "ghost"), within=60, what="the first failure"
        )
        assert _known(operator.runtime, name, ghost)

        proxy.blind_pod_lists = True
        try:
            await client.CoreV1Api(kube_api).delete_namespaced_pod(
                name="ghost", namespace=namespace, grace_period_seconds=0
            )
            await eventually(lambda: now(proxy.cut_pod_streams > 0), what="the DELETED event cut")
            await eventually(
                lambda: now(unbound_pods_selector(scheduler_name=scheduler) in proxy.held_pod_watches),
                what="the unbound-pod watch resuming, held",
            )
        finally:
            proxy.blind_pod_lists = False
        # Its resourceVersion is answered as compacted away (410): it lists afresh and diffs.
        await eventually(lambda: now(proxy.expired_pod_watches > 0), what="the watch expired")
        reported = await _failed_scheduling(kube_api, namespace, "ghost")

        # The watch is back once it sees a new pod.
        body = pod_body(name="witness", scheduler_name=scheduler, cpu="3")
        witness = (await create_pod(kube_api, namespace=namespace, body=body))["metadata"]["uid"]
        await eventually(lambda: now(_known(operator.runtime, name, witness)), what="the witness seen")

        await eventually(
            lambda: now(not _known(operator.runtime, name, ghost)), within=60, what="the ghost dropped"
        )
        sizes = operator.runtime.per_pod_sizes()
        passes = operator.runtime.pending.sweeps
        await eventually(
            lambda: now(operator.runtime.pending.sweeps > passes), within=60, what="another sweep"
        )
        assert _known(operator.runtime, name, witness), "a pod that exists must not be dropped"
        assert await _failed_scheduling(kube_api, namespace, "ghost") == reported
        assert sizes["pods"] >= 1
        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="witness", namespace=namespace, grace_period_seconds=0
        )
    finally:
        await delete_rm(kube_api, name=name)


PODS = 5000
CONCURRENCY = 32


async def _in_parallel(count: int, make: Callable[[int], Any]) -> None:
    """Run `make(i)` for i in range(count), at most CONCURRENCY at a time."""
    indices = iter(range(count))

    async def worker() -> None:
        for i in indices:
            await make(i)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


@pytest.mark.controlplane
@pytest.mark.timeout(600)
async def test_five_thousand_pods_come_and_go_and_leave_no_per_pod_memory(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    ref_rm: RMProcess,
    pool: tuple[str, str],
    uniq: Callable[[str], str],
) -> None:
    name, scheduler = uniq("rm"), uniq("sched")
    # Two cycles at a time: every pod is tried and fails (throttle and condition memory), without
    # 5,000 pods retrying every second on two cores.
    spec = {"maxInFlight": 2, "reconcileIntervalSeconds": 5}
    await serve_with(kube_api, rm=ref_rm, name=name, scheduler_names=[scheduler], namespace=namespace, **spec)
    core = client.CoreV1Api(kube_api)
    try:
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="first", scheduler_name=scheduler))
        await eventually(
            lambda: node_of(kube_api, namespace=namespace, name="first"), within=60, what="the first bind"
        )
        runtime = bindery.runtime
        # Unbound pods other tests left in their namespaces are remembered, rightly: not ours to count.
        baseline = runtime.per_pod_sizes()

        async def make(i: int) -> None:
            # 1 CPU each on a 2-CPU node: a few bind, the rest wait for room.
            body = pod_body(name=f"p{i}", scheduler_name=scheduler, cpu="1")
            await core.create_namespaced_pod(namespace=namespace, body=body, _preload_content=False)

        await _in_parallel(PODS, make)
        await eventually(
            lambda: now(runtime.per_pod_sizes()["pods"] >= PODS - 2), within=120, what="every pod seen"
        )
        peak = runtime.per_pod_sizes()
        for structure in ("queue", "event_throttle"):  # what the cycles remembered is really there
            assert peak[f"{name}/{structure}"] > 0, peak
        assert peak["conditions_written"] > baseline["conditions_written"], peak
        await core.delete_collection_namespaced_pod(namespace=namespace, grace_period_seconds=0)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 180
        leftovers = {"not read yet": 1}
        while leftovers and loop.time() < deadline:
            await asyncio.sleep(1)
            leftovers = {k: v for k, v in runtime.per_pod_sizes().items() if v > baseline.get(k, 0)}
        assert not leftovers, (
            f"per-pod structures still hold entries 180 s after every pod left: {leftovers} "
            f"(before the pods: {baseline})"
        )
    finally:
        await delete_rm(kube_api, name=name)


def test_a_queue_every_pod_left_holds_nothing_for_them() -> None:
    queue = SchedulingQueue(max_in_flight=1)
    pods = []
    for i in range(200):
        body = pod_body(name=f"p{i}", scheduler_name="s")
        body["metadata"] |= {
            "namespace": "ns",
            "uid": f"uid-{i}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        }
        pods.append(PodInfo.from_body(body))
    for pod in pods:
        queue.add(pod)
    popped = queue.pop_nowait()
    assert popped is not None
    queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE)
    for pod in pods[:150]:
        queue.forget(pod.uid)
    assert queue.footprint() < 200  # stale heap items are compacted as pods leave, not kept
    for pod in pods[150:]:
        queue.forget(pod.uid)
    assert queue.footprint() == 0


def test_the_event_throttle_forgets_a_pod_by_its_uid_and_stays_bounded() -> None:
    throttle = EventThrottle(max_tracked=3)
    for i in range(5):
        throttle.admit(uid=f"u{i}", key="k", message="m")
    throttle.admit(uid="u4", key="other", message="m")  # evicts the oldest: u0, u1, then u2
    assert len(throttle) == 3
    throttle.forget("u4")
    assert len(throttle) == 1
    throttle.forget("u0")  # evicted long ago: nothing left to forget
    throttle.forget("u3")
    assert len(throttle) == 0
    assert throttle.admit(uid="u3", key="k", message="again") == "again"  # a new pod history
