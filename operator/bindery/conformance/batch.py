"""Conformance checks for batches (contract v1.1 ``POST /v1/batch``): many operations, one request.

What they prove on the wire: one result per operation, in order, each what its single call answers
(the same scenario is run both ways and compared); reserve, commit and release mixed in one batch;
a replayed batch answers the same reservations and holds nothing twice; a malformed operation fails
alone; two reserves of one batch never share capacity, nor do concurrent batches; the envelope's
limits (1 to 500 operations) hold.

An RM certified at ``--contract-version 1.0`` has no batches: the kit then only checks that the
path answers 404 or 405 and reserves nothing (``batch-path``), which is how Bindery's client knows
to send single calls.  A 404 or 405 at 1.1 fails every batch check with that advice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx

from bindery.conformance.harness import (
    ConformanceFailure,
    Harness,
    expect_problem,
    expect_reservation,
    expect_status,
    is_json,
    require,
)
from bindery.rm.errors import ProblemType

__all__ = [
    "check_batch_concurrent_no_overcommit",
    "check_batch_invalid_operation",
    "check_batch_limits",
    "check_batch_matches_singles",
    "check_batch_mixed",
    "check_batch_path",
    "check_batch_replay",
    "expect_results",
]

ACTIVE = ("reserved", "committed")
MAX_OPERATIONS = 500  # contract v1.1; the kit states it rather than trusting the models it tests


def _no_batch(response: httpx.Response, what: str) -> None:
    if response.status_code in (404, 405):
        raise ConformanceFailure(
            f"{what}: HTTP {response.status_code} on POST /v1/batch: the RM has no batches (contract v1.1); "
            "if it implements only v1.0, certify it with --contract-version 1.0"
        )


def _reserve(body: dict[str, Any]) -> dict[str, Any]:
    return {"reserve": body}


def _ref(kind: str, reservation_id: str, pod_uid: str | None = None) -> dict[str, Any]:
    target: dict[str, Any] = {"reservationId": reservation_id}
    if pod_uid is not None:
        target["podUid"] = pod_uid
    return {kind: target}


def expect_results(response: httpx.Response, operations: Sequence[Any], what: str) -> list[dict[str, Any]]:
    """The answer is a batch result: one result per operation, in order.  Each has a status; a
    reservation answers the operation it belongs to (a reserve's pod, a commit's id), a problem is
    RFC 9457 with the result's status."""
    _no_batch(response, what)
    expect_status(response, 200, what)
    if not is_json(response):
        raise ConformanceFailure(
            f"{what}: expected application/json, got {response.headers.get('content-type')}"
        )
    answer = response.json()
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != len(operations):
        count = len(results) if isinstance(results, list) else "no"
        raise ConformanceFailure(
            f"{what}: expected one result per operation ({len(operations)}), got {count} results: "
            f"{str(answer)[:300]}"
        )
    for index, (operation, result) in enumerate(zip(operations, results, strict=True)):
        where = f"{what}: result {index}"
        require(
            isinstance(result, dict) and isinstance(result.get("status"), int),
            f"{where} has no status: {result}",
        )
        status = result["status"]
        if status >= 400:
            problem = result.get("problem")
            require(
                isinstance(problem, dict)
                and isinstance(problem.get("type"), str)
                and problem.get("status") == status
                and isinstance(problem.get("title"), str),
                f"{where} is HTTP {status} without a problem of that status, type and title: {result}",
            )
            continue
        reservation = result.get("reservation")
        if status == 204 or reservation is None:
            continue
        require(isinstance(reservation, dict), f"{where}: the reservation is not an object: {result}")
        for key in ("id", "node", "state", "podUid", "schedulerName"):
            require(
                isinstance(reservation.get(key), str) and bool(reservation[key]),
                f"{where}: the reservation lacks a string {key!r}: {reservation}",
            )
        if isinstance(operation, dict) and isinstance(operation.get("reserve"), dict):
            asked = operation["reserve"]["pod"]["uid"]
            require(
                reservation["podUid"] == asked,
                f"{where} answers a reservation of pod {reservation['podUid']}, but operation {index} "
                f"reserved for pod {asked}: results must be in the order of the operations",
            )
        if isinstance(operation, dict) and isinstance(operation.get("commit"), dict):
            asked = operation["commit"]["reservationId"]
            require(
                reservation["id"] == asked,
                f"{where} answers reservation {reservation['id']}, but operation {index} committed "
                f"{asked}: results must be in the order of the operations",
            )
    return results


