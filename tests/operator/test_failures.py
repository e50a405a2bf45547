"""Failure paths of the binding pipeline: every one reports, releases what it reserved, and retries."""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.adapters.binder import assigned_node
from bindery.devcluster.nodes import create_node, node_status
from bindery.devcluster.plane import ControlPlane
from bindery.rm.models import ReservationState
from bindery.scheduling.queue import SchedulingQueue
from tests.operator.apiproxy import ApiProxy
from tests.operator.conftest import (
    Bindery,
    RealStage,
    Stage,
    attempts,
    bind_pod,
    closed_port_url,
    condition,
    events_of,
    eventually,
    now,
    read_pod,
    real_stage_of,
)
from tests.operator.fakerm import FakeRM
from tests.operator.test_unconfirmed_bind import proxied  # noqa: F401 (the fixture)
from tests.rmproxy import rm_fault_proxy

pytestmark = pytest.mark.controlplane


async def _failed(api: client.ApiClient, namespace: str, name: str, reason: str) -> dict[str, Any] | None:
    """The PodScheduled=False condition with `reason`, once a FailedScheduling event exists too."""
    pod = await read_pod(api, namespace=namespace, name=name)
    cond = condition(pod)
    if cond is None or cond.get("status") != "False" or cond.get("reason") != reason:
        return None
    events = await events_of(api, namespace=namespace, pod_name=name)
    if not any(e["reason"] == "FailedScheduling" and e["type"] == "Warning" for e in events):
        return None
    return cond


@pytest.fixture
async def one_cpu_stage(
    controlplane: ControlPlane, kube_api: client.ApiClient, crd: None, namespace: str, tmp_path: pathlib.Path
) -> AsyncIterator[RealStage]:
    """`real_stage_of` with a 1-CPU node: room for one small pod, none for a 2-CPU one."""
    async with real_stage_of(
        controlplane=controlplane,
        api=kube_api,
        namespace=namespace,
        directory=tmp_path / "rm",
        capacity={"cpu": "1", "memory": "8Gi", "pods": "20"},
    ) as stage:
        yield stage


async def test_unschedulable_reports_retries_and_binds_when_capacity_frees(
    *,
    one_cpu_stage: RealStage,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
) -> None:
    """The reference RM finds no room on a 1-CPU node for a 2-CPU pod: Unschedulable with its reason,
    no reservation held. The node grows (what the RM mirrors): backoff brings the pod back, it binds,
    and exactly one reservation, committed, is left."""
    stage = one_cpu_stage
    async with stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
        uid = (await stage.create("p", cpu="2"))["metadata"]["uid"]
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "Unschedulable"), what="Unschedulable"
        )
        assert f'resource manager "{stage.rm_name}" has no room for the pod' in cond["message"]
        assert await stage.active() == []
        await client.CoreV1Api(kube_api).patch_node_status(
            name=stage.node,
            body={"status": node_status(capacity={"cpu": "4", "memory": "8Gi", "pods": "20"})},
        )
        assert await eventually(lambda: stage.node_of("p"), what="the bind") == stage.node
        await eventually(lambda: stage.states_are(uid, "committed"), what="the commit")
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert [e["reason"] for e in events].count("Scheduled") == 1
        await stage.settled()


def _reserves_only(method: str, path: str) -> bool:
    """The requests the fault proxy breaks: reserve calls; probes, commits and releases go through."""
    return (method, path) == ("POST", "/v1/reservations")


