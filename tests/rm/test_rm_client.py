"""The RM client against a small fault-injecting HTTP server on loopback.

Each test tells the server how to misbehave and checks that the client turns it into the one error
type the scheduler acts on, retries only as promised, and keeps its promises about tokens and TLS.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from bindery.rm import RMConflict, RMError, RMProtocolError, RMRejected, RMUnavailable, RMUnschedulable
from bindery.rm.client import CircuitBreaker, ResourceManagerClient
from bindery.rm.errors import ProblemType, RMPodMismatch, RMUnsupported
from bindery.rm.models import PodIdentity, ReservationRequest, ReservationState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

RESERVATION = {
    "id": "r1",
    "node": "n1",
    "state": "reserved",
    "expiresAt": "2030-01-01T00:00:00Z",
    "podUid": "u1",
    "schedulerName": "bindery",
}


COMMITTED = {**RESERVATION, "state": "committed", "expiresAt": None}


def ok(body: Any = RESERVATION, status: int = 201) -> web.Response:
    return web.json_response(body, status=status)


def problem(status: int, kind: str, **extra: Any) -> web.Response:
    body = {"type": kind, "title": kind.rsplit(":", 1)[-1], "status": status, **extra}
    return web.Response(status=status, text=json.dumps(body), content_type="application/problem+json")


@dataclass
class FaultServer:
    """Serves a scripted sequence of handlers; the last one repeats."""

    script: list[Handler] = field(default_factory=list)
    seen: list[web.Request] = field(default_factory=list)
    tokens: list[str | None] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request)
        auth = request.headers.get("Authorization")
        self.tokens.append(auth.removeprefix("Bearer ") if auth else None)
        await request.read()
        handler = self.script[min(len(self.seen) - 1, len(self.script) - 1)]
        return await handler(request)

    def play(self, *handlers: Handler) -> None:
        self.script = list(handlers)
        self.seen.clear()
        self.tokens.clear()


async def start_json_body(request: web.Request, *, length: int, first: bytes) -> web.StreamResponse:
    """Send 201 headers promising ``length`` bytes of JSON, then only ``first``; the caller goes on."""
    response = web.StreamResponse(
        status=201, headers={"Content-Type": "application/json", "Content-Length": str(length)}
    )
    await response.prepare(request)
    await response.write(first)
    return response


def respond(response: Callable[[], web.StreamResponse]) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        return response()

    return handler


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    fault = FaultServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fault.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fault.url = f"http://127.0.0.1:{port}"
    yield fault
    await runner.cleanup()


def make_client(server: FaultServer, **kwargs: Any) -> ResourceManagerClient:
    options: dict[str, Any] = {
        "base_url": server.url,
        "token": "secret",
        "allow_insecure_http": True,
        "connect_timeout": 1.0,
        "read_timeout": 0.5,
        "backoff_initial": 0.01,
        "backoff_max": 0.02,
    }
    options.update(kwargs)
    return ResourceManagerClient(**options)


REQUEST = ReservationRequest(
    pod=PodIdentity(uid="u1", namespace="ns", name="p", scheduler_name="bindery"),
    resources={"cpu": "1"},
    idempotency_key="u1",
    ttl_seconds=30,
)


async def test_reserve_sends_camel_case_and_token(server: FaultServer) -> None:
    server.play(respond(ok))
    async with make_client(server) as client:
        reservation = await client.reserve(REQUEST)
    assert reservation.node == "n1"
    assert reservation.state is ReservationState.RESERVED
    sent = server.seen[0]
    assert sent.method == "POST"
    assert sent.path == "/v1/reservations"
    assert server.tokens == ["secret"]


async def test_slow_server_times_out_then_unavailable(server: FaultServer) -> None:
    async def slow(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(1)
        return ok()

    server.play(slow)
    async with make_client(server, max_attempts=2, read_timeout=0.2) as client:
        with pytest.raises(RMUnavailable, match="timed out"):
            await client.reserve(REQUEST)
    assert len(server.seen) == 2


async def test_500_is_retried_then_unavailable(server: FaultServer) -> None:
    server.play(respond(lambda: problem(500, ProblemType.INTERNAL, detail="boom")))
    async with make_client(server, max_attempts=3) as client:
        with pytest.raises(RMUnavailable, match=r"HTTP 500.*boom"):
            await client.commit("r1")
    assert len(server.seen) == 3


async def test_500_then_success_recovers(server: FaultServer) -> None:
    server.play(
        respond(lambda: web.Response(status=502, text="bad gateway")),
        respond(lambda: ok(COMMITTED, status=200)),
    )
    async with make_client(server) as client:
        reservation = await client.commit("r1")
    assert reservation.id == "r1"
    assert len(server.seen) == 2


async def test_retry_after_is_honoured_and_capped(server: FaultServer) -> None:
    busy = respond(
        lambda: web.Response(
            status=503, text="{}", content_type="application/problem+json", headers={"Retry-After": "1"}
        )
    )
    server.play(busy, respond(ok))
    loop = asyncio.get_running_loop()
    async with make_client(server) as client:
        started = loop.time()
        await client.reserve(REQUEST)
        waited = loop.time() - started
    assert waited >= 0.9  # the server asked for one second; our own backoff is 0.02 s here
    server.play(
        respond(
            lambda: web.Response(
                status=429,
                text="{}",
                content_type="application/problem+json",
                headers={"Retry-After": "3600"},
            )
        )
    )
    async with make_client(server, max_attempts=2, max_retry_after=0.05) as client:
        with pytest.raises(RMUnavailable) as caught:
            await client.reserve(REQUEST)
    assert caught.value.retry_after == 3600
    assert len(server.seen) == 2


@pytest.mark.parametrize(
    ("response", "fragment"),
    [
        (
            lambda: web.Response(status=201, text="{not json", content_type="application/json"),
            "does not match",
        ),
        (lambda: web.Response(status=201, text="<html>hi</html>", content_type="text/html"), "content type"),
        (lambda: web.json_response({"id": 5, "node": []}, status=201), "does not match"),
        (lambda: web.json_response([RESERVATION], status=201), "does not match"),
        (lambda: web.json_response({**RESERVATION, "state": "weird"}, status=201), "state"),
        (lambda: web.json_response({**RESERVATION, "pad": "x" * 5000}, status=201), "larger than"),
        (
            lambda: web.Response(
                status=201, text="{}", content_type="application/json", headers={"Content-Length": str(10**9)}
            ),
            "larger than|cut off",
        ),
        (lambda: web.Response(status=409, text="{bad", content_type="application/problem+json"), "not valid"),
        (lambda: web.Response(status=302, headers={"Location": "/elsewhere"}), "unexpected status"),
        (
            lambda: web.json_response({**RESERVATION, "podUid": "someone-else"}, status=201),
            "for pod someone-else",
        ),
        (lambda: web.json_response({**RESERVATION, "state": "released"}, status=200), "in state released"),
    ],
)
async def test_bad_bodies_become_protocol_errors(
    server: FaultServer, response: Callable[[], web.StreamResponse], fragment: str
) -> None:
    server.play(respond(response))
    async with make_client(server, max_response_bytes=4096) as client:
        with pytest.raises(RMProtocolError, match=fragment):
            await client.reserve(REQUEST)


async def test_truncated_body_is_a_protocol_error(server: FaultServer) -> None:
    async def truncated(request: web.Request) -> web.StreamResponse:
        response = await start_json_body(request, length=500, first=b'{"id": "r1", "no')
        assert request.transport is not None
        request.transport.close()
        return response

    server.play(truncated)
    async with make_client(server) as client:
        with pytest.raises(RMProtocolError, match="cut off"):
            await client.reserve(REQUEST)


async def test_unschedulable_and_conflicts_map_to_types(server: FaultServer) -> None:
    server.play(
        respond(
            lambda: problem(
                409, ProblemType.UNSCHEDULABLE, reason="0/3 nodes are available", retryAfterSeconds=7
            )
        )
    )
    async with make_client(server) as client:
        with pytest.raises(RMUnschedulable) as unschedulable:
            await client.reserve(REQUEST)
        assert unschedulable.value.reason == "0/3 nodes are available"
        assert unschedulable.value.retry_after == 7
        assert len(server.seen) == 1  # not retried

        server.play(respond(lambda: problem(409, ProblemType.IDEMPOTENCY_KEY_REUSED, detail="other request")))
        with pytest.raises(RMConflict, match="other request"):
            await client.reserve(REQUEST)

        server.play(respond(lambda: problem(400, ProblemType.INVALID_REQUEST, detail="bad cpu")))
        with pytest.raises(RMRejected) as rejected:
            await client.reserve(REQUEST)
        assert rejected.value.status == 400
        assert rejected.value.problem["type"] == ProblemType.INVALID_REQUEST


async def test_release_tolerates_unknown(server: FaultServer) -> None:
    server.play(respond(lambda: web.Response(status=204)))
    async with make_client(server) as client:
        await client.release("r1")
        server.play(respond(lambda: problem(404, ProblemType.NOT_FOUND)))
        await client.release("gone")
        server.play(respond(lambda: problem(403, "about:blank")))
        with pytest.raises(RMRejected):
            await client.release("r1")


async def test_list_follows_pagination_and_detects_loops(server: FaultServer) -> None:
    page1 = respond(lambda: ok({"items": [RESERVATION], "nextCursor": "c1"}, status=200))
    page2 = respond(lambda: ok({"items": [{**RESERVATION, "id": "r2"}]}, status=200))
    server.play(page1, page2)
    async with make_client(server) as client:
        items = await client.list_reservations(scheduler_name="bindery", state="reserved")
        assert [item.id for item in items] == ["r1", "r2"]
        assert server.seen[1].query["cursor"] == "c1"
        assert server.seen[0].query["schedulerName"] == "bindery"
        server.play(page1)
        with pytest.raises(RMProtocolError, match="twice"):
            await client.list_reservations()


async def test_circuit_opens_and_half_opens(server: FaultServer) -> None:
    server.play(respond(lambda: web.Response(status=500)))
    async with make_client(server, max_attempts=1, failure_threshold=2, circuit_cool_down=0.3) as client:
        for _ in range(2):
            with pytest.raises(RMUnavailable, match="HTTP 500"):
                await client.commit("r1")
        with pytest.raises(RMUnavailable, match="circuit open"):
            await client.commit("r1")
        assert len(server.seen) == 2  # the open circuit did not reach the server
        await asyncio.sleep(0.35)
        server.play(respond(lambda: ok(COMMITTED, status=200)))
        await client.commit("r1")  # the half-open probe succeeds and closes the circuit
        assert client.breaker.state == "closed"


def test_breaker_half_open_admits_one_probe() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=1, cool_down=5, clock=lambda: now[0])
    breaker.before_call()
    breaker.record_failure()
    with pytest.raises(RMUnavailable):
        breaker.before_call()
    now[0] = 5.0
    breaker.before_call()  # the probe
    with pytest.raises(RMUnavailable):
        breaker.before_call()  # a second caller while the probe is in flight
    breaker.record_failure()
    assert breaker.state == "open"
    now[0] = 10.0
    breaker.before_call()
    breaker.record_success()
    assert breaker.state == "closed"


async def test_token_file_rotation_is_picked_up(server: FaultServer, tmp_path: pathlib.Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    server.play(respond(lambda: ok(COMMITTED, status=200)))
    async with make_client(server, token=None, token_file=token_file) as client:
        await client.commit("r1")
        token_file.write_text("second-token\n")
        os.utime(token_file, ns=(10**18, 10**18))
        await client.commit("r1")
    assert server.tokens == ["first", "second-token"]


async def test_401_rereads_token_file_once(server: FaultServer, tmp_path: pathlib.Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old")
    stat = token_file.stat()
    server.play(
        respond(lambda: problem(401, ProblemType.UNAUTHORIZED)), respond(lambda: ok(COMMITTED, status=200))
    )
    async with make_client(server, token=None, token_file=token_file) as client:
        assert client._tokens.current() == "old"
        # Rotated within the timestamp granularity: same size, same mtime, same inode.
        token_file.write_text("new")
        os.utime(token_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        await client.commit("r1")
    assert server.tokens == ["old", "new"]


async def test_missing_token_file_is_a_clear_error(server: FaultServer, tmp_path: pathlib.Path) -> None:
    async with make_client(server, token=None, token_file=tmp_path / "absent") as client:
        with pytest.raises(RMError, match="cannot read the RM bearer token"):
            await client.commit("r1")


def test_plain_http_refused_unless_allowed() -> None:
    with pytest.raises(ValueError, match="plain http"):
        ResourceManagerClient(base_url="http://rm.example:8080", token="t")
    with pytest.raises(ValueError, match="absolute https"):
        ResourceManagerClient(base_url="ftp://rm.example", token="t")
    ResourceManagerClient(base_url="https://rm.example", token="t")


async def test_unreachable_server_is_unavailable() -> None:
    async with ResourceManagerClient(
        base_url="http://127.0.0.1:9",
        token="t",
        allow_insecure_http=True,
        max_attempts=2,
        backoff_initial=0.01,
        backoff_max=0.01,
    ) as client:
        with pytest.raises(RMUnavailable, match="check that the RM is running"):
            await client.commit("r1")


async def test_ready_check(server: FaultServer) -> None:
    server.play(
        respond(lambda: web.json_response({"status": "ok"})),
        respond(lambda: web.json_response({"items": [], "nextCursor": None})),
    )
    async with make_client(server) as client:
        await client.check_ready()
        # /readyz is unauthenticated; the list after it proves the RM accepts the token.
        assert [(r.path, t) for r, t in zip(server.seen, server.tokens, strict=True)] == [
            ("/readyz", None),
            ("/v1/reservations", "secret"),
        ]
        server.play(respond(lambda: web.Response(status=503, headers={"Retry-After": "0"})))
        with pytest.raises(RMUnavailable):
            await client.check_ready()


def trickle(*, interval: float = 0.05, limit: int = 400) -> Handler:
    """Headers at once, then one byte every ``interval``: each read makes progress, none times out."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = await start_json_body(request, length=100_000, first=b"")
        try:
            for _ in range(limit):
                await asyncio.sleep(interval)
                await response.write(b" ")
        except (ConnectionError, RuntimeError):
            pass  # the client gave up and closed the connection, as it should
        return response

    return handler


