"""What to do after a scheduling cycle fails: a pure table, so every path is unit-tested.

Almost every failure after a reservation ends the same way (release the reservation; the one
exception is a Binding that got no answer, see ``_KEEP_RESERVATION``), but the rest differs, and
the differences are what a user observes, so they follow kube-scheduler:

* **Condition reason.**  ``Unschedulable`` only when the pod does not fit now: the RM found no
  room, or a PreBind plugin rejected the pod.  Cluster autoscalers and dashboards read that reason
  as "add capacity", so anything that is a fault rather than a lack of room is ``SchedulerError``:
  the RM unreachable or answering nonsense, the apiserver refusing the Binding, and also the RM
  choosing a node that fails our checks (the pod may fit fine; the RM's view is wrong).
* **Where the pod goes.**  ``Unschedulable`` pods are parked in the queue's unschedulable pool and
  moved back early when capacity may have been freed; errors back off (1 s doubling to 10 s) and
  are retried regardless of capacity, because capacity was not the problem.
* **Silence.**  A pod that was deleted, or bound by someone else, is not a failure to report: its
  reservation is released and it leaves the queue without an event or condition (kube-scheduler
  likewise does not requeue a pod whose informer copy already has a node).
"""

from __future__ import annotations

import dataclasses
import enum

from bindery.rm.errors import (
    RMError,
    RMFeatureMissing,
    RMProtocolError,
    RMRejected,
    RMUnavailable,
    RMUnschedulable,
)
from bindery.rm.models import PreemptionPlan
from bindery.scheduling.events import Requeue
from bindery.scheduling.ports import BindConflict, BindError, PodGone

__all__ = [
    "REASON_SCHEDULER_ERROR",
    "REASON_UNSCHEDULABLE",
    "Decision",
    "Failure",
    "FailureKind",
    "Outcome",
    "Stage",
    "decide",
    "failure_from_exception",
]

REASON_UNSCHEDULABLE = "Unschedulable"
REASON_SCHEDULER_ERROR = "SchedulerError"


class Stage(enum.StrEnum):
    """The extension point a failure happened in (for messages and logs)."""

    PRE_FILTER = "PreFilter"
    RESERVE = "Reserve"
    PRE_BIND = "PreBind"
    BIND = "Bind"
    POST_BIND = "PostBind"


class FailureKind(enum.StrEnum):
    RM_UNSCHEDULABLE = "RMUnschedulable"  # the RM found no room
    RM_UNAVAILABLE = "RMUnavailable"  # unreachable, timed out, 5xx/429 after retries, circuit open
    RM_PROTOCOL_ERROR = "RMProtocolError"  # answered outside the contract
    RM_REJECTED = "RMRejected"  # any other 4xx
    INVALID_REQUEST = "InvalidRequest"  # the pod cannot be put into a contract v1 request
    NODE_CHECK = "NodeCheckFailed"  # the RM's node failed the pre-bind node checks
    PLUGIN_UNSCHEDULABLE = "PluginUnschedulable"  # a plugin said the pod does not fit
    PLUGIN_ERROR = "PluginError"  # a plugin failed or raised
    BIND_CONFLICT = "BindConflict"  # 409 on the Binding without a known current node
    BIND_ERROR = "BindError"  # the apiserver refused the Binding otherwise
    BIND_UNCONFIRMED = "BindUnconfirmed"  # no answer to the Binding: it may have been applied
    LEASE_EXPIRED = "LeaseExpired"  # no Binding sent: the reservation may expire first (no renew)
    BOUND_ELSEWHERE = "BoundElsewhere"  # 409: someone else bound the pod to another node
    POD_GONE = "PodGone"  # deleted, recreated with another UID, or left the pending set
    ALREADY_BOUND = "AlreadyBound"  # the reserve answered a committed reservation: bound earlier
    INTERNAL = "InternalError"  # a bug: an exception nobody expected


