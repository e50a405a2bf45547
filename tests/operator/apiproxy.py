"""A TLS proxy in front of the test apiserver that can apply a Binding and swallow its answer.

A Binding whose answer is lost is the one failure the real apiserver never produces on its own:
the write lands, the caller sees a dropped connection. The operator under test gets a kubeconfig
that points here (a serving certificate from the plane's CA); every request is forwarded to the real
apiserver with the operator's own client certificate, so authentication and RBAC are unchanged,
and responses, watches included, are streamed back as they come.

`binding_faults` is consumed one entry per `pods/{name}/binding` POST; while it has entries the
operator never gets an answer (its connection is cut), and the POST itself is

- `"swallow"`: forwarded and applied first;
- `"late:<seconds>"`: forwarded that long after the cut (a write still in flight when the caller
  gave up);
- `"held"`: forwarded when the test calls `proxy.forward_held()`;
- `"drop"`: never forwarded;
- `"hang"`: never forwarded, and the connection is held open without an answer.

`blind_pod_lists` makes the operator miss what happens to pods, as a watch that was down longer
than the apiserver keeps history would: while it is set, every list or watch of pods (a GET of a
`pods` collection) is held unanswered, and a watch stream that was already open is cut instead of
delivering its next event. Clearing it lets held lists through, and answers each held watch that
resumes from a resourceVersion with what the apiserver says once that version is compacted away
(an ERROR event, code 410), so the watchers list afresh and never see the events of the gap.

`requests` records (method, path with query) of every request forwarded or answered, so a test
can count what the operator asked the apiserver for.

`open_pod_watches` holds the field selector of every pod watch stream open now (the tests count
the operator's watches with it).

`hold_node_lists`, while set, holds every list of Nodes (a GET of `/api/v1/nodes` that is not a
watch) unanswered, as an apiserver slow to list thousands of Nodes would; clearing it lets them
through. `held_node_lists` counts the lists it held.

`eviction_status`, when set, is the HTTP status every real eviction (a POST to `pods/{name}/eviction`
without `dryRun`) is answered with, unforwarded: an apiserver failing mid-preemption. Dry runs pass.

`bound_pod_list_status`, when set, is the HTTP status every list of a served name's bound pods (a
GET of a `pods` collection whose field selector has `spec.nodeName!=` and `spec.schedulerName=`,
not a watch) is answered with, unforwarded. The placed-pod watch of the inter-pod rules (every
scheduler's pods, no scheduler name) is forwarded: no pod is scheduled before it has listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import ssl
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from bindery.devcluster.plane import ControlPlane
from tests.operator.fakerm import serve_app

_BINDING = re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/binding$")
_EVICTION = re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/eviction$")
_POD_LISTS = re.compile(r"^/api/v1/(namespaces/[^/]+/)?pods$")
_EXPIRED = (
    json.dumps(
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": "too old resource version",
                "reason": "Expired",
                "code": 410,
            },
        }
    )
    + "\n"
)
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


@dataclasses.dataclass
class ApiProxy:
    url: str = ""
    binding_faults: list[str] = dataclasses.field(default_factory=list)
    held: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    #: (fault or "", the apiserver's status or None if not forwarded) per Binding POST, when known
    bindings: list[tuple[str, int | None]] = dataclasses.field(default_factory=list)
    #: (status, body) of every Binding answer the apiserver gave, delivered to the operator or not:
    #: the apiserver's own words, for tests that must not rely on a hand-written copy of them
    binding_answers: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    blind_pod_lists: bool = False
    #: pod watch streams cut (an event not delivered) while `blind_pod_lists` was set
    cut_pod_streams: int = 0
    #: field selectors of the pod watches held now (resuming from a resourceVersion)
    held_pod_watches: list[str] = dataclasses.field(default_factory=list)
    #: field selectors of the pod watch streams open now, one entry per stream
    open_pod_watches: list[str] = dataclasses.field(default_factory=list)
    #: held pod watches answered "410 Gone" when `blind_pod_lists` was cleared
    expired_pod_watches: int = 0
    bound_pod_list_status: int | None = None
    hold_node_lists: bool = False
    #: lists of Nodes held while `hold_node_lists` was set
    held_node_lists: int = 0
    eviction_status: int | None = None
    #: real evictions answered with `eviction_status`
    failed_evictions: int = 0
    #: lists of bound pods answered with `bound_pod_list_status`
    failed_bound_pod_lists: int = 0
    #: (method, path and query) of every request, in arrival order
    requests: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def forward_held(self) -> None:
        self.held.set()


@contextlib.asynccontextmanager
async def serve_api_proxy(*, plane: ControlPlane, user: str) -> AsyncIterator[ApiProxy]:
    """Serve a proxy that authenticates upstream as `user` (whose kubeconfig was minted already)."""
    proxy = ApiProxy()
    pki = plane.workdir / "pki"
    upstream_tls = ssl.create_default_context(cafile=str(plane.ca_file))
    upstream_tls.load_cert_chain(str(pki / f"{user}.crt"), str(pki / f"{user}.key"))
    cert, key = plane.issue_serving_certificate(stem="api-proxy")
    serving_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving_tls.load_cert_chain(str(cert), str(key))

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=upstream_tls),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
    )

    late: set[asyncio.Task[None]] = set()

    async def send(request: web.Request, body: bytes, fault: str) -> None:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with session.post(
            plane.server + request.path_qs, headers=headers, data=body or None
        ) as upstream:
            payload = await upstream.read()
            proxy.binding_answers.append((upstream.status, payload.decode(errors="replace")))
            proxy.bindings.append((fault, upstream.status))

    async def later(request: web.Request, body: bytes, fault: str, delay: float | None) -> None:
        if delay is None:
            await proxy.held.wait()
        else:
            await asyncio.sleep(delay)
        await send(request, body, fault)

    async def forward(request: web.Request) -> web.StreamResponse:
        proxy.requests.append((request.method, request.path_qs))
        body = await request.read()
        if request.method == "POST" and _BINDING.match(request.path) and proxy.binding_faults:
            fault = proxy.binding_faults.pop(0)
            if fault == "swallow":
                await send(request, body, fault)
            elif fault.startswith("late:") or fault == "held":
                delay = float(fault.split(":")[1]) if fault != "held" else None
                task = asyncio.create_task(later(request, body, fault, delay))
                late.add(task)
                task.add_done_callback(late.discard)
            else:
                proxy.bindings.append((fault, None))
            if fault == "hang":
                await asyncio.sleep(3600)
            assert request.transport is not None
            request.transport.abort()  # the operator never gets an answer
            raise asyncio.CancelledError
        evicting = request.method == "POST" and _EVICTION.match(request.path) is not None
        if evicting and proxy.eviction_status and not request.query.get("dryRun"):
            proxy.failed_evictions += 1
            code = proxy.eviction_status
            message = {"kind": "Status", "status": "Failure", "message": "injected", "code": code}
            return web.Response(status=code, content_type="application/json", text=json.dumps(message))
        watching = request.query.get("watch") in ("true", "True", "1")
        node_list = request.method == "GET" and request.path == "/api/v1/nodes" and not watching
        if node_list and proxy.hold_node_lists:
            proxy.held_node_lists += 1
            while proxy.hold_node_lists:
                await asyncio.sleep(0.05)
        pod_list = request.method == "GET" and _POD_LISTS.match(request.path) is not None
        failing = proxy.bound_pod_list_status
        selector = request.query.get("fieldSelector", "")
        bound_list = "spec.nodeName!=" in selector and "spec.schedulerName=" in selector
        if pod_list and failing and bound_list and request.query.get("watch") not in ("true", "1"):
            proxy.failed_bound_pod_lists += 1
            message = {"kind": "Status", "status": "Failure", "message": "injected", "code": failing}
            return web.Response(status=failing, content_type="application/json", text=json.dumps(message))
        if pod_list and proxy.blind_pod_lists:
            # "true" from Kopf, "True" from kubernetes_asyncio (the unbound-pod watch, the placed one)
            resumed = request.query.get("watch") in ("true", "True", "1") and bool(
                request.query.get("resourceVersion")
            )
            selector = request.query.get("fieldSelector", "")
            if resumed:
                proxy.held_pod_watches.append(selector)
            while proxy.blind_pod_lists:
                await asyncio.sleep(0.05)
            if resumed:
                proxy.held_pod_watches.remove(selector)
                proxy.expired_pod_watches += 1
                return web.Response(status=200, content_type="application/json", text=_EXPIRED)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        watch = pod_list and request.query.get("watch") in ("true", "True", "1")
        if watch:
            proxy.open_pod_watches.append(selector)
        try:
            return await relay(request, body, headers, pod_list=pod_list)
        finally:
            if watch:
                proxy.open_pod_watches.remove(selector)

    async def relay(
        request: web.Request, body: bytes, headers: dict[str, str], *, pod_list: bool
    ) -> web.StreamResponse:
        async with session.request(
            request.method, plane.server + request.path_qs, headers=headers, data=body or None
        ) as upstream:
            binding = request.method == "POST" and _BINDING.match(request.path) is not None
            if binding:
                proxy.bindings.append(("", upstream.status))
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP},
            )
            await response.prepare(request)
            answer = bytearray()
            async for chunk in upstream.content.iter_any():
                if pod_list and proxy.blind_pod_lists:
                    proxy.cut_pod_streams += 1
                    assert request.transport is not None
                    request.transport.abort()
                    raise asyncio.CancelledError
                if binding:
                    answer += chunk
                await response.write(chunk)
            if binding:
                proxy.binding_answers.append((upstream.status, answer.decode(errors="replace")))
            await response.write_eof()
            return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", forward)
    try:
        async with serve_app(app, ssl_context=serving_tls, handler_cancellation=True) as port:
            proxy.url = f"https://127.0.0.1:{port}"
            yield proxy
    finally:
        for task in late:
            task.cancel()
        await session.close()
