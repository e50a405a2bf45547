"""A reservation is a lease: no Binding outlasts it, and it is renewed while it is still needed.

The reference RM runs as its own process (tests/realrm.py) with a short ``reservationTTLSeconds``;
the operator talks to the apiserver through the proxy of tests/operator/apiproxy.py, which slows
the first Binding down (it hangs unanswered) or delivers it late. In front of the RM sits a small
proxy of this module: it counts renewals, can answer 404 on ``/renew`` as a contract v1.0 RM does,
and can refuse reservations for a while (the RM "unavailable" to the pod's next cycles).

What must hold: the pod ends bound with a reservation that is committed, and no Binding ever goes
out on a reservation whose lease may have run out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.rm.models import Reservation, ReservationState
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.conftest import OPERATOR_USER
from tests.operator.apiproxy import ApiProxy, serve_api_proxy
from tests.operator.conftest import (
    Bindery,
    create_pod,
    eventually,
    pod_body,
    read_pod,
    resource_manager,
)
from tests.operator.fakerm import serve_app
from tests.realrm import RMProcess, settled_invariants

pytestmark = pytest.mark.controlplane

TTL = 6  # seconds: a hung Binding attempt gets what the lease allows (5 s), so the lease runs low
_RENEW = re.compile(r"^/v1/reservations/[^/]+/renew$")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclasses.dataclass
class RMProxy:
    url: str = ""
    #: answer 404 on /renew, as an RM of contract v1.0 does (it has no such path)
    no_renew: bool = False
    #: answer 503 to every POST /v1/reservations while set
    refuse_reserves: bool = False
    renewed: list[int] = dataclasses.field(default_factory=list)  # the RM's status per renewal
    refused: int = 0


@contextlib.asynccontextmanager
async def serve_rm_proxy(*, upstream: str) -> AsyncIterator[RMProxy]:
    proxy = RMProxy()
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        renew = request.method == "POST" and _RENEW.match(request.path) is not None
        if renew and proxy.no_renew:
            return web.json_response({"title": "Not Found", "status": 404}, status=404)
        if request.method == "POST" and request.path == "/v1/reservations" and proxy.refuse_reserves:
            proxy.refused += 1
            return web.json_response(
                {"type": "about:blank", "title": "Service Unavailable", "status": 503},
                status=503,
                content_type="application/problem+json",
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with session.request(
            request.method, upstream + request.path_qs, headers=headers, data=body or None
        ) as answer:
            payload = await answer.read()
            if renew:
                proxy.renewed.append(answer.status)
            return web.Response(
                status=answer.status,
                body=payload,
                headers={k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP},
            )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    try:
        async with serve_app(app) as port:
            proxy.url = f"http://127.0.0.1:{port}"
            yield proxy
    finally:
        await session.close()


@dataclasses.dataclass
class World:
    api: client.ApiClient
    namespace: str
    node: str
    scheduler: str
    rm: RMProcess
    rm_proxy: RMProxy
    api_proxy: ApiProxy
    secret: str
    rm_name: str

    def served(self, *, ttl: int = TTL, **spec: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return resource_manager(
            self.api,
            name=self.rm_name,
            scheduler_names=[self.scheduler],
            endpoint=self.rm_proxy.url,
            auth={"tokenSecretRef": {"namespace": self.namespace, "name": self.secret}},
            reservationTTLSeconds=ttl,
            **spec,
        )

    async def create(self, name: str) -> str:
        pod = await create_pod(
            self.api, namespace=self.namespace, body=pod_body(name=name, scheduler_name=self.scheduler)
        )
        uid: str = pod["metadata"]["uid"]
        return uid

    async def bound(self, name: str) -> dict[str, Any] | None:
        pod = await read_pod(self.api, namespace=self.namespace, name=name)
        return pod if pod["spec"].get("nodeName") else None

    async def reservations_of(self, uid: str) -> list[Reservation]:
        return [r for r in await self.rm.reservations(active=False) if r.pod_uid == uid]

    async def settled(self) -> None:
        await settled_invariants(
            api=self.api, rm=self.rm, namespace=self.namespace, scheduler_names=[self.scheduler]
        )


@pytest.fixture
async def world(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> AsyncIterator[World]:
    """A one-node pool mirrored by the reference RM (behind the RM proxy), the operator in-process
    behind the apiserver proxy."""
    pool = uuid.uuid4().hex[:8]
    node = uniq("lease")
    await create_node(
        kube_api,
        name=node,
        capacity={"cpu": "4", "memory": "8Gi", "pods": "20"},
        labels={"bindery.dev/test-pool": pool},
    )
    try:
        async with (
            RMProcess(
                kubeconfig=controlplane.kubeconfig,
                directory=tmp_path / "rm",
                node_selector=f"bindery.dev/test-pool={pool}",
            ) as rm,
            serve_rm_proxy(upstream=rm.url) as rm_proxy,
            serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as api_proxy,
        ):
            secret = uniq("rm-token")
            await client.CoreV1Api(kube_api).create_namespaced_secret(
                namespace=namespace,
                body={
                    "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
                    "stringData": {"token": rm.token},
                },
            )
            kubeconfig = controlplane.mint_kubeconfig(
                user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=api_proxy.url
            )
            operator = Bindery(kubeconfig=kubeconfig)
            await operator.start()
            try:
                yield World(
                    api=kube_api,
                    namespace=namespace,
                    node=node,
                    scheduler=uniq("sched"),
                    rm=rm,
                    rm_proxy=rm_proxy,
                    api_proxy=api_proxy,
                    secret=secret,
                    rm_name=uniq("rm"),
                )
            finally:
                await operator.stop()
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(kube_api).delete_node(name=node)


def _reservation_on(pod: dict[str, Any]) -> str:
    rid: str = (pod["metadata"].get("annotations") or {}).get(RESERVATION_ANNOTATION, "")
    return rid


async def test_a_binding_slower_than_the_lease_renews_it_and_the_pod_commits_on_it(world: World) -> None:
    """The first Binding hangs for as long as the lease allows; the retry renews the lease first."""
    world.api_proxy.binding_faults = ["hang"]
    async with world.served(backoff={"initialSeconds": 0.5, "maxSeconds": 1}):
        uid = await world.create("p")
        pod = await eventually(lambda: world.bound("p"), within=60, what="the pod bound")
        await eventually(
            lambda: _states(world, uid, {_reservation_on(pod): ReservationState.COMMITTED}),
            within=30,
            what="its reservation committed",
        )
        await world.settled()
    (reservation,) = await world.reservations_of(uid)  # one reservation, renewed, never expired
    assert reservation.id == _reservation_on(pod)
    assert 200 in world.rm_proxy.renewed
    assert [status for _, status in world.api_proxy.bindings] == [None, 201]


async def test_without_renew_no_binding_is_sent_on_a_lease_that_may_have_expired(world: World) -> None:
    """A contract v1.0 RM cannot renew: once the hung attempt has used the lease up, no further
    Binding is sent with that reservation; the pod is bound later on a fresh reservation."""
    world.rm_proxy.no_renew = True
    world.api_proxy.binding_faults = ["hang"]
    async with world.served(backoff={"initialSeconds": 0.5, "maxSeconds": 1}):
        uid = await world.create("p")
        pod = await eventually(lambda: world.bound("p"), within=60, what="the pod bound")
        used = _reservation_on(pod)
        await eventually(
            lambda: _states(world, uid, {used: ReservationState.COMMITTED}),
            within=30,
            what="the reservation it was bound with committed",
        )
        await world.settled()
    # The hung attempt's reservation ran out unused; the Binding that landed had a live one.
    others = [r for r in await world.reservations_of(uid) if r.id != used]
    assert [r.state for r in others] in (
        [ReservationState.EXPIRED],
        [ReservationState.RELEASED],
    )
    assert not [status for status in world.rm_proxy.renewed if status == 200]


async def test_a_late_binding_after_a_failed_cycle_finds_its_reservation_alive(world: World) -> None:
    """The first Binding lands 9 s late (after the original 6 s lease); meanwhile the pod's next
    cycles fail at the RM. The tracker of the unanswered Binding keeps the reservation (a failed
    cycle that never got it back does not settle it) and renews it, so the late Binding commits."""
    world.api_proxy.binding_faults = ["late:9", "drop", "drop"]
    async with world.served(backoff={"initialSeconds": 0.5, "maxSeconds": 1}):
        uid = await world.create("p")
        await eventually(
            lambda: _fewer(world.api_proxy.binding_faults, 3), within=30, what="the first Binding sent"
        )
        world.rm_proxy.refuse_reserves = True  # the next cycles fail before they get it back
        await eventually(lambda: _positive(world.rm_proxy.refused), within=30, what="a later cycle failed")
        pod = await eventually(lambda: world.bound("p"), within=30, what="the late Binding")
        assert [status for fault, status in world.api_proxy.bindings if fault.startswith("late")] == [201]
        rid = _reservation_on(pod)
        await eventually(
            lambda: _states(world, uid, {rid: ReservationState.COMMITTED}),
            within=20,
            what="the late Binding's reservation committed",
        )
        world.rm_proxy.refuse_reserves = False
        await world.settled()
    (reservation,) = await world.reservations_of(uid)
    assert reservation.id == rid
    assert 200 in world.rm_proxy.renewed


async def _states(world: World, uid: str, expected: dict[str, ReservationState]) -> bool:
    found = {r.id: r.state for r in await world.reservations_of(uid)}
    return all(found.get(rid) is state for rid, state in expected.items())


async def _fewer(faults: list[str], than: int) -> bool:
    return len(faults) < than


async def _positive(value: int) -> bool:
    return value > 0
