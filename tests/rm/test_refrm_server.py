"""The reference RM as a real server on loopback: bad input, concurrency, restarts, TLS, CLI."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import logging
import os
import pathlib
import random
import signal
import subprocess
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.cli import main as refrm_main
from bindery.reference_rm.cli import serve_command, served_url
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import ProblemType, RMUnavailable, RMUnschedulable
from bindery.rm.models import Placement, PodIdentity, ReservationRequest, ReservationState

from .conftest import TOKEN, small_inventory, usage_by_node

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def request_body(uid: str, **resources: str) -> dict[str, Any]:
    return {
        "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "bindery"},
        "resources": resources or {"cpu": "1"},
        "idempotencyKey": uid,
        "ttlSeconds": 60,
    }


async def all_reservations(server: RunningServer) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.get("/v1/reservations", params={"limit": "500"}, headers=AUTH)
        assert response.status_code == 200
        return list(response.json()["items"])


BAD_INPUTS = [
    (
        "malformed JSON",
        b'{"pod": {',
        "application/json",
        AUTH,
        400,
        ProblemType.INVALID_REQUEST,
        "not valid JSON",
    ),
    (
        "an unknown field",
        json.dumps({**request_body("x"), "gang": "g1"}).encode(),
        "application/json",
        AUTH,
        400,
        ProblemType.INVALID_REQUEST,
        "gang",
    ),
    (
        "cpu: -1",
        json.dumps(request_body("x", cpu="-1")).encode(),
        "application/json",
        AUTH,
        400,
        ProblemType.INVALID_REQUEST,
        "negative",
    ),
    (
        "memory: 1e400",
        json.dumps(request_body("x", memory="1e400")).encode(),
        "application/json",
        AUTH,
        400,
        ProblemType.INVALID_REQUEST,
        "out of range",
    ),
    (
        "an invalid resource name",
        json.dumps({**request_body("x"), "resources": {"nvidia.com/GPU!": "1"}}).encode(),
        "application/json",
        AUTH,
        400,
        ProblemType.INVALID_REQUEST,
        "not a valid resource name",
    ),
    (
        "a number instead of a quantity string",
        json.dumps({**request_body("x"), "resources": {"cpu": 1}}).encode(),
        "application/json",
        AUTH,
        400,
        ProblemType.INVALID_REQUEST,
        "string",
    ),
    (
        "missing auth",
        json.dumps(request_body("x")).encode(),
        "application/json",
        {},
        401,
        ProblemType.UNAUTHORIZED,
        "bearer token",
    ),
    (
        "a token for another RM",
        json.dumps(request_body("x")).encode(),
        "application/json",
        {"Authorization": "Bearer token-of-another-rm"},
        401,
        ProblemType.UNAUTHORIZED,
        "bearer token",
    ),
    (
        "a non-bearer scheme",
        json.dumps(request_body("x")).encode(),
        "application/json",
        {"Authorization": f"Basic {TOKEN}"},
        401,
        ProblemType.UNAUTHORIZED,
        "bearer token",
    ),
    (
        "a body over the size limit",
        json.dumps({**request_body("x"), "pad": "x" * 100_000}).encode(),
        "application/json",
        AUTH,
        413,
        ProblemType.PAYLOAD_TOO_LARGE,
        "exceeds the limit",
    ),
    (
        "form data",
        b"a=b",
        "application/x-www-form-urlencoded",
        AUTH,
        415,
        ProblemType.UNSUPPORTED_MEDIA_TYPE,
        "application/json",
    ),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
async def test_bad_input_answers_problem_and_changes_nothing(
    refrm: RunningServer, case: tuple[Any, ...]
) -> None:
    _, content, media, headers, status, kind, fragment = case
    async with httpx.AsyncClient(base_url=refrm.url) as http:
        existing = await http.post("/v1/reservations", json=request_body("existing"), headers=AUTH)
        assert existing.status_code == 201
        before = await all_reservations(refrm)
        usage_before = refrm.rm._store.usage()
        response = await http.post(
            "/v1/reservations", content=content, headers={**headers, "Content-Type": media}
        )
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["type"] == kind
    assert problem["status"] == status
    assert fragment in response.text
    assert await all_reservations(refrm) == before
    assert refrm.rm._store.usage() == usage_before


async def test_unknown_paths_and_methods_are_problems(refrm: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=refrm.url) as http:
        missing = await http.get("/v1/placements", headers=AUTH)  # v1.1 made reservation-groups a path
        wrong_method = await http.put("/v1/reservations", headers=AUTH)
        bad_limit = await http.get("/v1/reservations", params={"limit": "0"}, headers=AUTH)
        bad_param = await http.get("/v1/reservations", params={"owner": "me"}, headers=AUTH)
        bad_commit = await http.post("/v1/reservations/x/commit", json={"force": True}, headers=AUTH)
    assert (missing.status_code, missing.json()["type"]) == (404, ProblemType.NOT_FOUND)
    assert (wrong_method.status_code, wrong_method.json()["type"]) == (405, ProblemType.METHOD_NOT_ALLOWED)
    assert (bad_limit.status_code, bad_limit.json()["type"]) == (400, ProblemType.INVALID_REQUEST)
    assert (bad_param.status_code, bad_param.json()["type"]) == (400, ProblemType.INVALID_REQUEST)
    assert (bad_commit.status_code, bad_commit.json()["type"]) == (400, ProblemType.INVALID_REQUEST)


async def test_serves_its_openapi_document(refrm: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=refrm.url) as http:
        text = (await http.get("/openapi.yaml")).text
        as_json = (await http.get("/openapi.json")).json()
    assert yaml.safe_load(text) == as_json
    assert as_json["info"]["title"] == "Bindery resource-manager contract"


def random_request(rng: random.Random, index: int) -> ReservationRequest:
    resources = {"cpu": rng.choice(["250m", "500m", "1"]), "memory": rng.choice(["256Mi", "1Gi", "1.5Gi"])}
    if rng.random() < 0.3:
        resources["nvidia.com/gpu"] = "1"
    tolerations = [{"key": "gpu", "operator": "Exists"}] if rng.random() < 0.5 else []
    return ReservationRequest(
        pod=PodIdentity(uid=f"pod-{index}", namespace="ns", name=f"pod-{index}", scheduler_name="bindery"),
        resources=resources,
        placement=Placement.model_validate({"tolerations": tolerations}),
        idempotency_key=f"pod-{index}",
        ttl_seconds=600,
    )


async def test_50_concurrent_clients_never_overcommit_and_restart_keeps_everything(
    tmp_path: pathlib.Path,
) -> None:
    db = tmp_path / "rm.sqlite"
    inventory = {node.name: node for node in small_inventory()}
    rng = random.Random(42)
    requests = [random_request(rng, index) for index in range(50)]

    async def one_client(url: str, request: ReservationRequest) -> str:
        async with ResourceManagerClient(base_url=url, token=TOKEN, allow_insecure_http=True) as client:
            try:
                await client.reserve(request)
            except RMUnschedulable:
                return "unschedulable"
            return "reserved"

    async with serve_reference_rm(db_path=db, inventory=list(inventory.values()), token=TOKEN) as server:
        outcomes = await asyncio.gather(*(one_client(server.url, request) for request in requests))
        before = await all_reservations(server)
    assert outcomes.count("reserved") == len(before)
    assert 0 < len(before) < 50  # contention really happened: some fit, some did not

    for node_name, usage in usage_by_node(before).items():
        for name, amount in usage.items():
            assert amount <= inventory[node_name].allocatable[name], f"{node_name} overcommitted on {name}"
    tainted = {item["podUid"] for item in before if item["node"] == "node-b"}
    tolerating = {r.pod.uid for r in requests if r.placement.tolerations}
    assert tainted <= tolerating

    async with serve_reference_rm(db_path=db, inventory=list(inventory.values()), token=TOKEN) as server:
        after = await all_reservations(server)
        assert after == before
        # The restarted RM still counts the held capacity: a second wave cannot overcommit either.
        second = [random_request(rng, 100 + index) for index in range(20)]
        await asyncio.gather(*(one_client(server.url, request) for request in second))
        total = await all_reservations(server)
    for node_name, usage in usage_by_node(total).items():
        for name, amount in usage.items():
            assert amount <= inventory[node_name].allocatable[name], (
                f"{node_name} overcommitted on {name} after restart"
            )


async def test_restart_keeps_states(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "rm.sqlite"
    async with (
        serve_reference_rm(db_path=db, inventory=small_inventory(), token=TOKEN) as server,
        ResourceManagerClient(base_url=server.url, token=TOKEN, allow_insecure_http=True) as client,
    ):
        requests = [ReservationRequest.model_validate(request_body(f"u{i}")) for i in range(3)]
        made = [await client.reserve(request) for request in requests]
        await client.commit(made[0].id)
        await client.release(made[1].id)
    async with (
        serve_reference_rm(db_path=db, inventory=small_inventory(), token=TOKEN) as server,
        ResourceManagerClient(base_url=server.url, token=TOKEN, allow_insecure_http=True) as client,
    ):
        states = {r.id: r.state for r in await client.list_reservations()}
        replay = await client.reserve(requests[2])
    assert states == {
        made[0].id: ReservationState.COMMITTED,
        made[1].id: ReservationState.RELEASED,
        made[2].id: ReservationState.RESERVED,
    }
    assert replay.id == made[2].id


def _pem_pair(
    tmp_path: pathlib.Path,
    name: str,
    *,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, pathlib.Path, pathlib.Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    certificate = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return certificate, key, cert_path, key_path


async def test_tls_with_client_certificates(tmp_path: pathlib.Path) -> None:
    import ssl

    ca_cert, ca_key, ca_path, _ = _pem_pair(tmp_path, "ca", issuer=None)
    _, _, server_crt, server_key = _pem_pair(tmp_path, "server", issuer=(ca_cert, ca_key), server=True)
    _, _, client_crt, client_key = _pem_pair(tmp_path, "client", issuer=(ca_cert, ca_key))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(server_crt, server_key)
    context.load_verify_locations(cafile=ca_path)
    context.verify_mode = ssl.CERT_REQUIRED
    request = ReservationRequest.model_validate(request_body("tls"))
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token=TOKEN, ssl_context=context
    ) as server:
        assert server.url.startswith("https://127.0.0.1:")
        async with ResourceManagerClient(
            base_url=server.url, token=TOKEN, ca_file=ca_path, client_cert=(client_crt, client_key)
        ) as client:
            assert (await client.reserve(request)).node
        options: dict[str, Any] = {"base_url": server.url, "token": TOKEN, "max_attempts": 1}
        async with ResourceManagerClient(**options, ca_file=ca_path) as no_client_cert:
            with pytest.raises(RMUnavailable):
                await no_client_cert.reserve(request)
        async with ResourceManagerClient(**options, client_cert=(client_crt, client_key)) as untrusted:
            with pytest.raises(RMUnavailable, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                await untrusted.reserve(request)


def test_cli_rejects_bad_configuration(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "inventory.yaml"
    bad.write_text("nodes:\n  - name: a\n    allocatable: {cpu: '-1'}\n")
    assert (
        refrm_main(["serve", "--db", str(tmp_path / "db"), "--inventory", str(bad), "--insecure-no-auth"])
        == 2
    )
    assert "negative" in capsys.readouterr().err
    good = tmp_path / "good.yaml"
    good.write_text("nodes:\n  - name: a\n    allocatable: {cpu: '1'}\n")
    os.environ.pop("BINDERY_RM_TOKEN", None)
    assert refrm_main(["--db", str(tmp_path / "db"), "--inventory", str(good)]) == 2
    assert "--token-file" in capsys.readouterr().err
    for seconds in ("0.5", "nan"):
        options = ["--db", str(tmp_path / "db"), "--inventory", str(good), "--insecure-no-auth"]
        assert refrm_main([*options, "--foreign-retry-seconds", seconds]) == 2
        assert "--foreign-retry-seconds must be at least 1" in capsys.readouterr().err
    for percentage in ("-1", "101"):
        options = ["--db", str(tmp_path / "db"), "--inventory", str(good), "--insecure-no-auth"]
        assert refrm_main([*options, "--percentage-of-nodes-to-score", percentage]) == 2
        assert "--percentage-of-nodes-to-score must be from 0 to 100" in capsys.readouterr().err
    for size in ("0", "10001"):
        options = ["--db", str(tmp_path / "db"), "--inventory", str(good), "--insecure-no-auth"]
        assert refrm_main([*options, "--mirror-pod-page-size", size]) == 2
        assert "--mirror-pod-page-size must be from 1 to 10000" in capsys.readouterr().err


async def test_cli_serves_until_sigterm(tmp_path: pathlib.Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump({"nodes": [{"name": "n1", "allocatable": {"cpu": "2", "memory": "1Gi"}}]})
    )
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    process = await asyncio.create_subprocess_exec(
        *serve_command(
            db=tmp_path / "rm.sqlite",
            token_file=token_file,
            options=["--inventory", str(inventory), "--policy", "spread"],
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        banner = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        url = served_url(banner)
        assert url.startswith("http://127.0.0.1:"), banner
        async with ResourceManagerClient(
            base_url=url, token_file=token_file, allow_insecure_http=True
        ) as client:
            await client.check_ready()
            reservation = await client.reserve(ReservationRequest.model_validate(request_body("cli")))
            assert reservation.node == "n1"
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=30)
    assert code == 0


async def test_back_pressure_answers_429_with_retry_after(tmp_path: pathlib.Path) -> None:
    import threading

    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token=TOKEN, max_pending=1
    ) as server:
        gate = threading.Event()
        server.rm._writer.submit(gate.wait)  # the single writer is busy
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            first = asyncio.create_task(
                http.post("/v1/reservations", json=request_body("first"), headers=AUTH)
            )
            async with asyncio.timeout(30):  # wait until the first request holds the only pending slot
                while server.rm._pending < 1:
                    await asyncio.sleep(0.01)
            second = await http.post("/v1/reservations", json=request_body("second"), headers=AUTH)
            gate.set()
            assert (await first).status_code == 201
        assert second.status_code == 429
        assert second.headers["Retry-After"] == "1"
        assert second.json()["type"] == ProblemType.RATE_LIMITED
        assert [item["podUid"] for item in await all_reservations(server)] == ["first"]


async def test_server_token_file_rotation(tmp_path: pathlib.Path) -> None:
    """With no overlap (`--token-overlap 0`) a rotation is a hard cut; the overlap's own tests are
    in test_token_rotation_unit.py."""
    token_file = tmp_path / "token"
    token_file.write_text("old-token\n")
    async with (
        serve_reference_rm(
            db_path=tmp_path / "rm.sqlite",
            inventory=small_inventory(),
            token_file=token_file,
            token_overlap=0,
        ) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        assert (
            await http.get("/v1/reservations", headers={"Authorization": "Bearer old-token"})
        ).status_code == 200
        token_file.write_text("new-token-value\n")
        os.utime(token_file, ns=(10**18, 10**18))
        assert (
            await http.get("/v1/reservations", headers={"Authorization": "Bearer old-token"})
        ).status_code == 401
        assert (
            await http.get("/v1/reservations", headers={"Authorization": "Bearer new-token-value"})
        ).status_code == 200


async def test_long_request_lines_reach_the_contract_without_aiohttp_fallback(
    refrm: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's parser limits (``handler_args``) are in force, and aiohttp accepts them silently.

    Should aiohttp ever reject one of those arguments it logs "Failed to create request handler with
    custom kwargs" and drops them all, which this catches twice: the warning, and the 8 KiB default
    limit answering the long header below with its own text/plain 400 instead of contract v1's.
    """
    caplog.set_level(logging.WARNING, logger="aiohttp")
    async with httpx.AsyncClient(base_url=refrm.url) as http:
        long_filter = await http.get("/v1/reservations", params={"podUid": "u" * 20_000}, headers=AUTH)
        long_header = await http.get("/v1/reservations", headers={**AUTH, "X-Padding": "p" * 20_000})
    assert long_filter.status_code == 400
    assert long_filter.headers["content-type"].startswith("application/problem+json")
    assert long_filter.json()["detail"] == "podUid must be 1 to 253 characters long"
    assert long_header.status_code == 200
    assert long_header.json() == {"items": [], "nextCursor": None}
    assert [record.getMessage() for record in caplog.records if record.name.startswith("aiohttp")] == []
