"""When the RM client sends the calls waiting for it as one ``POST /v1/batch`` (contract v1.1): pure.

Why: in a backlog every pod's cycle makes a reserve and a commit call, and each HTTP request costs
the operator (and the RM: an fsync per write) far more than the operation itself. Calls that many
cycles make at about the same moment are queued here and leave as one request.

The policy is *natural batching*, with no delay added to any call:

* a call is queued; if fewer than ``max_in_flight`` requests are in flight, the queue is sent at the
  loop's next iteration (so the calls made in the same iteration go together);
* otherwise it waits for an in-flight request to finish and goes with the next one: the busier the
  RM, the larger the batches, and an idle client sends each call as soon as it is made;
* at most ``max_operations`` calls go in one request; more wait for the next;
* *urgent* calls (reserves another cycle may be waiting for: the pods of a Deployment with rules
  wait on each other's; see :data:`URGENT_RESERVE`) go in a request of their own, and may use one
  slot past ``max_in_flight``: behind a batch of a backlog's commits, a reserve waited for a whole
  large batch to be carried out, then for its own, each chained pod paying it in turn
  (benchmarks/README.md). Urgent and other requests take turns when both
  are queued and a slot is free, so a stream of reserves never starves commits and releases
  (capacity given back).

A queue of exactly one call is sent as that call's ordinary single request (the caller decides:
:meth:`Coalescer.take` only says how many there are), so at low load the wire is what it was.

This module holds only the bookkeeping (a queue, a count of requests in flight, whether a send is
already scheduled), with no I/O and no event loop, so it is unit-testable; the client drives it.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["URGENT_RESERVE", "Coalescer", "reserve_urgency"]

#: Whether the reserve the current task sends may keep another cycle waiting (True unless the
#: caller says otherwise, see :func:`reserve_urgency`). A reserve nobody waits for (a pod without
#: inter-pod rules) goes with the commits and releases queued meanwhile: a request of its own
#: bought it nothing, and cost the RM one more request per few pods on a plain backlog.
URGENT_RESERVE: contextvars.ContextVar[bool] = contextvars.ContextVar("bindery_urgent_reserve", default=True)


@contextlib.contextmanager
def reserve_urgency(urgent: bool) -> Iterator[None]:
    """The reserves sent by the current task within the block are urgent, or not."""
    token = URGENT_RESERVE.set(urgent)
    try:
        yield
    finally:
        URGENT_RESERVE.reset(token)


_Item = TypeVar("_Item")


class Coalescer(Generic[_Item]):
    """The queue of calls waiting to be sent and the requests in flight.

    The driver calls :meth:`add` for each call and schedules a send (at the loop's next iteration)
    whenever a method returns True; the scheduled send calls :meth:`take` and sends what it gets,
    then :meth:`finish` once per non-empty take, when that request is over (answered or failed).
    ``live`` tells a queued item still worth sending from one whose caller went away (cancelled):
    those are dropped when taken, never sent.
    """

    def __init__(
        self,
        *,
        max_in_flight: int,
        max_operations: int,
        live: Callable[[_Item], bool] = lambda _: True,
        urgent: Callable[[_Item], bool] = lambda _: False,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if max_operations < 1:
            raise ValueError("max_operations must be at least 1")
        self.max_in_flight = max_in_flight
        self.max_operations = max_operations
        self._live = live
        self._urgent = urgent
        self._queue: collections.deque[_Item] = collections.deque()
        self._urgent_queue: collections.deque[_Item] = collections.deque()
        #: the last request taken was urgent: the others go next if they can
        self._urgent_last = False
        self._in_flight = 0
        self._scheduled = False

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        return len(self._queue) + len(self._urgent_queue)

    def add(self, item: _Item) -> bool:
        """Queue a call; True when the driver must schedule a send now."""
        (self._urgent_queue if self._urgent(item) else self._queue).append(item)
        return self._schedule()

    def take(self) -> tuple[list[_Item], bool]:
        """The scheduled send runs: the live items to send now (at most ``max_operations``), and
        whether another send must be scheduled at once (more are queued and a slot is free).

        A non-empty take occupies one in-flight slot until :meth:`finish`.
        """
        self._scheduled = False
        items: list[_Item] = []
        # Urgent calls alone (a small request, answered soon), the others only within
        # max_in_flight; when both wait and a slot is free, they take turns.
        others_may = self._others_may()
        if self._urgent_queue and not (others_may and self._urgent_last):
            queue = self._urgent_queue
            self._urgent_last = True
        elif others_may:
            queue = self._queue
            self._urgent_last = False
        else:
            return items, False
        while queue and len(items) < self.max_operations:
            item = queue.popleft()
            if self._live(item):
                items.append(item)
        if items:
            self._in_flight += 1
        return items, self._schedule()

    def finish(self) -> bool:
        """A request taken earlier is over; True when the driver must schedule a send now."""
        if self._in_flight <= 0:
            raise RuntimeError("finish() without a matching take(): the in-flight count would go negative")
        self._in_flight -= 1
        if not self._in_flight:
            self._urgent_last = False  # nothing in flight: no turn to give, reserves first again
        return self._schedule()

    def _others_may(self) -> bool:
        """Whether the other calls may leave now: within max_in_flight, or in the urgent slot when
        the last request was urgent (their turn)."""
        if not self._queue:
            return False
        limit = self.max_in_flight + (1 if self._urgent_last else 0)
        return self._in_flight < limit

    def _schedule(self) -> bool:
        if self._scheduled:
            return False
        urgent_may = bool(self._urgent_queue) and self._in_flight <= self.max_in_flight
        if not urgent_may and not self._others_may():
            return False
        self._scheduled = True
        return True
