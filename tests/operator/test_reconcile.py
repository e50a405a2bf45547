"""Continuous reconciliation against the real apiserver and the reference RM as its own process.

Every test here reproduces a leak or a wrong settle of issue 8: a reserved reservation of a pod
that is still pending (a Binding may still land on it), a pod deleted while the bound-pod watch
was down (a relist that missed the DELETED), a scheduler name moved to another ResourceManager,
and scenario 4 (a kube-apiserver restart, then deletions).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import pathlib
import shutil
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.backoff import BackoffPolicy
from bindery.controller.reservations.reconcile import Reconciler, ReconcileReport
from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnavailable, RMUnschedulable
from bindery.rm.models import PodIdentity, Reservation, ReservationRequest
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.revocation import OnRevoked
from tests.conftest import OPERATOR_USER, api_client_for
from tests.operator.apiproxy import serve_api_proxy
from tests.operator.conftest import (
    Bindery,
    bind_pod,
    closed_port_url,
    create_pod,
    create_rm,
    delete_rm,
    events_of,
    eventually,
    now,
    pod_body,
)
from tests.realrm import RMProcess, operator_process, serve_with

pytestmark = pytest.mark.controlplane
log = logging.getLogger(__name__)
POOL_LABEL = "bindery.dev/test-pool"


async def _pool_node(api: client.ApiClient, *, name: str, pool: str, cpu: str = "8") -> None:
    await create_node(
        api, name=name, capacity={"cpu": cpu, "memory": "16Gi", "pods": "110"}, labels={POOL_LABEL: pool}
    )


@pytest.fixture
async def pool_rm(
    controlplane: ControlPlane, kube_api: client.ApiClient, uniq: Callable[[str], str], tmp_path: pathlib.Path
) -> AsyncIterator[tuple[RMProcess, str]]:
    """The reference RM as a process mirroring one fresh 8-CPU node of its own pool: (rm, node)."""
    pool, node = uniq("pool"), uniq("rcl")
    await _pool_node(kube_api, name=node, pool=pool)
    async with RMProcess(
        kubeconfig=controlplane.kubeconfig, directory=tmp_path / "rm", node_selector=f"{POOL_LABEL}={pool}"
    ) as rm:
        yield rm, node


async def _reserve(
    rm: ResourceManagerClient, *, pod: dict[str, Any], scheduler: str, cpu: str = "100m"
) -> Reservation:
    """Reserve for `pod` as a cycle would (retrying while the RM has not mirrored the node yet)."""
    metadata = pod["metadata"]
    request = ReservationRequest(
        pod=PodIdentity(
            uid=metadata["uid"],
            namespace=metadata["namespace"],
            name=metadata["name"],
            scheduler_name=scheduler,
        ),
        resources={"cpu": cpu},
        idempotency_key=metadata["uid"],
        ttl_seconds=600,
    )
    async with asyncio.timeout(60):
        while True:
            try:
                return await rm.reserve(request)
            except (RMUnavailable, RMUnschedulable):
                await asyncio.sleep(0.2)


async def _states(rm: ResourceManagerClient, *, scheduler: str) -> dict[str, str]:
    """Pod name → state of its latest reservation of `scheduler` at the RM."""
    found = sorted(await rm.list_reservations(scheduler_name=scheduler), key=lambda r: r.created_at or 0)
    return {str(r.name): r.state.value for r in found}


async def test_a_pass_leaves_a_pending_pod_alone_releases_a_deleted_one_and_commits_a_bound_one(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """A pass (at start, too) no longer releases a pending pod's reservation (a late Binding may land)."""
    process, node = pool_rm
    scheduler = uniq("sched")
    pods = {
        name: await create_pod(
            kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler)
        )
        for name in ("pending", "deleted", "bound")
    }
    async with process.client() as rm:
        held = {name: await _reserve(rm, pod=pod, scheduler=scheduler) for name, pod in pods.items()}
        assert {r.node for r in held.values()} == {node}
        await bind_pod(
            kube_api,
            namespace=namespace,
            name="bound",
            node=node,
            annotations={RESERVATION_ANNOTATION: held["bound"].id},
        )
        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="deleted", namespace=namespace, grace_period_seconds=0
        )
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
        )
        report = await reconciler.run_once(reason="start")
        assert report.actions == {held["deleted"].id: "release", held["bound"].id: "commit"}
        assert await _states(rm, scheduler=scheduler) == {
            "pending": "reserved",
            "deleted": "released",
            "bound": "committed",
        }


class _Anonymous:
    """An RM that, as the contract allows, does not echo the pod's namespace and name."""

    def __init__(self, inner: ResourceManagerClient) -> None:
        self.inner = inner

    async def negotiated(self) -> bool:
        return await self.inner.negotiated()

    async def list_reservations(self, **filters: Any) -> list[Reservation]:
        found = await self.inner.list_reservations(**filters)
        return [r.model_copy(update={"namespace": None, "name": None}) for r in found]

    async def list_unscoped_reservations(self, **filters: Any) -> list[Reservation]:
        found = await self.inner.list_unscoped_reservations(**filters)
        return [r.model_copy(update={"namespace": None, "name": None}) for r in found]

    async def list_revoked_reservations(self, **filters: Any) -> list[Reservation]:
        found = await self.inner.list_revoked_reservations(**filters)
        return [r.model_copy(update={"namespace": None, "name": None}) for r in found]

    async def reserve(self, request: ReservationRequest) -> Reservation:
        return await self.inner.reserve(request)

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation:
        return await self.inner.commit(reservation_id, pod_uid=pod_uid)

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None:
        await self.inner.release(reservation_id, pod_uid=pod_uid)