async def test_trickling_server_hits_the_per_attempt_deadline(server: FaultServer) -> None:
    """No single read times out (a byte arrives every 50 ms), yet each attempt ends after 0.7 s."""
    server.play(trickle())
    async with make_client(
        server, connect_timeout=0.2, read_timeout=0.5, max_attempts=2, call_deadline=30
    ) as client:
        with pytest.raises(RMUnavailable, match=r"did not complete within 0\.7s"):
            await client.reserve(REQUEST)
    assert len(server.seen) == 2


async def test_trickling_server_hits_the_overall_call_deadline(server: FaultServer) -> None:
    """Three attempts are allowed, but the call's deadline leaves room for only the first one."""
    server.play(trickle())
    async with make_client(
        server, connect_timeout=0.5, read_timeout=0.5, max_attempts=3, call_deadline=0.6
    ) as client:
        with pytest.raises(RMUnavailable, match=r"overall deadline of 0\.6s ran out") as caught:
            await client.reserve(REQUEST)
    assert "gave up after 1 of 3 attempts" in caught.value.message
    assert len(server.seen) == 1


async def test_read_timeout_mid_body_is_retried(server: FaultServer) -> None:
    async def stall_mid_body(request: web.Request) -> web.StreamResponse:
        response = await start_json_body(request, length=500, first=b'{"id": "r1", "no')
        await asyncio.sleep(1)
        return response

    server.play(stall_mid_body, respond(ok))
    async with make_client(server, read_timeout=0.2) as client:
        reservation = await client.reserve(REQUEST)
        assert reservation.id == "r1"
        assert len(server.seen) == 2
        server.play(stall_mid_body)
        with pytest.raises(RMUnavailable, match="ReadTimeout"):
            await client.reserve(REQUEST)


