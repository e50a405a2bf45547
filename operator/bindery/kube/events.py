"""Scheduling events written exactly like kube-scheduler writes them (events.k8s.io/v1).

Users and tools (kubectl describe, dashboards, alerting on FailedScheduling) already know
kube-scheduler's events, so Bindery writes the same shape: reportingController = the scheduler name,
reportingInstance = `<schedulerName>-<hostname>`, action `Binding`/`Scheduling`, a MicroTime
eventTime, and the object name `<pod>.<hex nanoseconds>` as client-go's event recorder does.

Repeated identical FailedScheduling events for one pod are aggregated: an unschedulable pod retried
every 10 s would otherwise write an event per attempt. Within `repeat_window` seconds an identical
(pod, message) is not written again; the next one written after the window carries a `series` with
the number of occurrences, like client-go's event series.
"""

from __future__ import annotations

import dataclasses
import datetime
import socket
import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from bindery.kube.counters import WriteCounter
from bindery.scheduling.podspec import PodInfo

NOTE_LIMIT = 1024  # events.k8s.io rejects notes longer than 1 kB


def reporting_instance(*, scheduler_name: str, hostname: str | None = None) -> str:
    return f"{scheduler_name}-{hostname or socket.gethostname()}"


def micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(
    *,
    pod: PodInfo,
    resource_version: str | None,
    scheduler_name: str,
    hostname: str | None,
    type_: str,
    reason: str,
    action: str,
    note: str,
    now: datetime.datetime,
    series_count: int = 0,
) -> dict[str, Any]:
    regarding: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": pod.namespace,
        "name": pod.name,
        "uid": pod.uid,
    }
    if resource_version:
        regarding["resourceVersion"] = resource_version
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{pod.name}.{time.time_ns():x}", "namespace": pod.namespace},
        "eventTime": micro_time(now),
        "reportingController": scheduler_name,
        "reportingInstance": reporting_instance(scheduler_name=scheduler_name, hostname=hostname),
        "action": action,
        "reason": reason,
        "regarding": regarding,
        "note": note[:NOTE_LIMIT],
        "type": type_,
    }
    if series_count > 1:
        body["series"] = {"count": series_count, "lastObservedTime": micro_time(now)}
    return body


@dataclasses.dataclass
class _Seen:
    first_written: float
    suppressed: int = 0


class KubeEventSink:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        counter: WriteCounter | None = None,
        hostname: str | None = None,
        repeat_window: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._events = client.EventsV1Api(api)
        self._counter = counter or WriteCounter()
        self._hostname = hostname or socket.gethostname()
        self._repeat_window = repeat_window
        self._clock = clock
        self._seen: dict[tuple[str, str], _Seen] = {}

    async def scheduled(self, *, pod: PodInfo, node: str, scheduler_name: str) -> None:
        self.forget(uid=pod.uid)
        await self._create(
            pod=pod,
            scheduler_name=scheduler_name,
            type_="Normal",
            reason="Scheduled",
            action="Binding",
            note=f"Successfully assigned {pod.namespace}/{pod.name} to {node}",
        )

    async def failed_scheduling(self, *, pod: PodInfo, message: str, scheduler_name: str) -> None:
        count = self._occurrences_to_write(uid=pod.uid, message=message)
        if count == 0:
            return
        await self._create(
            pod=pod,
            scheduler_name=scheduler_name,
            type_="Warning",
            reason="FailedScheduling",
            action="Scheduling",
            note=message,
            series_count=count,
        )

    def forget(self, *, uid: str) -> None:
        """Drop aggregation state of a pod (bound or deleted)."""
        for key in [key for key in self._seen if key[0] == uid]:
            del self._seen[key]

    def _occurrences_to_write(self, *, uid: str, message: str) -> int:
        """0 = suppress; otherwise the occurrence count the written event stands for."""
        now = self._clock()
        key = (uid, message)
        seen = self._seen.get(key)
        if seen is not None and now - seen.first_written < self._repeat_window:
            seen.suppressed += 1
            return 0
        self._seen[key] = _Seen(first_written=now)
        return seen.suppressed + 1 if seen is not None else 1

    async def _create(
        self,
        *,
        pod: PodInfo,
        scheduler_name: str,
        type_: str,
        reason: str,
        action: str,
        note: str,
        series_count: int = 0,
    ) -> None:
        body = event_body(
            pod=pod,
            resource_version=getattr(pod, "resource_version", None),
            scheduler_name=scheduler_name,
            hostname=self._hostname,
            type_=type_,
            reason=reason,
            action=action,
            note=note,
            now=datetime.datetime.now(datetime.UTC),
            series_count=series_count,
        )
        self._counter.add(kind="event")
        response = await self._events.create_namespaced_event(
            namespace=pod.namespace, body=body, _preload_content=False
        )
        try:
            if response.status >= 300:
                detail = (await response.read())[:300].decode("utf-8", "replace")
                raise client.ApiException(status=response.status, reason=f"event not written: {detail}")
        finally:
            response.release()