async def test_a_reservation_whose_pod_the_rm_does_not_name_is_left_alone(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """namespace and name are optional in a Reservation: not knowing the pod is not the pod being gone."""
    process, _ = pool_rm
    scheduler = uniq("sched")
    pod = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="pending", scheduler_name=scheduler)
    )
    async with process.client() as rm:
        held = await _reserve(rm, pod=pod, scheduler=scheduler)
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: _Anonymous(rm),
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
        )
        report = await reconciler.run_once(reason="periodic")
        assert report.actions == {}
        assert report.kept == 1
        assert [r.state.value for r in await rm.list_reservations(pod_uid=held.pod_uid)] == ["reserved"]


async def test_a_commit_by_reconciliation_corrects_a_pod_reported_unscheduled(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """A Binding that got no answer landed, its cycle had said PodScheduled=False, and the pass (not
    the tracker) commits it: the pod is reported scheduled after all. A pod bound without such a
    report (a crash between Binding and commit) keeps its single Scheduled event from the bind."""
    process, node = pool_rm
    scheduler = uniq("sched")
    core = client.CoreV1Api(kube_api)
    pods = {
        name: await create_pod(
            kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler)
        )
        for name in ("reported", "quiet")
    }
    corrected: list[str] = []

    async def report(reservation: Reservation, pod: Any) -> None:
        corrected.append(pod["metadata"]["name"])

    async with process.client() as rm:
        for name, pod in pods.items():
            held = await _reserve(rm, pod=pod, scheduler=scheduler)
            await bind_pod(
                kube_api,
                namespace=namespace,
                name=name,
                node=node,
                annotations={RESERVATION_ANNOTATION: held.id},
            )
        await core.patch_namespaced_pod_status(
            name="reported",
            namespace=namespace,
            body={
                "status": {
                    "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]
                }
            },
        )
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            on_reported_unbound=report,
        )
        report_ = await reconciler.run_once(reason="periodic")
        assert len(report_.committed) == 2
    assert corrected == ["reported"]


async def test_a_bound_pod_without_a_reservation_is_warned_about_once(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    process, node = pool_rm
    scheduler = uniq("sched")
    await create_pod(kube_api, namespace=namespace, body=pod_body(name="stray", scheduler_name=scheduler))
    await bind_pod(kube_api, namespace=namespace, name="stray", node=node)  # bound outside Bindery
    async with process.client() as rm:
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
        )
        first = await reconciler.run_once(reason="test")
        second = await reconciler.run_once(reason="test")
    assert first.missing == (f"{namespace}/stray",)
    assert second.missing == ()
    events = await events_of(kube_api, namespace=namespace, pod_name="stray")
    warnings = [e for e in events if e["reason"] == "ReservationMissing"]
    assert len(warnings) == 1, events
    assert warnings[0]["type"] == "Warning"
    assert warnings[0]["reportingController"] == "bindery"
    assert "rm-under-test" in warnings[0]["note"]


async def _lose_the_reservation(
    kube_api: client.ApiClient, process: RMProcess, *, namespace: str, node: str, scheduler: str, name: str
) -> tuple[str, Reservation]:
    """Pod `name` bound to `node` on a committed reservation, which the RM then loses: SIGKILLed and
    started again from a copy of its database taken before the reserve. Returns (pod UID, lost)."""
    database = process.directory / "rm.sqlite"
    backup = process.directory / "rm-before.sqlite"
    await process.stop()  # a clean copy: nothing left in the write-ahead log
    shutil.copyfile(database, backup)
    await process.start()
    pod = await create_pod(kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler))
    uid = pod["metadata"]["uid"]
    async with process.client() as rm:
        lost = await _reserve(rm, pod=pod, scheduler=scheduler)
        await bind_pod(
            kube_api, namespace=namespace, name=name, node=node, annotations={RESERVATION_ANNOTATION: lost.id}
        )
        await rm.commit(lost.id, pod_uid=uid)
    process.kill()
    await process.wait()
    for stale in process.directory.glob("rm.sqlite*"):
        stale.unlink()
    shutil.copyfile(backup, database)
    await process.start()
    return uid, lost


async def _restored(
    reconciler: Reconciler, rm: ResourceManagerClient, uid: str
) -> tuple[list[ReconcileReport], Reservation]:
    """Passes until the pod's reservation is back (the RM mirrors its node first): reports, new one."""
    reports: list[ReconcileReport] = []

    async def active() -> list[Reservation]:
        reports.append(await reconciler.run_once(reason="test"))
        return [r for r in await rm.list_reservations(pod_uid=uid) if r.state.active]

    found = await eventually(active, within=60, what="an active reservation for the pod again")
    assert len(found) == 1, found
    return reports, found[0]


