"""Rate-limit repeated FailedScheduling events for the same pod.

A pod that cannot be placed is retried every few seconds (backoff caps at 10 s), and every attempt
fails the same way.  Writing an event each time floods the apiserver (and etcd, and anyone watching
events) with copies of one fact.  kube-scheduler relies on client-go's event correlator for this;
Bindery writes events.k8s.io events itself, so it throttles them here.

Repeats are recognised by ``(pod UID, key)``, where the key is the *kind* of failure rather than
the exact text: an RM's reason often embeds counts (``0/12 nodes are available: 10 Insufficient
cpu``) that change between attempts without telling the user anything new.  A new kind of failure
is reported at once; repeats of a known kind are reported at most once per ``interval``, with the
latest text and how many were suppressed.  Pure logic on an injectable clock; bounded memory.
Keys are indexed by pod UID, so forgetting a pod (every departure calls it) costs its own keys only.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["EventThrottle"]


@dataclasses.dataclass(slots=True)
class _Seen:
    emitted_at: float
    suppressed: int = 0


class EventThrottle:
    """Decides whether a failure event is written now; remembers at most ``max_tracked`` keys."""

    def __init__(
        self,
        *,
        interval: float = 60.0,
        max_tracked: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = interval
        self._max_tracked = max_tracked
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._keys: dict[str, set[str]] = {}  # uid -> its keys in _seen

    def admit(self, *, uid: str, key: str, message: str) -> str | None:
        """The event message to write now, or ``None`` to suppress this repeat."""
        now = self._clock()
        seen = self._seen.get((uid, key))
        if seen is not None and now - seen.emitted_at < self._interval:
            seen.suppressed += 1
            return None
        if seen is None:
            self._seen[(uid, key)] = _Seen(emitted_at=now)
            self._keys.setdefault(uid, set()).add(key)
            while len(self._seen) > self._max_tracked:
                (old_uid, old_key), _ = self._seen.popitem(last=False)
                self._unindex(old_uid, old_key)
            return message
        self._seen.move_to_end((uid, key))
        repeats, seen.suppressed, seen.emitted_at = seen.suppressed, 0, now
        if repeats:
            return f"{message} (and {repeats} similar failure{'s' if repeats > 1 else ''} not reported)"
        return message

    def forget(self, uid: str) -> None:
        """The pod was bound or deleted: drop its history."""
        for key in self._keys.pop(uid, ()):
            del self._seen[(uid, key)]

    def _unindex(self, uid: str, key: str) -> None:
        keys = self._keys.get(uid)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys[uid]

    def __len__(self) -> int:
        return len(self._seen)
