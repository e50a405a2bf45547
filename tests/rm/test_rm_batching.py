"""The pure coalescing policy of the RM client (bindery.rm.batching): when queued calls leave."""

from __future__ import annotations

import pytest

from bindery.rm.batching import Coalescer


def test_first_call_schedules_a_send_and_later_ones_join_it() -> None:
    coalescer: Coalescer[int] = Coalescer(max_in_flight=2, max_operations=10)
    assert coalescer.add(1) is True  # the driver schedules one send
    assert coalescer.add(2) is False  # already scheduled: goes with it
    assert coalescer.add(3) is False
    assert coalescer.take() == ([1, 2, 3], False)
    assert coalescer.in_flight == 1


def test_calls_wait_while_the_in_flight_limit_is_reached_then_leave_together() -> None:
    coalescer: Coalescer[int] = Coalescer(max_in_flight=2, max_operations=10)
    coalescer.add(1)
    assert coalescer.take() == ([1], False)
    assert coalescer.add(2) is True  # one in flight < 2: send at once
    assert coalescer.take() == ([2], False)
    assert coalescer.in_flight == 2
    assert [coalescer.add(n) for n in (3, 4, 5)] == [False, False, False]  # both slots busy
    assert coalescer.finish() is True  # a slot frees: what waited leaves as one
    assert coalescer.take() == ([3, 4, 5], False)
    assert coalescer.finish() is False  # nothing queued
    assert coalescer.finish() is False
    assert coalescer.in_flight == 0


def test_at_most_max_operations_per_send_and_the_rest_is_scheduled_again() -> None:
    coalescer: Coalescer[int] = Coalescer(max_in_flight=2, max_operations=3)
    for n in range(7):
        coalescer.add(n)
    assert coalescer.take() == ([0, 1, 2], True)  # a slot is still free: another send at once
    assert coalescer.take() == ([3, 4, 5], False)  # both slots busy now
    assert coalescer.finish() is True
    assert coalescer.take() == ([6], False)


def test_dead_items_are_dropped_and_an_all_dead_take_holds_no_slot() -> None:
    cancelled = {2, 3}
    coalescer: Coalescer[int] = Coalescer(
        max_in_flight=1, max_operations=2, live=lambda n: n not in cancelled
    )
    for n in (1, 2, 3, 4):
        coalescer.add(n)
    assert coalescer.take() == ([1, 4], False)  # dead ones do not count against max_operations
    assert coalescer.finish() is False
    coalescer.add(2)
    assert coalescer.take() == ([], False)
    assert coalescer.in_flight == 0
    assert coalescer.add(5) is True  # still free to send


def test_finish_without_take_is_a_bug() -> None:
    coalescer: Coalescer[int] = Coalescer(max_in_flight=1, max_operations=1)
    with pytest.raises(RuntimeError, match="without a matching take"):
        coalescer.finish()


@pytest.mark.parametrize(("in_flight", "operations"), [(0, 1), (1, 0)])
def test_limits_must_be_positive(in_flight: int, operations: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Coalescer(max_in_flight=in_flight, max_operations=operations)


@pytest.mark.parametrize("max_in_flight", [1, 2])
def test_a_steady_stream_of_reserves_does_not_starve_a_commit(max_in_flight: int) -> None:
    """Reserves are urgent (their own requests, one slot past the limit). With one arriving each
    time a request ends, the ordinary calls still get their turn: a queued commit (or a release,
    capacity given back) leaves within a round or two instead of never."""
    coalescer: Coalescer[str] = Coalescer(
        max_in_flight=max_in_flight, max_operations=100, urgent=lambda item: item.startswith("reserve")
    )
    out: list[list[str]] = []

    def pump(scheduled: bool) -> None:
        while scheduled:
            items, scheduled = coalescer.take()
            if items:
                out.append(items)

    for n in range(max_in_flight + 1):  # every slot taken by a reserve, the urgent one too
        pump(coalescer.add(f"reserve-p{n}"))
    assert coalescer.in_flight == max_in_flight + 1
    pump(coalescer.add("commit-A"))
    for n in range(20):
        out.pop(0)  # the oldest request is answered
        pump(coalescer.finish())
        pump(coalescer.add(f"reserve-{n}"))  # and another pod's reserve comes
        if any("commit-A" in items for items in out):
            break
    assert n <= 1, f"commit-A still queued after {n + 1} rounds"
    assert coalescer.in_flight <= max_in_flight + 1