def _statuses(results: Sequence[dict[str, Any]]) -> list[int]:
    return [int(result["status"]) for result in results]


def _kind(result: dict[str, Any]) -> str | None:
    problem = result.get("problem")
    return str(problem.get("type")) if isinstance(problem, dict) else None


async def _mine(h: Harness) -> list[dict[str, Any]]:
    """This run's active reservations."""
    items = await h.list_all(schedulerName=h.scheduler_name)
    return [item for item in items if item.get("state") in ACTIVE]


async def check_batch_path(h: Harness) -> None:
    """POST /v1/batch carries operations (v1.1); an RM certified at 1.0 may answer 404 or 405."""
    operations = [_reserve(h.request_body())]
    response = await h.batch(operations)
    if response.status_code in (404, 405) and h.contract_version == "1.0":
        require(
            not await _mine(h), f"a v1.0 RM answered {response.status_code} to a batch yet reserved something"
        )
        return
    (result,) = expect_results(response, operations, "a batch of one reserve")
    require(result["status"] == 201, f"a batch of one reserve answered {result}, expected status 201")
    expect_status(await h.release(result["reservation"]["id"]), 204, "release the batched reservation")


async def _scenario(h: Harness, send: Any) -> list[dict[str, Any]]:
    """Every kind of answer of reserve, commit and release, sent by ``send`` (as one batch or as
    single calls); returns the answers as batch results."""
    first = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    second = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    fresh = h.request_body()
    reused = dict(fresh, resources={h.config.resource: "2"})
    unknown = f"no-such-reservation-{h.run_id}"
    operations = [
        _ref("commit", first["id"], first["podUid"]),
        _ref("commit", first["id"]),  # committed again: 200
        _ref("commit", second["id"], f"{h.run_id}-another-pod"),  # 409 pod-mismatch
        _ref("release", second["id"], second["podUid"]),  # 204
        _ref("commit", second["id"]),  # released: 409 reservation-not-active
        _reserve(fresh),  # 201
        _reserve(fresh),  # a replay: 200, the same reservation
        _reserve(reused),  # the same key, another request: 409 idempotency-key-reused
        _reserve(h.request_body(amount=str(h.config.capacity + 1))),  # 409 unschedulable
        _ref("release", unknown),  # 204
        _ref("commit", unknown),  # 404
    ]
    results: list[dict[str, Any]] = await send(operations)
    return results