async def test_a_bound_pod_whose_reservation_the_rm_lost_gets_one_again_on_its_node(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """An RM that forgets a committed reservation (here: SIGKILLed and started again from a copy of
    its database taken before the reserve; on the Slurm bed, slurmctld SIGKILLed before it saved the
    commit it had acknowledged) leaves the pod running on capacity the RM no longer counts. A pass
    reserves again for the pod, pinned to its node, and commits; a Warning ReservationRestored says
    so once, and no ReservationMissing. Once the pod is gone, a pass releases the new reservation."""
    process, node = pool_rm
    scheduler = uniq("sched")
    uid, lost = await _lose_the_reservation(
        kube_api, process, namespace=namespace, node=node, scheduler=scheduler, name="kept"
    )
    async with process.client() as rm:
        assert [r for r in await rm.list_reservations(pod_uid=uid) if r.state.active] == []
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
        )
        reports, restored = await _restored(reconciler, rm, uid)
        active = [restored]
        assert [(r.state.value, r.node) for r in active] == [("committed", node)]
        assert [r.restored for r in reports if r.restored] == [(f"{namespace}/kept",)]
        assert active[0].id != lost.id
        again = await reconciler.run_once(reason="test")
        assert (again.restored, again.missing) == ((), ())
        # The annotation still names the lost reservation (the operator may not patch pods): the
        # pass releases the new one once the pod is gone.
        await client.CoreV1Api(kube_api).delete_namespaced_pod("kept", namespace, grace_period_seconds=0)
        gone = await reconciler.run_once(reason="test")
        assert gone.released == (active[0].id,)
        assert [r for r in await rm.list_reservations(pod_uid=uid) if r.state.active] == []
    events = await events_of(kube_api, namespace=namespace, pod_name="kept")
    restored_events = [e for e in events if e["reason"] == "ReservationRestored"]
    assert len(restored_events) == 1, events
    assert restored_events[0]["type"] == "Warning"
    assert lost.id in restored_events[0]["note"]
    assert active[0].id in restored_events[0]["note"]
    assert [e for e in events if e["reason"] == "ReservationMissing"] == []


async def test_a_restore_the_rm_refuses_is_warned_once_and_asked_again_until_there_is_room(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """The node has no room left for the pod's restore (another pod's reservation took it while the
    RM had lost this one): one ReservationMissing names the refusal, later passes ask again without
    another warning (no backoff here), and the pass after the room is freed restores the reservation."""
    process, node = pool_rm
    scheduler = uniq("sched")
    uid, _ = await _lose_the_reservation(
        kube_api, process, namespace=namespace, node=node, scheduler=scheduler, name="kept"
    )
    filler = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="filler", scheduler_name=scheduler, cpu="7900m")
    )
    async with process.client() as rm:
        # The mirror counts "kept" (its annotation names no reservation the RM holds): 100m + 7900m.
        taken = await _reserve(rm, pod=filler, scheduler=scheduler, cpu="7900m")
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            restore_backoff=BackoffPolicy(initial=0.0, maximum=0.0),  # every pass asks again
        )
        first = await reconciler.run_once(reason="test")
        second = await reconciler.run_once(reason="test")
        assert (first.missing, first.restored) == ((f"{namespace}/kept",), ())
        assert (second.missing, second.restored) == ((), ())
        assert [r for r in await rm.list_reservations(pod_uid=uid) if r.state.active] == []
        await rm.release(taken.id, pod_uid=taken.pod_uid)
        third = await reconciler.run_once(reason="test")
        assert third.restored == (f"{namespace}/kept",)
        assert [
            (r.state.value, r.node) for r in await rm.list_reservations(pod_uid=uid) if r.state.active
        ] == [("committed", node)]
    events = await events_of(kube_api, namespace=namespace, pod_name="kept")
    missing = [e for e in events if e["reason"] == "ReservationMissing"]
    assert len(missing) == 1, events
    assert "could not get them" in missing[0]["note"]
    assert [e["reason"] for e in events if e["reason"] == "ReservationRestored"] == ["ReservationRestored"]


@pytest.mark.parametrize("policy", [OnRevoked.EVICT, OnRevoked.WARN])
async def test_a_restored_reservation_the_rm_revokes_is_acted_on_and_not_restored_again(
    policy: OnRevoked,
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """The review's case: the pod's annotation still names the lost reservation, so a revocation of
    the restored one was acknowledged silently (no Revoked event, no eviction) and the next pass
    restored the room the RM had just taken back. Now the revocation is acted on per onRevoked, and
    a reservation the RM ended on purpose is never restored."""
    process, node = pool_rm
    scheduler = uniq("sched")
    uid, _ = await _lose_the_reservation(
        kube_api, process, namespace=namespace, node=node, scheduler=scheduler, name="kept"
    )
    async with process.client() as rm:
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            on_revoked=lambda: policy,
        )
        _, restored = await _restored(reconciler, rm, uid)
        await process.revoke(restored.id, reason="cancelled by the site admin")
        report = await reconciler.run_once(reason="test")
        assert report.revoked == (restored.id,)
        pod = await client.CoreV1Api(kube_api).read_namespaced_pod("kept", namespace)
        assert (pod.metadata.deletion_timestamp is not None) is (policy is OnRevoked.EVICT)
        # A new Reconciler, as after an operator restart: nothing remembered of the revocation.
        fresh = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            on_revoked=lambda: policy,
        )
        later = await fresh.run_once(reason="test")
        assert later.restored == ()
        assert [r for r in await rm.list_reservations(pod_uid=uid) if r.state.active] == []
    events = await events_of(kube_api, namespace=namespace, pod_name="kept")
    assert [e["reason"] for e in events if e["reason"] == "Revoked"] == ["Revoked"], events


async def test_the_crd_defaults_the_reconcile_interval_and_refuses_less_than_5s(
    *, kube_api: client.ApiClient, crd: None, uniq: Callable[[str], str]
) -> None:
    name = uniq("interval")
    created = await create_rm(kube_api, name=name, scheduler_names=[uniq("s")], endpoint="https://rm.example")
    try:
        assert created["spec"]["reconcileIntervalSeconds"] == 30
    finally:
        await delete_rm(kube_api, name=name)
    with pytest.raises(client.ApiException) as refused:
        await create_rm(
            kube_api,
            name=uniq("too-often"),
            scheduler_names=[uniq("s")],
            endpoint="https://rm.example",
            reconcileIntervalSeconds=1,
        )
    assert "reconcileIntervalSeconds" in str(refused.value.body)


# -- scenario 4: a kube-apiserver restart, then deletions ------------------------------------------

SCENARIO_PODS = 100
SCENARIO_DELETED = 50
SCENARIO_NEW = 100


