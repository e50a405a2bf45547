"""`bindery run` refuses bad options before connecting to anything."""

from __future__ import annotations

import pytest

from bindery.cli import main


def test_a_bad_metrics_address_is_refused_with_the_expected_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--metrics-addr", "9090"])
    assert exited.value.code == 2
    assert "metrics address '9090' is not HOST:PORT (e.g. 0.0.0.0:9090)" in capsys.readouterr().err
