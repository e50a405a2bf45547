"""What the coordinator holds for one pod group, shared by placement and recovery.

In a module of its own so that placement and recovery, which the coordinator calls, read it without
importing the coordinator back.
"""

from __future__ import annotations

import asyncio
import dataclasses

from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.queue import WakeOn

__all__ = ["GroupState"]


@dataclasses.dataclass(slots=True)
class GroupState:
    """What the coordinator holds for one pod group: its pending members and its task.

    Placement and recovery update it too (the try count, the backoff, members bound or gone).
    """

    pending: dict[str, PodInfo] = dataclasses.field(default_factory=dict)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    #: Number of group reservations released so far (a new idempotency key for each new try).
    attempt: int = 0
    #: The first pass after a start looks for reservations left by an earlier process.
    recovered: bool = False
    waiting_since: float | None = None
    #: Consecutive failed passes: the backoff's count (the profile's BackoffPolicy gives the wait).
    failures: int = 0
    #: The RM's last answer was "no room": released capacity is worth a new try at once.
    waits_for_capacity: bool = False
    #: The members' inter-pod rules refused the last try: the placed-pod changes that may lift that
    #: (:meth:`PodGroupCoordinator.wake`), and when the try's backoff ends (no wake comes sooner).
    rules: WakeOn | None = None
    retry_at: float = 0.0
    timer: asyncio.TimerHandle | None = None
    #: The last pass decided to wait for its PodGroup or members: a change of them wakes it.
    waiting: bool = False
    #: Something the group waits for changed during the pass under way: look again at once.
    changed: bool = False
