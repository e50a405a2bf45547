"""Errors raised by the RM client, and the stable problem ``type`` URIs of contract v1.

The scheduler needs to decide quickly what a failure means: retry later (``RMUnavailable``), report
the pod as unschedulable (``RMUnschedulable``), treat it as a bug on one side (``RMProtocolError``,
``RMRejected``), leave another pod's reservation alone (``RMPodMismatch``, v1.1), or fall back
because the RM's older minor version lacks the operation (``RMUnsupported``).  Every failure of the
client is one of these types; nothing lower-level escapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bindery.rm.models import PreemptionPlan

__all__ = [
    "PROBLEM_BASE",
    "ProblemType",
    "RMConflict",
    "RMError",
    "RMFeatureMissing",
    "RMGroupsUnsupported",
    "RMPodMismatch",
    "RMProtocolError",
    "RMRejected",
    "RMUnavailable",
    "RMUnschedulable",
    "RMUnsupported",
]

#: Problem type URIs are ``PROBLEM_BASE + kind``.  They are identifiers, not links to fetch.
PROBLEM_BASE = "urn:bindery:rm:v1:problem:"


class ProblemType:
    """The stable ``type`` of every problem a v1 RM may answer with."""

    INVALID_REQUEST = PROBLEM_BASE + "invalid-request"  # 400: malformed JSON, schema or value errors
    UNAUTHORIZED = PROBLEM_BASE + "unauthorized"  # 401: missing or wrong bearer token
    NOT_FOUND = PROBLEM_BASE + "not-found"  # 404: unknown reservation id or path
    METHOD_NOT_ALLOWED = PROBLEM_BASE + "method-not-allowed"  # 405
    IDEMPOTENCY_KEY_REUSED = PROBLEM_BASE + "idempotency-key-reused"  # 409: same key, different request
    UNSCHEDULABLE = PROBLEM_BASE + "unschedulable"  # 409: no node fits now
    RESERVATION_NOT_ACTIVE = PROBLEM_BASE + "reservation-not-active"  # 409: commit after release/expiry
    POD_MISMATCH = PROBLEM_BASE + "pod-mismatch"  # 409 (v1.1): the reservation belongs to another pod
    PLAN_NOT_ACTIVE = PROBLEM_BASE + "plan-not-active"  # 409 (v1.2): confirm of a used/cancelled/expired plan
    # 409 on POST /v1/reservation-groups (v1.1) is ``unschedulable`` or ``idempotency-key-reused`` too.
    PAYLOAD_TOO_LARGE = PROBLEM_BASE + "payload-too-large"  # 413
    UNSUPPORTED_MEDIA_TYPE = PROBLEM_BASE + "unsupported-media-type"  # 415
    RATE_LIMITED = PROBLEM_BASE + "rate-limited"  # 429 with Retry-After
    INTERNAL = PROBLEM_BASE + "internal"  # 500
    UNAVAILABLE = PROBLEM_BASE + "unavailable"  # 503 with Retry-After


class RMError(Exception):
    """Base of every error the RM client raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RMUnschedulable(RMError):
    """The RM answered that nothing fits now; ``reason`` is human-readable, for the pod's event.

    ``plan`` (contract v1.2, feature ``preemption``) is the RM's proposal to make room by evicting
    lower-priority pods, when the request asked for one and the RM found one. ``asked`` is the
    ``preemptionPolicy`` the request carried as sent (None: left out, so no plan was asked for):
    the client sets it, because only it knows what negotiation left of the request, and a plan
    nobody asked for is never carried out.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        retry_after: float | None = None,
        plan: PreemptionPlan | None = None,
        asked: str | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after
        self.plan = plan
        self.asked = asked


class RMFeatureMissing(RMUnschedulable):
    """The pod needs a contract feature the RM does not list (e.g. a ``Gt`` toleration without
    ``toleration-comparisons``): refused before any call, as unschedulable, since an upgraded RM may
    take it later, but never reported as the RM being full."""


class RMUnavailable(RMError):
    """The RM could not be reached or asked us to back off (after retries, or the circuit is open)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RMUnauthorized(RMUnavailable):
    """The RM refused the bearer token (401) even after the client re-read it: nothing will work
    until the token is fixed, so the readiness probe reports it (Ready=False, reason TokenRefused)."""


class RMProtocolError(RMError):
    """The RM answered something the contract does not allow: malformed, truncated, oversized, wrong type."""


class RMRejected(RMError):
    """The RM rejected the request (a 4xx other than unschedulable); ``problem`` is its problem body."""

    def __init__(self, message: str, *, status: int, problem: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.problem = problem or {}


class RMConflict(RMRejected):
    """409: the idempotency key was reused for a different request, or the reservation is not active."""


class RMPodMismatch(RMConflict):
    """409 ``pod-mismatch`` (v1.1): the reservation belongs to another pod, so the RM changed nothing.

    A commit or release that names a pod UID is refused when the reservation is someone else's: a
    pod that copied another pod's reservation annotation must not free (or pin) that pod's capacity.
    It is final: retrying the same call gets the same answer. It is a conflict, so code that treats
    every 409 as "retrying cannot help" handles it correctly without knowing v1.1.
    """


class RMUnsupported(RMError):
    """The RM speaks an older minor version of v1 without this operation (e.g. renew on a v1.0 RM).

    Not a failure of the RM: the caller falls back to what v1.0 offers (for renew: re-reserve with
    the same idempotency key after the lease, or commit sooner).
    """


class RMGroupsUnsupported(RMUnsupported):
    """The RM has no reservation groups (it answers 404 on ``/v1/reservation-groups``): a v1.0 RM, or
    a v1.1 RM that does not offer them.

    Unlike renew there is no fallback: reserving a gang pod by pod would let half of it hold
    capacity while the rest waits, which is what groups exist to prevent. The caller reports the
    group as unsupported by that RM instead of placing it.
    """
