"""The RM client coalescing concurrent reserve/commit/release calls into ``POST /v1/batch``.

Against a small RM on loopback that answers both the single calls and ``/v1/batch`` per the contract
(v1.1), or 404 on ``/v1/batch`` (v1.0). Each test checks what went over the wire and that every
caller got exactly the value or error its single call gives.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from bindery import tracing
from bindery.rm import RMConflict, RMProtocolError, RMRejected, RMUnavailable, RMUnschedulable
from bindery.rm.batching import reserve_urgency
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import ProblemType, RMPodMismatch
from bindery.rm.models import PodIdentity, Reservation, ReservationRequest, ReservationState


def request_for(uid: str) -> ReservationRequest:
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="ns", name=f"p-{uid}", scheduler_name="bindery"),
        resources={"cpu": "1"},
        idempotency_key=uid,
        ttl_seconds=30,
    )


def problem(status: int, kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "title": kind.rsplit(":", 1)[-1], "status": status, **extra}


@dataclass
class TinyRM:
    """Answers reserve (201; ``full`` pods are unschedulable), commit (200; 409 pod-mismatch when
    the podUid is not the reservation's) and release (204), alone or batched; records the wire."""

    batch: bool = True
    full: set[str] = field(default_factory=set)
    batch_gate: asyncio.Event | None = None  # batches wait for it
    batch_status: list[int] = field(default_factory=list)  # envelope statuses to answer first
    batch_delays: list[float] = field(default_factory=list)  # seconds to hold each batch, in turn
    operation_status: dict[str, int] = field(default_factory=dict)  # uid -> status, answered once
    drop_result: bool = False  # answer one result too few
    wire: list[tuple[str, int]] = field(default_factory=list)  # (path, operations) per request
    traceparents: list[str | None] = field(default_factory=list)  # of each batch
    owners: dict[str, str] = field(default_factory=dict)
    single_delay: float = 0.0  # seconds each single call takes
    singles_now: int = 0  # single calls being answered now
    singles_most: int = 0  # the most ever answered at once
    url: str = ""

    def reserve(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        uid = body["pod"]["uid"]
        if uid in self.operation_status:
            status = self.operation_status.pop(uid)
            return status, problem(status, ProblemType.INTERNAL)
        if uid in self.full:
            return 409, problem(
                409, ProblemType.UNSCHEDULABLE, reason="0/3 nodes fit: cpu", retryAfterSeconds=7
            )
        self.owners[f"rsv-{uid}"] = uid
        return 201, self._reservation(f"rsv-{uid}", "reserved")

    def commit(self, reservation_id: str, pod_uid: str | None) -> tuple[int, dict[str, Any] | None]:
        owner = self.owners.get(reservation_id)
        if owner is None:
            return 404, problem(404, ProblemType.NOT_FOUND)
        if pod_uid is not None and pod_uid != owner:
            return 409, problem(409, ProblemType.POD_MISMATCH, detail=f"{reservation_id} is {owner}'s")
        return 200, self._reservation(reservation_id, "committed")

    def release(self, reservation_id: str, pod_uid: str | None) -> tuple[int, dict[str, Any] | None]:
        self.owners.pop(reservation_id, None)
        return 204, None

    def _reservation(self, reservation_id: str, state: str) -> dict[str, Any]:
        return {
            "id": reservation_id,
            "node": "n1",
            "state": state,
            "podUid": self.owners[reservation_id],
            "schedulerName": "bindery",
        }

    async def single(self, request: web.Request) -> web.StreamResponse:
        self.wire.append((request.path, 1))
        self.singles_now += 1
        self.singles_most = max(self.singles_most, self.singles_now)
        try:
            if self.single_delay:
                await asyncio.sleep(self.single_delay)
            return await self._single(request)
        finally:
            self.singles_now -= 1

    async def _single(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == "/v1/reservations":
            status, body = self.reserve(await request.json())
        elif request.method == "POST" and request.path.endswith("/commit"):
            status, body = self.commit(request.match_info["id"], request.query.get("podUid"))
        else:
            status, body = self.release(request.match_info["id"], request.query.get("podUid"))
        return answer(status, body)

    async def batched(self, request: web.Request) -> web.StreamResponse:
        operations = (await request.json())["operations"]
        self.wire.append((request.path, len(operations)))
        self.traceparents.append(request.headers.get("traceparent"))
        if not self.batch:
            return answer(404, problem(404, ProblemType.NOT_FOUND))
        if self.batch_gate is not None:
            await self.batch_gate.wait()
        if self.batch_delays:
            await asyncio.sleep(self.batch_delays.pop(0))
        if self.batch_status:
            status = self.batch_status.pop(0)
            return answer(status, problem(status, ProblemType.UNAVAILABLE))
        results = []
        for operation in operations:
            if "reserve" in operation:
                status, body = self.reserve(operation["reserve"])
            elif "commit" in operation:
                ref = operation["commit"]
                status, body = self.commit(ref["reservationId"], ref.get("podUid"))
            else:
                ref = operation["release"]
                status, body = self.release(ref["reservationId"], ref.get("podUid"))
            result: dict[str, Any] = {"status": status}
            if body is not None:
                result["reservation" if status < 300 else "problem"] = body
            results.append(result)
        if self.drop_result:
            results.pop()
        return web.json_response({"results": results})


def answer(status: int, body: dict[str, Any] | None) -> web.Response:
    if body is None:
        return web.Response(status=status)
    kind = "application/json" if status < 300 else "application/problem+json"
    return web.Response(status=status, text=json.dumps(body), content_type=kind)


@pytest.fixture
async def rm() -> AsyncIterator[TinyRM]:
    tiny = TinyRM()
    app = web.Application()
    app.router.add_post("/v1/batch", tiny.batched)
    app.router.add_post("/v1/reservations", tiny.single)
    app.router.add_post("/v1/reservations/{id}/commit", tiny.single)
    app.router.add_delete("/v1/reservations/{id}", tiny.single)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    tiny.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield tiny
    await runner.cleanup()


def make_client(rm: TinyRM, **kwargs: Any) -> ResourceManagerClient:
    options: dict[str, Any] = {
        "base_url": rm.url,
        "token": "secret",
        "allow_insecure_http": True,
        "read_timeout": 2.0,
        "backoff_initial": 0.01,
        "backoff_max": 0.02,
    }
    options.update(kwargs)
    return ResourceManagerClient(**options)


async def test_a_lone_call_goes_as_its_single_call(rm: TinyRM) -> None:
    async with make_client(rm) as client:
        reservation = await client.reserve(request_for("a"))
        await client.commit(reservation.id, pod_uid="a")
        await client.release(reservation.id, pod_uid="a")
    assert rm.wire == [
        ("/v1/reservations", 1),
        ("/v1/reservations/rsv-a/commit", 1),
        ("/v1/reservations/rsv-a", 1),
    ]


async def test_concurrent_calls_go_as_one_batch_and_each_gets_its_own_answer(rm: TinyRM) -> None:
    uids = [f"u{n}" for n in range(10)]
    async with make_client(rm) as client:
        reservations = await asyncio.gather(*(client.reserve(request_for(uid)) for uid in uids))
        assert [r.pod_uid for r in reservations] == uids
        assert all(r.state is ReservationState.RESERVED for r in reservations)
        committed = await asyncio.gather(*(client.commit(r.id, pod_uid=r.pod_uid) for r in reservations))
        assert [c.state for c in committed] == [ReservationState.COMMITTED] * 10
        assert (
            await asyncio.gather(*(client.release(r.id, pod_uid=r.pod_uid) for r in reservations))
            == [None] * 10
        )
    assert rm.wire == [("/v1/batch", 10)] * 3


async def test_batched_errors_are_the_single_calls_errors(rm: TinyRM) -> None:
    rm.full = {"full"}
    async with make_client(rm) as client:
        first = await client.reserve(request_for("a"))
        outcomes = await asyncio.gather(
            client.reserve(request_for("b")),
            client.reserve(request_for("full")),
            client.commit(first.id, pod_uid="intruder"),
            client.commit("rsv-unknown", pod_uid="x"),
            client.release("rsv-unknown"),
            return_exceptions=True,
        )
        # The same mistakes made alone, for comparison:
        alone = [
            await asyncio.gather(client.reserve(request_for("full")), return_exceptions=True),
            await asyncio.gather(client.commit(first.id, pod_uid="intruder"), return_exceptions=True),
        ]
    # Reserves go first, in a request of their own (bindery.rm.batching: urgent calls).
    assert rm.wire[1:3] == [("/v1/batch", 2), ("/v1/batch", 3)]
    reserved, unschedulable, mismatch, unknown, released = outcomes
    assert not isinstance(reserved, BaseException)
    assert reserved.pod_uid == "b"
    assert isinstance(unschedulable, RMUnschedulable)
    assert (unschedulable.reason, unschedulable.retry_after) == ("0/3 nodes fit: cpu", 7)
    assert isinstance(mismatch, RMPodMismatch)
    assert mismatch.status == 409
    assert isinstance(unknown, RMRejected)
    assert not isinstance(unknown, RMConflict)
    assert unknown.status == 404
    assert released is None
    for batched, (single,) in zip((unschedulable, mismatch), alone, strict=True):
        assert type(batched) is type(single)
        assert str(batched) == str(single)


async def test_calls_made_while_batches_are_in_flight_wait_and_leave_together(rm: TinyRM) -> None:
    """Reserves may take one slot past batches_in_flight (urgent calls); past that they wait too."""
    rm.batch_gate = asyncio.Event()
    async with make_client(rm, batches_in_flight=1) as client:
        first = asyncio.gather(client.reserve(request_for("a")), client.reserve(request_for("b")))
        while len(rm.wire) < 1:
            await asyncio.sleep(0.01)
        second = asyncio.gather(client.reserve(request_for("c")), client.reserve(request_for("d")))
        while len(rm.wire) < 2:
            await asyncio.sleep(0.01)
        later = asyncio.gather(*(client.reserve(request_for(f"w{n}")) for n in range(5)))
        await asyncio.sleep(0.05)  # give a wrong implementation the chance to send them early
        assert rm.wire == [("/v1/batch", 2), ("/v1/batch", 2)]
        rm.batch_gate.set()
        await first
        await second
        assert [r.pod_uid for r in await later] == [f"w{n}" for n in range(5)]
    assert rm.wire == [("/v1/batch", 2), ("/v1/batch", 2), ("/v1/batch", 5)]


async def test_a_reserve_does_not_wait_behind_a_batch_of_commits(rm: TinyRM) -> None:
    """A pod whose rules depend on another's node waits for that pod's reserve: a reserve queued
    behind a backlog's commits waited for their whole batch before, and then shared its own."""
    async with make_client(rm, batches_in_flight=1) as client:
        reserved = await asyncio.gather(*(client.reserve(request_for(f"p{n}")) for n in range(4)))
        rm.wire.clear()
        rm.batch_gate = asyncio.Event()
        commits = asyncio.gather(*(client.commit(r.id, pod_uid=r.pod_uid) for r in reserved))
        while not rm.wire:
            await asyncio.sleep(0.01)
        more_commits = asyncio.gather(*(client.commit(r.id, pod_uid=r.pod_uid) for r in reserved[:2]))
        reserve = asyncio.ensure_future(
            asyncio.gather(client.reserve(request_for("x")), client.reserve(request_for("y")))
        )
        while len(rm.wire) < 2:
            await asyncio.sleep(0.01)
        assert rm.wire == [("/v1/batch", 4), ("/v1/batch", 2)]  # the reserves, not the commits
        rm.batch_gate.set()
        assert [r.pod_uid for r in await reserve] == ["x", "y"]
        await commits
        await more_commits
    assert rm.wire[2:] == [("/v1/batch", 2)]  # the commits that waited, after a slot freed


async def test_a_reserve_nobody_waits_for_goes_with_the_commits_queued_meanwhile(rm: TinyRM) -> None:
    """A pod without inter-pod rules (reserve_urgency(False)): its reserve leaves with the next
    batch, among the commits, rather than in a request of its own: one request fewer for the RM."""

    async def plain_reserve(uid: str) -> Reservation:
        with reserve_urgency(False):
            return await client.reserve(request_for(uid))

    async with make_client(rm, batches_in_flight=1) as client:
        reserved = await asyncio.gather(*(client.reserve(request_for(f"p{n}")) for n in range(4)))
        rm.wire.clear()
        rm.batch_gate = asyncio.Event()
        commits = asyncio.gather(*(client.commit(r.id, pod_uid=r.pod_uid) for r in reserved))
        while not rm.wire:
            await asyncio.sleep(0.01)
        more_commits = asyncio.gather(*(client.commit(r.id, pod_uid=r.pod_uid) for r in reserved[:2]))
        reserve = asyncio.gather(plain_reserve("x"), plain_reserve("y"))
        while client._coalescer.queued < 4:  # the two commits and the two reserves wait for the slot
            await asyncio.sleep(0.001)
        rm.batch_gate.set()
        assert [r.pod_uid for r in await reserve] == ["x", "y"]
        await commits
        await more_commits
    assert rm.wire == [("/v1/batch", 4), ("/v1/batch", 4)]  # two commits and the two reserves


async def test_at_most_max_batch_operations_per_request_and_a_remainder_of_one_goes_alone(rm: TinyRM) -> None:
    async with make_client(rm, batches_in_flight=1, max_batch_operations=3) as client:
        await asyncio.gather(*(client.reserve(request_for(f"u{n}")) for n in range(7)))
    assert rm.wire == [("/v1/batch", 3), ("/v1/batch", 3), ("/v1/reservations", 1)]


async def test_a_v1_0_rm_gets_single_calls_and_is_remembered(rm: TinyRM) -> None:
    rm.batch = False
    async with make_client(rm) as client:
        first = await asyncio.gather(*(client.reserve(request_for(f"u{n}")) for n in range(3)))
        assert [r.pod_uid for r in first] == ["u0", "u1", "u2"]
        assert rm.wire[0] == ("/v1/batch", 3)
        assert sorted(rm.wire[1:]) == [("/v1/reservations", 1)] * 3
        rm.wire.clear()
        await asyncio.gather(*(client.commit(r.id, pod_uid=r.pod_uid) for r in first))
    assert [path for path, _ in rm.wire] == [f"/v1/reservations/rsv-u{n}/commit" for n in range(3)]


async def test_an_rm_without_batches_gets_a_bounded_number_of_single_calls_at_once(rm: TinyRM) -> None:
    """maxInFlight is 256 by default, sized for batches: a v1.0 RM must not get 256 concurrent
    single calls, which queue behind its writes until they time out and open the breaker."""
    rm.batch = False
    rm.single_delay = 0.02
    async with make_client(rm, single_calls_in_flight=8) as client:
        reserved = await asyncio.gather(*(client.reserve(request_for(f"u{n:02d}")) for n in range(40)))
        assert rm.singles_most == 8
        rm.singles_most = 0
        await asyncio.gather(*(client.commit(r.id, pod_uid=r.pod_uid) for r in reserved))
    assert rm.singles_most == 8
    assert len(rm.owners) == 40


async def test_a_cancelled_caller_does_not_break_the_batch_for_the_others(rm: TinyRM) -> None:
    rm.batch_gate = asyncio.Event()
    async with make_client(rm) as client:
        calls = [asyncio.create_task(client.reserve(request_for(f"u{n}"))) for n in range(3)]
        while not rm.wire:
            await asyncio.sleep(0.01)
        calls[1].cancel()
        rm.batch_gate.set()
        done = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(done[1], asyncio.CancelledError)
        assert [getattr(r, "pod_uid", None) for r in (done[0], done[2])] == ["u0", "u2"]
        # The slot the batch held is free again: the next call leaves at once, alone.
        await client.reserve(request_for("after"))
    assert rm.wire == [("/v1/batch", 3), ("/v1/reservations", 1)]


async def test_a_caller_cancelled_before_the_send_is_left_out(rm: TinyRM) -> None:
    async with make_client(rm) as client:
        calls = [asyncio.create_task(client.reserve(request_for(f"u{n}"))) for n in range(3)]
        await asyncio.sleep(0)  # each call queued; the send is scheduled for the next iteration
        calls[0].cancel()
        done = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert rm.wire == [("/v1/batch", 2)]


async def test_closing_the_client_answers_the_callers_of_a_batch_that_had_not_started(rm: TinyRM) -> None:
    """aclose() cancels the batches in flight; one whose task was created in the same iteration has
    not run a line yet, and its callers must still get an answer rather than wait for ever."""
    client = make_client(rm)
    calls = [asyncio.create_task(client.reserve(request_for(f"u{n}"))) for n in range(2)]
    await asyncio.sleep(0)  # both calls queued, the send scheduled for the next iteration
    await asyncio.sleep(0)  # the send ran: the batch's task exists and has not started
    assert len(client._batches) == 1, "precondition: one batch task created and not yet run"
    await client.aclose()
    done = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=5)
    assert all(isinstance(outcome, RMUnavailable) for outcome in done), done
    assert "was closed" in str(done[0])
    assert rm.wire == []


async def test_a_batch_is_retried_as_any_call_after_a_503(rm: TinyRM) -> None:
    rm.batch_status = [503]
    async with make_client(rm) as client:
        reservations = await asyncio.gather(*(client.reserve(request_for(f"u{n}")) for n in range(4)))
    assert len(reservations) == 4
    assert rm.wire == [("/v1/batch", 4), ("/v1/batch", 4)]


async def test_an_operation_failing_with_5xx_is_retried_alone(rm: TinyRM) -> None:
    rm.operation_status = {"u1": 500}
    async with make_client(rm) as client:
        reservations = await asyncio.gather(*(client.reserve(request_for(f"u{n}")) for n in range(3)))
    assert [r.pod_uid for r in reservations] == ["u0", "u1", "u2"]
    assert rm.wire[0] == ("/v1/batch", 3)
    assert rm.wire[1:] == [("/v1/reservations", 1)]


async def test_a_batch_answer_missing_results_is_a_protocol_error_for_every_caller(rm: TinyRM) -> None:
    rm.drop_result = True
    async with make_client(rm) as client:
        outcomes = await asyncio.gather(
            *(client.reserve(request_for(f"u{n}")) for n in range(3)), return_exceptions=True
        )
    assert all(isinstance(outcome, RMProtocolError) for outcome in outcomes)
    assert "3 operations with 2 results" in str(outcomes[0])


async def test_batching_off_sends_single_calls(rm: TinyRM) -> None:
    async with make_client(rm, batching=False) as client:
        await asyncio.gather(*(client.reserve(request_for(f"u{n}")) for n in range(3)))
    assert rm.wire == [("/v1/reservations", 1)] * 3


async def test_a_queued_calls_deadline_counts_from_when_it_was_queued(rm: TinyRM) -> None:
    """Waiting for a batch slot is part of the call: it must not double the call's deadline."""
    rm.batch_delays = [0.6, 0.6, 0.6]
    async with make_client(rm, batches_in_flight=1, call_deadline=1.0, max_attempts=1) as client:
        first = asyncio.gather(*(client.reserve(request_for(f"a{n}")) for n in range(2)))
        while not rm.wire:
            await asyncio.sleep(0.01)
        # Reserves take one slot past batches_in_flight (urgent calls): these fill it.
        second = asyncio.gather(*(client.reserve(request_for(f"c{n}")) for n in range(2)))
        while len(rm.wire) < 2:
            await asyncio.sleep(0.01)
        late = asyncio.gather(
            *(client.reserve(request_for(f"b{n}")) for n in range(2)), return_exceptions=True
        )
        assert len(await first) == 2
        assert len(await second) == 2
        outcomes = await late  # queued ~0.6 s before their batch left: 0.4 s left of 1.0 s
    assert rm.wire == [("/v1/batch", 2), ("/v1/batch", 2), ("/v1/batch", 2)]
    assert all(isinstance(outcome, RMUnavailable) for outcome in outcomes)
    assert "overall deadline of 1.0s ran out" in str(outcomes[0])


async def test_a_batch_carries_the_first_callers_traceparent(
    rm: TinyRM, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    monkeypatch.setattr(tracing.state, "on", True)
    monkeypatch.setattr(tracing.state, "tracer", TracerProvider().get_tracer("test"))
    trace_ids: list[str] = []

    async def traced_reserve(uid: str) -> None:
        with tracing.span(f"cycle {uid}") as span:
            trace_ids.append(f"{span.get_span_context().trace_id:032x}")
            await client.reserve(request_for(uid))

    async with make_client(rm) as client:
        await asyncio.gather(*(traced_reserve(f"u{n}") for n in range(3)))
    assert rm.wire == [("/v1/batch", 3)]
    traceparent = rm.traceparents[0]
    assert traceparent is not None
    assert traceparent.split("-")[1] == trace_ids[0]  # one request continues one trace: the first's