async def test_open_circuit_says_when_calls_resume(server: FaultServer) -> None:
    server.play(respond(lambda: web.Response(status=500)))
    async with make_client(server, max_attempts=1, failure_threshold=1, circuit_cool_down=30) as client:
        with pytest.raises(RMUnavailable, match="HTTP 500"):
            await client.commit("r1")
        with pytest.raises(RMUnavailable) as caught:
            await client.commit("r1")
    assert re.search(
        r"next call is let through in (29\.\d|30\.0)s \(at \d\d:\d\d:\d\d UTC\)", caught.value.message
    )
    assert caught.value.retry_after is not None
    assert 29 < caught.value.retry_after <= 30


def test_breaker_messages_name_the_resume_time() -> None:
    now = [100.0]
    breaker = CircuitBreaker(
        failure_threshold=1, cool_down=5, probe_timeout=2, clock=lambda: now[0], wall_clock=lambda: 3600.0
    )
    breaker.record_failure()
    now[0] = 101.0
    with pytest.raises(RMUnavailable, match=r"in 4\.0s \(at 01:00:04 UTC\)") as opened:
        breaker.before_call()
    assert opened.value.retry_after == 4.0
    now[0] = 105.0
    assert breaker.before_call() is True  # the probe
    with pytest.raises(RMUnavailable, match=r"one probe call is testing it now.*within 2\.0s") as probing:
        breaker.before_call()
    assert probing.value.retry_after == 2.0


