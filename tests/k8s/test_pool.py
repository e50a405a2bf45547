"""How many apiserver connections the operator's pool allows (bindery.apiserver.pool), without a plane.

Issue 19's plain-pod budget (benchmarks/README.md) found the pool, sized one connection per cycle
in flight (maxInFlight 256), letting the operator send ~280 requests at once: the apiserver's
priority and fairness answered 429 to 5-10 % of the Bindings and events of a 3,000-pod backlog, and
each refused Binding cost the pod a second cycle. The watches keep a connection each; the cycles'
writes share a bounded number.
"""

from __future__ import annotations

from bindery.apiserver.pool import CYCLE_CONNECTIONS, HEADROOM, ConnectionPool


def test_every_watch_has_its_own_connection() -> None:
    assert ConnectionPool(watches=163, in_flight=8).size == 163 + 8 + HEADROOM


def test_cycles_in_flight_share_a_bounded_number_of_connections() -> None:
    pool = ConnectionPool(watches=5, in_flight=256)
    assert pool.size == 5 + CYCLE_CONNECTIONS + HEADROOM
    assert pool.in_flight == 256  # what the ResourceManagers allow is still said as it is


def test_fewer_cycles_than_the_bound_get_one_each() -> None:
    assert (
        ConnectionPool(watches=5, in_flight=CYCLE_CONNECTIONS - 1).size
        == 5 + CYCLE_CONNECTIONS - 1 + HEADROOM
    )
