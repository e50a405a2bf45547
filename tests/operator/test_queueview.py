"""The operator's read-only queue view (/debug/queue) as a pure function of its queues and pods."""

from __future__ import annotations

import dataclasses

from bindery.backoff import BackoffPolicy
from bindery.controller.preemption import PendingPlan
from bindery.controller.queueview import QueueView
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.queue import SchedulingQueue
from tests.scheduling.fakes import FakeClock, pod


@dataclasses.dataclass
class Runner:
    queue: SchedulingQueue
    #: uid → (seconds left, why): preemptors backing off after a failed plan.
    backoffs: dict[str, tuple[float, str]] = dataclasses.field(default_factory=dict)

    #: uid → the confirmed plan it waits on.
    plans: dict[str, PendingPlan] = dataclasses.field(default_factory=dict)

    def preemption_backoff(self, uid: str) -> tuple[float, str] | None:
        return self.backoffs.get(uid)

    def preemption_plan(self, uid: str) -> PendingPlan | None:
        return self.plans.get(uid)


class Pods(dict[str, PodInfo]):
    """The remembered pods, with the name index of bindery.adapters.UnboundPods; no way to scan them."""

    def find(self, *, namespace: str, name: str) -> PodInfo | None:
        return next((p for p in self.values() if (p.namespace, p.name) == (namespace, name)), None)

    def uids(self) -> set[str]:
        raise AssertionError("a lookup scanned every remembered pod")


