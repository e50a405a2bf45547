"""EventThrottle: first report at once, repeats at most once per interval with a count."""

from __future__ import annotations

from bindery.scheduling.throttle import EventThrottle


class Now:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_first_is_reported_repeats_are_suppressed_then_summarised() -> None:
    now = Now()
    throttle = EventThrottle(interval=60.0, clock=now)
    assert throttle.admit(uid="u", key="k", message="m1") == "m1"
    now.t = 30
    assert throttle.admit(uid="u", key="k", message="m2") is None
    now.t = 59.9
    assert throttle.admit(uid="u", key="k", message="m3") is None
    now.t = 60
    assert throttle.admit(uid="u", key="k", message="m4") == "m4 (and 2 similar failures not reported)"
    now.t = 121
    assert throttle.admit(uid="u", key="k", message="m5") == "m5"
    now.t = 122
    assert throttle.admit(uid="u", key="k", message="m6") is None
    now.t = 190
    assert throttle.admit(uid="u", key="k", message="m7") == "m7 (and 1 similar failure not reported)"


def test_other_keys_and_pods_are_independent() -> None:
    throttle = EventThrottle(interval=60.0, clock=Now())
    assert throttle.admit(uid="u", key="a", message="m") == "m"
    assert throttle.admit(uid="u", key="b", message="m") == "m"
    assert throttle.admit(uid="v", key="a", message="m") == "m"
    assert throttle.admit(uid="u", key="a", message="m") is None


def test_forget_and_bounded_memory() -> None:
    throttle = EventThrottle(interval=60.0, max_tracked=3, clock=Now())
    for uid in "abcd":
        throttle.admit(uid=uid, key="k", message="m")
    assert len(throttle) == 3
    assert throttle.admit(uid="a", key="k", message="m") == "m"  # evicted, so reported again
    throttle.forget("a")
    assert throttle.admit(uid="a", key="k", message="m") == "m"