async def _bound_names(api: client.ApiClient, *, namespace: str) -> set[str]:
    listed = await client.CoreV1Api(api).list_namespaced_pod(
        namespace=namespace, field_selector="spec.nodeName!="
    )
    return {pod.metadata.name for pod in listed.items}


async def _create_pods(api: client.ApiClient, *, namespace: str, names: list[str], scheduler: str) -> None:
    gate = asyncio.Semaphore(8)

    async def one(name: str) -> None:
        async with gate:
            await create_pod(api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler))

    await asyncio.gather(*(one(name) for name in names))


async def _active_by_name(rm: RMProcess) -> dict[str, str]:
    return {str(r.name): r.state.value for r in await rm.reservations()}


async def test_scenario_4_an_apiserver_restart_leaks_no_allocation(tmp_path: pathlib.Path) -> None:
    """100 pods bound; the kube-apiserver killed, down 10 s, restarted (etcd kept); 50 of the pods
    deleted and 100 new ones created: the new pods bind and every deleted pod's committed
    reservation is released within 45 s."""
    with ControlPlane.start() as plane:
        api = await api_client_for(str(plane.kubeconfig))
        try:
            await apply_crd(api=api)
            await grant_operator(api=api, user=OPERATOR_USER)
            kubeconfig = plane.mint_kubeconfig(user=OPERATOR_USER)
            namespace, scheduler = "scenario4", "bindery-s4"
            await client.CoreV1Api(api).create_namespace(body={"metadata": {"name": namespace}})
            for index in range(2):
                await _pool_node(api, name=f"s4-node-{index}", pool="s4", cpu="32")
            async with (
                RMProcess(kubeconfig=plane.kubeconfig, directory=tmp_path / "rm") as rm,
                operator_process(kubeconfig=kubeconfig, directory=tmp_path / "op") as operator,
            ):
                await serve_with(api, rm=rm, name="rm-s4", scheduler_names=[scheduler], namespace=namespace)
                first = [f"p{i:03}" for i in range(SCENARIO_PODS)]
                await _create_pods(api, namespace=namespace, names=first, scheduler=scheduler)
                await eventually(
                    lambda: _all_committed(rm, first),
                    within=120,
                    what="the first 100 pods bound and committed",
                )

                await asyncio.to_thread(plane.restart_apiserver, down_seconds=10)

                deleted = first[:SCENARIO_DELETED]
                core = client.CoreV1Api(api)
                for name in deleted:
                    await core.delete_namespaced_pod(name=name, namespace=namespace, grace_period_seconds=0)
                new = [f"q{i:03}" for i in range(SCENARIO_NEW)]
                await _create_pods(api, namespace=namespace, names=new, scheduler=scheduler)
                await eventually(
                    lambda: _bound_all(api, namespace, new), within=60, what="the 100 new pods bound"
                )
                loop = asyncio.get_running_loop()
                since = loop.time()

                async def deleted_released() -> bool:
                    active = await _active_by_name(rm)
                    return not any(name in active for name in deleted)

                try:
                    await eventually(
                        deleted_released, within=45, what="the deleted pods' reservations released"
                    )
                except AssertionError:
                    still = await _active_by_name(rm)
                    leaked = sorted(n for n in deleted if n in still)
                    raise AssertionError(
                        f"{len(leaked)} of {len(deleted)} deleted pods still hold an active reservation "
                        f"{loop.time() - since:.0f}s after the new pods were bound: {leaked[:5]}...\n"
                        f"operator log tail:\n{operator.log()[-3000:]}"
                    ) from None
                active = await _active_by_name(rm)
                assert set(active) == set(first[SCENARIO_DELETED:]) | set(new)
                assert set(active.values()) == {"committed"}
        finally:
            await api.close()


async def _all_committed(rm: RMProcess, names: list[str]) -> bool:
    active = await _active_by_name(rm)
    return all(active.get(name) == "committed" for name in names)


async def _bound_all(api: client.ApiClient, namespace: str, names: list[str]) -> bool:
    return set(names) <= await _bound_names(api, namespace=namespace)


# -- a relist that missed a DELETED; a scheduler name moved to another ResourceManager -------------


async def _committed_to(rm: RMProcess, pod: dict[str, Any]) -> Reservation | None:
    async with rm.client() as client_:
        found = await client_.list_reservations(pod_uid=pod["metadata"]["uid"], state="committed")
    return found[0] if found else None


async def _active_for(rm: RMProcess, pod: dict[str, Any]) -> list[Reservation]:
    async with rm.client() as client_:
        return [r for r in await client_.list_reservations(pod_uid=pod["metadata"]["uid"]) if r.state.active]


async def test_a_pod_deleted_while_the_bound_pod_watch_was_down_gives_its_reservation_back(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
    tmp_path: pathlib.Path,
) -> None:
    """The DELETED event never reaches the operator (its pod streams are cut); its relist must see
    that the pod is gone and release the pod's committed reservation."""
    rm, _ = pool_rm
    scheduler, rm_name = uniq("sched"), uniq("rm")
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as proxy:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=proxy.url
        )
        operator = Bindery(kubeconfig=kubeconfig)
        await operator.start()
        try:
            await serve_with(kube_api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=namespace)
            victim = await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="victim", scheduler_name=scheduler)
            )
            await eventually(lambda: _committed_to(rm, victim), within=60, what="the victim committed")

            proxy.blind_pod_lists = True
            await client.CoreV1Api(kube_api).delete_namespaced_pod(
                name="victim", namespace=namespace, grace_period_seconds=0
            )
            await eventually(lambda: now(proxy.cut_pod_streams > 0), what="the DELETED event cut")
            proxy.blind_pod_lists = False

            async def released() -> bool:
                return not await _active_for(rm, victim)

            await eventually(released, within=30, what="the victim's reservation released after the relist")
        finally:
            proxy.blind_pod_lists = False
            await operator.stop()
            await delete_rm(kube_api, name=rm_name)


