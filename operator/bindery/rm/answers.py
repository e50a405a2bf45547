"""An RM's answers, to the values and errors each operation means, alone or inside a batch.

One function per operation maps an answer to its value or error, so a caller gets exactly what its
single call would have given whether the answer came alone or as one result of ``POST /v1/batch``.
Pure: no I/O, the client hands in what it read.
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass
from typing import Protocol, TypeVar

import httpx
import pydantic

from bindery.rm.errors import (
    ProblemType,
    RMConflict,
    RMError,
    RMPodMismatch,
    RMProtocolError,
    RMRejected,
    RMUnschedulable,
)
from bindery.rm.models import (
    BatchOperationResult,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Placement,
    PodIdentity,
    Problem,
    Reservation,
    ReservationRequest,
    ReservationState,
)

__all__ = [
    "Answer",
    "BatchedOutcome",
    "Outcome",
    "Oversized",
    "SingleOutcome",
    "commit_result",
    "decode",
    "error_of",
    "media_type",
    "parse_retry_after",
    "pod_name",
    "pod_query",
    "problem_error",
    "problem_or_none",
    "quote",
    "reference",
    "release_result",
    "reserve_result",
    "summarize",
    "without_nodes",
]

BodyModel = TypeVar("BodyModel", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes


class Oversized(RMProtocolError):
    """The answer is larger than ``max_response_bytes`` (a batch's answer falls back to single calls)."""


def parse_retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # HTTP-date form or garbage: fall back to our own backoff
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def media_type(headers: httpx.Headers) -> str:
    value: str = headers.get("content-type") or ""
    return value.split(";", 1)[0].strip().lower()


class Outcome(Protocol):
    """One operation's answer, whether it came alone (a single call) or inside a batch's results."""

    @property
    def status(self) -> int: ...

    def reservation(self, what: str) -> Reservation:
        """The answer's reservation, or RMProtocolError if it has none that fits the contract."""
        ...

    def error(self, what: str) -> RMError:
        """The error a non-success answer means (see :func:`problem_error`)."""
        ...


def decode(answer: Answer, model: type[BodyModel], what: str) -> BodyModel:
    """The answer's body as ``model``, or RMProtocolError if it is not JSON of that shape."""
    media = media_type(answer.headers)
    if media != "application/json":
        raise RMProtocolError(
            f"the RM answered {what} with HTTP {answer.status} but content type {media or 'none'!r}; "
            "the contract requires application/json"
        )
    try:
        return model.model_validate_json(answer.body)
    except pydantic.ValidationError as error:
        raise RMProtocolError(
            f"the RM's answer to {what} (HTTP {answer.status}) does not match the contract: "
            f"{summarize(error)}"
        ) from None


def problem_or_none(answer: Answer) -> Problem | None:
    """The answer's RFC 9457 problem, if it has a readable one."""
    if media_type(answer.headers) not in ("application/problem+json", "application/json"):
        return None
    try:
        return Problem.model_validate_json(answer.body)
    except pydantic.ValidationError:
        return None


def error_of(answer: Answer, what: str) -> RMError:
    """Map a non-success answer to the error type the scheduler acts on."""
    problem = problem_or_none(answer)
    if problem is None and media_type(answer.headers) in (
        "application/problem+json",
        "application/json",
    ):
        return RMProtocolError(
            f"the RM answered {what} with HTTP {answer.status} and a problem body that is not valid "
            "RFC 9457 JSON"
        )
    return problem_error(
        status=answer.status,
        problem=problem,
        retry_after=parse_retry_after(answer.headers.get("retry-after")),
        what=what,
    )


class SingleOutcome:
    """The answer to a call sent alone: its HTTP status, headers and body."""

    __slots__ = ("_answer",)

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    @property
    def status(self) -> int:
        return self._answer.status

    def reservation(self, what: str) -> Reservation:
        return decode(self._answer, Reservation, what)

    def error(self, what: str) -> RMError:
        return error_of(self._answer, what)


class BatchedOutcome:
    """One operation's result inside a batch's answer: the status and body its single call has."""

    __slots__ = ("_result",)

    def __init__(self, result: BatchOperationResult) -> None:
        self._result = result

    @property
    def status(self) -> int:
        return self._result.status

    def reservation(self, what: str) -> Reservation:
        if self._result.reservation is None:
            raise RMProtocolError(
                f"the RM answered {what} in a batch with HTTP {self._result.status} but no reservation; "
                "the contract requires the reservation a single call would have answered with"
            )
        return self._result.reservation

    def error(self, what: str) -> RMError:
        return problem_error(
            status=self._result.status, problem=self._result.problem, retry_after=None, what=what
        )


def problem_error(*, status: int, problem: Problem | None, retry_after: float | None, what: str) -> RMError:
    """The error type the scheduler acts on for a non-success status and its problem (if any);
    ``retry_after`` (the header of a single call's answer) stands in for the problem's own."""
    if status < 400:
        return RMProtocolError(f"the RM answered {what} with unexpected status {status}")
    detail = (problem.detail or problem.title) if problem is not None else None
    message = f"the RM rejected {what} with HTTP {status}" + (f": {detail}" if detail else "")
    raw = problem.model_dump(by_alias=True, exclude_none=True) if problem is not None else None
    if problem is not None and problem.type == ProblemType.UNSCHEDULABLE:
        wait = problem.retry_after_seconds if problem.retry_after_seconds is not None else retry_after
        reason = problem.reason or problem.detail or "the resource manager found no node that fits"
        return RMUnschedulable(message, reason=reason, retry_after=wait, plan=problem.preemption)
    if problem is not None and problem.type == ProblemType.POD_MISMATCH:
        return RMPodMismatch(message, status=status, problem=raw)
    if status == 409:
        return RMConflict(message, status=409, problem=raw)
    return RMRejected(message, status=status, problem=raw)


# -- one function per operation: its answer (alone or batched) to its value or error ----------


def reserve_result(request: ReservationRequest, outcome: Outcome) -> Reservation:
    if outcome.status in (200, 201):
        reservation = outcome.reservation("reserve")
        if reservation.pod_uid != request.pod.uid or not reservation.state.active:
            raise RMProtocolError(
                f"the RM answered reserve for pod {request.pod.uid} with reservation {reservation.id} "
                f"for pod {reservation.pod_uid} in state {reservation.state.value}; an RM must return "
                "the active reservation of the pod it was asked about"
            )
        return reservation
    error = outcome.error("reserve")
    if isinstance(error, RMUnschedulable):
        error.asked = request.preemption_policy  # as sent: the plan, if any, was asked for or not
    raise error


def commit_result(reservation_id: str, pod_uid: str | None, outcome: Outcome) -> Reservation:
    if outcome.status == 200:
        reservation = outcome.reservation("commit")
        if reservation.id != reservation_id or reservation.state is not ReservationState.COMMITTED:
            raise RMProtocolError(
                f"the RM answered commit of {reservation_id} with reservation {reservation.id} in state "
                f"{reservation.state.value}; expected it committed"
            )
        if pod_uid is not None and reservation.pod_uid != pod_uid:
            raise RMPodMismatch(
                f"the RM committed reservation {reservation_id} of pod {reservation.pod_uid} although "
                f"it was asked to commit it for pod {pod_uid}: the RM ignores podUid (it speaks "
                "contract v1.0); upgrade it to v1.1 so it refuses such a commit",
                status=409,
            )
        return reservation
    raise outcome.error("commit")


def release_result(outcome: Outcome) -> None:
    if outcome.status in (200, 202, 204, 404, 410):
        return
    raise outcome.error("release")


def reference(reservation_id: str, pod_uid: str | None) -> dict[str, str]:
    """A batched commit's or release's target: the single call's path id and ``podUid`` query."""
    return (
        {"reservationId": reservation_id}
        if pod_uid is None
        else {
            "reservationId": reservation_id,
            "podUid": pod_uid,
        }
    )


def pod_query(pod_uid: str | None) -> dict[str, str] | None:
    """The v1.1 ``podUid`` query parameter; none at all without a UID, so the request is v1.0's."""
    return None if pod_uid is None else {"podUid": pod_uid}


def quote(reservation_id: str) -> str:
    """Reservation ids are opaque: percent-encode them so they stay one path segment."""
    return urllib.parse.quote(reservation_id, safe="")


def summarize(error: pydantic.ValidationError) -> str:
    parts = [
        f"{'.'.join(str(p) for p in item['loc']) or 'body'}: {item['msg']}" for item in error.errors()[:3]
    ]
    more = f" (and {error.error_count() - 3} more)" if error.error_count() > 3 else ""
    return "; ".join(parts) + more


def without_nodes(placement: Placement, nodes: list[str]) -> Placement:
    """``placement`` with ``nodes`` excluded: ``metadata.name NotIn`` (one value each, as Kubernetes
    allows) ANDed into every required term that does not exclude the node so already."""
    excluded = [
        NodeSelectorRequirement(key="metadata.name", operator="NotIn", values=[node]) for node in nodes
    ]
    if not excluded:
        return placement
    terms = placement.required_node_affinity or [NodeSelectorTerm()]
    return placement.model_copy(
        update={
            "required_node_affinity": [
                term.model_copy(
                    update={
                        "match_fields": [
                            *term.match_fields,
                            *(r for r in excluded if r not in term.match_fields),  # not twice
                        ]
                    }
                )
                for term in terms
            ]
        }
    )


def pod_name(pod: PodIdentity) -> str:
    """``namespace/name`` of a request's pod, for messages."""
    return f"{pod.namespace}/{pod.name}"
