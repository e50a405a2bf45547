"""The pure lease decisions: how long a call may take, when to renew, when to give up."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from bindery.rm.models import Reservation, ReservationState
from bindery.scheduling.lease import (
    MIN_CALL_SECONDS,
    CallStep,
    Lease,
    Plan,
    lease_from_answer,
    margin_for,
    plan_call,
)

WALL = datetime(2026, 1, 1, tzinfo=UTC)


def reservation(
    *, expires_in: float | None, state: ReservationState = ReservationState.RESERVED
) -> Reservation:
    return Reservation(
        id="r1",
        node="n1",
        state=state,
        pod_uid="u",
        scheduler_name="bindery",
        expires_at=None if expires_in is None else WALL + timedelta(seconds=expires_in),
    )


def test_margin_is_a_sixth_of_the_ttl_between_one_and_ten_seconds() -> None:
    assert margin_for(60) == 10
    assert margin_for(30) == 5
    assert margin_for(5) == 1
    assert margin_for(3600) == 10


def test_a_fresh_lease_counts_from_when_the_request_was_sent() -> None:
    lease = lease_from_answer(
        reservation=reservation(expires_in=60), ttl_seconds=60, sent_at=100, sent_at_wall=WALL
    )
    assert lease.expires == 160


def test_a_replayed_reservation_keeps_its_old_expiry() -> None:
    lease = lease_from_answer(
        reservation=reservation(expires_in=7), ttl_seconds=60, sent_at=100, sent_at_wall=WALL
    )
    assert lease.expires == 107


def test_an_rm_clock_running_ahead_cannot_stretch_the_lease_past_the_ttl() -> None:
    lease = lease_from_answer(
        reservation=reservation(expires_in=600), ttl_seconds=60, sent_at=100, sent_at_wall=WALL
    )
    assert lease.expires == 160


def test_without_expires_at_the_ttl_is_the_lease_and_a_committed_one_never_expires() -> None:
    lease = lease_from_answer(
        reservation=reservation(expires_in=None), ttl_seconds=30, sent_at=5, sent_at_wall=WALL
    )
    assert lease.expires == 35
    committed = lease_from_answer(
        reservation=reservation(expires_in=None, state=ReservationState.COMMITTED),
        ttl_seconds=30,
        sent_at=5,
        sent_at_wall=WALL,
    )
    assert committed.expires == math.inf
    assert plan_call(lease=committed, now=1e9, cap=30, needed=30, renewable=True) == Plan(CallStep.CALL, 30)


LEASE = Lease(reservation_id="r1", ttl_seconds=60, expires=160)


def test_a_call_with_plenty_of_lease_left_gets_its_cap() -> None:
    assert plan_call(lease=LEASE, now=100, cap=30, needed=MIN_CALL_SECONDS, renewable=True) == Plan(
        CallStep.CALL, 30
    )


def test_a_call_ends_a_margin_before_the_lease() -> None:
    # 45 s left (more than a third): no renewal, but the call gets 45 - 10 s, not its 40 s cap.
    assert plan_call(lease=LEASE, now=115, cap=40, needed=MIN_CALL_SECONDS, renewable=True) == Plan(
        CallStep.CALL, 35
    )


def test_a_lease_below_a_third_of_its_ttl_is_renewed_first() -> None:
    assert (
        plan_call(lease=LEASE, now=141, cap=10, needed=MIN_CALL_SECONDS, renewable=True).step
        is CallStep.RENEW
    )


def test_a_retry_that_needs_longer_than_what_is_left_renews_first() -> None:
    # 25 s left (more than a third) but a retry of a 30 s attempt could outlast it.
    assert plan_call(lease=LEASE, now=135, cap=30, needed=30, renewable=True).step is CallStep.RENEW


@pytest.mark.parametrize(("now", "timeout"), [(141, 9.0), (149.4, 0.6)])
def test_without_renewal_a_call_gets_what_is_left_before_the_margin(now: float, timeout: float) -> None:
    plan = plan_call(lease=LEASE, now=now, cap=30, needed=30, renewable=False)
    assert plan.step is CallStep.CALL
    assert plan.timeout == pytest.approx(timeout)


@pytest.mark.parametrize("now", [149.6, 150, 160, 200])
def test_without_renewal_no_call_starts_inside_the_margin(now: float) -> None:
    assert plan_call(lease=LEASE, now=now, cap=30, needed=MIN_CALL_SECONDS, renewable=False) == Plan(
        CallStep.GIVE_UP
    )


def test_an_expired_lease_is_still_renewed_when_the_rm_can() -> None:
    # The RM decides whether it is still alive (a conflict if not); asking costs no apiserver traffic.
    assert (
        plan_call(lease=LEASE, now=170, cap=30, needed=MIN_CALL_SECONDS, renewable=True).step
        is CallStep.RENEW
    )
