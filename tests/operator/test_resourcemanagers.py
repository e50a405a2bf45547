"""ResourceManager objects: status conditions, contested scheduler names, live changes, plugins."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.scheduling.framework import CycleContext, Status
from bindery.scheduling.registry import default_registry
from tests.operator.conftest import (
    Bindery,
    RealStage,
    Stage,
    closed_port_url,
    events_of,
    eventually,
    now,
    resource_manager,
)
from tests.operator.fakerm import FakeRM, serve_fake_rm

pytestmark = pytest.mark.controlplane
OBJECTS = {"group": "bindery.dev", "version": "v1alpha1", "plural": "resourcemanagers"}


async def _rm(api: client.ApiClient, name: str) -> dict[str, Any]:
    body: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(name=name, **OBJECTS)
    return body


async def _patch_spec(api: client.ApiClient, name: str, spec: dict[str, Any]) -> None:
    await client.CustomObjectsApi(api).patch_cluster_custom_object(
        name=name, body={"spec": spec}, _content_type="application/merge-patch+json", **OBJECTS
    )


def _conditions(rm: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (rm.get("status") or {}).get("conditions") or ()}


async def test_status_reports_ready_then_unreachable_after_an_endpoint_change(
    *, kube_api: client.ApiClient, bindery: Bindery, fake_rm: FakeRM, uniq: Callable[[str], str]
) -> None:
    name = uniq("rm")
    async with resource_manager(kube_api, name=name, scheduler_names=[uniq("s")], endpoint=fake_rm.url):

        async def ready() -> dict[str, Any] | None:
            rm = await _rm(kube_api, name)
            conds = _conditions(rm)
            ok = conds.get("Ready", {}).get("status") == "True" and conds["Reachable"]["status"] == "True"
            return rm if ok else None

        rm = await eventually(ready, what="Ready=True and Reachable=True")
        assert rm["status"]["observedGeneration"] == rm["metadata"]["generation"]

        await _patch_spec(
            kube_api, name, {"endpoint": closed_port_url(), "timeouts": {"connectSeconds": 0.2}}
        )

        async def unreachable() -> dict[str, Any] | None:
            conds = _conditions(await _rm(kube_api, name))
            ok = (
                conds.get("Ready", {}).get("reason") == "Unreachable"
                and conds["Reachable"]["status"] == "False"
            )
            return conds if ok else None

        conds = await eventually(unreachable, within=30, what="Ready=False/Unreachable")
        assert conds["Reachable"]["reason"] == "ProbeFailed"


async def test_a_contested_scheduler_name_is_reported_in_both_and_served_by_neither(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    uniq: Callable[[str], str],
    real_stage: RealStage,
) -> None:
    stage = real_stage
    node, shared = stage.node, stage.scheduler
    first, second = stage.rm_name, uniq("rm-b")
    async with stage.served():
        auth = {"tokenSecretRef": {"namespace": namespace, "name": stage.secret}}
        second_rm = resource_manager(
            kube_api, name=second, scheduler_names=[shared], endpoint=stage.rm.url, auth=auth
        )
        async with second_rm:
            for this, other in ((first, second), (second, first)):

                async def conflict(this: str = this) -> dict[str, Any] | None:
                    ready = _conditions(await _rm(kube_api, this)).get("Ready", {})
                    return ready if ready.get("reason") == "SchedulerNameConflict" else None

                ready = await eventually(conflict, what=f"{this} reporting the conflict")
                assert other in ready["message"]
            await stage.create("p")

            async def reported() -> list[dict[str, Any]]:
                events = await events_of(kube_api, namespace=namespace, pod_name="p")
                return [e for e in events if e["reason"] == "FailedScheduling"]

            (event,) = await eventually(reported, what="a FailedScheduling event naming the conflict")
            assert first in event["note"]
            assert second in event["note"]
            assert await stage.rm.reservations(active=False) == []  # neither reserved anything
            assert await stage.node_of("p") is None
        # The second claimant is gone: the name is uncontested, the pod gets scheduled.
        assert await eventually(lambda: stage.node_of("p"), within=30, what="the bind") == node
        await stage.settled()


async def test_an_endpoint_change_applies_without_restart(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    node, name = stage.node, stage.rm_name
    fake_rm.mode = "unschedulable"
    async with (
        serve_fake_rm(FakeRM(slots={node: 5})) as better,
        stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}),
    ):
        await stage.create("p")
        await eventually(lambda: _reserve_calls(fake_rm), what="the first RM being asked")
        await _patch_spec(kube_api, name, {"endpoint": better.url})
        assert await eventually(lambda: stage.node_of("p"), what="the bind") == node
        # The commit follows the bind (and the Scheduled event): wait for it.
        await eventually(lambda: _states_are(better, ["committed"]), what="the commit at the new RM")


async def _states_are(rm: FakeRM, states: list[str]) -> bool:
    return list(rm.states().values()) == states


async def _reserve_calls(rm: FakeRM) -> bool:
    return any(call[0] == "reserve" for call in rm.calls)


class RejectingPreBind:
    name = "test-reject"

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        return Status.unschedulable(f"test-reject refuses pod {ctx.pod.key}")


async def test_a_prebind_plugin_enabled_per_resource_manager(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    real_stage: RealStage,
) -> None:
    stage = real_stage
    node, name = stage.node, stage.rm_name
    default_registry.register(name="test-reject", plugin=RejectingPreBind())
    try:
        async with stage.served(
            plugins={"preBind": ["test-reject"]}, backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}
        ):
            created = await stage.create("p")
            uid = created["metadata"]["uid"]

            async def refused() -> list[dict[str, Any]]:
                events = await events_of(kube_api, namespace=namespace, pod_name="p")
                return [e for e in events if "test-reject refuses" in e["note"]]

            await eventually(refused, within=30, what="the plugin's FailedScheduling event")

            # Each refused cycle reserved at the RM (PreBind comes after Reserve) and released; polled,
            # since the next cycle may hold a reservation for the instant between its reserve and release.
            async def all_released() -> bool:
                made = await stage.reservations_of(uid)
                return bool(made) and not [r for r in made if r.state.active]

            await eventually(all_released, what="the refused cycles' reservations released")
            await _patch_spec(kube_api, name, {"plugins": {"preBind": []}})
            assert await eventually(lambda: stage.node_of("p"), what="the bind") == node
            await stage.settled()
            assert [r.pod_uid for r in await stage.active()] == [uid]
    finally:
        default_registry.unregister(name="test-reject")


async def test_a_missing_token_secret_is_reported(
    *, kube_api: client.ApiClient, bindery: Bindery, fake_rm: FakeRM, uniq: Callable[[str], str]
) -> None:
    name = uniq("rm")
    ref = {"namespace": "default", "name": uniq("no-such-secret")}
    async with resource_manager(
        kube_api, name=name, scheduler_names=[uniq("s")], endpoint=fake_rm.url, auth={"tokenSecretRef": ref}
    ):

        async def reported() -> dict[str, Any] | None:
            ready = _conditions(await _rm(kube_api, name)).get("Ready", {})
            return ready if ready.get("reason") == "CredentialsUnavailable" else None

        ready = await eventually(reported, what="Ready=False/CredentialsUnavailable")
        assert ref["name"] in ready["message"]


async def test_shrinking_max_in_flight_lets_running_cycles_finish(
    *, kube_api: client.ApiClient, bindery: Bindery, fake_rm: FakeRM, stage: Stage
) -> None:
    """Two cycles are inside the RM call when the budget drops to one: neither is cancelled, so
    nothing is released and reserved again, and every pod binds on its first reservation.

    Two, not more: the RM client keeps at most two requests in flight (rm/client.py,
    BATCHES_IN_FLIGHT), so while two reserves hang a third cycle waits in the client's queue and
    never reaches the RM; whether it does then depends on whether it was batched with the second.
    """
    gate = asyncio.Event()

    async def hold(reservation: dict[str, Any]) -> None:
        await gate.wait()

    fake_rm.on_reserve = hold
    pods = ("a", "b")
    async with stage.served(maxInFlight=2, timeouts={"readSeconds": 30}):
        for name in pods:
            await stage.create(name)
        await eventually(lambda: now(len(fake_rm.reservations) == 2), what="two cycles in flight")
        await _patch_spec(kube_api, stage.rm_name, {"maxInFlight": 1})

        async def applied() -> bool:
            rm = await _rm(kube_api, stage.rm_name)
            return bool((rm.get("status") or {}).get("observedGeneration") == rm["metadata"]["generation"])

        await eventually(applied, what="the new budget applied")
        gate.set()
        for name in pods:
            assert (
                await eventually(functools.partial(stage.node_of, name), what=f"pod {name} bound")
                == stage.node
            )
        await eventually(
            lambda: now(sorted(fake_rm.states().values()) == ["committed"] * 2), what="two commits"
        )
    assert not [call for call in fake_rm.calls if call[0] == "release"]
    assert sorted(fake_rm.reserve_attempts) == list(pods)
