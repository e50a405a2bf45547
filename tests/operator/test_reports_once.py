"""A pod's bind is reported once, even when the unconfirmed-Binding tracker and the pod's next
cycle both see the late Binding land at the same instant (seen in the apiserver-restart chaos run)."""

from __future__ import annotations

import asyncio

from kubernetes_asyncio import client

from bindery.controller.attempt import _CheckedEvents
from tests.scheduling.fakes import Calls, FakeEvents, pod


async def test_the_scheduled_event_is_written_once_per_pod() -> None:
    calls = Calls()
    async with client.ApiClient() as api:
        events = _CheckedEvents(inner=FakeEvents(calls), api=api, gone=set())
        web, db = pod("web"), pod("db")
        await asyncio.gather(
            events.scheduled(pod=web, node="n1", scheduler_name="bindery"),  # the tracker
            events.scheduled(pod=web, node="n1", scheduler_name="bindery"),  # the next cycle
        )
        await events.scheduled(pod=db, node="n1", scheduler_name="bindery")
    assert [details["pod"] for name, details in calls.log if name == "events.scheduled"] == [web.uid, db.uid]


async def test_a_stale_event_of_a_pod_this_process_bound_is_not_taken_as_pending() -> None:
    """Kopf can deliver a MODIFIED older than our Binding after the cycle recorded the bind: taking it
    as pending re-queued the pod and left its first-seen time behind for good (found by the
    5,000-pod test: one entry left of 5,000)."""
    import logging
    import types

    from bindery.adapters import KubeConditionWriter, KubeEventSink
    from bindery.controller.metrics import Metrics
    from bindery.controller.profile.pending import PendingPods

    web = pod("web")
    body = {
        "metadata": {"uid": web.uid, "namespace": web.namespace, "name": web.name},
        "spec": {"schedulerName": web.scheduler_name, "containers": []},
        "status": {"phase": "Pending"},
    }
    bound = types.SimpleNamespace(bound_recently=lambda uid: uid == web.uid, remembered=lambda: 1)
    async with client.ApiClient() as api:
        pending = PendingPods(
            api=api,
            binder=bound,  # type: ignore[arg-type]
            events=KubeEventSink(api=api),
            conditions=KubeConditionWriter(api=api),
            runners=dict,
            leading=lambda: True,
            sweep_interval=lambda: 30.0,
            metrics=Metrics(),
            logger=logging.getLogger("test"),
        )
        await pending.on_pod_event(event_type="MODIFIED", body=body)
        assert pending.sizes()["pods"] == 0
        assert pending.sizes()["first_seen"] == 0
        bound.bound_recently, bound.remembered = (lambda uid: False), (lambda: 0)
        await pending.on_pod_event(event_type="MODIFIED", body=body)
        assert pending.sizes()["pods"] == 1
