"""tests/durations.py reads the JUnit report scripts/test writes (no plane, no pytest run)."""

from __future__ import annotations

import pathlib

import pytest

from tests import durations


def _report(path: pathlib.Path, *cases: tuple[str, str, str]) -> pathlib.Path:
    rows = "".join(f'<testcase classname="{c}" name="{n}" time="{t}"/>' for c, n, t in cases)
    path.write_text(f'<testsuites><testsuite name="pytest">{rows}</testsuite></testsuites>')
    return path


def test_times_are_summed_by_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(
        tmp_path / "r.xml",
        ("tests.test_durations", "a", "2.0"),
        ("tests.test_durations", "b", "1.0"),
        ("tests.test_tiers", "c", "1.0"),
    )
    assert durations.main([str(report)]) == 0
    out = capsys.readouterr().out
    assert "3 tests, 4 s in all" in out
    assert "       3  75.0%     2  tests/test_durations.py" in out


def test_a_report_of_instant_tests_prints_instead_of_dividing_by_zero(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of skipped tests only (the Slurm bed without root, say) reports 0 s for every test."""
    report = _report(tmp_path / "r.xml", ("tests.test_tiers", "skipped", "0.000"))
    assert durations.main([str(report)]) == 0
    assert "1 tests, 0 s in all" in capsys.readouterr().out


def test_the_reports_of_the_unit_call_and_the_plane_call_merge_into_one(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """scripts/test runs two pytest calls (unit on workers, then the planes): one report sums both,
    and a call that wrote no report (it collected nothing) is left out rather than failing."""
    unit = _report(tmp_path / "unit.xml", ("tests.test_durations", "a", "2.0"))
    planes = _report(tmp_path / "planes.xml", ("tests.test_tiers", "b", "3.0"))
    merged = tmp_path / "all.xml"
    assert durations.main([str(merged), "--merge", str(unit), str(planes), str(tmp_path / "none.xml")]) == 0
    out = capsys.readouterr().out
    assert "2 tests, 5 s in all" in out
    assert out.count("pytest call pytest:") == 2
    assert durations.main([str(merged)]) == 0
    assert "2 tests, 5 s in all" in capsys.readouterr().out