def test_breaker_abandoned_probe_admits_the_next_one() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=1, cool_down=5, clock=lambda: now[0])
    breaker.record_failure()
    now[0] = 5.0
    assert breaker.before_call() is True
    breaker.abandon_probe()
    assert breaker.before_call() is True  # a new probe, not "circuit half-open" forever


async def test_cancelled_probe_does_not_wedge_the_circuit(server: FaultServer) -> None:
    """A pod's cycle cancelled during the half-open probe must not leave every later call refused."""
    server.play(respond(lambda: web.Response(status=500)))

    async def slow(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(1)
        return ok(COMMITTED, status=200)

    async with make_client(
        server, max_attempts=1, failure_threshold=1, circuit_cool_down=0.1, read_timeout=5
    ) as client:
        with pytest.raises(RMUnavailable, match="HTTP 500"):
            await client.commit("r1")
        await asyncio.sleep(0.15)
        server.play(slow)
        probe = asyncio.create_task(client.commit("r1"))
        async with asyncio.timeout(10):
            while not server.seen:
                await asyncio.sleep(0.01)
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        server.play(respond(lambda: ok(COMMITTED, status=200)))
        reservation = await client.commit("r1")
    assert reservation.state is ReservationState.COMMITTED
    assert client.breaker.state == "closed"


# -- contract v1.1: the pod UID on commit and release, and renew ---------------------------------


async def test_release_sends_the_pod_uid_as_a_query_parameter(server: FaultServer) -> None:
    server.play(respond(lambda: web.Response(status=204)))
    async with make_client(server) as client:
        await client.release("r1", pod_uid="u1")
        await client.release("r1")  # without a UID: exactly the v1.0 request
    sent = [(r.method, r.path, dict(r.query)) for r in server.seen]
    assert sent == [
        ("DELETE", "/v1/reservations/r1", {"podUid": "u1"}),
        ("DELETE", "/v1/reservations/r1", {}),
    ]


async def test_commit_query_carries_the_uid(server: FaultServer) -> None:
    server.play(respond(lambda: ok(COMMITTED, status=200)))
    async with make_client(server) as client:
        await client.commit("r1", pod_uid="u1")
        await client.commit("r1")
    sent = [(r.path, dict(r.query)) for r in server.seen]
    assert sent == [("/v1/reservations/r1/commit", {"podUid": "u1"}), ("/v1/reservations/r1/commit", {})]


@pytest.mark.parametrize("operation", ["commit", "release", "renew"])
async def test_pod_mismatch_is_its_own_error_and_not_retried(server: FaultServer, operation: str) -> None:
    server.play(
        respond(
            lambda: problem(409, ProblemType.POD_MISMATCH, detail="reservation r1 belongs to pod u1, not u2")
        )
    )
    async with make_client(server) as client:
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "commit": lambda: client.commit("r1", pod_uid="u2"),
            "release": lambda: client.release("r1", pod_uid="u2"),
            "renew": lambda: client.renew("r1", pod_uid="u2", ttl_seconds=30),
        }
        with pytest.raises(RMPodMismatch, match="belongs to pod u1") as refused:
            await calls[operation]()
    assert isinstance(refused.value, RMError)
    assert len(server.seen) == 1


