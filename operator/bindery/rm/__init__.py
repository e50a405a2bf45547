"""The resource-manager contract v1: typed models, errors and the async client Bindery uses."""

from bindery.rm.errors import (
    RMConflict,
    RMError,
    RMGroupsUnsupported,
    RMProtocolError,
    RMRejected,
    RMUnavailable,
    RMUnschedulable,
    RMUnsupported,
)
from bindery.rm.models import (
    GroupIdentity,
    GroupMemberRequest,
    Placement,
    PodIdentity,
    Problem,
    Reservation,
    ReservationGroup,
    ReservationGroupRequest,
    ReservationList,
    ReservationRequest,
    ReservationState,
    TopologyConstraint,
)

__all__ = [
    "GroupIdentity",
    "GroupMemberRequest",
    "Placement",
    "PodIdentity",
    "Problem",
    "RMConflict",
    "RMError",
    "RMGroupsUnsupported",
    "RMProtocolError",
    "RMRejected",
    "RMUnavailable",
    "RMUnschedulable",
    "RMUnsupported",
    "Reservation",
    "ReservationGroup",
    "ReservationGroupRequest",
    "ReservationList",
    "ReservationRequest",
    "ReservationState",
    "TopologyConstraint",
]
