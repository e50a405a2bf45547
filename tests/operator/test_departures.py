"""What a departure wakes: a pending pod deleted frees nothing and wakes nobody; a released
reservation wakes the pods refused for room at its own RM, and no other RM's.

On the plane with the reference RM as its own process behind tests/rmproxy.py, which counts the
reserve operations per pod: each wake of a parked pod costs one, so the count is what a tenant's
create/delete loop would cost the RM. Every negative count is read after a positive marker: room is
freed and the parked pods bind, so each made exactly its refused reserve and its binding one unless
something else woke it in between.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import (
    Bindery,
    RealStage,
    condition,
    eventually,
    read_pod,
    real_stage_of,
)
from tests.rmproxy import RMFaultProxy, rm_fault_proxy

pytestmark = pytest.mark.controlplane

#: short backoffs: a wake that should not happen shows as a reserve within half a second
BACKOFF = {"initialSeconds": 0.2, "maxSeconds": 0.5}


async def _unschedulable(api: client.ApiClient, namespace: str, name: str) -> bool:
    cond = condition(await read_pod(api, namespace=namespace, name=name))
    return cond is not None and cond.get("status") == "False" and cond.get("reason") == "Unschedulable"


async def _parked(bindery: Bindery, stage: RealStage, uid: str) -> bool:
    """The pod waits in its queue's unschedulable pool (refused, waiting for an event)."""
    runner = bindery.runtime.runners.get(stage.rm_name)
    position = runner.queue.position(uid) if runner is not None else None
    return position is not None and position.queue == "unschedulable"


async def _gone(bindery: Bindery, stage: RealStage, uid: str) -> bool:
    """The operator handled the pod's deletion: forgotten, and out of its queue."""
    runner = bindery.runtime.runners[stage.rm_name]
    return bindery.runtime.pods.get(uid) is None and runner.queue.position(uid) is None


@contextlib.asynccontextmanager
async def _served(stage: RealStage) -> AsyncIterator[RMFaultProxy]:
    """The stage's ResourceManager, reaching its RM through a counting proxy (no faults)."""
    async with (
        rm_fault_proxy(upstream=stage.rm.url, seed=0, rate=0.0) as proxy,
        stage.served(endpoint=proxy.url, backoff=BACKOFF),
    ):
        yield proxy


async def _full_with_parked(
    stage: RealStage, bindery: Bindery, *, parked: list[str], prefix: str = ""
) -> None:
    """A 2-CPU holder bound on the stage's 2-CPU node, then `parked` 1-CPU pods refused and parked
    (pod names prefixed with `prefix`: two stages may share a namespace)."""
    api, namespace = stage.api, stage.namespace
    await stage.create(f"{prefix}holder", cpu="2")
    await eventually(functools.partial(stage.node_of, f"{prefix}holder"), within=60, what="the holder bound")
    for name in parked:
        uid = (await stage.create(name, cpu="1"))["metadata"]["uid"]
        await eventually(
            functools.partial(_unschedulable, api, namespace, name), within=60, what=f"{name} refused"
        )
        await eventually(functools.partial(_parked, bindery, stage, uid), what=f"{name} parked")


async def _free_room(stage: RealStage, *, bound: list[str], prefix: str = "") -> None:
    """The marker: the holder deleted (its release frees the node) and `bound` pods bind."""
    await client.CoreV1Api(stage.api).delete_namespaced_pod(
        name=f"{prefix}holder", namespace=stage.namespace, grace_period_seconds=0
    )
    for name in bound:
        await eventually(
            functools.partial(stage.node_of, name), within=60, what=f"{name} bound once room freed"
        )


@pytest.fixture
async def two_cpu_stage(
    controlplane: ControlPlane, kube_api: client.ApiClient, crd: None, namespace: str, tmp_path: pathlib.Path
) -> AsyncIterator[RealStage]:
    async with real_stage_of(
        controlplane=controlplane,
        api=kube_api,
        namespace=namespace,
        directory=tmp_path / "rm",
        capacity={"cpu": "2", "memory": "8Gi", "pods": "20"},
    ) as stage:
        yield stage


async def test_pending_pods_deleted_in_a_loop_wake_no_parked_pod(
    *, two_cpu_stage: RealStage, kube_api: client.ApiClient, namespace: str, bindery: Bindery
) -> None:
    """A tenant's loop: create a pod that does not fit (refused: it holds no reservation), delete
    it, again. Each departure used to send every parked pod back to the RM (a reserve each). The
    parked pods' only reserves are their refusal and, once room is freed, their binding one."""
    stage = two_cpu_stage
    parked = ["parked-0", "parked-1"]
    async with _served(stage) as proxy:
        await _full_with_parked(stage, bindery, parked=parked)
        core = client.CoreV1Api(kube_api)
        for round_ in range(5):
            name = f"tenant-{round_}"
            uid = (await stage.create(name, cpu="1"))["metadata"]["uid"]
            await eventually(
                functools.partial(_unschedulable, kube_api, namespace, name),
                within=60,
                what=f"{name} refused",
            )
            await core.delete_namespaced_pod(name=name, namespace=namespace)
            await eventually(functools.partial(_gone, bindery, stage, uid), what=f"{name}'s deletion handled")
        await _free_room(stage, bound=parked)
        assert {name: proxy.reserves[name] for name in parked} == dict.fromkeys(parked, 2), (
            f"pending pods' departures woke parked pods: reserves per pod {dict(proxy.reserves)}"
        )


async def test_a_release_wakes_the_pods_refused_at_its_own_rm_only(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    tmp_path: pathlib.Path,
    bindery: Bindery,
) -> None:
    """Two ResourceManagers, two reference RMs, each node full with a pod parked behind it. A's
    holder deleted: its release wakes A's parked pod, which binds; B's RM freed nothing, so B's
    parked pod is not sent back to it (it was: every release woke every profile's parked pods).
    Then B's holder deleted: B's parked pod binds, after exactly its refusal and that reserve."""
    capacity = {"cpu": "2", "memory": "8Gi", "pods": "20"}
    async with (
        real_stage_of(
            controlplane=controlplane,
            api=kube_api,
            namespace=namespace,
            directory=tmp_path / "a",
            capacity=capacity,
        ) as a,
        real_stage_of(
            controlplane=controlplane,
            api=kube_api,
            namespace=namespace,
            directory=tmp_path / "b",
            capacity=capacity,
        ) as b,
        _served(a) as proxy_a,
        _served(b) as proxy_b,
    ):
        # The two stages share the namespace: their pods' names carry the stage's prefix.
        await _full_with_parked(a, bindery, parked=["a-parked"], prefix="a-")
        await _full_with_parked(b, bindery, parked=["b-parked"], prefix="b-")
        assert (proxy_a.reserves["a-parked"], proxy_b.reserves["b-parked"]) == (1, 1)

        await _free_room(a, bound=["a-parked"], prefix="a-")  # A's release woke A's parked pod
        await _free_room(b, bound=["b-parked"], prefix="b-")
        assert proxy_b.reserves["b-parked"] == 2, (
            f"a release at another RM woke B's parked pod: {proxy_b.reserves['b-parked']} reserves"
        )
        assert proxy_a.reserves["a-parked"] == 2