@pytest.mark.parametrize("fault", ["drop", "error500", "garbage", "delay", "lost_answer"])
async def test_rm_faults_are_scheduler_errors_without_leaks(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    real_stage: RealStage,
    fault: str,
) -> None:
    """Every reserve breaks between the operator and the reference RM (tests/rmproxy.py): the RM is
    unreachable (`drop`), fails (`error500`), answers garbage, answers after the client's deadline
    (`delay`: the reservation is made all the same) or makes the reservation and the answer is lost
    (`lost_answer`). The pod is reported and stays pending; once the faults stop it binds, and the
    RM holds exactly its one committed reservation: the one the operator never heard of was taken
    back by its next reserve (same idempotency key), not left to hold capacity.
    """
    stage = real_stage
    async with (
        rm_fault_proxy(
            upstream=stage.rm.url,
            seed=1,
            rate=1.0,
            kinds=[fault],
            delay=(1.0, 1.5),  # past the 0.5 s read timeout, every time
            applies=_reserves_only,
        ) as proxy,
        stage.served(
            endpoint=proxy.url,
            timeouts={"connectSeconds": 0.5, "readSeconds": 0.5},
            backoff={"initialSeconds": 0.2, "maxSeconds": 0.5},
        ),
    ):
        created = await stage.create("p")
        uid = created["metadata"]["uid"]
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "SchedulerError"), within=40, what="SchedulerError"
        )
        assert cond["message"]
        assert await stage.node_of("p") is None
        assert set(proxy.faults) == {fault}
        proxy.rate = 0  # the RM is reachable again
        assert await eventually(lambda: stage.node_of("p"), within=30, what="the bind") == stage.node
        await stage.settled()
        held = [(r.pod_uid, r.state) for r in await stage.active()]
        assert held == [(uid, ReservationState.COMMITTED)]
        # ... and it is the only one the RM ever made for the pod: a reservation made while its answer
        # was lost or late was taken back by the next reserve, not left for a later release.
        assert len(await stage.reservations_of(uid)) == 1


#: What an RM still starting answers 503 to: its readiness, the reserves (alone or batched), the lists.
_UNREADY_PATHS = ("/readyz", "/v1/reservations", "/v1/batch")


async def test_pods_refused_while_the_rm_was_unready_are_tried_the_moment_it_serves(
    *, kube_api: client.ApiClient, namespace: str, bindery: Bindery, real_stage: RealStage
) -> None:
    """The RM answers 503 to its readiness and to every reserve, as the reference RM does while its
    mirrors list at start-up; the pod's backoff is two minutes. Once the RM serves, the pod is tried
    at once: the RM turning ready is the event that wakes it, not its backoff running out."""
    stage = real_stage
    async with (
        rm_fault_proxy(upstream=stage.rm.url, seed=1, rate=0) as proxy,
        stage.served(endpoint=proxy.url, backoff={"initialSeconds": 120, "maxSeconds": 120}),
    ):
        for path in _UNREADY_PATHS:
            proxy.answer(path, 503, 1_000_000)
        await stage.create("p")
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "SchedulerError"), within=40, what="SchedulerError"
        )
        assert "unavailable" in cond["message"]
        for path in _UNREADY_PATHS:
            proxy.answer(path, 503, 0)  # ready: everything is forwarded again
        assert await eventually(lambda: stage.node_of("p"), within=60, what="the bind") == stage.node
        await stage.settled()


async def test_an_rm_that_is_down_is_a_scheduler_error_until_it_is_back(
    *, kube_api: client.ApiClient, namespace: str, bindery: Bindery, real_stage: RealStage
) -> None:
    """Nothing listens at the endpoint: reported, pending; pointed at the running RM, it binds."""
    stage = real_stage
    async with stage.served(
        endpoint=closed_port_url(),
        timeouts={"connectSeconds": 0.5, "readSeconds": 0.5},
        backoff={"initialSeconds": 0.2, "maxSeconds": 0.5},
    ):
        await stage.create("p")
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "SchedulerError"), within=40, what="SchedulerError"
        )
        assert cond["message"]
        assert await stage.node_of("p") is None
        await client.CustomObjectsApi(kube_api).patch_cluster_custom_object(
            group="bindery.dev",
            version="v1alpha1",
            plural="resourcemanagers",
            name=stage.rm_name,
            body={"spec": {"endpoint": stage.rm.url}},
            _content_type="application/merge-patch+json",
        )
        assert await eventually(lambda: stage.node_of("p"), within=30, what="the bind") == stage.node
        await stage.settled()


@pytest.mark.parametrize("problem", ["missing", "cordoned", "tainted"])
async def test_a_bad_node_choice_is_released_and_reported(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
    problem: str,
    stage: Stage,
) -> None:
    node = uniq(problem)  # the RM's choice, besides the stage's node
    rm_name = stage.rm_name
    if problem == "cordoned":
        await create_node(kube_api, name=node, unschedulable=True)
    elif problem == "tainted":
        await create_node(
            kube_api, name=node, taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
        )
    fake_rm.choose = node
    async with stage.served():
        await stage.create("p")
        cond = await eventually(
            lambda: _failed(kube_api, namespace, "p", "SchedulerError"), what="the report"
        )
        assert f'resource manager "{rm_name}" chose node "{node}"' in cond["message"]
        assert fake_rm.reservations
        assert fake_rm.active() == [], "the reservation on the bad node was not released"
        assert await stage.node_of("p") is None


