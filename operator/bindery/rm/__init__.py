"""The resource-manager contract v1: typed models, errors and the async client Bindery uses."""

from bindery.rm.errors import RMConflict, RMError, RMProtocolError, RMRejected, RMUnavailable, RMUnschedulable
from bindery.rm.models import (
    Placement,
    PodIdentity,
    Problem,
    Reservation,
    ReservationList,
    ReservationRequest,
    ReservationState,
)

__all__ = [
    "Placement",
    "PodIdentity",
    "Problem",
    "RMConflict",
    "RMError",
    "RMProtocolError",
    "RMRejected",
    "RMUnavailable",
    "RMUnschedulable",
    "Reservation",
    "ReservationList",
    "ReservationRequest",
    "ReservationState",
]
