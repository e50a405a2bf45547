"""What every server of contract v1 answers the same way: problems, body limits, batches, list queries.

The reference RM and the Slurm adapter are two servers of one contract. Their answers to a bad
request (RFC 9457 problems, the 400 of a body that fails validation, the 413 of one too large, a
batch's envelope, the query of ``GET /v1/reservations``) are the contract's, not theirs, so they
are written once here and an RM built on this kit cannot drift from the conformance kit's reading.
What differs between servers (cursors, which states a caller may see, the store) stays theirs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from aiohttp import web

from bindery.rm.errors import ProblemType
from bindery.rm.models import MAX_BATCH_OPERATIONS

__all__ = [
    "KINDS",
    "LIST_FILTERS",
    "LIST_PARAMS",
    "TITLES",
    "ListQuery",
    "batch_operations",
    "is_json",
    "list_query",
    "problem",
    "problem_body",
    "read_capped",
    "validation_errors",
]

TITLES = {
    400: "Invalid request",
    401: "Unauthorized",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Payload too large",
    415: "Unsupported media type",
    429: "Too many requests",
    500: "Internal error",
    503: "Unavailable",
}
#: The problem type of an HTTP error raised by aiohttp itself (no route, a body over its limit, …).
KINDS = {
    400: ProblemType.INVALID_REQUEST,
    401: ProblemType.UNAUTHORIZED,
    404: ProblemType.NOT_FOUND,
    405: ProblemType.METHOD_NOT_ALLOWED,
    413: ProblemType.PAYLOAD_TOO_LARGE,
    415: ProblemType.UNSUPPORTED_MEDIA_TYPE,
    429: ProblemType.RATE_LIMITED,
    503: ProblemType.UNAVAILABLE,
}
#: The filters of ``GET /v1/reservations`` (``clusterId`` only where the server offers the feature).
LIST_FILTERS = ("schedulerName", "podUid", "groupId", "clusterId")
#: The query parameters of ``GET /v1/reservations`` every server takes.
LIST_PARAMS = frozenset({"schedulerName", "state", "podUid", "groupId", "limit", "cursor"})
_MAX_PAGE = 500


def problem_body(
    status: int, kind: str, detail: str, *, title: str | None = None, **extensions: Any
) -> dict[str, Any]:
    """An RFC 9457 problem document; extensions that are None are left out."""
    body = {"type": kind, "title": title or TITLES.get(status, "Error"), "status": status, "detail": detail}
    body.update({key: value for key, value in extensions.items() if value is not None})
    return body


def problem(
    status: int,
    kind: str,
    detail: str,
    *,
    title: str | None = None,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> web.Response:
    """An RFC 9457 problem response."""
    body = problem_body(status, kind, detail, title=title, **extensions)
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/problem+json", headers=headers
    )


def validation_errors(
    error: pydantic.ValidationError, *, at: tuple[str | int, ...] = ()
) -> tuple[str, list[dict[str, str]]]:
    """The detail and ``errors`` of a 400; ``at`` is where the validated value sits in the body."""
    items = [
        {"location": "/".join(str(part) for part in (*at, *item["loc"])) or "body", "message": item["msg"]}
        for item in error.errors(include_url=False, include_input=False)
    ][:20]
    if any(item["type"] == "json_invalid" for item in error.errors(include_url=False)):
        return "the body is not valid JSON", items
    first = items[0] if items else {"location": "/".join(map(str, at)) or "body", "message": "invalid"}
    return f"{first['location']}: {first['message']}", items or [first]


def is_json(request: web.Request) -> bool:
    """Whether the request says its body is JSON (the contract's only body type)."""
    return request.content_type == "application/json"


async def read_capped(request: web.Request, *, limit: int, advice: str) -> bytes | web.Response:
    """The body, or a 413 problem once it exceeds ``limit``; read as it streams, so a client that
    sends too much is stopped at the limit rather than after the whole body."""
    too_large = problem(
        413, ProblemType.PAYLOAD_TOO_LARGE, f"the body exceeds the limit of {limit} bytes {advice}"
    )
    if request.content_length is not None and request.content_length > limit:
        return too_large
    body = bytearray()
    while chunk := await request.content.readany():
        body.extend(chunk)
        if len(body) > limit:
            return too_large
    return bytes(body)


def batch_operations(body: bytes) -> list[Any] | web.Response:
    """The operations of a ``POST /v1/batch`` body, or the 400 that fails the whole batch (a wrong
    envelope); each operation is validated by the server on its own."""
    try:
        document = json.loads(body)
    except ValueError:
        return problem(400, ProblemType.INVALID_REQUEST, "the body is not valid JSON")
    if not isinstance(document, dict) or not isinstance(document.get("operations"), list):
        return problem(
            400,
            ProblemType.INVALID_REQUEST,
            'a batch is a JSON object {"operations": [...]} with a list of operations',
            errors=[{"location": "operations", "message": "Field required (a list)"}],
        )
    unknown = sorted(set(document) - {"operations"})
    if unknown:
        return problem(
            400,
            ProblemType.INVALID_REQUEST,
            f"{unknown[0]}: Extra inputs are not permitted",
            errors=[{"location": name, "message": "Extra inputs are not permitted"} for name in unknown],
        )
    operations: list[Any] = document["operations"]
    if not 1 <= len(operations) <= MAX_BATCH_OPERATIONS:
        return problem(
            400,
            ProblemType.INVALID_REQUEST,
            f"a batch carries 1 to {MAX_BATCH_OPERATIONS} operations, this one {len(operations)}; "
            "split it into several batches",
            errors=[{"location": "operations", "message": f"1 to {MAX_BATCH_OPERATIONS} items"}],
        )
    return operations


@dataclass(frozen=True)
class ListQuery:
    """A checked query of ``GET /v1/reservations``: its page size and filters. ``state`` and
    ``cursor`` are as given (None if absent): which states a caller sees and what a cursor looks
    like are the server's."""

    limit: int
    filters: Mapping[str, str]
    state: str | None
    cursor: str | None


def list_query(query: Mapping[str, str], *, cluster_ids: bool) -> ListQuery | web.Response:
    """``query`` checked against the contract, or the 400 to answer; ``cluster_ids``: the server
    offers the ``cluster-id`` feature (else ``clusterId`` is an unknown parameter, as in v1.1)."""
    unknown = sorted(set(query) - (LIST_PARAMS | ({"clusterId"} if cluster_ids else set())))
    if unknown:
        return problem(400, ProblemType.INVALID_REQUEST, f"unknown query parameters {unknown}")
    try:
        limit = int(query.get("limit", "100"))
        if not 1 <= limit <= _MAX_PAGE:
            raise ValueError
    except ValueError:
        return problem(400, ProblemType.INVALID_REQUEST, f"limit must be an integer from 1 to {_MAX_PAGE}")
    for name in LIST_FILTERS:
        if name in query and not 1 <= len(query[name]) <= 253:
            return problem(400, ProblemType.INVALID_REQUEST, f"{name} must be 1 to 253 characters long")
    return ListQuery(
        limit=limit,
        filters={name: query[name] for name in LIST_FILTERS if name in query},
        state=query.get("state"),
        cursor=query.get("cursor"),
    )
