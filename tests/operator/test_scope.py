"""What the operator schedules, in which order, what it leaves alone, and what it does after a crash."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.operator.conftest import (
    Bindery,
    RealStage,
    Stage,
    bind_pod,
    create_pod,
    events_of,
    eventually,
    now,
    pod_body,
    read_pod,
    reservation_entry,
)
from tests.operator.fakerm import FakeRM

pytestmark = pytest.mark.controlplane


async def test_priority_order_under_max_in_flight_one(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
    stage: Stage,
) -> None:
    scheduler = stage.scheduler
    fake_rm.slots[stage.node] = 10
    # The pods wait (no ResourceManager serves them yet), so they are all queued at once when it appears.
    priorities = {"low": 1, "mid": 50, "high": 100, "top": 1000}
    scheduling = client.SchedulingV1Api(kube_api)
    for name, priority in priorities.items():
        await scheduling.create_priority_class(body={"metadata": {"name": uniq(name)}, "value": priority})
    for name in priorities:
        body = pod_body(name=name, scheduler_name=scheduler, priorityClassName=uniq(name))
        # The priority admission plugin sees new PriorityClasses through a cache: retry until it does.
        await eventually(functools.partial(_try_create, kube_api, namespace, body), what="pod admitted")
    # The name's unbound pods are listed when a ResourceManager claims it: all four in one page,
    # offered before any cycle starts.
    async with stage.served(maxInFlight=1):
        for name in priorities:
            await eventually(functools.partial(stage.node_of, name), what=f"pod {name} bound")
    assert fake_rm.reserve_order == ["top", "high", "mid", "low"]


async def _try_create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> bool:
    try:
        await create_pod(api, namespace=namespace, body=body)
    except client.ApiException as exc:
        if exc.status == 403 and "PriorityClass" in str(exc.body):
            return False
        raise
    return True


async def test_pods_of_other_scheduler_names_are_never_touched(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    uniq: Callable[[str], str],
    real_stage: RealStage,
) -> None:
    stage = real_stage
    async with stage.served():
        await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="other", scheduler_name=uniq("nobody"))
        )
        await stage.create("ours")
        # "ours" was created later, so once it is bound the operator has seen "other" too.
        await eventually(lambda: stage.node_of("ours"), within=30, what="the served pod bound")
        other = await read_pod(kube_api, namespace=namespace, name="other")
        assert other["spec"].get("nodeName") is None
        assert not (other.get("status") or {}).get("conditions")
        assert not other["metadata"].get("annotations")
        managers = {entry["manager"] for entry in other["metadata"].get("managedFields") or ()}
        # Only the test's client (kubernetes_asyncio's default agent) wrote it; Bindery's agent is "bindery".
        assert managers == {"OpenAPI-Generator"}
        assert await events_of(kube_api, namespace=namespace, pod_name="other") == []
        assert [r.name for r in await stage.rm.reservations(active=False)] == ["ours"]
        await stage.settled()


async def test_restart_settles_reservations_left_by_a_crash(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: Any,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
    stage: Stage,
) -> None:
    """Reserved-but-not-committed reservations are committed if the bind happened, else released."""
    node, scheduler = stage.node, stage.scheduler
    bound = await stage.create("bound")
    # as the crashed Bindery's Binding did: the pod carries its reservation
    await bind_pod(
        kube_api,
        namespace=namespace,
        name="bound",
        node=node,
        annotations={RESERVATION_ANNOTATION: "r-bound"},
    )
    leftovers = {
        "r-bound": reservation_entry(
            rid="r-bound",
            node=node,
            scheduler=scheduler,
            namespace=namespace,
            name="bound",
            uid=bound["metadata"]["uid"],
        ),
        "r-gone": reservation_entry(
            rid="r-gone",
            node=node,
            scheduler=scheduler,
            namespace=namespace,
            name="gone",
            uid="uid-of-a-deleted-pod",
        ),
        "r-other": reservation_entry(
            rid="r-other", node=node, scheduler=uniq("unrelated"), namespace=namespace, name="x", uid="uid-x"
        ),
    }
    fake_rm.reservations.update(leftovers)
    operator = Bindery(kubeconfig=operator_kubeconfig)
    await operator.start()
    try:
        async with stage.served():
            await eventually(lambda: _settled(fake_rm), what="leftover reservations settled")
    finally:
        await operator.stop()
    assert fake_rm.states() == {"r-bound": "committed", "r-gone": "released", "r-other": "reserved"}


async def _settled(rm: FakeRM) -> bool:
    states = rm.states()
    return states["r-bound"] != "reserved" and states["r-gone"] != "reserved"


async def test_departed_pods_give_their_capacity_back(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    real_stage: RealStage,
) -> None:
    """Deleted or finished pods that Bindery bound get their committed reservations released."""
    stage = real_stage
    core = client.CoreV1Api(kube_api)
    async with stage.served():
        uids = {}
        for name in ("deleted", "finished", "running"):
            created = await stage.create(name)
            uids[name] = created["metadata"]["uid"]
        for name, uid in uids.items():
            await eventually(
                functools.partial(stage.states_are, uid, "committed"), within=30, what=f"{name} committed"
            )
        await core.delete_namespaced_pod(name="deleted", namespace=namespace, grace_period_seconds=0)
        await core.patch_namespaced_pod_status(
            name="finished", namespace=namespace, body={"status": {"phase": "Succeeded"}}
        )
        await eventually(lambda: stage.states_are(uids["deleted"], "released"), what="deleted released")
        await eventually(lambda: stage.states_are(uids["finished"], "released"), what="finished released")
        assert await stage.states_are(uids["running"], "committed")
        await stage.settled()
        assert [r.name for r in await stage.active()] == ["running"]


async def test_restart_releases_committed_reservations_of_pods_that_went_away(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: Any,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    node, scheduler = stage.node, stage.scheduler
    running = await stage.create("running")
    await bind_pod(
        kube_api,
        namespace=namespace,
        name="running",
        node=node,
        annotations={RESERVATION_ANNOTATION: "c-running"},
    )
    for rid, name, uid in (
        ("c-running", "running", running["metadata"]["uid"]),
        ("c-gone", "gone", "uid-gone"),
    ):
        entry = reservation_entry(
            rid=rid, node=node, scheduler=scheduler, namespace=namespace, name=name, uid=uid
        )
        fake_rm.reservations[rid] = {**entry, "state": "committed"}
    operator = Bindery(kubeconfig=operator_kubeconfig)
    await operator.start()
    try:
        async with stage.served():
            await eventually(lambda: now(fake_rm.states()["c-gone"] == "released"), what="c-gone released")
    finally:
        await operator.stop()
    assert fake_rm.states()["c-running"] == "committed"
