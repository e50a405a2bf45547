"""``POST /v1/batch`` on the reference RM as a real server on loopback (contract v1.1)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import pathlib
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import yaml

from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.cli import main as refrm_main
from bindery.reference_rm.cli import serve_command, served_url
from bindery.rm.errors import ProblemType
from bindery.rm.models import MAX_BATCH_OPERATIONS, BatchResult

from .conftest import TOKEN, small_inventory, usage_by_node

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLOT = "bindery.dev/conformance-slot"  # small_inventory has 4: 2 on node-a, 1 on node-b, 1 on node-c


def reserve_body(uid: str, slots: str = "1", **changes: Any) -> dict[str, Any]:
    body = {
        "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "bindery"},
        "resources": {SLOT: slots},
        "placement": {"tolerations": [{"operator": "Exists"}]},
        "idempotencyKey": uid,
        "ttlSeconds": 60,
    }
    body.update(changes)
    return body


async def batch(http: httpx.AsyncClient, operations: list[Any]) -> list[dict[str, Any]]:
    response = await http.post("/v1/batch", json={"operations": operations}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    BatchResult.model_validate_json(response.content)  # the wire shape of the models on main
    results: list[dict[str, Any]] = response.json()["results"]
    assert len(results) == len(operations)
    return results


async def active(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await http.get("/v1/reservations", params={"limit": "500"}, headers=AUTH)
    return [item for item in response.json()["items"] if item["state"] in ("reserved", "committed")]


def answer(response: httpx.Response) -> dict[str, Any]:
    """A single call's answer in the shape of a batch result."""
    if response.status_code == 204:
        return {"status": 204}
    key = "problem" if response.status_code >= 400 else "reservation"
    return {"status": response.status_code, key: response.json()}


def comparable(result: dict[str, Any]) -> tuple[Any, ...]:
    """What must be equal between a single call and its batched twin on another RM (ids differ)."""
    problem = result.get("problem") or {}
    reservation = result.get("reservation") or {}
    return (
        result["status"],
        problem.get("type"),
        problem.get("title"),
        problem.get("reason"),
        reservation.get("node"),
        reservation.get("state"),
        reservation.get("podUid"),
    )


