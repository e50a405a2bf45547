"""One hierarchy for every failure of a request to the apiserver.

Before this module a failed request surfaced as ``kubernetes_asyncio``'s ``ApiException`` (any
status), as ``RuntimeError`` (raw reads that checked the status themselves), as an aiohttp error or
a ``TimeoutError`` (transport), or as ``None`` (a 404 some helpers swallowed): every caller decided
on its own what was worth a retry. Now the raw layer translates each of them, once, in
:func:`translate`, and callers catch what they mean::

    ApiError                      anything the apiserver layer raises
    ├── Unavailable               worth a retry later: transport errors, timeouts, 429, 5xx
    │                             (``retry_after`` when the server said so)
    └── Rejected                  the server answered and said no; retrying the same request won't help
        ├── BadRequest            400 (a malformed request; watch errors without a code land here too)
        ├── Unauthorized          401
        ├── Forbidden             403 (RBAC)
        ├── NotFound              404
        ├── Conflict              409 (a stale resourceVersion, AlreadyExists, a bound pod)
        ├── Gone                  410 (an expired resourceVersion: relist)
        ├── TooLarge              413
        └── Invalid               422 (validation)

Every error carries the ``status``, ``reason`` and ``message`` of the apiserver's ``Status`` body
where there was one (``reason`` is the machine-readable word: ``NotFound``, ``AlreadyExists``,
``Expired``...). The pattern is Kopf's ``check_response`` (one place that reads the Status body) and
httpx's ``_exceptions.py`` (a tree drawn where it is defined).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

__all__ = [
    "ApiError",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "NotFound",
    "Rejected",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "from_status",
    "translate",
]


class ApiError(Exception):
    """Base of every error of the apiserver layer. ``status`` is 0 when no HTTP answer came."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "", what: str = "") -> None:
        super().__init__(f"{what}: {message}" if what else message)
        self.status = status
        self.reason = reason
        self.message = message


class Unavailable(ApiError):
    """No answer, or an answer that asks to come back later (429, 5xx)."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str = "",
        what: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=status, reason=reason, what=what)
        self.retry_after = retry_after


class Rejected(ApiError):
    """The server understood the request and refused it."""


class BadRequest(Rejected):
    """400."""


class Unauthorized(Rejected):
    """401: the credentials are wrong or expired."""


class Forbidden(Rejected):
    """403: RBAC does not allow it."""


class NotFound(Rejected):
    """404: the object (or its namespace, or the resource type) does not exist."""


class Conflict(Rejected):
    """409: AlreadyExists, a stale resourceVersion, a pod already bound."""


class Gone(Rejected):
    """410: the resourceVersion asked for was compacted away (``Expired``): relist."""


class TooLarge(Rejected):
    """413: the request body is over the apiserver's limit."""


class Invalid(Rejected):
    """422: the object failed validation."""


_REJECTED: Mapping[int, type[Rejected]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: TooLarge,
    422: Invalid,
}


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = (headers or {}).get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from the apiserver, and the backoff covers it


def _status_fields(body: bytes | str | Mapping[str, Any] | None) -> tuple[str, str]:
    """(reason, message) of a Status body; the body's start as the message if it is not one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        text = body
        try:
            body = json.loads(text) if text.strip() else None
        except ValueError:
            return "", text[:500]
    if isinstance(body, Mapping):
        return str(body.get("reason") or ""), str(body.get("message") or "")
    return "", ""


def from_status(
    status: int,
    body: bytes | str | Mapping[str, Any] | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    what: str = "",
) -> ApiError:
    """Pure: the error of an HTTP answer `status` (not 2xx) with its Status `body`.

    A watch's ERROR event carries a Status object too: pass its ``code`` and the object.
    """
    reason, message = _status_fields(body)
    message = message or reason or f"HTTP {status}"
    if status == 429 or status >= 500:
        return Unavailable(
            message, status=status, reason=reason, what=what, retry_after=_retry_after(headers)
        )
    kind = _REJECTED.get(status, BadRequest if 400 <= status < 500 else Rejected)
    return kind(message, status=status, reason=reason, what=what)


def translate(error: BaseException, *, what: str = "") -> ApiError:
    """The :class:`ApiError` for whatever a request raised (an ApiError passes through unchanged).

    ``ApiException`` by its status (0, the client's own refusal, is Unavailable only if it has no
    HTTP answer at all, which is what status 0 means there); aiohttp's errors, ``TimeoutError`` and
    ``OSError`` as :class:`Unavailable`. Anything else is not an apiserver failure: the caller
    should let it propagate, so this raises ``TypeError`` for it.
    """
    if isinstance(error, ApiError):
        return error
    if isinstance(error, ApiException):
        if not error.status:
            return Unavailable(str(error.reason or error), what=what)
        return from_status(int(error.status), error.body, headers=error.headers, what=what)
    if isinstance(error, TimeoutError | aiohttp.ClientError | OSError):
        return Unavailable(f"{type(error).__name__}: {error}".rstrip(": "), what=what)
    raise TypeError(f"not an apiserver failure: {error!r}")
