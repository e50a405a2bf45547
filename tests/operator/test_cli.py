"""`bindery run` refuses bad options before connecting to anything."""

from __future__ import annotations

import pytest

from bindery.cli import main


def test_a_bad_metrics_address_is_refused_with_the_expected_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--metrics-addr", "9090"])
    assert exited.value.code == 2
    assert "metrics address '9090' is not HOST:PORT (e.g. 0.0.0.0:9090)" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "code"), [(["rm", "--help"], 0), (["rm"], 2)])
def test_rm_alone_lists_its_subcommands(
    argv: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    out = capsys.readouterr().out
    assert "serve" in out
    assert "conformance" in out
    assert "unknown command" not in out


def test_run_freezes_what_start_loaded_and_collects_the_young_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 19's plain-pod budget: the default collector spent 1.0-1.3 s of a 3,000-pod backlog's
    operator CPU walking the imports; `bindery run` freezes them before its loop starts."""
    import gc

    import bindery.controller.startup.entry
    from bindery.collector import COLLECTOR_THRESHOLDS

    seen: dict[str, object] = {}

    async def run_operator(**_: object) -> None:
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()

    monkeypatch.setattr(bindery.controller.startup.entry, "run_operator", run_operator)
    gc.unfreeze()  # CPython's defaults, whatever ran before (tests/conftest.py restores them after)
    gc.set_threshold(700, 10, 10)
    assert main(["run"]) == 0
    assert seen["threshold"] == COLLECTOR_THRESHOLDS
    assert isinstance(seen["frozen"], int)
    assert seen["frozen"] > 0


def test_run_leaves_sigterm_to_kopf_and_passes_no_stop_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf, in the main thread, replaces any SIGINT/SIGTERM handler set before it with its own. A
    `stop_flag` set by such a handler was never set, and Kopf waited 5 s at every exit for the task
    left waiting on it (every rollout, every test restarting an operator process)."""
    import gc

    import bindery.controller.startup.entry

    seen: dict[str, object] = {}

    async def run_operator(**kwargs: object) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(bindery.controller.startup.entry, "run_operator", run_operator)
    before = gc.get_threshold()
    try:
        assert main(["run"]) == 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert "options" in seen
    assert seen.get("stop_flag") is None