async def test_each_operation_answers_what_its_single_call_answers(tmp_path: pathlib.Path) -> None:
    """One scenario twice, on two fresh RMs: as single calls, and as one batch. Every answer (status,
    problem type and reason, node and state) is the same, in order."""

    def scenario(prepared: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        first, second = prepared
        return [
            ("commit", {"reservationId": first["id"], "podUid": "first"}),
            ("commit", {"reservationId": first["id"]}),  # committed again: 200
            ("commit", {"reservationId": second["id"], "podUid": "someone-else"}),  # pod-mismatch
            ("release", {"reservationId": second["id"], "podUid": "second"}),
            ("commit", {"reservationId": second["id"]}),  # released: reservation-not-active
            ("release", {"reservationId": second["id"]}),  # released again: 204
            ("reserve", reserve_body("c")),
            ("reserve", reserve_body("c")),  # replay: 200, the same reservation
            ("reserve", reserve_body("c", "1000m")),  # quantities by value: a replay too
            ("reserve", reserve_body("c", "2")),  # idempotency-key-reused
            ("reserve", reserve_body("d")),
            ("reserve", reserve_body("e")),  # the pool (4 slots) is full: unschedulable
            ("release", {"reservationId": "no-such-reservation"}),  # 204
            ("commit", {"reservationId": "no-such-reservation"}),  # 404
        ]

    async def prepare(http: httpx.AsyncClient) -> list[dict[str, Any]]:
        made = []
        for uid in ("first", "second", "filler"):
            response = await http.post("/v1/reservations", json=reserve_body(uid), headers=AUTH)
            assert response.status_code == 201
            made.append(response.json())
        return made[:2]

    singles: list[dict[str, Any]] = []
    async with (
        serve_reference_rm(
            db_path=tmp_path / "singles.sqlite", inventory=small_inventory(), token=TOKEN
        ) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        for kind, payload in scenario(await prepare(http)):
            if kind == "reserve":
                response = await http.post("/v1/reservations", json=payload, headers=AUTH)
            else:
                path = f"/v1/reservations/{payload['reservationId']}"
                params = {"podUid": payload["podUid"]} if payload.get("podUid") else {}
                if kind == "commit":
                    response = await http.post(f"{path}/commit", params=params, headers=AUTH)
                else:
                    response = await http.delete(path, params=params, headers=AUTH)
            singles.append(answer(response))
        single_usage = usage_by_node(await active(http))
    async with (
        serve_reference_rm(
            db_path=tmp_path / "batch.sqlite", inventory=small_inventory(), token=TOKEN
        ) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        operations = [{kind: payload} for kind, payload in scenario(await prepare(http))]
        batched = await batch(http, operations)
        batch_usage = usage_by_node(await active(http))
    assert [r["status"] for r in batched] == [
        200,
        200,
        409,
        204,
        409,
        204,
        201,
        200,
        200,
        409,
        201,
        409,
        204,
        404,
    ]
    assert [comparable(r) for r in batched] == [comparable(r) for r in singles]
    assert (
        batched[7]["reservation"]["id"] == batched[6]["reservation"]["id"] == batched[8]["reservation"]["id"]
    )
    assert batched[2]["problem"]["type"] == ProblemType.POD_MISMATCH
    assert batched[4]["problem"]["type"] == ProblemType.RESERVATION_NOT_ACTIVE
    assert batched[9]["problem"]["type"] == ProblemType.IDEMPOTENCY_KEY_REUSED
    assert batched[11]["problem"]["type"] == ProblemType.UNSCHEDULABLE
    assert batched[11]["problem"]["retryAfterSeconds"] > 0
    assert batch_usage == single_usage


async def test_an_invalid_operation_gets_its_own_400_and_the_others_are_carried_out(
    refrm: RunningServer,
) -> None:
    async with httpx.AsyncClient(base_url=refrm.url) as http:
        single = await http.post("/v1/reservations", json=reserve_body("bad", ttlSeconds=0), headers=AUTH)
        results = await batch(
            http,
            [
                {"reserve": reserve_body("a")},
                {"reserve": reserve_body("bad", ttlSeconds=0)},
                {"commit": {"reservationId": "x"}, "release": {"reservationId": "x"}},
                {},
                "not an operation",
                {"commit": {"reservationId": "x", "force": True}},
                {"reserve": reserve_body("b")},
            ],
        )
        held = await active(http)
        only_invalid = await batch(http, [{}, {"reserve": {}}])
    assert [r["status"] for r in only_invalid] == [400, 400]
    assert [r["status"] for r in results] == [201, 400, 400, 400, 400, 400, 201]
    assert single.status_code == 400
    expected = single.json()
    bad = results[1]["problem"]
    assert {k: v for k, v in bad.items() if k not in ("detail", "errors")} == {
        k: v for k, v in expected.items() if k not in ("detail", "errors")
    }
    assert bad["errors"] == [
        {**error, "location": f"operations/1/reserve/{error['location']}"} for error in expected["errors"]
    ]
    assert bad["detail"] == f"operations/1/reserve/{expected['detail']}"
    assert (
        "names exactly one of reserve, commit, release; this one names commit, release"
        in (results[2]["problem"]["detail"])
    )
    assert "this one names none" in results[3]["problem"]["detail"]
    assert results[4]["problem"]["errors"][0]["location"] == "operations/4"
    assert results[5]["problem"]["errors"][0]["location"] == "operations/5/commit/force"
    for result in results[1:6]:
        assert result["problem"]["type"] == ProblemType.INVALID_REQUEST
        assert result["problem"]["status"] == 400
    assert sorted(item["podUid"] for item in held) == ["a", "b"]


Sender = Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]


def post(content: bytes, media: str = "application/json") -> Sender:
    async def send(http: httpx.AsyncClient) -> httpx.Response:
        return await http.post("/v1/batch", content=content, headers={**AUTH, "Content-Type": media})

    return send


def operations(count: int) -> bytes:
    return json.dumps(
        {"operations": [{"release": {"reservationId": f"r{i}"}} for i in range(count)]}
    ).encode()


WHOLE_BATCH_ERRORS: list[tuple[str, Sender, int, str]] = [
    ("not JSON", post(b'{"operations": ['), 400, ProblemType.INVALID_REQUEST),
    ("a JSON array", post(b"[]"), 400, ProblemType.INVALID_REQUEST),
    ("no operations", post(b"{}"), 400, ProblemType.INVALID_REQUEST),
    ("operations not a list", post(b'{"operations": {}}'), 400, ProblemType.INVALID_REQUEST),
    ("zero operations", post(b'{"operations": []}'), 400, ProblemType.INVALID_REQUEST),
    ("501 operations", post(operations(MAX_BATCH_OPERATIONS + 1)), 400, ProblemType.INVALID_REQUEST),
    (
        "an unknown field",
        post(b'{"operations": [{"release": {"reservationId": "x"}}], "atomic": true}'),
        400,
        ProblemType.INVALID_REQUEST,
    ),
    ("text/plain", post(operations(1), "text/plain"), 415, ProblemType.UNSUPPORTED_MEDIA_TYPE),
    (
        "a 5 MiB body",
        post(b'{"operations": [{"release": {"reservationId": "' + b"x" * (5 * 2**20) + b'"}}]}'),
        413,
        ProblemType.PAYLOAD_TOO_LARGE,
    ),
    ("GET", lambda http: http.get("/v1/batch", headers=AUTH), 405, ProblemType.METHOD_NOT_ALLOWED),
    ("no token", lambda http: http.post("/v1/batch", content=operations(1)), 401, ProblemType.UNAUTHORIZED),
]


@pytest.mark.parametrize("case", WHOLE_BATCH_ERRORS, ids=[case[0] for case in WHOLE_BATCH_ERRORS])
async def test_a_wrong_envelope_fails_the_whole_batch(
    refrm: RunningServer, case: tuple[str, Sender, int, str]
) -> None:
    _, send, status, kind = case
    async with httpx.AsyncClient(base_url=refrm.url) as http:
        response = await send(http)
        still = await batch(http, [{"release": {"reservationId": "x"}}])  # the server goes on
    assert still == [{"status": 204}]
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert (response.json()["type"], response.json()["status"]) == (kind, status)


async def test_500_operations_fit_the_body_limit(refrm: RunningServer) -> None:
    """The largest batch of reserves (each with labels) is within the default body limit."""
    labels = {f"label-{i}": "v" * 20 for i in range(10)}
    bodies = [reserve_body(f"p{i}") for i in range(MAX_BATCH_OPERATIONS)]
    for body in bodies:
        body["pod"]["labels"] = labels
    async with httpx.AsyncClient(base_url=refrm.url, timeout=60) as http:
        results = await batch(http, [{"reserve": body} for body in bodies])
        held = await active(http)
    statuses = [r["status"] for r in results]
    assert statuses.count(201) == 4  # the pool's 4 slots, no more
    assert statuses.count(409) == MAX_BATCH_OPERATIONS - 4
    assert len(held) == 4


async def test_concurrent_batches_and_singles_never_overcommit(refrm: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=refrm.url) as http:
        batches = [batch(http, [{"reserve": reserve_body(f"b{n}-{i}")} for i in range(3)]) for n in range(6)]
        singles = [http.post("/v1/reservations", json=reserve_body(f"s{n}"), headers=AUTH) for n in range(6)]
        answers = await asyncio.gather(*batches, *singles)
        held = await active(http)
    statuses = [r["status"] for results in answers[:6] for r in results]
    statuses += [response.status_code for response in answers[6:]]
    assert statuses.count(201) == 4
    assert statuses.count(409) == len(statuses) - 4
    assert len(held) == 4
    assert {node: used[SLOT] for node, used in usage_by_node(held).items()} == {
        "node-a": 2,
        "node-b": 1,
        "node-c": 1,
    }


async def test_an_rm_without_batches_answers_404(tmp_path: pathlib.Path) -> None:
    async with (
        serve_reference_rm(
            db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token=TOKEN, batch=False
        ) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        response = await http.post("/v1/batch", content=operations(1), headers=AUTH)
        got = await http.get("/v1/batch", headers=AUTH)
    assert response.status_code == 404
    assert response.json()["type"] == ProblemType.NOT_FOUND
    assert "--no-batch" in response.json()["detail"]
    assert got.status_code == 404


def test_the_help_documents_no_batch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        refrm_main(["serve", "--help"])
    assert "--no-batch" in capsys.readouterr().out


async def test_the_cli_flags_no_batch_and_no_groups_make_a_v1_0_like_rm(tmp_path: pathlib.Path) -> None:
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "allocatable": {SLOT: "2"}}]}))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv = serve_command(
        db=tmp_path / "rm.sqlite",
        token_file=token_file,
        options=["--inventory", str(inventory_file), "--no-batch", "--no-groups"],
    )
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        url = served_url(await asyncio.wait_for(process.stdout.readline(), timeout=60))
        async with httpx.AsyncClient(base_url=url) as http:
            batched = await http.post("/v1/batch", content=operations(1), headers=AUTH)
            grouped = await http.post("/v1/reservation-groups", json={}, headers=AUTH)
            single = await http.post("/v1/reservations", json=reserve_body("a"), headers=AUTH)
        assert (batched.status_code, grouped.status_code, single.status_code) == (404, 404, 201)
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=30)


