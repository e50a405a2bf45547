"""Node events wake parked pods only when they change what placement reads of a Node.

The queue parks an unschedulable pod until an event could make it fit (issue 20, scenario 3); a
Node added or changed is one. Heartbeats and other status churn are not (a cluster's kubelets
would otherwise retry every parked pod every few seconds), and a relist repeating known Nodes is not.
"""

from __future__ import annotations

import copy
import logging
import types
from typing import Any

from kubernetes_asyncio import client

from bindery.adapters import KubeConditionWriter, KubeEventSink
from bindery.controller.metrics import Metrics
from bindery.controller.profile.pending import NODE_EVENT_SETTLE_SECONDS, PendingPods
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.queue import SchedulingQueue
from tests.scheduling.fakes import FakeClock, pod


def node(*, cpu: str = "4", heartbeat: str = "2026-01-01T00:00:00Z", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": labels},
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu},
            "allocatable": {"cpu": cpu},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}],
        },
    }


async def test_a_node_added_or_changed_wakes_parked_pods_and_status_churn_does_not() -> None:
    clock = FakeClock()
    queue = SchedulingQueue(clock=clock)
    runner = types.SimpleNamespace(queue=queue, podgroups=types.SimpleNamespace(retry=lambda: None))
    async with client.ApiClient() as api:
        pending = PendingPods(
            api=api,
            binder=None,  # type: ignore[arg-type]
            events=KubeEventSink(api=api),
            conditions=KubeConditionWriter(api=api),
            runners=lambda: {"pool": runner},  # type: ignore[dict-item]
            leading=lambda: True,
            sweep_interval=lambda: 30.0,
            metrics=Metrics(),
            logger=logging.getLogger("test"),
        )

        def park() -> None:
            popped = queue.pop_nowait()
            assert popped is not None
            queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE)
            assert queue.stats().unschedulable == 1

        def woken() -> bool:
            """Moved out of the pool; tried once the RM had the settling delay to see the Node."""
            if queue.stats().unschedulable:
                return False
            assert queue.pop_nowait() is None
            clock.advance(NODE_EVENT_SETTLE_SECONDS)
            return queue.pop_nowait() is not None

        queue.add(pod("web"))
        park()
        pending.on_node_event(event_type=None, body=node())  # the initial list: a Node added
        assert woken()
        queue.done("uid-web", outcome=Outcome.UNSCHEDULABLE)
        clock.advance(20.0)  # past the pod's backoff: only the settling delay holds it back

        pending.on_node_event(event_type="MODIFIED", body=node(heartbeat="2026-01-01T00:00:40Z"))
        pending.on_node_event(event_type=None, body=node())  # a relist
        assert queue.stats().unschedulable == 1
        pending.on_node_event(event_type="MODIFIED", body=node(cpu="8"))
        assert woken()
        queue.done("uid-web", outcome=Outcome.UNSCHEDULABLE)
        clock.advance(20.0)

        pending.on_node_event(event_type="MODIFIED", body=node(cpu="8", zone="b"))
        assert woken()
        queue.done("uid-web", outcome=Outcome.UNSCHEDULABLE)
        clock.advance(20.0)

        gone = copy.deepcopy(node(cpu="8", zone="b"))
        pending.on_node_event(event_type="DELETED", body=gone)
        assert queue.stats().unschedulable == 1


async def test_a_node_deleted_wakes_the_pods_their_topology_spread_refused_and_only_those() -> None:
    """A Node gone can lift a DoNotSchedule spread's refusal (its domain no longer counts in the
    skew's minimum: kube-scheduler's PodTopologySpread registers Node deletions); it frees no room
    for a pod the RM refused, nor lifts an anti-affinity (its pods' deletions do that)."""
    from bindery.podrules.model import LabelSelector, PodRules, SpreadConstraint
    from bindery.scheduling.placementrules import wake_on

    clock = FakeClock()
    queue = SchedulingQueue(clock=clock)
    runner = types.SimpleNamespace(queue=queue, podgroups=types.SimpleNamespace(retry=lambda: None))
    async with client.ApiClient() as api:
        pending = PendingPods(
            api=api,
            binder=None,  # type: ignore[arg-type]
            events=KubeEventSink(api=api),
            conditions=KubeConditionWriter(api=api),
            runners=lambda: {"pool": runner},  # type: ignore[dict-item]
            leading=lambda: True,
            sweep_interval=lambda: 30.0,
            metrics=Metrics(),
            logger=logging.getLogger("test"),
        )
        spread = SpreadConstraint(
            max_skew=1,
            topology_key="topology.kubernetes.io/zone",
            selector=LabelSelector(),
        )
        spreads = pod("spreads", rules=PodRules(spread=(spread,)))
        no_room = pod("no-room")
        queue.add(spreads)
        queue.add(no_room)
        for _ in range(2):
            popped = queue.pop_nowait()
            assert popped is not None
            if popped.uid == spreads.uid:
                queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE, wake_on=wake_on(popped))
            else:
                queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE)
        pending.on_node_event(event_type=None, body=node(zone="a"))  # known before it goes
        clock.advance(NODE_EVENT_SETTLE_SECONDS + 20.0)
        for _ in range(2):  # the node's arrival woke both: park them again
            popped = queue.pop_nowait()
            assert popped is not None
            rules = wake_on(popped) if popped.uid == spreads.uid else None
            queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE, wake_on=rules)
        clock.advance(20.0)
        assert queue.stats().unschedulable == 2

        pending.on_node_event(event_type="DELETED", body=node(zone="a"))
        assert queue.position(spreads.uid) is not None
        assert queue.position(spreads.uid).queue != "unschedulable", "the spread-refused pod stayed parked"  # type: ignore[union-attr]
        assert queue.position(no_room.uid).queue == "unschedulable"  # type: ignore[union-attr]
