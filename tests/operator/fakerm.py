"""A small, scriptable resource manager on 127.0.0.1 for fault injection in operator tests.

It speaks contract v1 over real HTTP (aiohttp), keeps reservations in memory and counts slots per
node, and can be told to misbehave: refuse connections, hang, answer 500, answer a malformed body,
or choose a given node regardless of capacity. The reference RM covers correct behaviour; this one
exists for the failures the reference RM never produces.

With ``features`` set it also answers ``GET /v1/info`` (contract v1.2) and, with ``plans``, attaches
whatever preemption plan it is told to an Unschedulable answer, asked for or not: a lying RM, which
the reference RM (it vets its own plans) cannot be made into.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import itertools
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

PROBLEM = "urn:bindery:rm:v1:problem:"


@dataclasses.dataclass
class FakeRM:
    slots: dict[str, int]  # node -> how many pods fit
    mode: str = "ok"  # ok | 500 | malformed | slow | unschedulable
    choose: str | None = None  # force this node (even if unknown/full)
    place: dict[str, str] = dataclasses.field(default_factory=dict)  # pod name -> forced node
    retry_after: float | None = None  # retryAfterSeconds on unschedulable answers
    refuse_namespaces: set[str] = dataclasses.field(default_factory=set)  # pods here never fit
    slow_seconds: float = 30.0
    reservations: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    calls: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    url: str = ""
    #: awaited with the new reservation before the RM answers (to race the operator)
    on_reserve: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    #: awaited with the pod's name on every reserve call, before anything is decided (to hold cycles)
    on_attempt: Callable[[str], Awaitable[None]] | None = None
    #: awaited with the existing reservation before a replayed reserve is answered
    on_replay: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    reserve_order: list[str] = dataclasses.field(default_factory=list)  # pod names reserved, in order
    reserve_attempts: list[str] = dataclasses.field(default_factory=list)  # pod names of every call
    #: ``GET /v1/info``'s features (contract v1.2); None: no such path (an RM of v1.1)
    features: list[str] | None = None
    #: pod name -> the preemption plan (contract JSON) its Unschedulable answer carries, whatever
    #: the reserve asked; the pod then never fits
    plans: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: pod name -> the plan answered instead when its reserve asks for none (``preemptionPolicy``
    #: absent or ``Never``)
    unasked_plans: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: each reserve's body as received, by pod name (the last one)
    reserve_bodies: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    confirmed: list[str] = dataclasses.field(default_factory=list)  # plan ids confirmed, in order
    cancelled: list[str] = dataclasses.field(default_factory=list)  # plan ids cancelled, in order
    _ids: itertools.count[int] = dataclasses.field(default_factory=lambda: itertools.count(1))

    # -- queries for assertions ------------------------------------------------------------------

    def states(self) -> dict[str, str]:
        return {rid: r["state"] for rid, r in self.reservations.items()}

    def active(self) -> list[dict[str, Any]]:
        return [r for r in self.reservations.values() if r["state"] in ("reserved", "committed")]

    def for_pod(self, uid: str) -> list[dict[str, Any]]:
        return [r for r in self.reservations.values() if r["podUid"] == uid]

    # -- handlers --------------------------------------------------------------------------------

    async def _fault(self) -> web.Response | None:
        if self.mode == "500":
            return web.json_response(
                {"type": PROBLEM + "internal", "title": "boom", "status": 500},
                status=500,
                content_type="application/problem+json",
            )
        if self.mode == "malformed":
            return web.Response(text='{"id": 12, "node": ', content_type="application/json", status=201)
        if self.mode == "slow":
            await asyncio.sleep(self.slow_seconds)
        return None

    async def reserve(self, request: web.Request) -> web.Response:
        self.calls.append(("reserve", ""))
        fault = await self._fault()
        if fault is not None:
            return fault
        body = await request.json()
        pod = body["pod"]
        self.reserve_attempts.append(pod["name"])
        self.reserve_bodies[pod["name"]] = body
        if self.on_attempt is not None:
            await self.on_attempt(pod["name"])
        for existing in self.reservations.values():
            if existing["idempotencyKey"] == body["idempotencyKey"] and existing["state"] == "reserved":
                if self.on_replay is not None:
                    await self.on_replay(existing)
                return web.json_response(existing, status=200)
        node = self.place.get(pod["name"]) or self.choose or self._free_node()
        plan = self.plans.get(pod["name"])
        if body.get("preemptionPolicy") != "PreemptLowerPriority":
            plan = self.unasked_plans.get(pod["name"], plan)
        if (
            node is None
            or plan is not None
            or self.mode == "unschedulable"
            or pod["namespace"] in self.refuse_namespaces
        ):
            return web.json_response(
                {
                    "type": PROBLEM + "unschedulable",
                    "title": "no room",
                    "status": 409,
                    "detail": "no node has a free slot",
                    "reason": "all nodes are full",
                    **({"retryAfterSeconds": self.retry_after} if self.retry_after else {}),
                    **({"preemption": plan} if plan is not None else {}),
                },
                status=409,
                content_type="application/problem+json",
            )
        rid = f"r-{next(self._ids)}"
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=body["ttlSeconds"])
        reservation = {
            "id": rid,
            "node": node,
            "state": "reserved",
            "podUid": pod["uid"],
            "schedulerName": pod["schedulerName"],
            "namespace": pod["namespace"],
            "name": pod["name"],
            "expiresAt": expires.isoformat().replace("+00:00", "Z"),
            "idempotencyKey": body["idempotencyKey"],
        }
        self.reservations[rid] = reservation
        self.reserve_order.append(pod["name"])
        if self.on_reserve is not None:
            await self.on_reserve(reservation)
        return web.json_response(reservation, status=201)

    def _free_node(self) -> str | None:
        used: dict[str, int] = {}
        for r in self.active():
            used[r["node"]] = used.get(r["node"], 0) + 1
        for node, slots in sorted(self.slots.items()):
            if used.get(node, 0) < slots:
                return node
        return None

    @staticmethod
    def _mismatch(reservation: dict[str, Any] | None, pod_uid: str | None) -> web.Response | None:
        """Contract v1.1: a commit, release or renew naming another pod changes nothing."""
        if reservation is None or pod_uid is None or reservation["podUid"] == pod_uid:
            return None
        return web.json_response(
            {
                "type": PROBLEM + "pod-mismatch",
                "title": "pod mismatch",
                "status": 409,
                "detail": f"reservation {reservation['id']} belongs to pod {reservation['podUid']}",
            },
            status=409,
            content_type="application/problem+json",
        )

    async def commit(self, request: web.Request) -> web.Response:
        rid = request.match_info["rid"]
        self.calls.append(("commit", rid))
        reservation = self.reservations.get(rid)
        mismatch = self._mismatch(reservation, request.query.get("podUid"))
        if mismatch is not None:
            return mismatch
        if reservation is None or reservation["state"] not in ("reserved", "committed"):
            return web.json_response(
                {"type": PROBLEM + "reservation-not-active", "title": "not active", "status": 409},
                status=409,
                content_type="application/problem+json",
            )
        reservation["state"] = "committed"
        return web.json_response(reservation)

    async def release(self, request: web.Request) -> web.Response:
        rid = request.match_info["rid"]
        self.calls.append(("release", rid))
        reservation = self.reservations.get(rid)
        mismatch = self._mismatch(reservation, request.query.get("podUid"))
        if mismatch is not None:
            return mismatch
        if reservation is not None and reservation["state"] == "reserved":
            reservation["state"] = "released"
        if reservation is not None and reservation["state"] == "committed":
            reservation["state"] = "released"
        return web.Response(status=204)

    async def renew(self, request: web.Request) -> web.Response:
        rid = request.match_info["rid"]
        self.calls.append(("renew", rid))
        body = await request.json()
        reservation = self.reservations.get(rid)
        if reservation is None:
            return web.json_response(
                {"type": PROBLEM + "not-found", "title": "not found", "status": 404},
                status=404,
                content_type="application/problem+json",
            )
        mismatch = self._mismatch(reservation, body["podUid"])
        if mismatch is not None:
            return mismatch
        if reservation["state"] not in ("reserved", "committed"):
            return web.json_response(
                {"type": PROBLEM + "reservation-not-active", "title": "not active", "status": 409},
                status=409,
                content_type="application/problem+json",
            )
        if reservation["state"] == "reserved":
            expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=body["ttlSeconds"])
            reservation["expiresAt"] = expires.isoformat().replace("+00:00", "Z")
        return web.json_response(reservation)

    async def list(self, request: web.Request) -> web.Response:
        self.calls.append(("list", ""))
        query = request.query
        items = [
            r
            for r in self.reservations.values()
            if all(
                query.get(param) in (None, r[field])
                for param, field in (
                    ("schedulerName", "schedulerName"),
                    ("state", "state"),
                    ("podUid", "podUid"),
                )
            )
        ]
        return web.json_response({"items": items})

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def info(self, request: web.Request) -> web.Response:
        if self.features is None:
            return web.json_response(
                {"type": "about:blank", "title": "not found", "status": 404},
                status=404,
                content_type="application/problem+json",
            )
        return web.json_response({"contractVersion": "1.2.4", "features": self.features})

    def _plan(self, plan_id: str) -> dict[str, Any] | None:
        plans = [*self.plans.values(), *self.unasked_plans.values()]
        return next((plan for plan in plans if plan["planId"] == plan_id), None)

    async def confirm(self, request: web.Request) -> web.Response:
        plan_id = request.match_info["plan"]
        self.calls.append(("confirm", plan_id))
        plan = self._plan(plan_id)
        if plan is None:
            return web.json_response(
                {"type": PROBLEM + "not-found", "title": "not found", "status": 404},
                status=404,
                content_type="application/problem+json",
            )
        self.confirmed.append(plan_id)
        return web.json_response({**plan, "state": "confirmed"})

    async def cancel(self, request: web.Request) -> web.Response:
        plan_id = request.match_info["plan"]
        self.calls.append(("cancel", plan_id))
        self.cancelled.append(plan_id)
        plan = self._plan(plan_id)
        return web.json_response({**plan, "state": "cancelled"} if plan is not None else {})


@asynccontextmanager
async def serve_fake_rm(rm: FakeRM) -> AsyncIterator[FakeRM]:
    app = web.Application()
    app.router.add_post("/v1/reservations", rm.reserve)
    app.router.add_get("/v1/reservations", rm.list)
    app.router.add_post("/v1/reservations/{rid}/commit", rm.commit)
    app.router.add_post("/v1/reservations/{rid}/renew", rm.renew)
    app.router.add_delete("/v1/reservations/{rid}", rm.release)
    app.router.add_get("/readyz", rm.ready)
    app.router.add_get("/v1/info", rm.info)
    app.router.add_post("/v1/preemptions/{plan}:confirm", rm.confirm)
    app.router.add_post("/v1/preemptions/{plan}:cancel", rm.cancel)
    async with serve_app(app, shutdown_timeout=0.1) as port:
        rm.url = f"http://127.0.0.1:{port}"
        yield rm


@asynccontextmanager
async def serve_app(
    app: web.Application, *, ssl_context: ssl.SSLContext | None = None, **runner_options: Any
) -> AsyncIterator[int]:
    """Serve `app` on a free loopback port (yielded) until the block ends."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True)