async def test_one_watch_of_pods_on_nodes_feeds_the_rules_and_the_releases(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
    tmp_path: pathlib.Path,
) -> None:
    """The operator holds one pod watch with ``spec.nodeName!=`` (its scope: all namespaces), not
    that of the inter-pod rules plus one per scheduler name for the releases (issue 19: every
    bound pod's events were sent and decoded twice); a deleted Bindery pod and a pod deleted while
    that watch was down (a 410 relist) still give their reservations back. Periodic reconcile
    passes are off (an hour apart): the releases are the watch's."""
    rm, _ = pool_rm
    scheduler, rm_name = uniq("sched"), uniq("rm")
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as proxy:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=proxy.url
        )
        operator = Bindery(kubeconfig=kubeconfig)
        await operator.start()
        try:
            await serve_with(
                kube_api,
                rm=rm,
                name=rm_name,
                scheduler_names=[scheduler],
                namespace=namespace,
                reconcileIntervalSeconds=3600,
            )
            pods = {}
            for name in ("deleted", "relisted"):
                pods[name] = await create_pod(
                    kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler)
                )
            for name, pod in pods.items():
                committed = functools.partial(_committed_to, rm, pod)
                await eventually(committed, within=60, what=f"{name} committed")
            core = client.CoreV1Api(kube_api)

            await core.delete_namespaced_pod(name="deleted", namespace=namespace, grace_period_seconds=0)

            async def released(pod: dict[str, Any]) -> bool:
                return not await _active_for(rm, pod)

            await eventually(
                functools.partial(released, pods["deleted"]), within=30, what="the deleted pod's release"
            )
            # The release came through a watch of bound pods: every one the operator holds is here.
            on_nodes = sorted(s for s in proxy.open_pod_watches if "spec.nodeName!=" in s)
            assert on_nodes == ["spec.nodeName!="]

            proxy.blind_pod_lists = True
            await core.delete_namespaced_pod(name="relisted", namespace=namespace, grace_period_seconds=0)
            await eventually(lambda: now(proxy.cut_pod_streams > 0), what="the DELETED event cut")
            proxy.blind_pod_lists = False
            await eventually(
                functools.partial(released, pods["relisted"]),
                within=30,
                what="the release of the pod deleted while the watch was down",
            )
            placed = operator.runtime.placed
            assert placed is not None
            assert all(placed.get(pod["metadata"]["uid"]) is None for pod in pods.values())
        finally:
            proxy.blind_pod_lists = False
            await operator.stop()
            await delete_rm(kube_api, name=rm_name)


async def test_a_pass_leaves_names_this_rm_never_served_to_whoever_serves_them_there(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    bindery: Bindery,
    pool_rm: tuple[RMProcess, str],
) -> None:
    """A shared RM also serves another cluster under a name this cluster gives to another RM: the
    other cluster's allocations are not this cluster's to judge (its pods are invisible here)."""
    shared, _ = pool_rm
    ours, theirs = uniq("ours"), uniq("theirs")
    first, second = uniq("rm-shared"), uniq("rm-other")
    async with shared.client() as rm:
        elsewhere = ReservationRequest(
            pod=PodIdentity(
                uid=uniq("uid"), namespace=namespace, name="in-another-cluster", scheduler_name=theirs
            ),
            resources={"cpu": "100m"},
            idempotency_key=uniq("key"),
            ttl_seconds=600,
        )
        async with asyncio.timeout(60):
            while True:
                try:
                    held = await rm.reserve(elsewhere)
                    break
                except (RMUnavailable, RMUnschedulable):
                    await asyncio.sleep(0.2)
        await rm.commit(held.id)
        try:
            await serve_with(
                kube_api,
                rm=shared,
                name=first,
                scheduler_names=[ours],
                namespace=namespace,
                reconcileIntervalSeconds=5,
            )
            await create_rm(kube_api, name=second, scheduler_names=[theirs], endpoint=closed_port_url())

            def passes() -> int:
                supervisor = bindery.runtime.supervisors.get(first)
                return supervisor.reconciled if supervisor is not None else 0

            await eventually(
                lambda: now(passes() >= 3), within=60, what="three reconcile passes of the shared RM"
            )
            assert [r.state.value for r in await rm.list_reservations(pod_uid=held.pod_uid)] == ["committed"]
        finally:
            await delete_rm(kube_api, name=first)
            await delete_rm(kube_api, name=second)


