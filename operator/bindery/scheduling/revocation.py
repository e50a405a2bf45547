"""What Bindery does when an RM takes a reservation back (contract v1.2 feature ``revocation``).

Pure decisions only; :mod:`bindery.controller.reservations.revocation` reads the pods and acts. A batch system
ends allocations by itself (an administrator's ``scancel``, preemption by a higher QOS, a time
limit, a node lost). The pod bound on such a reservation may still run, on capacity the RM now
hands to others: by the ResourceManager's ``spec.onRevoked`` Bindery evicts it (the default: the
workload's controller makes a new pod, which is scheduled through the RM again) or only warns
(the site drains such pods its own way). A pod that is gone, finished, being deleted, replaced
under its name, bound elsewhere or bound with another reservation needs nothing: the revocation is
only acknowledged. A pod not bound yet may still be bound on the reservation (a cycle between reserve
and bind, a pod group waiting for its members), as reconciliation assumes of any pending pod: the
revocation waits for a later pass (the cycle's own release acknowledges it if it is not bound).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from bindery.rm.models import Reservation
from bindery.scheduling.framework import RESERVATION_ANNOTATION

__all__ = ["OnRevoked", "RevokedAction", "revoked_action", "revoked_note"]

_TERMINAL_PHASES = ("Succeeded", "Failed")


class OnRevoked(enum.StrEnum):
    """``spec.onRevoked`` of a ResourceManager."""

    EVICT = "Evict"
    WARN = "Warn"


class RevokedAction(enum.StrEnum):
    EVICT = "evict"  # the Eviction API, a Warning event, then acknowledge
    WARN = "warn"  # a Warning event, then acknowledge; the pod keeps running
    ACKNOWLEDGE = "acknowledge"  # no running pod uses it: only release it at the RM
    WAIT = "wait"  # its pod is not bound yet and may still be bound on it: decide in a later pass


def revoked_action(
    *,
    reservation: Reservation,
    pod: Mapping[str, Any] | None,
    policy: OnRevoked,
    named_active: bool = True,
) -> RevokedAction:
    """Pure: what to do about one revoked reservation, given its pod's current body (None: none).

    Only the pod the reservation was made for (same UID), bound to the reservation's node (with
    this reservation, when its annotation names one) and neither finished nor being deleted, still
    uses it; that pod not bound yet may still be (WAIT); anything else is acknowledged silently.
    `named_active`: whether the reservation the pod's annotation names is active at the RM. When it
    is not, this reservation may be the one a reconcile pass made for the pod after the RM lost
    that one (:mod:`bindery.controller.reservations.restore`; the annotation keeps the lost id), so
    the pod uses this one: it is acted on.
    """
    if pod is None:
        return RevokedAction.ACKNOWLEDGE
    metadata = pod.get("metadata") or {}
    if metadata.get("uid") != reservation.pod_uid or metadata.get("deletionTimestamp"):
        return RevokedAction.ACKNOWLEDGE
    if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
        return RevokedAction.ACKNOWLEDGE
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return RevokedAction.WAIT
    bound_with = (metadata.get("annotations") or {}).get(RESERVATION_ANNOTATION)
    if node != reservation.node or (bound_with and bound_with != reservation.id and named_active):
        return RevokedAction.ACKNOWLEDGE
    return RevokedAction.EVICT if policy is OnRevoked.EVICT else RevokedAction.WARN


def revoked_note(*, reservation: Reservation, resource_manager: str, action: RevokedAction) -> str:
    """Pure: the Warning event's text: what happened, the RM's own reason, and what follows."""
    reason = reservation.revoked_reason or "no reason given"
    when = f" at {reservation.revoked_at.isoformat()}" if reservation.revoked_at else ""
    head = (
        f"ResourceManager {resource_manager} revoked reservation {reservation.id} on node "
        f"{reservation.node}{when}: {reason}."
    )
    if action is RevokedAction.EVICT:
        return (
            head + " The pod is evicted (spec.onRevoked: Evict); its controller, if any, creates a new one."
        )
    return head + (
        " The pod keeps running (spec.onRevoked: Warn) on capacity the resource manager no longer "
        "counts for it, so other pods may be placed on it: drain or delete the pod."
    )
