"""`bindery run` logs what a person reads, not a line per RM request or per pod event Kopf handled."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from bindery.cli import PER_REQUEST_LOGGERS, configure_logging


@pytest.fixture
def restored_levels() -> Iterator[None]:
    levels = {name: logging.getLogger(name).level for name in PER_REQUEST_LOGGERS}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("restored_levels")
def test_per_request_lines_are_off_by_default_and_warnings_still_show() -> None:
    configure_logging(verbose=False, log_format="text")
    for name in ("httpx", "kopf.objects"):
        logger = logging.getLogger(name)
        assert not logger.isEnabledFor(logging.INFO), f"{name} still logs every request/event"
        assert logger.isEnabledFor(logging.WARNING)


@pytest.mark.usefixtures("restored_levels")
def test_verbose_shows_them_again() -> None:
    configure_logging(verbose=False, log_format="text")
    configure_logging(verbose=True, log_format="text")
    assert logging.getLogger("httpx").level == logging.NOTSET
    assert logging.getLogger("kopf.objects").level == logging.NOTSET
