"""Pod groups placed by Bindery through the reference RM (its own process) on the cluster plane.

(a) a group of 8 where 7 fit: none bound, every member explained, nothing held at the RM; room
freed: all 8 bound. (b) two groups that each fit alone but not together: one whole, the other
wholly pending, which follows once the first finishes. (c) topology: every member in one zone.
(d) the operator SIGKILLed once the group is reserved: after its restart every member is bound and
committed (or everything released). (e) an RM without groups (v1.0): the group is refused with a
reason on every member, and no member is placed alone. Each ends with the settled invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from bindery.controller.podgroups.coordinator import REPORT_WAITING_AFTER_SECONDS
from bindery.controller.startup.rbac import OPERATOR_RULES, cluster_role, cluster_role_binding
from bindery.devcluster.plane import ControlPlane
from bindery.explain.collect import explain_pod
from bindery.explain.facts import render
from tests.gangs.scenarios import (
    LAYOUTS,
    Layout,
    Stage,
    resource_manager_ready,
    room_for_seven,
    topology,
    two_groups,
)
from tests.operator.fakerm import serve_app
from tests.realrm import RMProcess, operator_process, serve_with, settled_invariants
from tests.rmproxy import rm_fault_proxy
from tests.workloads import POOL, Bindery, bindery_on, eventually

pytestmark = pytest.mark.controlplane


@contextlib.asynccontextmanager
async def gang_stage(
    *,
    cluster: ControlPlane,
    api: client.ApiClient,
    operator_kubeconfig: pathlib.Path,
    namespace: str,
    directory: pathlib.Path,
    layout: Layout,
) -> AsyncIterator[tuple[Stage, Bindery]]:
    """Bindery on a pool of its own (made first: the RM starts knowing every node's capacity);
    a pending group must hold nothing at the RM."""
    pool = uuid.uuid4().hex[:6]
    stage = Stage(api=api, namespace=namespace, scheduler="", pool=pool)
    await stage.pool(*layout)
    async with bindery_on(
        api=api,
        cluster=cluster,
        operator_kubeconfig=operator_kubeconfig,
        namespace=namespace,
        pool=pool,
        directory=directory,
    ) as bindery:
        stage.scheduler = bindery.scheduler
        await resource_manager_ready(api, bindery.rm_name)

        async def nothing_held(group: str) -> None:
            held = [
                r
                for r in await bindery.rm.reservations()
                if r.namespace == namespace and r.state.active and (r.name or "").startswith(f"{group}-")
            ]
            assert held == [], f"members of pending group {group} hold reservations: {held}"

        stage.on_pending = nothing_held
        try:
            yield stage, bindery
            await settled_invariants(
                api=api, rm=bindery.rm, namespace=namespace, scheduler_names=[bindery.scheduler]
            )
        finally:
            await stage.cleanup()


async def condition(api: client.ApiClient, namespace: str, group: str) -> dict[str, Any] | None:
    body = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", namespace, "podgroups", group
    )
    conditions = (body.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c["type"] == "PodGroupScheduled"), None)


async def test_a_group_of_8_where_7_fit_waits_whole_then_binds_whole(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    async with gang_stage(
        cluster=cluster,
        api=cluster_api,
        operator_kubeconfig=cluster_operator_kubeconfig,
        namespace=cluster_namespace,
        directory=tmp_path,
        layout=LAYOUTS["room_for_seven"],
    ) as (stage, _):
        result = await room_for_seven(stage)
        assert 'cannot place pod group "' in result.notes[0], result.notes
        assert "none placed" in result.notes[0]

        async def scheduled() -> bool:
            found = await condition(cluster_api, cluster_namespace, "big")
            return found is not None and found["status"] == "True" and found["reason"] == "Scheduled"

        await eventually(scheduled, within=30, what="PodGroupScheduled=True on the group")


async def test_two_groups_that_fit_only_alone_go_one_after_the_other_whole(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    async with gang_stage(
        cluster=cluster,
        api=cluster_api,
        operator_kubeconfig=cluster_operator_kubeconfig,
        namespace=cluster_namespace,
        directory=tmp_path,
        layout=LAYOUTS["two_groups"],
    ) as (stage, _):
        result = await two_groups(stage)
        assert result.outcome.startswith("one group 4/4, the other 0/4"), result.outcome
        assert result.follow_seconds is not None


async def test_a_topology_constrained_group_lands_in_one_zone(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    async with gang_stage(
        cluster=cluster,
        api=cluster_api,
        operator_kubeconfig=cluster_operator_kubeconfig,
        namespace=cluster_namespace,
        directory=tmp_path,
        layout=LAYOUTS["topology"],
    ) as (stage, _):
        result = await topology(stage)
        # Zone b holds 3 of the 4 CPUs: only zone a fits the whole group.
        assert result.notes == ["zones: ['a']"], result


@pytest.mark.parametrize("moment", ["reserved", "some-bound"])
async def test_an_operator_killed_mid_group_ends_with_every_member_bound_and_committed(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
    moment: str,
) -> None:
    """SIGKILL between the group reservation and the Bindings, then a restart.

    ``reserved``: the group reservation is applied at the RM but its answer is lost (the proxy cuts
    it), so no Binding was sent when the operator dies. ``some-bound``: the operator dies the moment
    the first member is seen bound (the others' Bindings in flight or not sent; how many were bound
    is printed). The pool holds exactly the 8 members, so a restart that asked for a new group while
    the old one's members still held their capacity would wait for their lease to run out: every
    member must be bound and committed well inside the 60 s lease, with nothing left reserved.
    """
    namespace, pool = cluster_namespace, uuid.uuid4().hex[:6]
    token = uuid.uuid4().hex[:6]
    scheduler, rm_name = f"gang-{token}", f"rm-gang-{token}"
    stage = Stage(api=cluster_api, namespace=namespace, scheduler=scheduler, pool=pool)
    await stage.pool({"0": {}, "1": {}}, {"0": "4", "1": "4"})  # before the RM: it starts knowing them
    lose = moment == "reserved"
    try:
        async with (
            RMProcess(
                kubeconfig=cluster.kubeconfig, directory=tmp_path, node_selector=f"{POOL}={pool}"
            ) as rm,
            rm_fault_proxy(
                upstream=rm.url,
                seed=11,
                rate=1.0 if lose else 0.0,
                kinds=("lost_answer",),
                applies=lambda method, path: method == "POST" and path == "/v1/reservation-groups",
            ) as proxy,
            operator_process(kubeconfig=cluster_operator_kubeconfig, directory=tmp_path) as operator,
        ):
            await serve_with(
                cluster_api,
                rm=rm,
                name=rm_name,
                scheduler_names=[scheduler],
                namespace=namespace,
                endpoint=proxy.url,
            )
            await stage.group("crash", min_count=8)
            await stage.members("crash", [f"crash-{i}" for i in range(8)], pool=pool)
            if lose:

                async def reserved() -> bool:
                    held = [
                        r
                        for r in await rm.reservations()
                        if r.namespace == namespace and r.state.value == "reserved"
                    ]
                    return len(held) == 8

                await eventually(reserved, within=60, what="the group's 8 members reserved at the RM")
                assert await stage.bound("crash") == {}, "a member was bound although the answer was lost"
            else:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while not await stage.bound("crash"):
                    assert loop.time() < deadline, "no member was bound within 60 s"
                    await asyncio.sleep(0.005)
            operator.kill(signal.SIGKILL)
            await operator.wait()
            at_kill = len(await stage.bound("crash"))
            print(f"killed the operator ({moment}) with {at_kill} of 8 members bound")
            proxy.rate = 0.0
            restarted = asyncio.get_running_loop().time()
            await operator.start()
            took = await stage.all_bound("crash", 8, since=restarted, within=30)
            print(f"all 8 bound {took:.1f} s after the restart")
            await settled_invariants(api=cluster_api, rm=rm, namespace=namespace, scheduler_names=[scheduler])
            states = sorted(r.state.value for r in await rm.reservations() if r.namespace == namespace)
            assert states == ["committed"] * 8, states
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CustomObjectsApi(cluster_api).delete_cluster_custom_object(
                group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=rm_name
            )
        await stage.cleanup()


async def test_a_member_deleted_while_the_operator_is_down_releases_the_whole_group_on_restart(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    """The group of 8 is reserved (its answer lost), the operator SIGKILLed, one member deleted.

    On restart the earlier group cannot bind whole any more: every member's reservation is released
    and no member is bound (before the fix, recovery bound the 7 left, a partial gang). A new 8th
    member then gets the group placed whole.
    """
    namespace, pool = cluster_namespace, uuid.uuid4().hex[:6]
    token = uuid.uuid4().hex[:6]
    scheduler, rm_name = f"gang-{token}", f"rm-gang-{token}"
    stage = Stage(api=cluster_api, namespace=namespace, scheduler=scheduler, pool=pool)
    await stage.pool({"0": {}, "1": {}}, {"0": "4", "1": "4"})
    try:
        async with (
            RMProcess(
                kubeconfig=cluster.kubeconfig, directory=tmp_path, node_selector=f"{POOL}={pool}"
            ) as rm,
            rm_fault_proxy(
                upstream=rm.url,
                seed=11,
                rate=1.0,
                kinds=("lost_answer",),
                applies=lambda method, path: method == "POST" and path == "/v1/reservation-groups",
            ) as proxy,
            operator_process(kubeconfig=cluster_operator_kubeconfig, directory=tmp_path) as operator,
        ):
            await serve_with(
                cluster_api,
                rm=rm,
                name=rm_name,
                scheduler_names=[scheduler],
                namespace=namespace,
                endpoint=proxy.url,
            )
            await stage.group("gone", min_count=8)
            await stage.members("gone", [f"gone-{i}" for i in range(8)], pool=pool)

            async def held() -> list[str]:
                return [
                    r.state.value
                    for r in await rm.reservations()
                    if r.namespace == namespace and r.state.value in ("reserved", "committed")
                ]

            async def reserved() -> bool:
                return len(await held()) == 8

            await eventually(reserved, within=60, what="the group's 8 members reserved at the RM")
            operator.kill(signal.SIGKILL)
            await operator.wait()
            assert await stage.bound("gone") == {}
            await stage.core.delete_namespaced_pod("gone-7", namespace, grace_period_seconds=0)
            proxy.rate = 0.0
            await operator.start()

            async def released() -> bool:
                return await held() == []

            await eventually(released, within=30, what="the earlier group's reservations released")
            assert await stage.bound("gone") == {}, "recovery bound part of the group"
            since = await stage.members("gone", ["gone-8"], pool=pool)
            await stage.all_bound("gone", 8, since=since, within=30)
            await settled_invariants(api=cluster_api, rm=rm, namespace=namespace, scheduler_names=[scheduler])
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CustomObjectsApi(cluster_api).delete_cluster_custom_object(
                group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=rm_name
            )
        await stage.cleanup()


@contextlib.asynccontextmanager
async def without_groups(upstream: str) -> AsyncIterator[str]:
    """The reference RM as a contract v1.0 server: 404 on /v1/reservation-groups, the rest forwarded."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/v1/reservation-groups"):
            return web.json_response(
                {"title": "Not Found", "status": 404}, status=404, content_type="application/problem+json"
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with session.request(
            request.method, upstream + request.path_qs, headers=headers, data=await request.read() or None
        ) as answer:
            return web.Response(
                status=answer.status, body=await answer.read(), content_type=answer.content_type
            )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    try:
        async with serve_app(app) as port:
            yield f"http://127.0.0.1:{port}"
    finally:
        await session.close()


async def test_an_rm_without_groups_refuses_the_group_and_places_no_member_alone(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    namespace, pool = cluster_namespace, uuid.uuid4().hex[:6]
    token = uuid.uuid4().hex[:6]
    scheduler, rm_name = f"gang-{token}", f"rm-gang-{token}"
    stage = Stage(api=cluster_api, namespace=namespace, scheduler=scheduler, pool=pool)
    await stage.pool({"0": {}}, {"0": "8"})
    try:
        async with (
            RMProcess(
                kubeconfig=cluster.kubeconfig, directory=tmp_path, node_selector=f"{POOL}={pool}"
            ) as rm,
            without_groups(rm.url) as url,
            operator_process(kubeconfig=cluster_operator_kubeconfig, directory=tmp_path),
        ):
            await serve_with(
                cluster_api,
                rm=rm,
                name=rm_name,
                scheduler_names=[scheduler],
                namespace=namespace,
                endpoint=url,
            )
            await stage.group("old", min_count=2)
            await stage.members("old", ["old-0", "old-1"], pool=pool)
            messages = await stage.explained("old", 2)
            for message in messages:
                assert "does not support reservation groups" in message, message
                assert "never places a group's members one by one" in message, message
            # An ordinary pod of the same scheduler name is placed: the RM works, only groups do not.
            await stage.members(None, ["single"], pool=pool)
            await stage.all_bound("none", 1, since=0.0)
            assert await stage.bound("old") == {}
            found = await condition(cluster_api, namespace, "old")
            assert found is not None, "no PodGroupScheduled condition"
            assert (found["status"], found["reason"]) == ("False", "SchedulerError"), found
            assert [
                r
                for r in await rm.reservations()
                if r.namespace == namespace and (r.name or "").startswith("old-")
            ] == []
            # `bindery explain` on a member shows its group beside the refusal.
            answer = await explain_pod(api=cluster_api, namespace=namespace, name="old-0", operator=None)
            assert answer.group is not None
            assert (answer.group.name, answer.group.min_count, answer.group.members, answer.group.bound) == (
                "old",
                2,
                2,
                0,
            ), answer.group
            assert answer.group.condition is not None
            assert answer.group.condition["status"] == "False"
            assert "Pod group:         old: minCount 2, 2 member(s) exist, 0 bound" in render(answer)
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CustomObjectsApi(cluster_api).delete_cluster_custom_object(
                group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=rm_name
            )
        await stage.cleanup()


async def test_a_member_arriving_after_its_group_was_placed_is_placed_alone(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    """As kube-scheduler's Permit counts scheduled pods: minCount is met by the members bound, so a
    late member neither waits for more members nor unschedules the group."""
    async with gang_stage(
        cluster=cluster,
        api=cluster_api,
        operator_kubeconfig=cluster_operator_kubeconfig,
        namespace=cluster_namespace,
        directory=tmp_path,
        layout=({"0": {}}, {"0": "8"}),
    ) as (stage, _):
        await stage.group("late", min_count=3)
        created = await stage.members("late", ["late-0", "late-1", "late-2"], pool=stage.pool_id)
        await stage.all_bound("late", 3, since=created)
        created = await stage.members("late", ["late-3"], pool=stage.pool_id)
        took = await stage.all_bound("late", 4, since=created, within=30)
        assert took < REPORT_WAITING_AFTER_SECONDS, (
            f"the late member waited {took:.1f} s as if short of members"
        )
        found = await condition(cluster_api, cluster_namespace, "late")
        assert found is not None
        assert found["status"] == "True"


async def test_a_member_deleted_while_its_group_is_reserved_binds_no_member_and_releases_all(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    """The group reservation is held 3 s at a proxy; a member is deleted meanwhile. The reservation
    then comes back for all 4 members, PreBind finds one gone, and no member is bound: the whole
    group is released and the 3 left wait for a fourth member; once it comes, all 4 are bound."""
    namespace, pool = cluster_namespace, uuid.uuid4().hex[:6]
    token = uuid.uuid4().hex[:6]
    scheduler, rm_name = f"gang-{token}", f"rm-gang-{token}"
    stage = Stage(api=cluster_api, namespace=namespace, scheduler=scheduler, pool=pool)
    await stage.pool({"0": {}}, {"0": "8"})
    try:
        async with (
            RMProcess(
                kubeconfig=cluster.kubeconfig, directory=tmp_path, node_selector=f"{POOL}={pool}"
            ) as rm,
            rm_fault_proxy(
                upstream=rm.url,
                seed=5,
                rate=1.0,
                kinds=("delay",),
                delay=(3.0, 3.0),
                applies=lambda method, path: method == "POST" and path == "/v1/reservation-groups",
            ) as proxy,
            operator_process(kubeconfig=cluster_operator_kubeconfig, directory=tmp_path),
        ):
            await serve_with(
                cluster_api,
                rm=rm,
                name=rm_name,
                scheduler_names=[scheduler],
                namespace=namespace,
                endpoint=proxy.url,
            )
            await resource_manager_ready(cluster_api, rm_name)
            await stage.group("mid", min_count=4)
            await stage.members("mid", [f"mid-{i}" for i in range(4)], pool=pool)
            await eventually(
                lambda: asyncio.sleep(0, result=proxy.injected >= 1),
                within=30,
                what="the group reservation held at the proxy",
                every=0.01,
            )
            proxy.rate = 0.0
            await client.CoreV1Api(cluster_api).delete_namespaced_pod(
                "mid-0", namespace, grace_period_seconds=0
            )
            messages = await stage.explained("mid", 3)
            assert any("released the reservation of all 4 members" in m for m in messages) or all(
                "waiting for 1 more" in m for m in messages
            ), messages

            async def released() -> bool:
                return not [r for r in await rm.reservations() if r.namespace == namespace]

            await eventually(released, within=30, what="every member reservation released")
            assert await stage.bound("mid") == {}
            created = await stage.members("mid", ["mid-4"], pool=pool)
            await stage.all_bound("mid", 4, since=created, within=30)
            await settled_invariants(api=cluster_api, rm=rm, namespace=namespace, scheduler_names=[scheduler])
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CustomObjectsApi(cluster_api).delete_cluster_custom_object(
                group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=rm_name
            )
        await stage.cleanup()


async def test_an_operator_that_may_not_read_pod_groups_says_so_on_the_members(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    """An older ClusterRole (without podgroups): the members are told what permission is missing."""
    token = uuid.uuid4().hex[:6]
    user, role = f"old-operator-{token}", f"old-operator-{token}"
    rbac_api = client.RbacAuthorizationV1Api(cluster_api)
    older = [rule for rule in OPERATOR_RULES if "scheduling.k8s.io" not in rule["apiGroups"]]
    await rbac_api.create_cluster_role(body={**cluster_role(name=role), "rules": older})
    await rbac_api.create_cluster_role_binding(body=cluster_role_binding(name=role, user=user))
    kubeconfig = cluster.mint_kubeconfig(user=user)
    namespace, pool = cluster_namespace, uuid.uuid4().hex[:6]
    scheduler, rm_name = f"gang-{token}", f"rm-gang-{token}"
    stage = Stage(api=cluster_api, namespace=namespace, scheduler=scheduler, pool=pool)
    await stage.pool({"0": {}}, {"0": "8"})
    try:
        async with (
            RMProcess(
                kubeconfig=cluster.kubeconfig, directory=tmp_path, node_selector=f"{POOL}={pool}"
            ) as rm,
            operator_process(kubeconfig=kubeconfig, directory=tmp_path),
        ):
            await serve_with(
                cluster_api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=namespace
            )
            await stage.group("forbidden", min_count=2)
            await stage.members("forbidden", ["forbidden-0", "forbidden-1"], pool=pool)
            messages = await stage.explained("forbidden", 2)
            for message in messages:
                assert "HTTP 403" in message, message
                assert "list and watch on podgroups.scheduling.k8s.io" in message, message
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CustomObjectsApi(cluster_api).delete_cluster_custom_object(
                group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=rm_name
            )
        with contextlib.suppress(client.ApiException):
            await rbac_api.delete_cluster_role_binding(role)
        with contextlib.suppress(client.ApiException):
            await rbac_api.delete_cluster_role(role)
        await stage.cleanup()
