"""One backoff for every retry in Bindery: a wait doubling from `initial`, capped at `maximum`.

kube-scheduler's per-pod backoff is the model (1 s, doubled per failed attempt, at most 10 s). The
same shape serves every loop that retries: the scheduling queue (per pod), the pod-group
coordinator (per group), the ResourceManager supervisor (build, probe, reconcile) and the
list-then-watch loop (per watch). There used to be a copy in each of them, with different exponent
bounds and different ideas of when the wait starts over; now a policy is a value and a loop that
retries one thing keeps a :class:`Backoff` (the policy plus its consecutive failures).

It sits below every room (it imports nothing of Bindery's), so the raw apiserver layer can use it.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Backoff", "BackoffPolicy"]

#: 2**60 already exceeds any sane maximum; bounding the exponent avoids huge floats.
_MAX_EXPONENT = 60


@dataclasses.dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """``initial`` doubled per further attempt, capped at ``maximum`` (pure: no state)."""

    initial: float = 1.0
    maximum: float = 10.0

    def delay(self, *, attempts: int) -> float:
        """The wait after `attempts` consecutive failures (0 for none)."""
        if attempts <= 0:
            return 0.0
        return min(self.initial * 2.0 ** min(attempts - 1, _MAX_EXPONENT), self.maximum)


@dataclasses.dataclass(slots=True)
class Backoff:
    """A policy and the consecutive failures so far, for a loop that retries one thing.

    ``next()`` counts a failure and returns the wait before the next try; a server's Retry-After is
    honoured when it is longer (still at most ``maximum``); ``reset()`` after any progress.
    """

    policy: BackoffPolicy = dataclasses.field(default_factory=BackoffPolicy)
    failures: int = 0

    def next(self, *, retry_after: float | None = None) -> float:
        self.failures += 1
        wait = self.policy.delay(attempts=self.failures)
        return min(max(wait, retry_after or 0.0), self.policy.maximum)

    def reset(self) -> None:
        self.failures = 0