async def test_a_pod_deleted_between_reserve_and_bind_releases_its_reservation(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    async def delete_the_pod(reservation: dict[str, Any]) -> None:
        await client.CoreV1Api(kube_api).delete_namespaced_pod(name=reservation["name"], namespace=namespace)

    fake_rm.on_reserve = delete_the_pod
    async with stage.served():
        await stage.create("p")
        await eventually(lambda: _released_all(fake_rm), what="the release")
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert not [e for e in events if e["reason"] == "Scheduled"]


async def test_a_pod_bound_by_someone_else_first_is_released_without_a_binding(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
    stage: Stage,
) -> None:
    """Someone else binds the pod while the RM reserves, and the operator sees it before binding:
    PodStillPending stops the cycle, no Binding is sent, the reservation is released, nothing is
    reported. The RM answers only once the operator has dropped the pod from its unbound pods, so
    this path (not the 409 one below) is the one taken, every run."""
    theirs = uniq("theirs")  # ours is the stage's node, where the RM reserves
    await create_node(kube_api, name=theirs)

    async def someone_else_binds(reservation: dict[str, Any]) -> None:
        await bind_pod(kube_api, namespace=namespace, name=reservation["name"], node=theirs)
        uid = reservation["podUid"]
        await eventually(lambda: now(uid not in bindery.runtime.pods.uids()), what="the pod seen bound")

    fake_rm.on_reserve = someone_else_binds
    async with stage.served():
        await stage.create("p")
        await eventually(lambda: _released_all(fake_rm), what="the release")
        assert await stage.node_of("p") == theirs
        assert bindery.runtime.writes.snapshot().get("binding", 0) == 0  # the release came after PreBind
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert not [e for e in events if e["reason"] in ("Scheduled", "FailedScheduling")]


async def test_a_pod_bound_elsewhere_unseen_meets_the_apiservers_409_and_is_released(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    proxied: tuple[ApiProxy, Bindery],  # noqa: F811
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
    stage: Stage,
) -> None:
    """Someone else binds the pod while the RM reserves, and the operator cannot see it (its pod
    watches are blind in the apiserver proxy): its Binding is sent and meets the apiserver's own
    `409 ... already assigned to node "theirs"`; not our node, so the reservation is released and
    nothing is reported. FakeRM: the bind must happen inside the reserve call."""
    proxy, _ = proxied
    theirs = uniq("theirs")
    await create_node(kube_api, name=theirs)

    async def someone_else_binds_unseen(reservation: dict[str, Any]) -> None:
        proxy.blind_pod_lists = True
        await bind_pod(kube_api, namespace=namespace, name=reservation["name"], node=theirs)

    fake_rm.on_reserve = someone_else_binds_unseen
    try:
        async with stage.served():
            await stage.create("p")
            await eventually(lambda: _released_all(fake_rm), what="the release")
    finally:
        proxy.blind_pod_lists = False
    assert proxy.bindings == [("", 409)]  # the Binding was sent, and refused
    ((status, answer),) = proxy.binding_answers
    assert status == 409
    assert assigned_node(json.loads(answer)["message"]) == theirs
    assert await stage.node_of("p") == theirs
    events = await events_of(kube_api, namespace=namespace, pod_name="p")
    assert not [e for e in events if e["reason"] in ("Scheduled", "FailedScheduling")]


async def test_two_pods_racing_for_the_last_slot(
    *,
    one_cpu_stage: RealStage,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
) -> None:
    """A 1-CPU node at the reference RM and two pods of 600m: one binds, the other is reported
    Unschedulable, and the RM holds one reservation (the loser's refused reserve left nothing)."""
    stage = one_cpu_stage
    node = stage.node
    async with stage.served():
        for name in ("a", "b"):
            await stage.create(name, cpu="600m")

        async def one_bound_one_unschedulable() -> bool:
            nodes = [await stage.node_of(n) for n in ("a", "b")]
            loser = "b" if nodes[0] else "a"
            unschedulable = await _failed(kube_api, namespace, loser, "Unschedulable")
            return nodes.count(node) == 1 and bool(unschedulable)

        await eventually(one_bound_one_unschedulable, within=30, what="one winner and one Unschedulable")
        await stage.settled()
        (held,) = await stage.active()
        winner = "a" if await stage.node_of("a") else "b"
        assert (held.name, held.state) == (winner, ReservationState.COMMITTED)


async def _released_all(rm: FakeRM) -> bool:
    return bool(rm.reservations) and all(state == "released" for state in rm.states().values())


async def test_parked_pods_are_retried_on_releases_not_on_our_binds_or_pending_pods_deleted(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    """A bound pod leaving the unbound-pod watch is "left scope"; a pending pod deleted held nothing
    (a tenant's create/delete loop used to send every parked pod back to the RM on each deletion);
    a bound pod deleted releases its reservation, which may have freed room."""
    node = stage.node
    fake_rm.slots[node] = 0
    fake_rm.retry_after = 120  # parked for 2 minutes unless something may have freed capacity
    fake_rm.place["bound"] = node
    async with stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
        await stage.create("parked")
        await eventually(lambda: _failed(kube_api, namespace, "parked", "Unschedulable"), what="parked")
        await stage.create("bound")
        await eventually(lambda: stage.node_of("bound"), what="the other pod bound")
        # The runtime remembers the pod it bound until it handles that pod leaving the unbound pods
        # (the DELETED event of "left scope"); the same call would retry the parked pods, at once.
        await eventually(
            lambda: now(bindery.runtime.per_pod_sizes()["recently_bound"] == 0),
            what="the bound pod's departure handled",
        )
        assert bindery.runtime.runners[stage.rm_name].queue.stats().unschedulable == 1  # still parked
        assert _reserves(fake_rm, "parked") == 1

        core = client.CoreV1Api(kube_api)
        for round_ in range(3):  # a tenant's loop: create a pod that does not fit, delete it
            doomed = await stage.create(f"doomed-{round_}")
            name, uid = doomed["metadata"]["name"], doomed["metadata"]["uid"]
            await eventually(
                functools.partial(_failed, kube_api, namespace, name, "Unschedulable"), what="doomed parked"
            )
            await core.delete_namespaced_pod(name=name, namespace=namespace)
            queue = bindery.runtime.runners[stage.rm_name].queue
            await eventually(
                functools.partial(_forgotten, bindery, uid, queue), what="the pending pod's deletion handled"
            )
            assert (queue.stats().unschedulable, _reserves(fake_rm, "parked")) == (1, 1), (
                f"a pending pod's deletion retried the parked pod (round {round_})"
            )

        # A bound pod deleted (at once: no kubelet here to finish a graceful deletion) releases its
        # reservation, and the release retries the parked pod.
        await core.delete_namespaced_pod(name="bound", namespace=namespace, grace_period_seconds=0)
        await eventually(lambda: now(_reserves(fake_rm, "parked") >= 2), what="the parked pod retried")


async def _attempted(bindery: Bindery, rm_name: str, count: int) -> bool:
    return attempts(bindery, resource_manager=rm_name) >= count


async def _forgotten(bindery: Bindery, uid: str, queue: SchedulingQueue) -> bool:
    """The operator handled the pod's deletion: gone from its pods and from the queue."""
    return bindery.runtime.pods.get(uid) is None and queue.position(uid) is None


def _reserves(rm: FakeRM, name: str) -> int:
    return rm.reserve_attempts.count(name)


async def test_repeated_failures_do_not_flood_the_api(
    *,
    one_cpu_stage: RealStage,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
) -> None:
    """Eight attempts that the reference RM refuses for lack of room write one FailedScheduling event
    and the condition at most twice: repeats are throttled and an unchanged condition is not rewritten.
    A refused pod is parked until an event could make it fit: each attempt after the first follows a
    change of the Node's labels."""
    stage = one_cpu_stage
    core = client.CoreV1Api(kube_api)
    async with stage.served(backoff={"initialSeconds": 0.1, "maxSeconds": 0.2}):
        await stage.create("p", cpu="2")
        for seen in range(1, 8):
            await eventually(
                functools.partial(_attempted, bindery, stage.rm_name, seen), what=f"attempt {seen}"
            )
            await core.patch_node(name=stage.node, body={"metadata": {"labels": {"test-nudge": str(seen)}}})
        await eventually(
            lambda: now(attempts(bindery, resource_manager=stage.rm_name) >= 8), what="eight attempts"
        )
        events = await events_of(kube_api, namespace=namespace, pod_name="p")
        assert len([e for e in events if e["reason"] == "FailedScheduling"]) == 1
        writes = bindery.runtime.writes.snapshot()
        assert writes.get("condition", 0) <= 2, writes  # an unchanged condition is not rewritten
        assert await stage.active() == []