async def test_commit_answered_for_another_pod_is_a_mismatch(server: FaultServer) -> None:
    """A v1.0 RM ignores podUid: the client still notices that the reservation is someone else's."""
    server.play(respond(lambda: ok({**COMMITTED, "podUid": "victim"}, status=200)))
    async with make_client(server) as client:
        with pytest.raises(RMPodMismatch, match="victim"):
            await client.commit("r1", pod_uid="u1")


async def test_renew_sends_uid_and_ttl_and_is_retried(server: FaultServer) -> None:
    server.play(
        respond(lambda: web.Response(status=503, headers={"Retry-After": "0"})),
        respond(lambda: ok(RESERVATION, status=200)),
    )
    async with make_client(server) as client:
        reservation = await client.renew("r1", pod_uid="u1", ttl_seconds=45)
    assert reservation.state is ReservationState.RESERVED
    assert [(r.method, r.path) for r in server.seen] == [("POST", "/v1/reservations/r1/renew")] * 2


async def test_renew_body(server: FaultServer) -> None:
    bodies: list[Any] = []

    async def capture(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        return ok(COMMITTED, status=200)

    server.play(capture)
    async with make_client(server) as client:
        reservation = await client.renew("r1", pod_uid="u1", ttl_seconds=45)
    assert reservation.state is ReservationState.COMMITTED
    assert bodies == [{"podUid": "u1", "ttlSeconds": 45}]


async def test_renew_on_a_v1_0_server_is_unsupported_and_remembered(server: FaultServer) -> None:
    """404 for the path, yet the reservation exists: the server has no renew (contract 1.0)."""

    async def v1_0(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/renew"):
            return problem(404, ProblemType.NOT_FOUND, detail=f"there is no {request.path} in contract v1")
        return ok(RESERVATION, status=200)

    server.play(v1_0)
    async with make_client(server) as client:
        with pytest.raises(RMUnsupported, match="renew"):
            await client.renew("r1", pod_uid="u1", ttl_seconds=30)
        assert [(r.method, r.path) for r in server.seen] == [
            ("POST", "/v1/reservations/r1/renew"),
            ("GET", "/v1/reservations/r1"),
        ]
        with pytest.raises(RMUnsupported):
            await client.renew("r2", pod_uid="u1", ttl_seconds=30)
    assert len(server.seen) == 2  # remembered: no second round trip


async def test_renew_405_is_unsupported(server: FaultServer) -> None:
    server.play(respond(lambda: problem(405, ProblemType.METHOD_NOT_ALLOWED)))
    async with make_client(server) as client:
        with pytest.raises(RMUnsupported):
            await client.renew("r1", pod_uid="u1", ttl_seconds=30)


async def test_renew_of_an_unknown_reservation_is_not_unsupported(server: FaultServer) -> None:
    server.play(respond(lambda: problem(404, ProblemType.NOT_FOUND, detail="no reservation 'r9'")))
    async with make_client(server) as client:
        with pytest.raises(RMRejected) as rejected:
            await client.renew("r9", pod_uid="u1", ttl_seconds=30)
        assert not isinstance(rejected.value, RMUnsupported)
        assert rejected.value.status == 404
        with pytest.raises(RMRejected):  # and nothing was remembered: the next renew asks again
            await client.renew("r9", pod_uid="u1", ttl_seconds=30)
    assert len(server.seen) == 4


async def test_renew_of_an_inactive_reservation_is_a_conflict(server: FaultServer) -> None:
    server.play(respond(lambda: problem(409, ProblemType.RESERVATION_NOT_ACTIVE, detail="r1 is released")))
    async with make_client(server) as client:
        with pytest.raises(RMConflict, match="released") as conflict:
            await client.renew("r1", pod_uid="u1", ttl_seconds=30)
    assert not isinstance(conflict.value, RMPodMismatch)


async def test_renew_answered_for_another_pod_is_a_protocol_error(server: FaultServer) -> None:
    server.play(respond(lambda: ok({**RESERVATION, "podUid": "other"}, status=200)))
    async with make_client(server) as client:
        with pytest.raises(RMProtocolError, match="other"):
            await client.renew("r1", pod_uid="u1", ttl_seconds=30)
