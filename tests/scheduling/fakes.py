"""In-memory fakes of the scheduling ports, a fake RM client and a fake clock, for unit tests.

These fake *our* ports (``bindery.scheduling.ports``), not the Kubernetes API: they record every
call so tests can assert exactly which writes a cycle made.  The real adapters are tested against
the real apiserver in ``tests/operator``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from bindery.rm.models import Reservation, ReservationRequest, ReservationState
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection

BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def pod(
    name: str = "p",
    *,
    uid: str | None = None,
    priority: int = 0,
    age: int = 0,
    **fields: Any,
) -> PodInfo:
    """A pending pod; ``age`` is seconds after BASE_TIME it was created (higher = younger)."""
    fields.setdefault("requests", {"cpu": Decimal("0.1")})
    return PodInfo(
        uid=uid or f"uid-{name}",
        namespace="ns",
        name=name,
        scheduler_name="bindery",
        priority=priority,
        created=BASE_TIME + timedelta(seconds=age),
        **fields,
    )


class FakeClock:
    """A clock that only moves when told; ``wait`` resolves when ``advance`` passes its deadline."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._waiters: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def wait(self, event: asyncio.Event, *, delay: float | None) -> None:
        if event.is_set():
            return
        deadline = math.inf if delay is None else self.t + delay
        timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (deadline, timer)
        self._waiters.append(waiter)
        event_task: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        racing: list[asyncio.Future[Any]] = [event_task, timer]
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            event_task.cancel()
            self._waiters.remove(waiter)

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for deadline, timer in self._waiters:
            if deadline <= self.t and not timer.done():
                timer.set_result(None)


class Calls:
    """An ordered log of every call made on the fakes: ``(port.method, details)``."""

    def __init__(self) -> None:
        self.log: list[tuple[str, dict[str, Any]]] = []

    def record(self, what: str, **details: Any) -> None:
        self.log.append((what, details))

    def names(self) -> list[str]:
        return [what for what, _ in self.log]

    def count(self, what: str) -> int:
        return sum(1 for name, _ in self.log if name == what)


class FakeNodes:
    def __init__(self, calls: Calls, nodes: Mapping[str, NodeProjection] | None = None) -> None:
        self.calls = calls
        self.nodes: dict[str, NodeProjection] = dict(nodes or {})

    def get(self, name: str) -> NodeProjection | None:
        self.calls.record("nodes.get", name=name)
        return self.nodes.get(name)


class FakePods:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.pods: dict[str, PodInfo] = {}

    def get(self, uid: str) -> PodInfo | None:
        self.calls.record("pods.get", uid=uid)
        return self.pods.get(uid)


class FakeBinder:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.error: BaseException | None = None
        self.timeouts: list[float | None] = []  # per bind call

    async def bind(  # `timeout`: the Binding's own bound, derived from the lease
        self,
        *,
        pod: PodInfo,
        node: str,
        annotations: Mapping[str, str],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        self.calls.record("binder.bind", pod=pod.uid, node=node, annotations=dict(annotations))
        self.timeouts.append(timeout)
        if self.error is not None:
            raise self.error


class FakeEvents:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.error: BaseException | None = None
        self.timeouts: list[float | None] = []  # per scheduled call

    async def scheduled(
        self,
        *,
        pod: PodInfo,
        node: str,
        scheduler_name: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        self.calls.record("events.scheduled", pod=pod.uid, node=node, scheduler_name=scheduler_name)
        self.timeouts.append(timeout)
        if self.error is not None:
            raise self.error

    async def failed_scheduling(self, *, pod: PodInfo, message: str, scheduler_name: str) -> None:
        self.calls.record(
            "events.failed_scheduling", pod=pod.uid, message=message, scheduler_name=scheduler_name
        )
        if self.error is not None:
            raise self.error


class FakeConditions:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.error: BaseException | None = None

    async def pod_scheduled_false(self, *, pod: PodInfo, reason: str, message: str) -> None:
        self.calls.record("conditions.pod_scheduled_false", pod=pod.uid, reason=reason, message=message)
        if self.error is not None:
            raise self.error

    async def pod_scheduled_true(self, *, pod: PodInfo) -> None:
        self.calls.record("conditions.pod_scheduled_true", pod=pod.uid)
        if self.error is not None:
            raise self.error


class FakeRM:
    """A reservation client that places every pod on ``node`` unless told to fail."""

    def __init__(self, calls: Calls, *, node: str = "n1") -> None:
        self.calls = calls
        self.node = node
        self.reserve_error: BaseException | None = None
        self.reserve_errors: list[BaseException] = []  # raised first, one per reserve
        #: what list_reservations answers (filtered by pod UID)
        self.listed: list[Reservation] = []
        self.commit_error: BaseException | None = None
        self.commit_errors: list[BaseException] = []  # raised first, one per commit
        self.release_error: BaseException | None = None
        self.renew_error: BaseException | None = None
        self.requests: list[ReservationRequest] = []
        #: (operation, reservation id, pod UID passed) of every commit, release and renew
        self.pod_uids: list[tuple[str, str, str | None]] = []
        self._ids = itertools.count(1)

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.calls.record("rm.reserve", pod=request.pod.uid, key=request.idempotency_key)
        self.requests.append(request)
        if self.reserve_errors:
            raise self.reserve_errors.pop(0)
        if self.reserve_error is not None:
            raise self.reserve_error
        return Reservation(
            id=f"r{next(self._ids)}",
            node=self.node,
            state=ReservationState.RESERVED,
            pod_uid=request.pod.uid,
            scheduler_name=request.pod.scheduler_name,
        )

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation:
        self.calls.record("rm.commit", id=reservation_id)
        self.pod_uids.append(("commit", reservation_id, pod_uid))
        if self.commit_errors:
            raise self.commit_errors.pop(0)
        if self.commit_error is not None:
            raise self.commit_error
        return Reservation(
            id=reservation_id,
            node=self.node,
            state=ReservationState.COMMITTED,
            pod_uid=pod_uid or "",
            scheduler_name="",
        )

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None:
        self.calls.record("rm.release", id=reservation_id)
        self.pod_uids.append(("release", reservation_id, pod_uid))
        if self.release_error is not None:
            raise self.release_error

    async def renew(self, reservation_id: str, /, *, pod_uid: str, ttl_seconds: int) -> Reservation:
        self.calls.record("rm.renew", id=reservation_id, ttl=ttl_seconds)
        self.pod_uids.append(("renew", reservation_id, pod_uid))
        if self.renew_error is not None:
            raise self.renew_error
        return Reservation(
            id=reservation_id,
            node=self.node,
            state=ReservationState.RESERVED,
            pod_uid=pod_uid,
            scheduler_name="",
        )

    async def list_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None, pod_uid: str | None = None
    ) -> list[Reservation]:
        self.calls.record("rm.list", pod=pod_uid)
        return [r for r in self.listed if pod_uid is None or r.pod_uid == pod_uid]
