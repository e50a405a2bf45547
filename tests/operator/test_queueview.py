"""The operator's read-only queue view (/debug/queue) as a pure function of its queues and pods."""

from __future__ import annotations

import dataclasses

from bindery.backoff import BackoffPolicy
from bindery.controller.queueview import QueueView
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.queue import SchedulingQueue
from tests.scheduling.fakes import FakeClock, pod


@dataclasses.dataclass
class Runner:
    queue: SchedulingQueue


class Pods(dict[str, object]):
    def uids(self) -> set[str]:
        return set(self)


def test_a_parked_pod_is_found_by_name_or_uid_with_its_next_attempt() -> None:
    clock = FakeClock(start=100.0)
    queue = SchedulingQueue(clock=clock, backoff=BackoffPolicy(initial=2.0, maximum=10.0))
    web, db = pod("web"), pod("db")
    pods = Pods({web.uid: web, db.uid: db})
    leading = [True]
    view = QueueView(
        runners=lambda: {"pool": Runner(queue)},
        pods=pods,  # type: ignore[arg-type]
        leading=lambda: leading[0],
        wall_clock=lambda: 1_767_225_600.0,  # 2026-01-01T00:00:00Z
    )
    queue.add(web)
    queue.pop_nowait()
    queue.done(web.uid, outcome=Outcome.UNSCHEDULABLE, retry_after=2.0)  # else parked 5 minutes
    clock.advance(0.5)
    status, answer = view.pod(namespace=web.namespace, name="web")
    assert status == 200
    assert answer == {
        "pod": web.key,
        "uid": web.uid,
        "leading": True,
        "resource_manager": "pool",
        "queue": "unschedulable",
        "attempts": 1,
        "next_attempt_in_seconds": 1.5,
        "next_attempt_at": "2026-01-01T00:00:01+00:00",
        "waits_for_capacity": True,
    }
    assert view.pod(namespace=web.namespace, name="web", uid=web.uid) == (200, answer)
    # The UID must match the name: a pod that replaced another under its name is not mistaken for it.
    status, other = view.pod(namespace=web.namespace, name="web", uid=db.uid)
    assert status == 404
    assert "no unbound pod of that name and UID" in other["message"]
    # Known but in no queue (its scheduler name is served by nobody).
    status, unqueued = view.pod(namespace=db.namespace, name="db")
    assert status == 404
    assert "no ResourceManager's queue holds it" in unqueued["message"]
    assert view.summary() == {
        "leading": True,
        "resource_managers": {"pool": {"active": 0, "backoff": 0, "unschedulable": 1, "in_flight": 0}},
    }
    leading[0] = False  # a standby says so: its attempts are not the real ones
    assert view.pod(namespace=web.namespace, name="web")[1]["leading"] is False
