"""A fault-injecting HTTP proxy between the operator and a real resource manager.

Why a proxy and not a fake: the chaos suite's promise is "every reservation ends committed or
released" and that can only fail if the reservations are real. The reference RM behind the proxy
stores them; the proxy only breaks the conversation, the way a network, a load balancer or an
overloaded RM does. Each request draws its fate from a seeded `random.Random`, so a failing run
can be replayed with the same seed (the order of requests still depends on timing).

Fault kinds (`KINDS`):

- ``drop``: the connection is closed before the request reaches the RM (nothing applied);
- ``reset``: the same, with a TCP RST (SO_LINGER 0) instead of a FIN;
- ``delay``: the request is held 0.2-2.5 s, then forwarded (may cross the client's deadline);
- ``error500`` / ``throttle429``: answered by the proxy (429 with ``Retry-After: 1``), nothing applied;
- ``garbage``: a 200 whose body is not JSON, nothing applied;
- ``lost_answer``: the request is forwarded and applied at the RM, then the connection is closed
  instead of the answer: the client cannot tell it from ``drop``, which is the hard case.

``answer(path, status, times)`` answers the next ``times`` requests for ``path`` with ``status`` and
a problem body (or ``body``, as JSON), drawing nothing and forwarding nothing: an RM replica of
another version behind the same Service is ``answer("/v1/info", 404, 1)``.

``answered``, when set, is awaited with each request's (method, path) after the RM has applied it
and before the client gets the answer: a test holds a request there to act at that exact moment
(the preemption crash test SIGKILLs the operator between the RM's confirm and its answer).

The first faults cycle through every kind once (in a seeded order), so even a short run injects
each kind; after that kinds are drawn at random. A test about one fault narrows `kinds` to it,
`applies` to the requests it concerns (the others are forwarded untouched and draw nothing), and
`delay` to a range that is sure to cross its client's deadline.

``reserves`` counts the reserve operations that reached the proxy, by pod name, whether sent alone
(``POST /v1/reservations``) or inside a ``POST /v1/batch``: what a test of wake-ups counts, since
each wake of a parked pod costs one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from tests.operator.fakerm import serve_app

KINDS = ("drop", "reset", "delay", "error500", "throttle429", "garbage", "lost_answer")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


class RMFaultProxy:
    """What the test sees and steers: `rate` (0 stops faults), counts by kind, requests seen."""

    def __init__(
        self,
        *,
        upstream: str,
        seed: int,
        rate: float = 0.3,
        kinds: Sequence[str] = KINDS,
        delay: tuple[float, float] = (0.2, 2.5),
        applies: Callable[[str, str], bool] | None = None,
    ) -> None:
        if not kinds or set(kinds) - set(KINDS):
            raise ValueError(f"fault kinds must be some of {KINDS}, not {list(kinds)}")
        self.upstream = upstream.rstrip("/")
        self.rate = rate
        self.url = ""
        self.requests = 0
        self.faults: collections.Counter[str] = collections.Counter()
        #: reserve operations received, by pod name (single calls and batched ones alike)
        self.reserves: collections.Counter[str] = collections.Counter()
        self.delay = delay
        #: (method, path) → whether the request may draw a fault; None: every request may
        self.applies = applies
        #: awaited after the RM applied a request, before its answer (see the module docstring)
        self.answered: Callable[[str, str], Awaitable[None]] | None = None
        #: path → (status, body, requests left) for :meth:`answer`
        self._scripted: dict[str, tuple[int, Any, int]] = {}
        self._kinds = tuple(kinds)
        self._rng = random.Random(seed)
        self._order = list(self._kinds)
        self._rng.shuffle(self._order)

    def answer(self, path: str, status: int, times: int, *, body: Any = None) -> None:
        """Answer the next `times` requests for `path` with `status` (see the module docstring)."""
        self._scripted[path] = (status, body, times)

    def scripted(self, path: str) -> int:
        """Requests for `path` still to be answered by :meth:`answer` (0: forwarded again)."""
        return self._scripted.get(path, (0, None, 0))[2]

    def _scripted_answer(self, path: str) -> web.Response | None:
        status, body, left = self._scripted.get(path, (0, None, 0))
        if left <= 0:
            return None
        self._scripted[path] = (status, body, left - 1)
        if body is not None:
            return web.json_response(body, status=status)
        return web.json_response(
            {"title": f"answered {status} by the test proxy"},
            status=status,
            content_type="application/problem+json",
        )

    @property
    def injected(self) -> int:
        return sum(self.faults.values())

    def _draw(self) -> str | None:
        if self.rate <= 0 or self._rng.random() >= self.rate:
            return None
        done = self.injected
        kind = self._order[done] if done < len(self._order) else self._rng.choice(self._kinds)
        self.faults[kind] += 1
        return kind


def _reserved_pods(method: str, path: str, body: bytes) -> list[str]:
    """The pod names of the reserve operations of one request (none if it is not JSON)."""
    if method != "POST" or path not in ("/v1/reservations", "/v1/batch"):
        return []
    try:
        document = json.loads(body)
    except ValueError:
        return []
    if not isinstance(document, dict):
        return []
    reserves: list[Any] = [document]
    if path == "/v1/batch":
        operations = document.get("operations")
        ops = operations if isinstance(operations, list) else []
        reserves = [op.get("reserve") for op in ops if isinstance(op, dict)]
    names: list[str] = []
    for reserve in reserves:
        pod = reserve.get("pod") if isinstance(reserve, dict) else None
        if isinstance(pod, dict) and isinstance(pod.get("name"), str):
            names.append(pod["name"])
    return names


def _cut(request: web.Request, *, reset: bool) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if reset and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


@contextlib.asynccontextmanager
async def rm_fault_proxy(
    *,
    upstream: str,
    seed: int,
    rate: float = 0.3,
    kinds: Sequence[str] = KINDS,
    delay: tuple[float, float] = (0.2, 2.5),
    applies: Callable[[str, str], bool] | None = None,
) -> AsyncIterator[RMFaultProxy]:
    """Serve an `RMFaultProxy` to `upstream` on a loopback port for the block."""
    proxy = RMFaultProxy(upstream=upstream, seed=seed, rate=rate, kinds=kinds, delay=delay, applies=applies)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), auto_decompress=False)

    async def forward(request: web.Request) -> tuple[int, dict[str, str], bytes]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        async with session.request(
            request.method, proxy.upstream + request.path_qs, headers=headers, data=body or None
        ) as upstream_response:
            payload = await upstream_response.read()
            kept = {k: v for k, v in upstream_response.headers.items() if k.lower() not in _HOP_BY_HOP}
            return upstream_response.status, kept, payload

    async def handle(request: web.Request) -> web.StreamResponse:
        proxy.requests += 1
        proxy.reserves.update(_reserved_pods(request.method, request.path, await request.read()))
        scripted = proxy._scripted_answer(request.path)
        if scripted is not None:
            return scripted
        faulty = proxy.applies is None or proxy.applies(request.method, request.path)
        kind = proxy._draw() if faulty else None
        if kind in ("drop", "reset"):
            _cut(request, reset=kind == "reset")
            return web.Response(status=499)  # never reaches the client: the connection is gone
        if kind == "error500":
            return web.json_response({"title": "injected by the chaos proxy"}, status=500)
        if kind == "throttle429":
            return web.json_response(
                {"title": "injected by the chaos proxy"}, status=429, headers={"Retry-After": "1"}
            )
        if kind == "garbage":
            return web.Response(body=b"\x00{not json", status=200, content_type="application/json")
        if kind == "delay":
            await asyncio.sleep(proxy._rng.uniform(*proxy.delay))
        try:
            status, headers, payload = await forward(request)
        except (aiohttp.ClientError, TimeoutError):
            _cut(request, reset=False)  # the RM is down: the client sees a dropped connection
            return web.Response(status=502)
        if proxy.answered is not None:
            await proxy.answered(request.method, request.path)
        if kind == "lost_answer":
            _cut(request, reset=False)
            return web.Response(status=499)
        return web.Response(status=status, headers=headers, body=payload)

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    options: dict[str, Any] = {"access_log": None, "handler_cancellation": True}
    try:
        async with serve_app(app, **options) as port:
            proxy.url = f"http://127.0.0.1:{port}"
            yield proxy
    finally:
        await session.close()
