"""Which failed attempts of an RM call are retried, and the log line a retry leaves.

The client's calls retry through tenacity; what is worth retrying is marked by wrapping the error
the last attempt would raise, so giving up raises exactly that error.
"""

from __future__ import annotations

import logging

from tenacity import RetryCallState

from bindery.rm.errors import RMUnavailable

__all__ = ["Retryable", "log_retry"]

log = logging.getLogger(__name__)


class Retryable(Exception):
    """An attempt failed in a way worth retrying; carries what to raise if it was the last one."""

    def __init__(self, error: RMUnavailable) -> None:
        super().__init__(error.message)
        self.error = error


def log_retry(state: RetryCallState) -> None:
    outcome = state.outcome
    error = outcome.exception() if outcome is not None else None
    sleep = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning("RM call attempt %d failed (%s); retrying in %.2fs", state.attempt_number, error, sleep)