class Outcome(enum.StrEnum):
    """What the queue does with the pod after its cycle (``SchedulingQueue.done``)."""

    BOUND = "Bound"  # forget it
    UNSCHEDULABLE = "Unschedulable"  # park until capacity may have freed or its backoff expires
    ERROR = "Error"  # retry after backoff
    DROPPED = "Dropped"  # gone or bound elsewhere: forget it


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """Why a cycle failed, phrased for the pod's event (``message``)."""

    kind: FailureKind
    message: str
    stage: Stage
    retry_after: float | None = None
    plugin: str = ""
    #: The RM's preemption plan for the pod (contract v1.2), on an RM_UNSCHEDULABLE failure.
    plan: PreemptionPlan | None = None
    #: The ``preemptionPolicy`` the reserve that got ``plan`` carried as sent (None: none).
    plan_asked: str | None = None
    #: The events that can make the pod schedulable, as the plugin that refused it declared them
    #: (its ``events_to_register``; the cycle fills it in). None: it comes back on its backoff.
    requeue: Requeue | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What the cycle does about a :class:`Failure`."""

    outcome: Outcome
    #: Release the reservation (if one is held).  True for every failure except an unanswered
    #: Binding: a pod that is not bound must not hold capacity, and one that was bound by someone
    #: else holds capacity elsewhere.
    release: bool
    #: Write a FailedScheduling event and the PodScheduled=False condition.
    report: bool
    condition_reason: str
    message: str
    retry_after: float | None = None


_UNSCHEDULABLE = (Outcome.UNSCHEDULABLE, True, REASON_UNSCHEDULABLE)
_ERROR = (Outcome.ERROR, True, REASON_SCHEDULER_ERROR)
_SILENT = (Outcome.DROPPED, False, REASON_SCHEDULER_ERROR)

#: Failures after which the reservation is kept: the pod may be bound after all, and releasing the
#: capacity of a running pod is worse than letting an unused reservation expire.  If the pod is in
#: fact still pending, its next cycle gets the same reservation back (same idempotency key).
_KEEP_RESERVATION = frozenset({FailureKind.BIND_UNCONFIRMED, FailureKind.ALREADY_BOUND})

_TABLE: dict[FailureKind, tuple[Outcome, bool, str]] = {
    FailureKind.RM_UNSCHEDULABLE: _UNSCHEDULABLE,
    FailureKind.PLUGIN_UNSCHEDULABLE: _UNSCHEDULABLE,
    FailureKind.RM_UNAVAILABLE: _ERROR,
    FailureKind.RM_PROTOCOL_ERROR: _ERROR,
    FailureKind.RM_REJECTED: _ERROR,
    FailureKind.INVALID_REQUEST: _ERROR,
    FailureKind.NODE_CHECK: _ERROR,
    FailureKind.PLUGIN_ERROR: _ERROR,
    FailureKind.BIND_CONFLICT: _ERROR,
    FailureKind.BIND_ERROR: _ERROR,
    FailureKind.BIND_UNCONFIRMED: _ERROR,
    FailureKind.LEASE_EXPIRED: _ERROR,
    FailureKind.INTERNAL: _ERROR,
    FailureKind.BOUND_ELSEWHERE: _SILENT,
    FailureKind.ALREADY_BOUND: _SILENT,
    FailureKind.POD_GONE: _SILENT,
}


def decide(*, failure: Failure) -> Decision:
    """The decision for ``failure`` (see the module docstring for the rationale)."""
    outcome, report, reason = _TABLE[failure.kind]
    return Decision(
        outcome=outcome,
        release=failure.kind not in _KEEP_RESERVATION,
        report=report,
        condition_reason=reason,
        message=failure.message,
        retry_after=failure.retry_after,
    )


def failure_from_exception(
    *, error: BaseException, stage: Stage, rm_name: str, node: str | None, plugin: str = ""
) -> Failure:
    """Classify an exception raised by the RM client, a port or a plugin."""
    kind, message, retry_after = _classify(error=error, rm_name=rm_name, node=node)
    if kind is FailureKind.INTERNAL:
        where = f'{stage} plugin "{plugin}"' if plugin else str(stage)
        message = f"internal error in {where}: {message}"
    plan = error.plan if isinstance(error, RMUnschedulable) else None
    asked = error.asked if isinstance(error, RMUnschedulable) else None
    return Failure(
        kind=kind,
        message=message,
        stage=stage,
        retry_after=retry_after,
        plugin=plugin,
        plan=plan,
        plan_asked=asked,
    )


#: Binding answers that do not say the write was refused: the apiserver may have stored it (an etcd
#: timeout answers 500 "etcdserver: request timed out", the apiserver's own deadline 504, a proxy
#: in front of it 502/503). Like no answer at all, they keep the reservation until the pod is seen.
_MAYBE_APPLIED = frozenset({500, 502, 503, 504})


def _classify(
    *, error: BaseException, rm_name: str, node: str | None
) -> tuple[FailureKind, str, float | None]:
    rm = f'resource manager "{rm_name}"'
    if isinstance(error, RMFeatureMissing):
        return FailureKind.RM_UNSCHEDULABLE, f"{rm} cannot take the pod: {error.reason}", error.retry_after
    if isinstance(error, RMUnschedulable):
        return (
            FailureKind.RM_UNSCHEDULABLE,
            f"{rm} has no room for the pod: {error.reason}",
            error.retry_after,
        )
    if isinstance(error, RMUnavailable):
        return FailureKind.RM_UNAVAILABLE, f"{rm} is unavailable: {error.message}", error.retry_after
    if isinstance(error, RMProtocolError):
        return FailureKind.RM_PROTOCOL_ERROR, f"{rm} answered outside contract v1: {error.message}", None
    if isinstance(error, RMRejected):
        return (
            FailureKind.RM_REJECTED,
            f"{rm} rejected the request (HTTP {error.status}): {error.message}",
            None,
        )
    if isinstance(error, RMError):
        return FailureKind.RM_PROTOCOL_ERROR, f"{rm} failed: {error.message}", None
    if isinstance(error, PodGone):
        return FailureKind.POD_GONE, error.message, None
    if isinstance(error, BindConflict):
        if error.current_node is not None and error.current_node != node:
            return (
                FailureKind.BOUND_ELSEWHERE,
                f'the pod was bound to node "{error.current_node}" by someone else',
                None,
            )
        return FailureKind.BIND_CONFLICT, error.message, None
    if isinstance(error, BindError):
        if error.status is None or error.status in _MAYBE_APPLIED:
            kept = "; its reservation is kept until Bindery sees whether the Binding was applied"
            return FailureKind.BIND_UNCONFIRMED, f"{error.message}{kept}", None
        return FailureKind.BIND_ERROR, error.message, None
    return FailureKind.INTERNAL, f"{type(error).__name__}: {error}", None