def test_a_parked_pod_is_found_by_name_or_uid_with_its_next_attempt() -> None:
    clock = FakeClock(start=100.0)
    queue = SchedulingQueue(clock=clock, backoff=BackoffPolicy(initial=2.0, maximum=10.0))
    web, db = pod("web"), pod("db")
    pods = Pods({web.uid: web, db.uid: db})
    leading = [True]
    view = QueueView(
        runners=lambda: {"pool": Runner(queue)},
        pods=pods,
        leading=lambda: leading[0],
        served=lambda name: name == "bindery",
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
    # Known, of a served name, but in no queue (refused by a namespaceSelector, say).
    status, unqueued = view.pod(namespace=db.namespace, name="db")
    assert status == 404
    assert "no ResourceManager's queue does" in unqueued["message"]
    assert view.summary() == {
        "leading": True,
        "resource_managers": {
            "pool": {"active": 0, "backoff": 0, "unschedulable": 1, "in_flight": 0, "binding": 0}
        },
    }
    leading[0] = False  # a standby says so: its attempts are not the real ones
    assert view.pod(namespace=web.namespace, name="web")[1]["leading"] is False


def test_a_pod_of_a_scheduler_name_nobody_serves_is_not_disclosed() -> None:
    """Issue 20, scenario 9: whoever reaches the view learns nothing of other schedulers' pods, not
    even that they exist: the same 404 as for a pod that does not exist, by name or by UID."""
    queue = SchedulingQueue(clock=FakeClock(start=0.0), backoff=BackoffPolicy(initial=1.0, maximum=1.0))
    theirs = dataclasses.replace(pod("theirs"), scheduler_name="default-scheduler")
    view = QueueView(
        runners=lambda: {"pool": Runner(queue)},
        pods=Pods({theirs.uid: theirs}),
        leading=lambda: True,
        served=lambda name: name == "bindery",
    )
    for uid in (None, theirs.uid):
        status, body = view.pod(namespace="ns", name="theirs", uid=uid)
        _, unknown = view.pod(namespace="ns", name="nobody", uid=uid)
        assert status == 404
        assert body["message"] == unknown["message"]
        assert theirs.scheduler_name not in str(body)
    assert view.pod(namespace="ns", name="theirs")[1]["uid"] is None


def test_a_preemptor_backing_off_after_a_failed_plan_says_until_when_and_why() -> None:
    """The back-off lives only in the operator's memory: the view serves it beside the queue."""
    clock = FakeClock(start=100.0)
    queue = SchedulingQueue(clock=clock, backoff=BackoffPolicy(initial=2.0, maximum=10.0))
    high = pod("high")
    why = "evicting victim ns/low on node a would exceed PodDisruptionBudget ns/keep"
    runner = Runner(queue, backoffs={high.uid: (7.5, why)})
    view = QueueView(
        runners=lambda: {"pool": runner},
        pods=Pods({high.uid: high}),
        leading=lambda: True,
        served=lambda name: True,
        wall_clock=lambda: 1_767_225_600.0,  # 2026-01-01T00:00:00Z
    )
    queue.add(high)
    queue.pop_nowait()
    queue.done(high.uid, outcome=Outcome.UNSCHEDULABLE, retry_after=2.0)
    status, answer = view.pod(namespace=high.namespace, name="high")
    assert status == 200
    assert answer["preemption_backoff"] == {
        "seconds": 7.5,
        "until": "2026-01-01T00:00:07+00:00",
        "reason": why,
    }
    runner.backoffs.clear()  # it may preempt again: nothing said
    assert "preemption_backoff" not in view.pod(namespace=high.namespace, name="high")[1]


def test_a_preemptor_waiting_on_its_plan_shows_the_plan_its_victims_and_the_lease_end() -> None:
    """The confirmed plan lives only in the operator's memory and the RM's database."""
    clock = FakeClock(start=100.0)
    queue = SchedulingQueue(clock=clock, backoff=BackoffPolicy(initial=2.0, maximum=10.0))
    high = pod("high")
    plan = PendingPlan(
        plan_id="p-1",
        node="a",
        victims=(("ns/low-0", "terminating"), ("ns/low-1", "gone")),
        waits_for="victims",
        lease_left=42.0,
    )
    runner = Runner(queue, plans={high.uid: plan})
    view = QueueView(
        runners=lambda: {"pool": runner},
        pods=Pods({high.uid: high}),
        leading=lambda: True,
        served=lambda name: True,
        wall_clock=lambda: 1_767_225_600.0,  # 2026-01-01T00:00:00Z
    )
    queue.add(high)
    queue.pop_nowait()
    queue.done(high.uid, outcome=Outcome.UNSCHEDULABLE, retry_after=2.0)
    status, answer = view.pod(namespace=high.namespace, name="high")
    assert status == 200
    assert answer["preemption_plan"] == {
        "id": "p-1",
        "node": "a",
        "victims": [{"pod": "ns/low-0", "state": "terminating"}, {"pod": "ns/low-1", "state": "gone"}],
        "waits_for": "victims",
        "lease_until": "2026-01-01T00:00:42+00:00",
        "lease_seconds": 42.0,
    }
    runner.plans.clear()  # bound, cancelled or lapsed: nothing said
    assert "preemption_plan" not in view.pod(namespace=high.namespace, name="high")[1]


def test_a_pod_group_member_shows_its_groups_back_off_and_plan() -> None:
    """A group preempts as a whole, so its back-off and plan are kept under the group's key, not a
    member's UID: a member's answer carries them, and names the group."""
    clock = FakeClock(start=100.0)
    queue = SchedulingQueue(clock=clock, backoff=BackoffPolicy(initial=2.0, maximum=10.0))
    member = dataclasses.replace(pod("train-0"), scheduling_group="train")
    key = f"group/{member.namespace}/train"
    why = "the plan evicts 2 pods PodDisruptionBudget ns/keep covers (ns/a, ns/b) and it allows 1"
    runner = Runner(queue, backoffs={key: (7.5, why)})
    view = QueueView(
        runners=lambda: {"pool": runner},
        pods=Pods({member.uid: member}),
        leading=lambda: True,
        served=lambda name: True,
        wall_clock=lambda: 1_767_225_600.0,  # 2026-01-01T00:00:00Z
    )
    status, answer = view.pod(namespace=member.namespace, name="train-0")
    assert status == 404  # in no per-pod queue: the group is placed as a whole
    assert "pod group" in answer["message"]
    assert answer["preemption_group"] == f"{member.namespace}/train"
    assert answer["preemption_backoff"] == {
        "seconds": 7.5,
        "until": "2026-01-01T00:00:07+00:00",
        "reason": why,
    }
    assert "preemption_plan" not in answer

    runner.backoffs.clear()
    runner.plans[key] = PendingPlan(
        plan_id="p-g", node="a", victims=(("ns/low-0", "running"),), waits_for="victims", lease_left=30.0
    )
    answer = view.pod(namespace=member.namespace, name="train-0")[1]
    assert answer["preemption_plan"]["id"] == "p-g"
    assert "preemption_backoff" not in answer

    runner.plans.clear()  # nothing kept for the group: nothing said
    answer = view.pod(namespace=member.namespace, name="train-0")[1]
    assert "preemption_group" not in answer
    assert "preemption_plan" not in answer
