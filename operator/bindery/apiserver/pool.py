"""How many connections the operator's ApiClient may hold to the apiserver, and why that many.

kubernetes_asyncio sizes its aiohttp connector once, from ``Configuration.connection_pool_maxsize``
(100 in the version pinned; ``cpu_count() × 5`` in others), and Bindery's long watches (unbound
and bound pods of every claimed scheduler name, in each watched namespace, and namespace labels)
hold one connection each for minutes. With enough names the watches alone took the whole pool and
every Binding, event and status write waited for a watch to end; with a large ``maxInFlight`` the
cycles queued for connections behind each other whatever the RM's speed.

:class:`ConnectionPool` says what the pool is for: the watches, one connection per cycle that may
be in flight (``maxInFlight`` of every ResourceManager summed) up to :data:`CYCLE_CONNECTIONS`, and
headroom for the rest (reads, leases, events, reconcile lists). The runtime computes it whenever
the ResourceManagers change and :meth:`ConnectionPool.apply` resizes the live connector.
"""

from __future__ import annotations

import dataclasses

from bindery.apiserver.api import ApiClient

__all__ = ["CYCLE_CONNECTIONS", "HEADROOM", "ConnectionPool"]

#: Connections beyond the watches and the cycles: leader lease renewals, reconcile lists, pod reads,
#: events and conditions written outside a cycle, the namespace and sweep lists.
HEADROOM = 16

#: Connections the cycles' writes (Bindings, events, conditions) share, however many cycles are in
#: flight. More do not bind faster: the apiserver serves a user's requests a few dozen at a time
#: (priority and fairness seats) and answers 429 to what waits too long in its queues. With one
#: connection per cycle (maxInFlight 256) a 3,000-pod backlog on the dev plane lost 5-10 % of its
#: Bindings and events to 429 and bound 20-40 % slower (benchmarks/README.md, issue 19's budgets);
#: with the 100 connections kubernetes_asyncio had before, none. A cycle waiting here for a
#: connection waits in the operator, not in the apiserver's queues; that wait counts against the
#: request's own timeout (aiohttp's ``total`` covers taking a connection from the pool), e.g. a
#: Binding's 30 s (``bindery.adapters.binder.BIND_TIMEOUT_SECONDS``).
CYCLE_CONNECTIONS = 64


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionPool:
    """The apiserver connections the operator may open at once (``size``), by what uses them."""

    #: long-lived watch connections (each holds one for up to its timeout, then reconnects)
    watches: int = 0
    #: scheduling cycles that may be in flight at once; their writes share up to CYCLE_CONNECTIONS
    in_flight: int = 0
    headroom: int = HEADROOM

    def __post_init__(self) -> None:
        if min(self.watches, self.in_flight, self.headroom) < 0:
            raise ValueError(f"a connection pool cannot be sized with a negative count: {self}")

    @property
    def size(self) -> int:
        return self.watches + min(self.in_flight, CYCLE_CONNECTIONS) + max(self.headroom, 1)

    def apply(self, api: ApiClient) -> int:
        """Resize `api`'s connector to ``size`` now; returns the limit it had.

        aiohttp has no public setter for a connector's limit, so this sets the attribute its
        `_available_connections` reads, then wakes as many queued requests as the pool grew by
        (aiohttp wakes one per released connection otherwise). A smaller pool closes nothing:
        connections in use finish, and new requests wait until fewer are in use than the limit.
        """
        connector = api.rest_client.pool_manager.connector
        before = int(connector.limit)
        connector._limit = self.size  # no public setter (see the docstring)
        for _ in range(max(self.size - before, 0)):
            connector._release_waiter()
        return before
