"""When a reservation's lease runs out on this process's clock, and what to do before each call.

A ``reserved`` reservation is a lease: the RM hands its capacity to other pods once ``expiresAt``
has passed.  A pod bound on an expired lease runs on capacity the RM gives away again, so every
call a cycle makes while it holds a lease must end before the lease does, with room left for the
commit that follows.  These decisions are pure functions of a :class:`Lease` and a clock reading,
so every edge is unit-tested without waiting.

Why the local monotonic clock: ``expiresAt`` is the RM's wall clock.  The lease is converted once,
when the answer arrives, into "seconds left" measured from when the request was *sent* (so the time
the request took counts against it), and never longer than the TTL asked for (so an RM clock
running ahead cannot stretch it).  A replayed reservation (the same idempotency key after an
unanswered Binding) comes back with its old ``expiresAt``, which is why the TTL alone is not
enough.  :func:`margin_for` keeps a few seconds in hand for the commit and for clock skew.

What a call may take (:func:`plan_call`):

* **renew** first when the lease runs low (less than a third of the TTL left) or the call would not
  get the time it needs (a retry after an attempt that got no answer needs as long as that attempt
  had) and the RM can renew (contract v1.1);
* otherwise **call**, with a timeout that ends ``margin`` before the lease;
* **give up** when less than :data:`MIN_CALL_SECONDS` would be left: a Binding is then not sent at
  all (its reservation may already have expired), the reservation is released and the pod retried.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from datetime import datetime

from bindery.rm.models import Reservation, ReservationState

__all__ = [
    "MAX_MARGIN_SECONDS",
    "MIN_CALL_SECONDS",
    "MIN_MARGIN_SECONDS",
    "CallStep",
    "Lease",
    "Plan",
    "lease_from_answer",
    "margin_for",
    "plan_call",
]

#: The shortest timeout worth giving a call; a call that would get less is not started.
MIN_CALL_SECONDS = 0.5
MIN_MARGIN_SECONDS = 1.0
MAX_MARGIN_SECONDS = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """A reservation's lease on the local monotonic clock."""

    reservation_id: str
    ttl_seconds: float
    #: Monotonic time after which the RM may have let the reservation expire (inf: committed).
    expires: float

    def remaining(self, *, now: float) -> float:
        return self.expires - now


class CallStep(enum.StrEnum):
    CALL = "Call"
    RENEW = "Renew"
    GIVE_UP = "GiveUp"


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    step: CallStep
    #: For CALL: the call's timeout in seconds (it ends ``margin`` before the lease).
    timeout: float = 0.0


def margin_for(ttl_seconds: float) -> float:
    """Seconds kept in hand before the expiry: the commit after the Binding, and clock skew.

    A sixth of the TTL, between 1 and 10 s (10 s for the default 60 s lease, 1 s for 5 s).
    """
    return min(MAX_MARGIN_SECONDS, max(MIN_MARGIN_SECONDS, ttl_seconds / 6))


def lease_from_answer(
    *, reservation: Reservation, ttl_seconds: float, sent_at: float, sent_at_wall: datetime
) -> Lease:
    """The lease of an RM answer to a request sent at ``sent_at`` (monotonic) / ``sent_at_wall``.

    The RM set ``expiresAt`` after it received the request, so measuring from the send time is
    conservative; the TTL caps it.  Committed reservations never expire.
    """
    if reservation.state is ReservationState.COMMITTED:
        return Lease(reservation_id=reservation.id, ttl_seconds=ttl_seconds, expires=math.inf)
    left = float(ttl_seconds)
    if reservation.expires_at is not None:
        left = min(left, (reservation.expires_at - sent_at_wall).total_seconds())
    return Lease(reservation_id=reservation.id, ttl_seconds=ttl_seconds, expires=sent_at + left)


def plan_call(*, lease: Lease, now: float, cap: float, needed: float, renewable: bool) -> Plan:
    """What to do before a call that may take up to ``cap`` seconds and should get ``needed``.

    ``renewable`` is False once the RM said it cannot renew (v1.0) or a renewal failed.
    """
    remaining = lease.remaining(now=now)
    usable = remaining - margin_for(lease.ttl_seconds)
    low = remaining < lease.ttl_seconds / 3 or usable < min(cap, max(needed, MIN_CALL_SECONDS))
    if low and renewable and math.isfinite(remaining):
        return Plan(CallStep.RENEW)
    if usable < MIN_CALL_SECONDS:
        return Plan(CallStep.GIVE_UP)
    return Plan(CallStep.CALL, timeout=min(cap, usable))
