"""CI runs the conformance kit against the reference RM, one pytest test per check."""

from __future__ import annotations

import pathlib
import signal
import subprocess

import pytest

from bindery.conformance import CHECKS, Check, ConformanceConfig
from bindery.conformance.cli import main as conformance_main
from bindery.conformance.kit import http_client, run_check
from bindery.refrm import RunningServer
from bindery.refrm.cli import serve_command, served_url

from .conftest import TOKEN


@pytest.mark.parametrize("check", CHECKS, ids=[check.name for check in CHECKS])
async def test_reference_rm_conforms(refrm: RunningServer, check: Check) -> None:
    config = ConformanceConfig(url=refrm.url, token=TOKEN)
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
    assert "no-overcommit" in capsys.readouterr().out


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
        assert "12/12 checks passed" in output
        wrong = conformance_main(
            ["--url", url, "--token-file", str(token_file), "--capacity", "6", "--check", "no-overcommit"]
        )
        assert wrong == 1
        assert "FAIL no-overcommit" in capsys.readouterr().out
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