async def check_batch_matches_singles(h: Harness) -> None:
    """One result per operation, in order, each what its single call answers: the same scenario sent
    as one batch and as single calls gets the same statuses and problem types."""

    async def batched(operations: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return expect_results(await h.batch(operations), operations, "a batch of every kind of answer")

    async def singles(operations: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results = []
        for operation in operations:
            if "reserve" in operation:
                response = await h.reserve(operation["reserve"])
            else:
                kind = "commit" if "commit" in operation else "release"
                target = operation[kind]
                call = h.commit if kind == "commit" else h.release
                response = await call(target["reservationId"], pod_uid=target.get("podUid"))
            result: dict[str, Any] = {"status": response.status_code}
            if response.status_code >= 400:
                result["problem"] = response.json()
            elif response.status_code != 204:
                result["reservation"] = response.json()
            results.append(result)
        return results

    got = await _scenario(h, batched)
    expected = [200, 200, 409, 204, 409, 201, 200, 409, 409, 204, 404]
    require(_statuses(got) == expected, f"the batch answered statuses {_statuses(got)}, expected {expected}")
    kinds = [_kind(result) for result in got]
    require(
        [kinds[2], kinds[4], kinds[7], kinds[8], kinds[10]]
        == [
            ProblemType.POD_MISMATCH,
            ProblemType.RESERVATION_NOT_ACTIVE,
            ProblemType.IDEMPOTENCY_KEY_REUSED,
            ProblemType.UNSCHEDULABLE,
            ProblemType.NOT_FOUND,
        ],
        f"the batch's problem types are {kinds}",
    )
    require(
        got[6]["reservation"]["id"] == got[5]["reservation"]["id"],
        "a reserve replayed later in the same batch must answer the reservation the earlier one made",
    )
    require(got[0]["reservation"]["state"] == "committed", f"a batched commit left {got[0]['reservation']}")
    require(bool(got[8]["problem"].get("reason")), "a batched unschedulable needs a reason")
    for item in await _mine(h):  # the scenario again from an empty pool
        expect_status(await h.release(item["id"]), 204, "release")
    single = await _scenario(h, singles)
    require(
        _statuses(single) == _statuses(got) and [_kind(r) for r in single] == kinds,
        f"single calls answered {list(zip(_statuses(single), [_kind(r) for r in single], strict=True))}, "
        f"the batch {list(zip(_statuses(got), kinds, strict=True))}",
    )


async def check_batch_mixed(h: Harness) -> None:
    """Reserve, commit and release mixed in one batch, each seeing the ones before it (a reserve
    takes the slot a release before it freed); the states afterwards are what the operations did."""
    committed = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    released = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    fill = [
        expect_reservation(await h.reserve(h.request_body()), 201, "fill the pool")
        for _ in range(h.config.capacity - 2)
    ]
    body = h.request_body()
    operations = [
        _ref("release", released["id"], released["podUid"]),
        _reserve(body),  # the pool was full: only the slot the release freed fits it
        _ref("commit", committed["id"], committed["podUid"]),
        _reserve(body),  # a replay: the same reservation
    ]
    results = expect_results(await h.batch(operations), operations, "a mixed batch")
    require(
        _statuses(results) == [204, 201, 200, 200],
        f"a mixed batch (release, reserve the freed slot, commit, replay) answered {_statuses(results)}, "
        "expected [204, 201, 200, 200]",
    )
    made = results[1]["reservation"]
    require(
        results[3]["reservation"]["id"] == made["id"],
        "a reserve replayed in the same batch answered another reservation",
    )
    states = {}
    for name, reservation_id in (
        ("committed", committed["id"]),
        ("released", released["id"]),
        ("made", made["id"]),
    ):
        answer = await h.get(reservation_id)
        states[name] = (
            answer.json().get("state") if answer.status_code == 200 else f"HTTP {answer.status_code}"
        )
    require(
        states["committed"] == "committed"
        and states["made"] == "reserved"
        and states["released"] in ("released", "HTTP 404"),
        f"after the mixed batch the reservations are {states}",
    )
    held = sorted(item["id"] for item in await _mine(h))
    expected = sorted([committed["id"], made["id"], *(item["id"] for item in fill)])
    require(
        held == expected,
        f"after the mixed batch {len(held)} reservations are active, expected {len(expected)}",
    )


async def check_batch_replay(h: Harness) -> None:
    """Replaying a whole batch (after a lost answer) answers the same reservations (200) and holds
    nothing twice: the pool is exactly as full as after the first."""
    capacity = h.config.capacity
    prepared = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    operations = [_reserve(h.request_body()) for _ in range(capacity - 1)]
    operations.append(_ref("commit", prepared["id"], prepared["podUid"]))
    first = expect_results(await h.batch(operations), operations, "a batch")
    require(
        _statuses(first) == [201] * (capacity - 1) + [200],
        f"a batch filling the pool answered {_statuses(first)}",
    )
    again = expect_results(await h.batch(operations), operations, "the same batch replayed")
    require(
        _statuses(again) == [200] * capacity,
        f"the replayed batch answered {_statuses(again)}, expected 200 for every operation",
    )
    ids = [result["reservation"]["id"] for result in first]
    require(
        [result["reservation"]["id"] for result in again] == ids,
        "the replayed batch answered other reservations than the first",
    )
    held = await _mine(h)
    require(
        len(held) == capacity,
        f"after a replayed batch {len(held)} reservations are active, expected {capacity}",
    )

    expect_problem(
        await h.reserve(h.request_body()),
        409,
        ProblemType.UNSCHEDULABLE,
        "reserve after the replayed batch (the pool must be exactly full)",
    )


async def check_batch_invalid_operation(h: Harness) -> None:
    """A malformed operation gets its own 400 invalid-request and reserves nothing; the others are
    carried out."""
    valid_first, valid_last = h.request_body(), h.request_body()
    bad_ttl = {**h.request_body(), "ttlSeconds": 0}
    unknown_field = {**h.request_body(), "colour": "red"}
    operations: list[Any] = [
        _reserve(valid_first),
        _reserve(bad_ttl),
        {**_ref("commit", "x"), **_ref("release", "x")},  # two operations in one
        {},  # none
        _reserve(unknown_field),
        _reserve(valid_last),
    ]
    results = expect_results(await h.batch(operations), operations, "a batch with malformed operations")
    require(
        _statuses(results) == [201, 400, 400, 400, 400, 201],
        f"a batch with 4 malformed operations between 2 valid reserves answered {_statuses(results)}, "
        "expected [201, 400, 400, 400, 400, 201]",
    )
    for index in range(1, 5):
        require(
            _kind(results[index]) == ProblemType.INVALID_REQUEST,
            f"malformed operation {index} answered problem type {_kind(results[index])}",
        )
    held = sorted(item["podUid"] for item in await _mine(h))
    expected = sorted([valid_first["pod"]["uid"], valid_last["pod"]["uid"]])
    require(
        held == expected, f"after the batch the active reservations are for pods {held}, expected {expected}"
    )


async def check_batch_concurrent_no_overcommit(h: Harness) -> None:
    """Two reserves of one batch that fit only one at a time: the first reserved, the second
    unschedulable; a batch and concurrent batches never hold more than the pool."""
    capacity = h.config.capacity
    fill = [
        expect_reservation(await h.reserve(h.request_body()), 201, "fill the pool")
        for _ in range(capacity - 1)
    ]
    operations = [_reserve(h.request_body()), _reserve(h.request_body())]
    results = expect_results(await h.batch(operations), operations, "two reserves for the last slot")
    require(
        _statuses(results) == [201, 409] and _kind(results[1]) == ProblemType.UNSCHEDULABLE,
        f"two reserves in one batch for the one free slot answered {_statuses(results)} "
        f"({[_kind(r) for r in results]}); expected 201 then 409 unschedulable: they must not share it",
    )
    for item in fill:
        expect_status(await h.release(item["id"]), 204, "release")
    expect_status(await h.release(results[0]["reservation"]["id"]), 204, "release")
    many = [_reserve(h.request_body()) for _ in range(2 * capacity)]
    results = expect_results(await h.batch(many), many, f"{2 * capacity} reserves in one batch")
    won = _statuses(results).count(201)
    require(
        won == capacity, f"{won} of {2 * capacity} one-slot reserves in one batch won a pool of {capacity}"
    )
    for result in results:
        if result["status"] == 201:
            expect_status(await h.release(result["reservation"]["id"]), 204, "release")
    batches = [[_reserve(h.request_body()) for _ in range(capacity)] for _ in range(3)]
    answers = await asyncio.gather(*(h.batch(operations) for operations in batches))
    won = sum(
        _statuses(expect_results(answer, operations, "concurrent batches")).count(201)
        for answer, operations in zip(answers, batches, strict=True)
    )
    require(won == capacity, f"concurrent batches won {won} one-slot reserves in a pool of {capacity}")
    held = await _mine(h)
    require(len(held) == capacity, f"{len(held)} one-slot reservations are active in a pool of {capacity}")


async def check_batch_limits(h: Harness) -> None:
    """The envelope: 1 to 500 operations (more, none, no list, not JSON: 400 for the whole batch,
    and nothing done); 500 operations are carried out."""
    reserve = _reserve(h.request_body())
    releases = [_ref("release", f"no-such-reservation-{h.run_id}-{i}") for i in range(MAX_OPERATIONS)]
    too_many = await h.batch([reserve, *releases])
    _no_batch(too_many, "a batch of 501 operations")

    expect_problem(too_many, 400, ProblemType.INVALID_REQUEST, "a batch of 501 operations")
    require(not await _mine(h), "a batch refused for its 501 operations reserved something")
    expect_problem(await h.batch([]), 400, ProblemType.INVALID_REQUEST, "a batch of no operations")
    for what, content in (
        ("a body that is not JSON", b'{"operations": ['),
        ("a body without operations", b"{}"),
        ("operations that are not a list", b'{"operations": {"release": {}}}'),
    ):
        response = await h.http.post(
            "/v1/batch", content=content, headers={**h.auth, "Content-Type": "application/json"}
        )
        expect_problem(response, 400, ProblemType.INVALID_REQUEST, f"a batch with {what}")
    results = expect_results(await h.batch(releases), releases, "a batch of 500 releases")
    require(_statuses(results) == [204] * MAX_OPERATIONS, "500 releases of unknown ids must each answer 204")
