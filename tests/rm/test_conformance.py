"""CI runs the conformance kit against the reference RM, one pytest test per check."""

from __future__ import annotations

import pytest

from bindery.conformance import CHECKS, Check, ConformanceConfig
from bindery.conformance.cli import main as conformance_main
from bindery.conformance.kit import http_client, run_check
from bindery.refrm import RunningServer

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
