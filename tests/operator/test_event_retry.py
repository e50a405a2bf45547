"""A `Scheduled` event the apiserver turns away for now is written later, once.

It is the one event about a bound pod: before, a 429 (API Priority and Fairness shedding load
during a burst) or a timeout on its POST lost it for good, and `kubectl describe pod` showed a
pod bound with no `Scheduled` event. kube-scheduler's event recorder retries its events.

The apiserver is the real one; only the first POST's answer is replaced (a 429, or a timeout
after the event landed), because a real apiserver cannot be made to shed one given request.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

import bindery.apiserver.api
from bindery.adapters import events
from bindery.adapters.events import KubeEventSink
from bindery.apiserver.errors import Unavailable
from bindery.scheduling.podspec import PodInfo
from tests.operator.conftest import create_pod, events_of, eventually, pod_body


async def _no_wait(_delay: float) -> None:
    return None


async def _pod(kube_api: client.ApiClient, namespace: str) -> PodInfo:
    created = await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name="s"))
    return PodInfo(uid=created["metadata"]["uid"], namespace=namespace, name="p", scheduler_name="s")


async def test_a_scheduled_event_refused_with_429_is_written_by_a_retry(
    *, kube_api: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = bindery.apiserver.api.answer_of
    refused: list[str] = []

    async def shed_first(*args: Any, **kwargs: Any) -> tuple[int, bytes]:
        if not refused:
            refused.append(args[2])
            return 429, b'{"kind":"Status","reason":"TooManyRequests","message":"too many requests"}'
        return await real(*args, **kwargs)

    monkeypatch.setattr(events, "answer_of", shed_first)
    pod = await _pod(kube_api, namespace)
    sink = KubeEventSink(api=kube_api, sleep=_no_wait)
    await sink.scheduled(pod=pod, node="n1", scheduler_name="s")

    written = await eventually(
        lambda: events_of(kube_api, namespace=namespace, pod_name="p"), what="the Scheduled event"
    )
    assert refused, "the first POST was not the one shed"
    assert [(e["reason"], e["note"]) for e in written] == [
        ("Scheduled", f"Successfully assigned {namespace}/p to n1")
    ]


async def test_a_scheduled_event_whose_answer_was_lost_is_not_written_twice(
    *, kube_api: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = bindery.apiserver.api.answer_of
    tries: list[int] = []

    async def lose_first_answer(*args: Any, **kwargs: Any) -> tuple[int, bytes]:
        answer = await real(*args, **kwargs)
        tries.append(answer[0])
        if len(tries) == 1:
            raise Unavailable("timed out waiting for the answer", status=0, what="event not written")
        return answer

    monkeypatch.setattr(events, "answer_of", lose_first_answer)
    pod = await _pod(kube_api, namespace)
    sink = KubeEventSink(api=kube_api, sleep=_no_wait)
    await sink.scheduled(pod=pod, node="n1", scheduler_name="s")

    await eventually(lambda: _async(len(tries) == 2), what="the retry's POST")
    assert tries == [201, 409]  # the retry met the event the first try wrote
    written = await events_of(kube_api, namespace=namespace, pod_name="p")
    assert [e["reason"] for e in written] == ["Scheduled"]


async def _async(value: bool) -> bool:
    return value
