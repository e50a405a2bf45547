"""The `bindery rm ...` command lines, through the top-level entry point and the installed script.

Both paths matter: `bindery.cli.main` strips `rm serve` / `rm conformance` before delegating, and the
console script is what a user (and the container's ENTRYPOINT) actually runs.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from bindery.cli import main as bindery_main
from bindery.conformance.kit import CHECKS

SERVE_OPTIONS = ("--listen", "--db", "--inventory", "--mirror-nodes", "--token-file", "--policy")
CONSOLE_SCRIPT = pathlib.Path(sys.executable).parent / "bindery"


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    assert CONSOLE_SCRIPT.exists(), f"the bindery console script is not installed next to {sys.executable}"
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_rm_serve_help_via_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bindery_main(["rm", "serve", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bindery rm serve"), out
    for option in SERVE_OPTIONS:
        assert option in out


def test_rm_serve_help_via_console_script() -> None:
    result = run_script("rm", "serve", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: bindery rm serve"), result.stdout
    for option in SERVE_OPTIONS:
        assert option in result.stdout


def test_conformance_list_needs_no_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert bindery_main(["rm", "conformance", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [check.name for check in CHECKS]
    result = run_script("rm", "conformance", "--list")
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == listed


def test_conformance_run_still_requires_url(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bindery_main(["rm", "conformance", "--token-file", "/nonexistent"])
    assert exited.value.code == 2
    assert "--url is required" in capsys.readouterr().err


def test_rm_serve_freezes_what_start_loaded_and_collects_the_young_less_often(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """Issue 19: at CPython's default the cyclic collector took about a seventh of the reference
    RM's CPU on the rules backlog (its full passes walked every import); `bindery rm serve` tunes it
    as `bindery run` does, before its loop starts."""
    import gc

    import bindery.reference_rm.cli as rm_cli
    from bindery.collector import COLLECTOR_THRESHOLDS

    seen: dict[str, object] = {}

    async def serve(args: object) -> None:
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()

    monkeypatch.setattr(rm_cli, "_serve", serve)
    gc.unfreeze()  # CPython's defaults, whatever ran before (tests/conftest.py restores them after)
    gc.set_threshold(700, 10, 10)
    assert bindery_main(["rm", "serve", "--db", str(tmp_path / "rm.sqlite"), "--mirror-nodes"]) == 0
    assert seen["threshold"] == COLLECTOR_THRESHOLDS
    assert isinstance(seen["frozen"], int)
    assert seen["frozen"] > 0
