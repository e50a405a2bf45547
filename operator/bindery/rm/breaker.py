"""The RM client's circuit breaker: a dead RM is not hammered, and callers learn when calls resume.

Pure state with injectable clocks, apart from the client so it is tested without any I/O.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from bindery.rm.errors import RMUnavailable

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Consecutive failures open the circuit; after a cool-down one probe call is let through.

    Closed → (``failure_threshold`` consecutive failures) → open → (``cool_down`` seconds) →
    half-open: exactly one call may try; its success closes the circuit, its failure re-opens it.
    A probe that ends without a verdict (cancelled with its pod's cycle) hands the probe slot back
    via :meth:`abandon_probe`, or the circuit would stay shut forever.
    Pure state with injectable clocks, so it is unit-testable.
    """

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        cool_down: float = 10.0,
        probe_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.cool_down = cool_down
        self.probe_timeout = cool_down if probe_timeout is None else probe_timeout
        self._clock = clock
        self._wall_clock = wall_clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.cool_down:
            return "half-open"
        return "open"

    def before_call(self) -> bool:
        """Let the call through (True if it is the half-open probe) or raise RMUnavailable.

        The error says when calls resume: the end of the cool-down, or, while a probe is in
        flight, at the latest when that probe times out.
        """
        state = self.state
        if state == "closed":
            return False
        if state == "half-open" and not self._probing:
            self._probing = True
            return True
        if state == "half-open":
            raise RMUnavailable(
                f"the resource manager failed {self._failures} times in a row (circuit half-open); one "
                "probe call is testing it now and the others wait: calls resume when it succeeds, "
                f"try again within {self.probe_timeout:.1f}s ({self._at(self.probe_timeout)})",
                retry_after=self.probe_timeout,
            )
        assert self._opened_at is not None
        remaining = max(0.0, self.cool_down - (self._clock() - self._opened_at))
        raise RMUnavailable(
            f"the resource manager failed {self._failures} times in a row, so calls are paused "
            f"(circuit open); the next call is let through in {remaining:.1f}s ({self._at(remaining)}); "
            "check that the RM is running and reachable",
            retry_after=remaining or self.cool_down,
        )

    def _at(self, seconds: float) -> str:
        moment = datetime.datetime.fromtimestamp(self._wall_clock() + seconds, tz=datetime.UTC)
        return "at " + moment.strftime("%H:%M:%S UTC")

    def abandon_probe(self) -> None:
        """The probe ended with neither success nor failure (cancelled): let the next call probe."""
        self._probing = False

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def record_failure(self) -> None:
        self._failures += 1
        if self._probing or self._failures >= self.failure_threshold:
            self._opened_at = self._clock()
        self._probing = False
