"""A pod's bind is reported once, even when the unconfirmed-Binding tracker and the pod's next
cycle both see the late Binding land at the same instant (seen in the apiserver-restart chaos run)."""

from __future__ import annotations

import asyncio

from kubernetes_asyncio import client

from bindery.controller.profiles import _CheckedEvents
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
