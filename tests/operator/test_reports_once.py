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

    from bindery.controller.options import OperatorOptions
    from bindery.controller.runtime import Runtime

    runtime = Runtime(options=OperatorOptions(), logger=logging.getLogger("test"))
    web = pod("web")
    body = {
        "metadata": {"uid": web.uid, "namespace": web.namespace, "name": web.name},
        "spec": {"schedulerName": web.scheduler_name, "containers": []},
        "status": {"phase": "Pending"},
    }
    runtime._binder = types.SimpleNamespace(  # type: ignore[assignment]
        bound_recently=lambda uid: uid == web.uid, remembered=lambda: 1
    )
    await runtime.on_pod_event(event_type="MODIFIED", body=body)
    assert runtime.per_pod_sizes()["pods"] == 0
    assert runtime.per_pod_sizes()["first_seen"] == 0
    runtime._binder = types.SimpleNamespace(  # type: ignore[assignment]
        bound_recently=lambda uid: False, remembered=lambda: 0
    )
    await runtime.on_pod_event(event_type="MODIFIED", body=body)
    assert runtime.per_pod_sizes()["pods"] == 1
