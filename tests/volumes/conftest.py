"""Prints the volume-binding cases' outcomes side by side at the end of the session."""

from __future__ import annotations

import pytest

from tests.volumes import report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not report.OUTCOMES and not report.BLOCKS:
        return
    terminalreporter.section("volume binding: outcomes by scheduler")
    for line in report.table():
        terminalreporter.write_line(line)
    for text in report.BLOCKS:
        terminalreporter.write_line("")
        for line in text.splitlines():
            terminalreporter.write_line(line)
