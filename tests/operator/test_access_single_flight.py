"""The review cache's single flight (bindery.adapters.access) when the request that asked goes away.

Requests with one new token share the first one's TokenReview. If that first request is cancelled
(its client hung up with handler cancellation on, the server closing), the others must not be
cancelled with it: they were not, and each still needs an answer.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from bindery.adapters.access import AccessReviewer, _User
from bindery.apiserver import ApiClient


class _Scripted(AccessReviewer):
    """Reviews answered by the test instead of an apiserver; the first TokenReview waits on `gate`."""

    def __init__(self) -> None:
        super().__init__(api=lambda: cast(ApiClient, object()))  # never used: reviews are scripted
        self.gate = asyncio.Event()
        self.asked = asyncio.Event()

    async def _authenticate(self, api: Any, token: str) -> _User | None:
        self.reviews["TokenReview"] += 1
        if self.reviews["TokenReview"] == 1:
            self.asked.set()
            await self.gate.wait()
        return _User(name="reader", uid="u-1", groups=(), extra=())

    async def _authorize(self, api: Any, user: _User, *, path: str, verb: str) -> tuple[bool, str]:
        self.reviews["SubjectAccessReview"] += 1
        return True, ""


async def test_a_cancelled_first_request_does_not_cancel_the_ones_sharing_its_review() -> None:
    access = _Scripted()
    first = asyncio.create_task(access.check(authorization="Bearer t", path="/debug/queue"))
    await asyncio.wait_for(access.asked.wait(), timeout=10)
    second = asyncio.create_task(access.check(authorization="Bearer t", path="/debug/queue"))
    await asyncio.sleep(0)  # the second request now waits on the first one's review
    first.cancel()
    decision = await asyncio.wait_for(second, timeout=10)
    assert first.cancelled()
    assert decision.status == 200, decision
    assert access.reviews["TokenReview"] == 2  # it asked for itself once the first went away


async def test_a_waiter_cancelled_itself_is_cancelled() -> None:
    """The converse: a request cancelled while it waits for another's review ends cancelled, and
    the review it waited for still answers the request that asked."""
    access = _Scripted()
    first = asyncio.create_task(access.check(authorization="Bearer t", path="/debug/queue"))
    await asyncio.wait_for(access.asked.wait(), timeout=10)
    second = asyncio.create_task(access.check(authorization="Bearer t", path="/debug/queue"))
    await asyncio.sleep(0)
    second.cancel()
    access.gate.set()
    decision = await asyncio.wait_for(first, timeout=10)
    assert decision.status == 200
    assert second.cancelled()
    assert access.reviews["TokenReview"] == 1
