"""The pure clock-offset estimate behind the skew warnings (bindery.clock)."""

from __future__ import annotations

import email.utils

import pytest

from bindery.clock import Skew, skew_of


def test_skew_of_a_date_header() -> None:
    """The peer stamped a time within the request's span, truncated to its second."""
    now = 1_800_000_000.0
    header = email.utils.formatdate(now - 50, usegmt=True)
    skew = skew_of(header, sent_at=now, received_at=now + 0.2)
    assert skew is not None
    assert skew.seconds == pytest.approx(-50 + 0.5 - 0.1)
    assert skew.error == pytest.approx(0.6)
    assert skew.beyond(5.0)
    assert not Skew(seconds=5.5, error=1.0).beyond(5.0)  # maybe only 4.5 s: not surely beyond
    assert skew_of(None, sent_at=now, received_at=now) is None
    assert skew_of("yesterday", sent_at=now, received_at=now) is None
    assert skew_of("Sat, 15 Jan 2027 08:00:00", sent_at=now, received_at=now) is None  # no zone