async def test_a_scheduler_name_moved_to_another_resource_manager_leaks_nothing_at_the_old_one(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> None:
    """A pod bound via RM1; its scheduler name moves to RM2; deleting the pod releases RM1's allocation."""
    pool = uniq("pool")
    await _pool_node(kube_api, name=uniq("mv"), pool=pool)
    moved, kept = uniq("moved"), uniq("kept")
    first, second = uniq("rm1"), uniq("rm2")
    custom = client.CustomObjectsApi(kube_api)
    async with (
        RMProcess(
            kubeconfig=controlplane.kubeconfig,
            directory=tmp_path / "rm1",
            node_selector=f"{POOL_LABEL}={pool}",
        ) as rm1,
        RMProcess(
            kubeconfig=controlplane.kubeconfig,
            directory=tmp_path / "rm2",
            node_selector=f"{POOL_LABEL}={pool}",
        ) as rm2,
    ):
        try:
            await serve_with(
                kube_api,
                rm=rm1,
                name=first,
                scheduler_names=[moved],
                namespace=namespace,
                reconcileIntervalSeconds=5,
            )
            await serve_with(
                kube_api,
                rm=rm2,
                name=second,
                scheduler_names=[kept],
                namespace=namespace,
                reconcileIntervalSeconds=5,
            )
            pod = await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=moved)
            )
            await eventually(lambda: _committed_to(rm1, pod), within=60, what="the pod committed at RM1")

            for name, names in ((first, [uniq("other")]), (second, [kept, moved])):
                await custom.patch_cluster_custom_object(
                    group="bindery.dev",
                    version="v1alpha1",
                    plural="resourcemanagers",
                    name=name,
                    body={"spec": {"schedulerNames": names}},
                    _content_type="application/merge-patch+json",
                )
            # RM2 serves the name now: a new pod of it is placed there (the move took effect).
            later = await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="later", scheduler_name=moved)
            )
            await eventually(
                lambda: _committed_to(rm2, later), within=60, what="a pod of the moved name at RM2"
            )

            await client.CoreV1Api(kube_api).delete_namespaced_pod(
                name="p", namespace=namespace, grace_period_seconds=0
            )

            async def released() -> bool:
                return not await _active_for(rm1, pod)

            await eventually(released, within=45, what="RM1's reservation of the deleted pod released")
        finally:
            await delete_rm(kube_api, name=first)
            await delete_rm(kube_api, name=second)


async def _revoked_setup(
    kube_api: client.ApiClient,
    rm: ResourceManagerClient,
    process: RMProcess,
    *,
    namespace: str,
    node: str,
    scheduler: str,
    names: tuple[str, ...],
) -> dict[str, Reservation]:
    """Pods `names` bound to `node` on committed reservations; the reservations of all but the last
    revoked by the RM's operator with a reason naming the pod."""
    held: dict[str, Reservation] = {}
    for name in names:
        pod = await create_pod(
            kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler)
        )
        held[name] = await _reserve(rm, pod=pod, scheduler=scheduler)
        await bind_pod(
            kube_api,
            namespace=namespace,
            name=name,
            node=node,
            annotations={RESERVATION_ANNOTATION: held[name].id},
        )
        await rm.commit(held[name].id, pod_uid=held[name].pod_uid)
    for name in names[:-1]:
        await process.revoke(held[name].id, reason=f"cancelled by the site admin ({name})")
    return held


async def test_a_revoked_reservation_gets_its_running_pod_evicted_with_the_rms_reason(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """spec.onRevoked: Evict (the default): the pod is evicted (Eviction API: deletionTimestamp set),
    a Warning event Revoked names the ResourceManager and the RM's reason, the revocation is
    acknowledged (no longer listed), a pod that was already gone is only acknowledged, and a pod whose
    reservation was not revoked is left alone."""
    process, node = pool_rm
    scheduler = uniq("sched")
    async with process.client() as rm:
        held = await _revoked_setup(
            kube_api,
            rm,
            process,
            namespace=namespace,
            node=node,
            scheduler=scheduler,
            names=("revoked", "departed", "kept"),
        )
        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="departed", namespace=namespace, grace_period_seconds=0
        )
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
        )
        report = await reconciler.run_once(reason="test")
        # What a user sees first: the pod is being evicted, and its event says why.
        evicted = await client.CoreV1Api(kube_api).read_namespaced_pod(name="revoked", namespace=namespace)
        assert evicted.metadata.deletion_timestamp is not None  # no kubelet here: graceful deletion began
        events = [
            e
            for e in await events_of(kube_api, namespace=namespace, pod_name="revoked")
            if e["reason"] == "Revoked"
        ]
        assert len(events) == 1, events
        assert events[0]["type"] == "Warning"
        assert "rm-under-test" in events[0]["note"]
        assert "cancelled by the site admin (revoked)" in events[0]["note"]
        assert "evicted" in events[0]["note"]
        kept = await client.CoreV1Api(kube_api).read_namespaced_pod(name="kept", namespace=namespace)
        assert kept.metadata.deletion_timestamp is None
        assert [
            e
            for e in await events_of(kube_api, namespace=namespace, pod_name="kept")
            if e["reason"] == "Revoked"
        ] == []
        assert report.evicted == (f"{namespace}/revoked",)
        assert set(report.revoked) == {held["revoked"].id, held["departed"].id}
        assert await rm.list_revoked_reservations(scheduler_name=scheduler) == []
        assert [r.id for r in await rm.list_reservations(scheduler_name=scheduler, state="committed")] == [
            held["kept"].id
        ]
        again = await reconciler.run_once(reason="test")
        assert again.evicted == ()
        assert again.revoked == ()


async def test_on_revoked_warn_keeps_the_pod_and_says_why_once(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """spec.onRevoked: Warn: the pod keeps running, one Warning event Revoked with the RM's reason,
    the revocation acknowledged, and no ReservationMissing on top in later passes."""
    process, node = pool_rm
    scheduler = uniq("sched")
    async with process.client() as rm:
        held = await _revoked_setup(
            kube_api,
            rm,
            process,
            namespace=namespace,
            node=node,
            scheduler=scheduler,
            names=("warned", "other"),
        )
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            on_revoked=lambda: OnRevoked.WARN,
        )
        first = await reconciler.run_once(reason="test")
        second = await reconciler.run_once(reason="test")
        assert first.revoked == (held["warned"].id,)
        assert first.evicted == ()
        assert second.revoked == ()
        assert second.missing == ()
        assert await rm.list_revoked_reservations(scheduler_name=scheduler) == []
    pod = await client.CoreV1Api(kube_api).read_namespaced_pod(name="warned", namespace=namespace)
    assert pod.metadata.deletion_timestamp is None
    events = await events_of(kube_api, namespace=namespace, pod_name="warned")
    assert [e["reason"] for e in events if e["type"] == "Warning"] == ["Revoked"], events
    assert "cancelled by the site admin (warned)" in events[0]["note"]
    assert "keeps running" in events[0]["note"]


