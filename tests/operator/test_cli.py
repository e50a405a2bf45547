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
