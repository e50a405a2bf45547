"""CI runs the conformance kit against the reference RM, one pytest test per check."""

from __future__ import annotations

import pathlib
import re
import signal
import subprocess
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from bindery.conformance import CHECKS, Check, ConformanceConfig, checks_for
from bindery.conformance.cli import main as conformance_main
from bindery.conformance.kit import http_client, run_check
from bindery.refrm import RunningServer
from bindery.refrm.cli import serve_command, served_url
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import ProblemType, RMUnsupported
from bindery.rm.models import ReservationRequest

from .conftest import TOKEN


@pytest.mark.parametrize("check", CHECKS, ids=[check.name for check in CHECKS])
async def test_reference_rm_conforms(refrm: RunningServer, check: Check) -> None:
    config = ConformanceConfig(url=refrm.url, token=TOKEN, topology_key="zone")  # one zone per node
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
    server = subprocess.Popen(
        serve_command(
            db=tmp_path / "rm.sqlite", token_file=token_file, options=["--inventory", str(inventory)]
        ),
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        url = served_url(server.stdout.readline())
        code = conformance_main(["--url", url, "--token-file", str(token_file), "--capacity", "5"])
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
    """The reference RM as a v1.0 server would look: podUid ignored, no renew or group paths (404)."""
    async with httpx.AsyncClient(base_url=refrm.url) as upstream:

        async def forward(request: web.Request) -> web.StreamResponse:
            if request.path.endswith("/renew") or request.path.startswith("/v1/reservation-groups"):
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
    assert len(newer) == 12
    async with http_client(config) as http:
        for check in newer:
            result = await run_check(check, config, http)
            assert not result.passed, check.name
            if check.name.startswith("group-"):
                assert "--contract-version 1.0" in (result.error or ""), result.error
        groups_path = next(check for check in CHECKS if check.name == "groups-path")
        assert not (await run_check(groups_path, config, http)).passed  # a 404 fails at 1.1 ...
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