async def test_a_revoked_pods_eviction_refused_by_a_pdb_is_said_once_and_retried_never_deleted(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """A PodDisruptionBudget refuses the eviction of a Running pod (429; on this plane no disruption
    controller computes its status, so it refuses every such eviction): the pod is not deleted, one
    Warning event RevokedEvictionBlocked says so (and no ReservationMissing), the revocation stays
    unacknowledged, and a pass soon after (inside the back-off) neither evicts nor says it again.
    Once the budget is gone, a later pass evicts."""
    process, node = pool_rm
    scheduler = uniq("sched")
    policy = client.PolicyV1Api(kube_api)
    await policy.create_namespaced_pod_disruption_budget(
        namespace=namespace,
        body={"metadata": {"name": "keep-one"}, "spec": {"minAvailable": 1, "selector": {}}},
    )
    async with process.client() as rm:
        held = await _revoked_setup(
            kube_api,
            rm,
            process,
            namespace=namespace,
            node=node,
            scheduler=scheduler,
            names=("guarded", "other"),
        )
        # The Eviction API ignores budgets for Pending pods, and no kubelet runs this one: say it runs.
        await client.CoreV1Api(kube_api).patch_namespaced_pod_status(
            name="guarded", namespace=namespace, body={"status": {"phase": "Running"}}
        )
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
        )
        first = await reconciler.run_once(reason="test")
        second = await reconciler.run_once(reason="test")
        pod = await client.CoreV1Api(kube_api).read_namespaced_pod(name="guarded", namespace=namespace)
        assert pod.metadata.deletion_timestamp is None
        assert first.evicted == ()
        assert second.evicted == ()
        assert [r.id for r in await rm.list_revoked_reservations(scheduler_name=scheduler)] == [
            held["guarded"].id
        ]
        events = await events_of(kube_api, namespace=namespace, pod_name="guarded")
        assert sorted(e["reason"] for e in events if e["type"] == "Warning") == [
            "Revoked",
            "RevokedEvictionBlocked",
        ]
        await policy.delete_namespaced_pod_disruption_budget(name="keep-one", namespace=namespace)

        async def evicted() -> bool:
            report = await reconciler.run_once(reason="test")
            return report.evicted == (f"{namespace}/guarded",)

        await eventually(evicted, within=30, interval=1.0, what="the eviction once the budget is gone")
        assert await rm.list_revoked_reservations(scheduler_name=scheduler) == []
    events = await events_of(kube_api, namespace=namespace, pod_name="guarded")
    assert [e["reason"] for e in events if e["reason"] == "Revoked"] == ["Revoked"]  # said once in all


class _ForgetsAcknowledgements:
    """An RM that shows a revocation again after it was acknowledged (the Slurm adapter after a
    restart: it keeps acknowledgements in memory, since Slurm refuses to change a finished job)."""

    def __init__(self, inner: ResourceManagerClient) -> None:
        self.inner = inner
        self.shown: dict[str, Reservation] = {}

    async def negotiated(self) -> bool:
        return await self.inner.negotiated()

    async def list_reservations(self, **filters: Any) -> list[Reservation]:
        return await self.inner.list_reservations(**filters)

    async def list_unscoped_reservations(self, **filters: Any) -> list[Reservation]:
        return await self.inner.list_unscoped_reservations(**filters)

    async def list_revoked_reservations(self, **filters: Any) -> list[Reservation]:
        for reservation in await self.inner.list_revoked_reservations(**filters):
            self.shown[reservation.id] = reservation
        return list(self.shown.values())

    async def reserve(self, request: ReservationRequest) -> Reservation:
        return await self.inner.reserve(request)

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation:
        return await self.inner.commit(reservation_id, pod_uid=pod_uid)

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None:
        await self.inner.release(reservation_id, pod_uid=pod_uid)


async def test_a_revocation_shown_again_after_its_acknowledgement_is_not_acted_on_twice(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """spec.onRevoked: Warn against an RM that forgets acknowledgements: one Revoked event in all,
    and the repeated revocation is only acknowledged again."""
    process, node = pool_rm
    scheduler = uniq("sched")
    async with process.client() as rm:
        held = await _revoked_setup(
            kube_api,
            rm,
            process,
            namespace=namespace,
            node=node,
            scheduler=scheduler,
            names=("twice", "other"),
        )
        forgetful = _ForgetsAcknowledgements(rm)
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: forgetful,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            on_revoked=lambda: OnRevoked.WARN,
        )
        first = await reconciler.run_once(reason="test")
        second = await reconciler.run_once(reason="test")
    assert first.revoked == (held["twice"].id,)
    assert second.revoked == (held["twice"].id,)  # acknowledged again, nothing else
    events = await events_of(kube_api, namespace=namespace, pod_name="twice")
    assert [e["reason"] for e in events if e["type"] == "Warning"] == ["Revoked"], events


async def test_a_revocation_acknowledged_retries_the_parked_pods(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """The RM returned a revoked reservation's capacity when it revoked it, and Bindery learns of it
    only in this pass: pods parked for want of room must be retried now (as after a release), not on
    their 5-minute flush. With spec.onRevoked: Warn no pod leaves, so nothing else would wake them."""
    process, node = pool_rm
    scheduler = uniq("sched")
    woken: list[str] = []
    async with process.client() as rm:
        held = await _revoked_setup(
            kube_api,
            rm,
            process,
            namespace=namespace,
            node=node,
            scheduler=scheduler,
            names=("warned", "other"),
        )
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            on_revoked=lambda: OnRevoked.WARN,
            on_released=lambda: woken.append("pass"),
        )
        report = await reconciler.run_once(reason="test")
        assert report.revoked == (held["warned"].id,)
        assert report.released == ()
        assert woken == ["pass"]


