"""Who may read the operator's debug views: the apiserver decides (TokenReview, then SubjectAccessReview).

The operator's `/debug/queue` names every pending pod it serves, in every tenant's namespace. As
kube-scheduler and controller-runtime protect their debug and metrics endpoints (delegated
authentication and authorization, `filters.WithAuthenticationAndAuthorization`), the caller sends a
bearer token; the apiserver says whose it is (TokenReview) and whether that user may `get` the
non-resource URL asked for (SubjectAccessReview), so an RBAC binding grants it like any other URL.

Answers are cached for `ttl` seconds (kube-scheduler's delegated defaults: 10 s, allowed and denied
alike) in a bounded table, so a scraper polling every second costs the apiserver two reviews per
ten seconds, not per request, and a flood of made-up tokens cannot grow memory. A failed review
(apiserver down, the operator lacking RBAC) is not cached: it is answered 503 and asked again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bindery.apiserver import ApiClient, ApiError, request

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
#: Seconds an answer is reused (kube-scheduler's --authentication-token-webhook-cache-ttl and
#: --authorization-webhook-cache-(un)authorized-ttl default to 10 s).
CACHE_TTL = 10.0
#: Entries per table: the oldest goes first, so unknown tokens cannot grow it without bound.
CACHE_SIZE = 1024
REVIEW_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True)
class Decision:
    """HTTP status to answer (200: go on) and, when refused, what happened and what to do."""

    status: int
    message: str = ""
    user: str = ""


@dataclasses.dataclass(frozen=True)
class _User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class _TTLCache:
    """A bounded table of answers, each valid for `ttl` seconds (the oldest entry is dropped first).

    `answer` asks at most once per key at a time: callers that arrive while the first one waits for
    the apiserver share its answer (or its error, which is not kept), so twenty parallel requests
    with a new token cost one review, not twenty. If the first one is cancelled, they ask again."""

    def __init__(self, *, ttl: float, size: int, clock: Callable[[], float]) -> None:
        self._ttl, self._size, self._clock = ttl, size, clock
        self._entries: collections.OrderedDict[Any, tuple[float, Any]] = collections.OrderedDict()
        self._asking: dict[Any, asyncio.Future[Any]] = {}

    async def answer(self, key: Any, ask: Callable[[], Awaitable[Any]]) -> Any:
        while True:
            known, value = self.get(key)
            if known:
                return value
            pending = self._asking.get(key)
            if pending is None:
                break
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not pending.cancelled() or (task is not None and task.cancelling()):
                    raise  # this request was cancelled, not the one it waited for
                # The request that asked went away (cancelled): this one still needs an answer.
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        try:
            value = await ask()
        except asyncio.CancelledError:
            future.cancel()  # the callers sharing it ask again (above) instead of being cancelled
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: a failure nobody else awaited is not logged as lost
            raise
        else:
            self.put(key, value)
            future.set_result(value)
            return value
        finally:
            del self._asking[key]

    def get(self, key: Any) -> tuple[bool, Any]:
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        if entry[0] <= self._clock():
            del self._entries[key]
            return False, None
        return True, entry[1]

    def put(self, key: Any, value: Any) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (self._clock() + self._ttl, value)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def bearer_token(header: str | None) -> str | None:
    """Pure: the token of an `Authorization: Bearer TOKEN` header, or None."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _grant(path: str) -> str:
    """Pure: the RBAC rule that lets a user read `path`, in words, with the chart's role for it."""
    if path == "/debug/queue" or path.startswith("/debug/queue/"):
        return (
            "nonResourceURLs [/debug/queue, /debug/queue/*] verbs [get] (the chart's ClusterRole "
            "<fullname>-debug-reader)"
        )
    return f"nonResourceURLs [{path}] verbs [get]"


def _how_to(path: str) -> str:
    return (
        'send a token, e.g. `curl -H "Authorization: Bearer $(kubectl create token SA -n NS)" URL`, '
        f"of an account bound to a ClusterRole granting {_grant(path)}"
    )


class AccessReviewer:
    """Asks the apiserver, as the operator, whether a bearer token may `get` a non-resource URL."""

    def __init__(
        self,
        *,
        api: Callable[[], ApiClient | None],
        ttl: float = CACHE_TTL,
        size: int = CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._users = _TTLCache(ttl=ttl, size=size, clock=clock)
        self._verdicts = _TTLCache(ttl=ttl, size=size, clock=clock)
        #: Reviews sent to the apiserver, by kind (the cache's effect is visible in a test).
        self.reviews: collections.Counter[str] = collections.Counter()

    def cached(self) -> tuple[int, int]:
        """Entries held: (token answers, access answers), each at most `size`."""
        return len(self._users), len(self._verdicts)

    async def check(self, *, authorization: str | None, path: str, verb: str = "get") -> Decision:
        token = bearer_token(authorization)
        how_to = _how_to(path)
        if token is None:
            return Decision(401, f"{path} needs a bearer token (no Authorization: Bearer header): {how_to}")
        api = self._api()
        if api is None:
            return Decision(503, "the operator is starting and cannot check tokens yet: try again shortly")
        key = hashlib.sha256(token.encode()).hexdigest()  # never keep the token itself
        try:
            user = await self._users.answer(key, lambda: self._authenticate(api, token))
        except ApiError as exc:
            return Decision(503, _review_failed("TokenReview", "tokenreviews.authentication.k8s.io", exc))
        if user is None:
            return Decision(
                401,
                f"the apiserver did not accept this bearer token (TokenReview: not authenticated; "
                f"expired, revoked or not a Kubernetes token): {how_to}",
            )
        assert isinstance(user, _User)
        verdict_key = (user, path, verb)
        try:
            verdict = await self._verdicts.answer(
                verdict_key, lambda: self._authorize(api, user, path=path, verb=verb)
            )
        except ApiError as exc:
            return Decision(
                503,
                _review_failed("SubjectAccessReview", "subjectaccessreviews.authorization.k8s.io", exc),
            )
        allowed, reason = verdict
        if not allowed:
            return Decision(
                403,
                f"user {user.name!r} may not {verb} {path}{f' ({reason})' if reason else ''}: bind it "
                f"to a ClusterRole granting {_grant(path)}, e.g. `kubectl create clusterrolebinding "
                "NAME --clusterrole=ROLE --serviceaccount=NS:SA`",
                user=user.name,
            )
        return Decision(200, user=user.name)

    async def _authenticate(self, api: ApiClient, token: str) -> _User | None:
        self.reviews["TokenReview"] += 1
        review = await request(
            api,
            "POST",
            TOKEN_REVIEWS,
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
            request_timeout=REVIEW_TIMEOUT,
            what="TokenReview",
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        extra = user.get("extra") or {}
        return _User(
            name=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items())),
        )

    async def _authorize(self, api: ApiClient, user: _User, *, path: str, verb: str) -> tuple[bool, str]:
        self.reviews["SubjectAccessReview"] += 1
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = await request(
            api,
            "POST",
            ACCESS_REVIEWS,
            body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
            request_timeout=REVIEW_TIMEOUT,
            what="SubjectAccessReview",
        )
        status = review.get("status") or {}
        return bool(status.get("allowed")) and not status.get("denied"), str(status.get("reason") or "")


def _review_failed(kind: str, resource: str, exc: ApiError) -> str:
    hint = (
        f"; the operator's identity needs create on {resource} (bindery.controller.startup.rbac)"
        if exc.status == 403
        else ""
    )
    return f"the operator could not check the token ({kind} failed: {exc}){hint}; try again shortly"
