"""decide / failure_from_exception: reason, release, report and requeue for every failure kind."""

from __future__ import annotations

import pytest

from bindery.rm.errors import (
    RMConflict,
    RMError,
    RMFeatureMissing,
    RMProtocolError,
    RMRejected,
    RMUnavailable,
    RMUnschedulable,
)
from bindery.scheduling.decisions import (
    Failure,
    FailureKind,
    Outcome,
    Stage,
    decide,
    failure_from_exception,
)
from bindery.scheduling.ports import BindConflict, BindError, PodGone

EXPECTED: dict[FailureKind, tuple[Outcome, bool, str]] = {
    FailureKind.RM_UNSCHEDULABLE: (Outcome.UNSCHEDULABLE, True, "Unschedulable"),
    FailureKind.PLUGIN_UNSCHEDULABLE: (Outcome.UNSCHEDULABLE, True, "Unschedulable"),
    FailureKind.RM_UNAVAILABLE: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.RM_PROTOCOL_ERROR: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.RM_REJECTED: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.INVALID_REQUEST: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.NODE_CHECK: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.PLUGIN_ERROR: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.BIND_CONFLICT: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.BIND_ERROR: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.BIND_UNCONFIRMED: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.LEASE_EXPIRED: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.INTERNAL: (Outcome.ERROR, True, "SchedulerError"),
    FailureKind.BOUND_ELSEWHERE: (Outcome.DROPPED, False, "SchedulerError"),
    FailureKind.POD_GONE: (Outcome.DROPPED, False, "SchedulerError"),
    FailureKind.ALREADY_BOUND: (Outcome.DROPPED, False, "SchedulerError"),
}


def test_every_kind_has_an_expected_decision() -> None:
    assert set(EXPECTED) == set(FailureKind)


@pytest.mark.parametrize("kind", list(FailureKind))
def test_decision_table(kind: FailureKind) -> None:
    decision = decide(failure=Failure(kind=kind, message="why", stage=Stage.BIND, retry_after=3.0))
    outcome, report, reason = EXPECTED[kind]
    assert (decision.outcome, decision.report) == (outcome, report)
    if report:
        assert decision.condition_reason == reason
    # A pod that is not bound by us never keeps its reservation; one that may be, or is, does.
    assert decision.release is (kind not in (FailureKind.BIND_UNCONFIRMED, FailureKind.ALREADY_BOUND))
    assert decision.message == "why"
    assert decision.retry_after == 3.0


def classify(error: BaseException, *, node: str | None = "n1", stage: Stage = Stage.RESERVE) -> Failure:
    return failure_from_exception(error=error, stage=stage, rm_name="pool", node=node)


def test_rm_errors() -> None:
    unschedulable = classify(RMUnschedulable("409", reason="0/2 nodes are available.", retry_after=5.0))
    assert unschedulable.kind is FailureKind.RM_UNSCHEDULABLE
    assert (
        unschedulable.message == 'resource manager "pool" has no room for the pod: 0/2 nodes are available.'
    )
    assert unschedulable.retry_after == 5.0
    unavailable = classify(RMUnavailable("503 after 3 attempts", retry_after=2.0))
    assert (unavailable.kind, unavailable.retry_after) == (FailureKind.RM_UNAVAILABLE, 2.0)
    assert unavailable.message == 'resource manager "pool" is unavailable: 503 after 3 attempts'
    assert classify(RMProtocolError("truncated body")).kind is FailureKind.RM_PROTOCOL_ERROR
    rejected = classify(RMConflict("key reused", status=409))
    assert rejected.kind is FailureKind.RM_REJECTED
    assert rejected.message == 'resource manager "pool" rejected the request (HTTP 409): key reused'
    assert classify(RMRejected("forbidden", status=403)).kind is FailureKind.RM_REJECTED
    assert classify(RMError("something else")).kind is FailureKind.RM_PROTOCOL_ERROR


def test_a_feature_the_rm_lacks_is_unschedulable_without_claiming_it_is_full() -> None:
    """A Gt toleration for an RM without toleration-comparisons: the pod waits like an unschedulable
    one (until something changes, the RM may be upgraded), but the message must not say "no room"."""
    reason = "pod ns/p has a toleration with operator Gt or Lt (spec.tolerations), which ..."
    failure = classify(RMFeatureMissing(reason, reason=reason))
    assert failure.kind is FailureKind.RM_UNSCHEDULABLE
    assert failure.message == f'resource manager "pool" cannot take the pod: {reason}'


def test_bind_errors() -> None:
    elsewhere = classify(BindConflict("already assigned", current_node="n2"), stage=Stage.BIND)
    assert elsewhere.kind is FailureKind.BOUND_ELSEWHERE
    assert elsewhere.message == 'the pod was bound to node "n2" by someone else'
    unknown = classify(BindConflict("UID precondition failed"), stage=Stage.BIND)
    assert unknown.kind is FailureKind.BIND_CONFLICT
    assert unknown.message == "UID precondition failed"  # the adapter's sentence, verbatim
    sentence = "binding pod ns/p to node 'n1' failed: HTTP 403: forbidden"
    failed = classify(BindError(sentence, status=403), stage=Stage.BIND)
    assert failed.kind is FailureKind.BIND_ERROR
    assert failed.message == sentence
    for status in (500, 502, 503, 504):  # e.g. "etcdserver: request timed out": it may have been applied
        maybe = classify(BindError(f"binding failed: HTTP {status}", status=status), stage=Stage.BIND)
        assert maybe.kind is FailureKind.BIND_UNCONFIRMED, status
    assert classify(PodGone(), stage=Stage.BIND).kind is FailureKind.POD_GONE
    unanswered = classify(BindError("binding pod ns/p timed out"), stage=Stage.BIND)
    assert unanswered.kind is FailureKind.BIND_UNCONFIRMED
    assert unanswered.message == (
        "binding pod ns/p timed out; "
        "its reservation is kept until Bindery sees whether the Binding was applied"
    )


def test_unexpected_exceptions_are_internal_errors_naming_the_plugin() -> None:
    failure = failure_from_exception(
        error=KeyError("x"), stage=Stage.PRE_BIND, rm_name="pool", node="n1", plugin="quota"
    )
    assert failure.kind is FailureKind.INTERNAL
    assert failure.message == "internal error in PreBind plugin \"quota\": KeyError: 'x'"
    assert failure.plugin == "quota"