class _RevokedListFails:
    """The RM, except that its list of revoked reservations fails (unreachable for that call)."""

    def __init__(self, inner: ResourceManagerClient) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def list_revoked_reservations(self, **filters: Any) -> list[Reservation]:
        raise RMUnavailable("the RM stopped answering")


async def test_releases_made_before_a_failed_revocation_list_still_retry_the_parked_pods(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """The revoked reservations are listed after the pass released what it had to: when that list
    fails the pass fails, but the releases it made stand, and the pods parked for want of room must
    be retried for them (the next pass has nothing left to release, so nothing would wake them)."""
    process, _ = pool_rm
    scheduler = uniq("sched")
    woken: list[str] = []
    pod = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="gone", scheduler_name=scheduler)
    )
    async with process.client() as rm:
        held = await _reserve(rm, pod=pod, scheduler=scheduler)
        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="gone", namespace=namespace, grace_period_seconds=0
        )
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: _RevokedListFails(rm),
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            on_released=lambda: woken.append("pass"),
        )
        with pytest.raises(RMUnavailable):
            await reconciler.run_once(reason="test")
        assert await _states(rm, scheduler=scheduler) == {"gone": "released"}
        assert woken == ["pass"], f"reservation {held.id} was released and nothing retried the parked pods"


async def test_a_reservation_revoked_before_its_pod_is_bound_gets_the_pod_evicted_once_bound(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """The RM revokes a reservation while its pod is still pending (a cycle between reserve and
    bind, a pod group waiting for its members) and a pass runs then: the revocation must wait, not
    be acknowledged, so that once the Binding lands on it the next pass evicts the pod. Acknowledged
    at once, the pod ran on capacity the RM had taken back, and nothing evicted it."""
    process, node = pool_rm
    scheduler = uniq("sched")
    pod = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="late", scheduler_name=scheduler)
    )
    async with process.client() as rm:
        held = await _reserve(rm, pod=pod, scheduler=scheduler)
        await process.revoke(held.id, reason="cancelled by the site admin (late)")
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
        )
        pending = await reconciler.run_once(reason="test")
        assert pending.revoked == ()
        assert [r.id for r in await rm.list_revoked_reservations(scheduler_name=scheduler)] == [held.id]
        await bind_pod(
            kube_api,
            namespace=namespace,
            name="late",
            node=node,
            annotations={RESERVATION_ANNOTATION: held.id},
        )
        bound = await reconciler.run_once(reason="test")
        assert bound.evicted == (f"{namespace}/late",)
        assert bound.revoked == (held.id,)
    late = await client.CoreV1Api(kube_api).read_namespaced_pod(name="late", namespace=namespace)
    assert late.metadata.deletion_timestamp is not None


class _CountsReserves:
    """The real client, counting the reserves a pass sends (the restores it asks for)."""

    def __init__(self, inner: ResourceManagerClient) -> None:
        self.inner = inner
        self.reserves = 0

    async def negotiated(self) -> bool:
        return await self.inner.negotiated()

    async def list_reservations(self, **filters: Any) -> list[Reservation]:
        return await self.inner.list_reservations(**filters)

    async def list_unscoped_reservations(self, **filters: Any) -> list[Reservation]:
        return await self.inner.list_unscoped_reservations(**filters)

    async def list_revoked_reservations(self, **filters: Any) -> list[Reservation]:
        return await self.inner.list_revoked_reservations(**filters)

    async def reserve(self, request: ReservationRequest) -> Reservation:
        self.reserves += 1
        return await self.inner.reserve(request)

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation:
        return await self.inner.commit(reservation_id, pod_uid=pod_uid)

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None:
        await self.inner.release(reservation_id, pod_uid=pod_uid)


async def test_a_refused_restore_is_asked_for_again_only_after_its_backoff(
    *,
    kube_api: client.ApiClient,
    operator_api: client.ApiClient,
    namespace: str,
    uniq: Callable[[str], str],
    pool_rm: tuple[RMProcess, str],
) -> None:
    """A restore the RM refuses (no room on the node) is not asked for again by every pass: a
    thousand such pods would be a thousand reserves per pass. Within its backoff (an hour here)
    later passes send no reserve for it."""
    process, node = pool_rm
    scheduler = uniq("sched")
    await _lose_the_reservation(
        kube_api, process, namespace=namespace, node=node, scheduler=scheduler, name="kept"
    )
    filler = await create_pod(
        kube_api, namespace=namespace, body=pod_body(name="filler", scheduler_name=scheduler, cpu="7900m")
    )
    async with process.client() as raw:
        await _reserve(raw, pod=filler, scheduler=scheduler, cpu="7900m")
        rm = _CountsReserves(raw)
        reconciler = Reconciler(
            resource_manager="rm-under-test",
            rm=lambda: rm,
            api=operator_api,
            scheduler_names=lambda: (scheduler,),
            logger=log,
            restore_backoff=BackoffPolicy(initial=3600.0, maximum=3600.0),
        )
        first = await reconciler.run_once(reason="test")
        assert (first.missing, first.restored) == ((f"{namespace}/kept",), ())
        assert rm.reserves == 1
        for _ in range(2):
            await reconciler.run_once(reason="test")
        assert rm.reserves == 1, f"{rm.reserves} reserves for one refused restore in three passes"
