"""Is a peer's clock (the apiserver's, a resource manager's) far from this process's?

Bindery compares times another process stamped with its own clock: a reservation's ``expiresAt``
is the RM's, a leader Lease's ``renewTime`` the other replicas'. An RM whose clock is 50 s behind
hands out leases that look expired here the moment they arrive, and the messages then blamed the
lease TTL. Every HTTP answer carries the peer's clock in its ``Date`` header (RFC 9110, whole
seconds), so an answer is enough to estimate the offset: the peer stamped it between the request
being sent and the answer arriving, within the second the header names.

:class:`ClockWatch` keeps the last estimate of one peer and says once, in the log, when it passes
the tolerance (and once when it is back), with what it breaks and what to do.
"""

from __future__ import annotations

import dataclasses
import email.utils
import logging
from collections.abc import Callable

__all__ = ["DEFAULT_TOLERANCE_SECONDS", "ClockWatch", "Skew", "skew_of"]

log = logging.getLogger(__name__)

#: Offsets up to this are normal (NTP keeps hosts within milliseconds; this leaves room for a loaded
#: host's slow answer). Well below the shortest lease Bindery asks for (30 s).
DEFAULT_TOLERANCE_SECONDS = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class Skew:
    """The peer's clock minus ours (seconds; negative: the peer is behind), give or take `error`."""

    seconds: float
    error: float

    def beyond(self, tolerance: float) -> bool:
        """Surely off by more than `tolerance`, whatever the measurement's own uncertainty."""
        return abs(self.seconds) - self.error > tolerance


def skew_of(date_header: str | None, *, sent_at: float, received_at: float) -> Skew | None:
    """Pure: the offset a ``Date`` header shows, from the request's wall-clock send and receive times.

    The peer stamped a time in [sent_at, received_at] of ours, truncated to its second: the middle
    of both intervals is the estimate, their half-widths its error. None if the header is missing
    or unreadable.
    """
    if not date_header:
        return None
    try:
        stamped = email.utils.parsedate_to_datetime(date_header)
    except (TypeError, ValueError):
        return None
    if stamped.tzinfo is None:  # RFC 9110 dates are GMT; a naive one is a broken peer
        return None
    peer = stamped.timestamp() + 0.5
    ours = (sent_at + received_at) / 2.0
    return Skew(seconds=peer - ours, error=0.5 + max(received_at - sent_at, 0.0) / 2.0)


class ClockWatch:
    """The clock offset of one peer, logged when it passes `tolerance` and when it is back.

    `peer` names it in messages ("the RM at https://rm:8443"); `consequence` says what a wrong
    clock there breaks; `on_skew` receives every estimate (a metric's gauge).
    """

    def __init__(
        self,
        *,
        peer: str,
        consequence: str,
        tolerance: float = DEFAULT_TOLERANCE_SECONDS,
        on_skew: Callable[[float], None] = lambda seconds: None,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
    ) -> None:
        self.peer = peer
        self.consequence = consequence
        self.tolerance = tolerance
        self.last: Skew | None = None
        self.off = False
        self._on_skew = on_skew
        self._log = logger or log

    def observe(self, date_header: str | None, *, sent_at: float, received_at: float) -> Skew | None:
        skew = skew_of(date_header, sent_at=sent_at, received_at=received_at)
        if skew is None:
            return None
        self.last = skew
        self._on_skew(skew.seconds)
        if skew.beyond(self.tolerance) and not self.off:
            self.off = True
            self._log.warning(self.message(skew))
        elif self.off and abs(skew.seconds) <= self.tolerance:
            self.off = False
            self._log.info(f"the clock of {self.peer} agrees with this host's again ({skew.seconds:+.1f} s)")
        return skew

    def message(self, skew: Skew) -> str:
        """What is wrong, why it matters, what to do."""
        side = "behind" if skew.seconds < 0 else "ahead of"
        return (
            f"the clock of {self.peer} is {abs(skew.seconds):.0f} s {side} this host's (its HTTP Date "
            f"header, ±{skew.error:.1f} s; tolerance {self.tolerance:.0f} s). {self.consequence} "
            "Synchronize both hosts' clocks (NTP: chrony or systemd-timesyncd) rather than raising "
            "timeouts or lease TTLs."
        )