async def test_commits_and_releases_are_served_before_the_inventory_is_loaded(tmp_path: pathlib.Path) -> None:
    """As single calls: only a reserve needs the inventory (503 until it is loaded)."""
    async with (
        serve_reference_rm(db_path=tmp_path / "rm.sqlite", token=TOKEN) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        releases = await batch(
            http, [{"release": {"reservationId": "x"}}, {"commit": {"reservationId": "x"}}]
        )
        with_reserve = await http.post(
            "/v1/batch", json={"operations": [{"reserve": reserve_body("a")}]}, headers=AUTH
        )
    assert [r["status"] for r in releases] == [204, 404]
    assert with_reserve.status_code == 503
    assert with_reserve.headers["Retry-After"] == "1"


async def _serve(argv: list[str]) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert process.stdout is not None
    banner = await asyncio.wait_for(process.stdout.readline(), timeout=60)
    assert banner, "the reference RM did not start"
    return process, served_url(banner)


async def test_an_rm_killed_while_batches_race_keeps_each_batch_whole_or_not_at_all(
    tmp_path: pathlib.Path,
) -> None:
    """SIGKILL while batches are in flight: after a restart every batch is there whole (each is one
    transaction) or not at all, every batch that was answered is there, and no node holds more than
    it has."""
    inventory_file = tmp_path / "inventory.yaml"
    nodes = [{"name": f"n{i}", "allocatable": {SLOT: "6"}} for i in range(4)]
    inventory_file.write_text(yaml.safe_dump({"nodes": nodes}))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv = serve_command(
        db=tmp_path / "rm.sqlite", token_file=token_file, options=["--inventory", str(inventory_file)]
    )
    process, url = await _serve(argv)
    answered: dict[int, list[dict[str, Any]]] = {}

    async def send(http: httpx.AsyncClient, number: int) -> None:
        operations = [{"reserve": reserve_body(f"b{number}-{i}")} for i in range(4)]
        with contextlib.suppress(httpx.HTTPError):
            response = await http.post("/v1/batch", json={"operations": operations}, headers=AUTH)
            answered[number] = response.json()["results"]

    try:
        async with httpx.AsyncClient(base_url=url) as http:
            sending = [asyncio.create_task(send(http, number)) for number in range(12)]
            while not answered:  # at least one batch made it before the kill
                await asyncio.sleep(0.001)
            process.send_signal(signal.SIGKILL)
            await asyncio.gather(*sending)
        await asyncio.wait_for(process.wait(), timeout=30)
        argv[argv.index("--listen") + 1] = url.removeprefix("http://")
        process, url = await _serve(argv)
        async with httpx.AsyncClient(base_url=url) as http:
            held = await active(http)
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=30)
    by_batch: dict[str, set[str]] = {}
    for item in held:
        by_batch.setdefault(item["podUid"].split("-")[0], set()).add(item["podUid"])
    for number, results in answered.items():
        won = {r["reservation"]["podUid"] for r in results if r["status"] == 201}
        assert by_batch.get(f"b{number}", set()) == won, (
            f"batch {number} answered {won}, restart shows it partly"
        )
    for name, pods in by_batch.items():  # unanswered ones too: reserves in order, so a prefix of them won
        indices = sorted(int(pod.split("-")[1]) for pod in pods)
        assert indices == list(range(len(indices))), f"batch {name} is there only in part: {sorted(pods)}"
    assert len(held) <= 24
    assert all(count <= 6 for count in collections.Counter(item["node"] for item in held).values())
