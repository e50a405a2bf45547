"""CI runs the conformance kit against the reference RM, one pytest test per check."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from bindery.conformance import CHECKS, Check, ConformanceConfig, checks_for
from bindery.conformance.cli import main as conformance_main
from bindery.conformance.kit import http_client, run_check
from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.cli import serve_command, served_url
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import ProblemType, RMUnsupported
from bindery.rm.models import ReservationRequest

from .conftest import ADMIN_TOKEN, TOKEN, admin_revoke, small_inventory


@pytest.mark.parametrize("check", CHECKS, ids=[check.name for check in CHECKS])
async def test_reference_rm_conforms(refrm: RunningServer, check: Check) -> None:
    config = ConformanceConfig(
        url=refrm.url, token=TOKEN, topology_key="zone", revoke=admin_revoke(refrm.url)
    )  # one zone per node
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert result.passed, result.error


async def test_kit_detects_a_wrong_capacity_hint(refrm: RunningServer) -> None:
    """The kit can fail: told the pool has 3 slots when it has 4, the overcommit check must fail."""
    config = ConformanceConfig(url=refrm.url, token=TOKEN, capacity=3)
    check = next(c for c in CHECKS if c.name == "no-overcommit")
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert not result.passed
    assert "4 one-slot reservations succeeded but only 3" in (result.error or "")


def test_cli_lists_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert conformance_main(["--url", "http://x", "--list"]) == 0
    out = capsys.readouterr().out
    assert "no-overcommit" in out
    assert re.search(r"^renew-refusals +v1\.1 ", out, re.MULTILINE), out
    assert re.search(r"^no-overcommit +v1\.0 ", out, re.MULTILINE), out
    assert re.search(r"^cluster-isolation +v1\.2 ", out, re.MULTILINE), out


def test_cli_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BINDERY_RM_TOKEN", raising=False)
    assert conformance_main(["--url", "http://x"]) == 2


def test_cli_against_a_served_reference_rm(
    tmp_path: pathlib.Path, token_file: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The vendor path: the RM is some process at a URL, the kit is a command with an exit status."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "nodes:\n"
        "  - {name: a, allocatable: {cpu: '4', bindery.dev/conformance-slot: '3'}}\n"
        "  - {name: b, allocatable: {cpu: '4', bindery.dev/conformance-slot: '2'},"
        " taints: [{key: k, value: v, effect: NoSchedule}]}\n"
    )
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN_TOKEN)
    server = subprocess.Popen(
        serve_command(
            db=tmp_path / "rm.sqlite",
            token_file=token_file,
            options=["--inventory", str(inventory), "--admin-token-file", str(admin_file)],
        ),
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        url = served_url(server.stdout.readline())
        revoke = shlex.join(
            [
                *(sys.executable, "-m", "bindery.reference_rm.cli", "revoke", "--url", url),
                *("--admin-token-file", str(admin_file), "--reason", "{reason}", "{id}"),
            ]
        )
        code = conformance_main(
            ["--url", url, "--token-file", str(token_file), "--capacity", "5", "--revoke-command", revoke]
        )
        output = capsys.readouterr().out
        assert code == 0, output
        assert f"{len(CHECKS)}/{len(CHECKS)} checks passed" in output
        wrong = conformance_main(
            ["--url", url, "--token-file", str(token_file), "--capacity", "6", "--check", "no-overcommit"]
        )
        assert wrong == 1
        assert "FAIL no-overcommit" in capsys.readouterr().out
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


@pytest.fixture
async def v1_0_rm(refrm: RunningServer) -> AsyncIterator[str]:
    """The reference RM as a v1.0 server would look: podUid ignored, no renew, group or batch paths
    (404)."""
    async with httpx.AsyncClient(base_url=refrm.url) as upstream:

        async def forward(request: web.Request) -> web.StreamResponse:
            if request.path.endswith("/renew") or request.path.startswith(
                ("/v1/reservation-groups", "/v1/batch")
            ):
                return web.json_response(
                    {"type": ProblemType.NOT_FOUND, "title": "Not found", "status": 404},
                    status=404,
                    content_type="application/problem+json",
                )
            query = {
                k: v for k, v in request.query.items() if not (k == "podUid" and request.method != "GET")
            }
            headers = {
                k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")
            }
            answer = await upstream.request(
                request.method, request.path, params=query, content=await request.read(), headers=headers
            )
            return web.Response(
                status=answer.status_code,
                body=answer.content,
                headers={"Content-Type": answer.headers.get("content-type", "application/octet-stream")},
            )

        app = web.Application(client_max_size=8 * 1024 * 1024)  # the RM, not the proxy, answers 413
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


async def test_kit_fails_a_v1_0_server_on_the_v1_1_checks_only(v1_0_rm: str) -> None:
    """The v1.1 checks can fail: a server that ignores podUid and has no renew fails each of them,
    and passes everything when certified at 1.0."""
    config = ConformanceConfig(url=v1_0_rm, token=TOKEN, topology_key="zone")
    newer = [check for check in CHECKS if check.since == "1.1"]
    assert len(newer) == 18
    async with http_client(config) as http:
        for check in newer:
            result = await run_check(check, config, http)
            assert not result.passed, check.name
            if check.name.startswith(("group-", "batch-")):
                assert "--contract-version 1.0" in (result.error or ""), result.error
        for name in ("groups-path", "batch-path"):
            path_check = next(check for check in CHECKS if check.name == name)
            assert not (await run_check(path_check, config, http)).passed, name  # a 404 fails at 1.1 ...
        for check in checks_for("1.0"):  # ... and passes at 1.0
            result = await run_check(check, config, http, contract_version="1.0")
            assert result.passed, (check.name, result.error)


async def test_client_tells_a_v1_0_server_from_an_unknown_reservation(v1_0_rm: str) -> None:
    async with ResourceManagerClient(base_url=v1_0_rm, token=TOKEN, allow_insecure_http=True) as client:
        made = await client.reserve(
            ReservationRequest.model_validate(
                {
                    "pod": {"uid": "u1", "namespace": "ns", "name": "p", "schedulerName": "bindery"},
                    "resources": {"cpu": "1"},
                    "idempotencyKey": "u1",
                    "ttlSeconds": 30,
                }
            )
        )
        with pytest.raises(RMUnsupported, match=r"v1\.0"):
            await client.renew(made.id, pod_uid="u1", ttl_seconds=60)
        await client.release(made.id, pod_uid="u1")


@pytest.fixture
async def careless_groups_rm(refrm: RunningServer) -> AsyncIterator[str]:
    """An RM whose groups are not atomic: it reserves member by member, keeps what it got when one
    does not fit, and ignores topology. Everything else is the reference RM."""
    async with httpx.AsyncClient(base_url=refrm.url) as upstream:

        async def forward(request: web.Request) -> web.StreamResponse:
            headers = {
                k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")
            }
            if request.method == "POST" and request.path == "/v1/reservation-groups":
                body = await request.json()
                members = []
                for index, member in enumerate(body["members"]):
                    single = {
                        **member,
                        "idempotencyKey": f"{body['idempotencyKey']}/{index}",
                        "ttlSeconds": 60,
                    }
                    answer = await upstream.post("/v1/reservations", json=single, headers=headers)
                    if answer.status_code not in (200, 201):
                        return web.Response(
                            status=answer.status_code,
                            body=answer.content,
                            content_type="application/problem+json",
                        )
                    members.append({**answer.json(), "groupId": body["idempotencyKey"]})
                return web.json_response({"id": body["idempotencyKey"], "members": members}, status=201)
            answer = await upstream.request(
                request.method,
                request.path,
                params=request.query,
                content=await request.read(),
                headers=headers,
            )
            return web.Response(
                status=answer.status_code,
                body=answer.content,
                headers={"Content-Type": answer.headers.get("content-type", "application/octet-stream")},
            )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("group-all-or-nothing", "a group that did not fit left 4 reservations behind"),
        ("group-concurrent", "exactly one fits"),
        ("group-topology", "expected HTTP 409, got 201"),
    ],
)
async def test_kit_fails_an_rm_whose_groups_are_not_atomic(
    careless_groups_rm: str, name: str, message: str
) -> None:
    """The group checks can fail: partial groups left behind, racing groups both half placed, and a
    topology no node satisfies placed anyway."""
    config = ConformanceConfig(url=careless_groups_rm, token=TOKEN, topology_key="zone")
    check = next(c for c in CHECKS if c.name == name)
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert not result.passed
    assert message in (result.error or ""), result.error


async def _single(upstream: httpx.AsyncClient, headers: dict[str, str], operation: Any) -> dict[str, Any]:
    """One batched operation sent as its single call; its answer as a batch result."""
    if not isinstance(operation, dict) or len(operation) != 1:
        return {
            "status": 400,
            "problem": {"type": ProblemType.INVALID_REQUEST, "title": "Invalid", "status": 400},
        }
    ((kind, payload),) = operation.items()
    if kind == "reserve":
        response = await upstream.post("/v1/reservations", json=payload, headers=headers)
    else:
        path = f"/v1/reservations/{payload.get('reservationId')}"
        params = {"podUid": payload["podUid"]} if payload.get("podUid") else {}
        if kind == "commit":
            response = await upstream.post(f"{path}/commit", params=params, headers=headers)
        else:
            response = await upstream.delete(path, params=params, headers=headers)
    if response.status_code == 204:
        return {"status": 204}
    return {
        "status": response.status_code,
        ("problem" if response.status_code >= 400 else "reservation"): response.json(),
    }


@pytest.fixture
async def careless_batch_rm(refrm: RunningServer, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """An RM whose POST /v1/batch sends each operation as a single call to the reference RM, with one
    defect (``request.param``): ``reversed`` answers the results in reverse order; ``snapshot`` places
    every reserve of a batch against the pool as it was when the batch began (it tells the later
    ones they have the first one's slot: double-booking); ``fresh-keys`` makes every reserve new (a
    replayed batch reserves again); ``all-or-400`` refuses the whole batch for one bad operation."""
    defect = request.param
    async with httpx.AsyncClient(base_url=refrm.url) as upstream:

        async def forward(request: web.Request) -> web.StreamResponse:
            headers = {
                k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")
            }
            if request.method == "POST" and request.path == "/v1/batch":
                try:
                    envelope = await request.json()
                except ValueError:
                    envelope = None
                operations = envelope.get("operations") if isinstance(envelope, dict) else None
                if not isinstance(operations, list) or not 1 <= len(operations) <= 500:
                    return web.json_response(
                        {"type": ProblemType.INVALID_REQUEST, "title": "Invalid", "status": 400},
                        status=400,
                        content_type="application/problem+json",
                    )
                if defect == "all-or-400" and any(
                    not isinstance(op, dict) or len(op) != 1 or op.get("reserve", {}).get("ttlSeconds") == 0
                    for op in operations
                ):
                    return web.json_response(
                        {"type": ProblemType.INVALID_REQUEST, "title": "Invalid", "status": 400},
                        status=400,
                        content_type="application/problem+json",
                    )
                if defect == "fresh-keys":
                    operations = [
                        {"reserve": {**op["reserve"], "idempotencyKey": uuid.uuid4().hex}}
                        if "reserve" in op
                        else op
                        for op in operations
                    ]
                results = []
                first_placed: dict[str, Any] | None = None
                for operation in operations:
                    if defect == "snapshot" and "reserve" in operation and first_placed is not None:
                        uid = operation["reserve"]["pod"]["uid"]
                        results.append(
                            {
                                "status": 201,
                                "reservation": {**first_placed, "id": f"rsv-{uid}", "podUid": uid},
                            }
                        )
                        continue
                    result = await _single(upstream, headers, operation)
                    if "reserve" in operation and result["status"] == 201 and first_placed is None:
                        first_placed = result["reservation"]
                    results.append(result)
                if defect == "reversed":
                    results.reverse()
                return web.json_response({"results": results})
            answer = await upstream.request(
                request.method,
                request.path,
                params=request.query,
                content=await request.read(),
                headers=headers,
            )
            return web.Response(
                status=answer.status_code,
                body=answer.content,
                headers={"Content-Type": answer.headers.get("content-type", "application/octet-stream")},
            )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


@pytest.mark.parametrize(
    ("careless_batch_rm", "name", "message"),
    [
        ("reversed", "batch-matches-singles", "results must be in the order of the operations"),
        ("reversed", "batch-mixed", "results must be in the order of the operations"),
        ("snapshot", "batch-no-overcommit", "they must not share it"),
        ("fresh-keys", "batch-replay", "expected 200 for every operation"),
        ("all-or-400", "batch-invalid-operation", "expected HTTP 200, got 400"),
    ],
    indirect=["careless_batch_rm"],
)
async def test_kit_fails_an_rm_whose_batches_are_careless(
    careless_batch_rm: str, name: str, message: str
) -> None:
    """The batch checks can fail: results out of order, reserves of one batch sharing a slot, a
    replayed batch reserving again, one bad operation failing the whole batch."""
    config = ConformanceConfig(url=careless_batch_rm, token=TOKEN)
    check = next(c for c in CHECKS if c.name == name)
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert not result.passed
    assert message in (result.error or ""), result.error


@pytest.mark.parametrize("careless_batch_rm", ["none"], indirect=True)
async def test_the_batch_proxy_without_a_defect_passes(careless_batch_rm: str) -> None:
    """The control: the proxy above with no defect passes every batch check, so each failure above
    is its defect's, not the proxy's."""
    config = ConformanceConfig(url=careless_batch_rm, token=TOKEN)
    async with http_client(config) as http:
        for check in [c for c in CHECKS if c.name.startswith("batch-")]:
            result = await run_check(check, config, http)
            assert result.passed, (check.name, result.error)


# -- contract v1.2: /v1/info and clusterId -------------------------------------------------------


@pytest.fixture
async def v1_1_refrm(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    """The reference RM serving as a v1.1 RM: no /v1/info (404), clusterId refused (400)."""
    async with serve_reference_rm(
        db_path=tmp_path / "v11.sqlite", inventory=small_inventory(), token=TOKEN, cluster_ids=False
    ) as server:
        yield server


async def test_a_v1_1_run_never_sends_cluster_id_and_the_v1_2_checks_fail_a_v1_1_rm(
    v1_1_refrm: RunningServer,
) -> None:
    """Certified at 1.1, an RM that refuses clusterId (as every v1.1 RM refuses unknown fields) passes
    every check, so no 1.1 check sends the field; the v1.2 checks fail it, saying which version to
    certify it at."""
    config = ConformanceConfig(url=v1_1_refrm.url, token=TOKEN, topology_key="zone")
    newer = [check for check in CHECKS if check.since == "1.2"]
    assert {check.name for check in newer} == {
        "cluster-isolation",
        "cluster-id-validated",
        "node-preferences",
        "group-node-preferences",
        "preemption",
        "group-preemption",
        "revocation",
        "rule-preemption",
    }
    async with http_client(config) as http:
        for check in checks_for("1.1"):
            result = await run_check(check, config, http, contract_version="1.1")
            assert result.passed, (check.name, result.error)
        for check in newer:
            result = await run_check(check, config, http)
            assert not result.passed, check.name
            assert "--contract-version 1.1" in (result.error or ""), result.error
        info_path = next(check for check in CHECKS if check.name == "info-path")
        assert not (await run_check(info_path, config, http)).passed  # a 404 fails at 1.2


@pytest.fixture
async def unfiltered_rm(refrm: RunningServer) -> AsyncIterator[str]:
    """An RM that stores clusterId but ignores the list filter (the defect of scenario 1's RM)."""
    async with httpx.AsyncClient(base_url=refrm.url) as upstream:

        async def forward(request: web.Request) -> web.StreamResponse:
            query = {k: v for k, v in request.query.items() if k != "clusterId"}
            headers = {
                k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")
            }
            answer = await upstream.request(
                request.method, request.path, params=query, content=await request.read(), headers=headers
            )
            return web.Response(
                status=answer.status_code,
                body=answer.content,
                headers={"Content-Type": answer.headers.get("content-type", "application/octet-stream")},
            )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


async def test_kit_fails_an_rm_that_lists_other_clusters_reservations(unfiltered_rm: str) -> None:
    config = ConformanceConfig(url=unfiltered_rm, token=TOKEN)
    check = next(c for c in CHECKS if c.name == "cluster-isolation")
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert not result.passed
    assert "?clusterId=Y lists" in (result.error or ""), result.error


@pytest.fixture
async def preferences_rm(refrm: RunningServer, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The reference RM behind a proxy: ``ignores`` lists node-preferences but drops the field (of a
    reserve, and of each member of a group reserve) before the RM sees it; ``unlisted`` does not
    list the feature and answers 400 to the field, as a v1.1 RM's validation would."""
    mode = request.param
    async with httpx.AsyncClient(base_url=refrm.url) as upstream:

        async def forward(web_request: web.Request) -> web.StreamResponse:
            headers = {
                k: v for k, v in web_request.headers.items() if k.lower() in ("authorization", "content-type")
            }
            body = await web_request.read()
            paths = ("/v1/reservations", "/v1/reservation-groups")
            if web_request.path in paths and web_request.method == "POST" and body:
                parsed = json.loads(body)
                placements = [parsed.get("placement") or {}] + [
                    member.get("placement") or {} for member in parsed.get("members") or []
                ]
                if any("preferredNodeAffinity" in placement for placement in placements):
                    if mode == "unlisted":
                        return web.json_response(
                            {"type": ProblemType.INVALID_REQUEST, "title": "Bad request", "status": 400},
                            status=400,
                            content_type="application/problem+json",
                        )
                    for placement in placements:
                        placement.pop("preferredNodeAffinity", None)
                    body = json.dumps(parsed).encode()
            answer = await upstream.request(
                web_request.method, web_request.path, params=web_request.query, content=body, headers=headers
            )
            content = answer.content
            if web_request.path == "/v1/info" and mode == "unlisted" and answer.status_code == 200:
                info = answer.json()
                info["features"] = [f for f in info["features"] if f != "node-preferences"]
                content = json.dumps(info).encode()
            return web.Response(
                status=answer.status_code,
                body=content,
                headers={"Content-Type": answer.headers.get("content-type", "application/octet-stream")},
            )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


@pytest.mark.parametrize("preferences_rm", ["ignores"], indirect=True)
async def test_kit_fails_an_rm_that_lists_node_preferences_and_ignores_them(preferences_rm: str) -> None:
    config = ConformanceConfig(url=preferences_rm, token=TOKEN)
    check = next(c for c in CHECKS if c.name == "node-preferences")
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert not result.passed
    assert "must prefer a feasible node that matches" in (result.error or ""), result.error


@pytest.mark.parametrize("preferences_rm", ["ignores"], indirect=True)
async def test_kit_fails_an_rm_that_lists_node_preferences_and_ignores_them_in_groups(
    preferences_rm: str,
) -> None:
    config = ConformanceConfig(url=preferences_rm, token=TOKEN)
    check = next(c for c in CHECKS if c.name == "group-node-preferences")
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert not result.passed
    assert "must score each member's preferredNodeAffinity" in (result.error or ""), result.error


async def test_the_reference_rm_scores_group_members_preferences(refrm: RunningServer) -> None:
    config = ConformanceConfig(url=refrm.url, token=TOKEN)
    check = next(c for c in CHECKS if c.name == "group-node-preferences")
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert result.passed, result.error


@pytest.mark.parametrize("preferences_rm", ["unlisted"], indirect=True)
@pytest.mark.parametrize("name", ["node-preferences", "group-node-preferences"])
async def test_kit_never_sends_preferences_to_an_rm_without_the_feature(
    preferences_rm: str, name: str
) -> None:
    """The proxy refuses the field with 400: the check passes only because it never sends it."""
    config = ConformanceConfig(url=preferences_rm, token=TOKEN)
    check = next(c for c in CHECKS if c.name == name)
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert result.passed, result.error


@pytest.fixture
async def revoked_to_everyone_rm(refrm: RunningServer) -> AsyncIterator[str]:
    """An RM that shows state revoked to every caller, whether it asked or not (a v1.1 client would
    meet a state it does not know)."""
    async with httpx.AsyncClient(base_url=refrm.url) as upstream:

        async def forward(request: web.Request) -> web.StreamResponse:
            headers = {
                k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")
            }
            headers["Bindery-Features"] = "revocation"
            answer = await upstream.request(
                request.method,
                request.path,
                params=dict(request.query),
                content=await request.read(),
                headers=headers,
            )
            return web.Response(
                status=answer.status_code,
                body=answer.content,
                headers={"Content-Type": answer.headers.get("content-type", "application/octet-stream")},
            )

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


async def test_the_revocation_check_fails_an_rm_that_shows_revoked_to_callers_that_did_not_ask(
    revoked_to_everyone_rm: str, refrm: RunningServer
) -> None:
    config = ConformanceConfig(url=revoked_to_everyone_rm, token=TOKEN, revoke=admin_revoke(refrm.url))
    check = next(c for c in CHECKS if c.name == "revocation")
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert not result.passed
    assert "must read a revoked reservation as released" in (result.error or ""), result.error


async def test_the_revocation_check_needs_a_way_to_revoke(refrm: RunningServer) -> None:
    """An RM listing the feature cannot pass by the kit having no hook: the check says what to give."""
    config = ConformanceConfig(url=refrm.url, token=TOKEN)
    check = next(c for c in CHECKS if c.name == "revocation")
    async with http_client(config) as http:
        result = await run_check(check, config, http)
    assert not result.passed
    assert "--revoke-command" in (result.error or ""), result.error
