"""Scheduling events written exactly like kube-scheduler writes them (events.k8s.io/v1).

Users and tools (kubectl describe, dashboards, alerting on FailedScheduling) already know
kube-scheduler's events, so Bindery writes the same shape: reportingController = the scheduler name,
reportingInstance = `<schedulerName>-<hostname>`, action `Binding`/`Scheduling`, a MicroTime
eventTime, and the object name `<pod>.<hex nanoseconds>` as client-go's event recorder does.

Repeats are throttled by the cycle (bindery.scheduling.throttle), so this sink writes every event
it is asked to write.

Every POST has a timeout: the generated client waits up to 5 minutes by default, and the
`Scheduled` event sits between the Binding and the commit of the pod's reservation, whose lease
must not run out meanwhile (the cycle passes a shorter `timeout` when the lease requires it).

A `Scheduled` event the apiserver turns away for now (429 under API Priority and Fairness, a 5xx,
no answer) is written again in the background, as kube-scheduler's event recorder retries its
events: it is the one event about a bound pod, and nothing else would write it later. The retry
POSTs the same object, so a first POST that landed without its answer ends the retries with 409.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bindery.adapters.counters import WriteCounter
from bindery.apiserver import ApiClient, resources
from bindery.apiserver.api import answer_of
from bindery.apiserver.errors import Conflict, Unavailable, from_status
from bindery.scheduling.podspec import PodInfo

NOTE_LIMIT = 1024  # events.k8s.io rejects notes longer than 1 KiB: bytes of UTF-8, not characters
#: The longest one event POST may take; an event normally takes milliseconds.
EVENT_TIMEOUT_SECONDS = 10.0
#: Waits before each new try of a `Scheduled` event turned away for now: about a minute in all
#: (client-go's recorder tries an event 12 times, 10 s apart).
SCHEDULED_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)

log = logging.getLogger(__name__)


def fit_note(note: str, *, limit: int = NOTE_LIMIT) -> str:
    """`note` cut to at most `limit` bytes of UTF-8, at a character boundary.

    The apiserver measures the note in bytes: cut at `limit` characters, a reason in a non-ASCII
    script (or quoting non-ASCII labels) is up to four times too long, the POST gets 422 and the
    event, the user's only clue why the pod is pending, is lost.
    """
    encoded = note.encode()
    if len(encoded) <= limit:
        return note
    return encoded[:limit].decode(errors="ignore")  # drops only the last, partial character


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
        "note": fit_note(note),
        "type": type_,
    }
    return body


class KubeEventSink:
    def __init__(
        self,
        *,
        api: ApiClient,
        counter: WriteCounter | None = None,
        hostname: str | None = None,
        timeout: float = EVENT_TIMEOUT_SECONDS,
        retry_delays: Sequence[float] = SCHEDULED_RETRY_DELAYS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api = api
        self._counter = counter or WriteCounter()
        self._hostname = hostname or socket.gethostname()
        self._timeout = timeout
        self._retry_delays = tuple(retry_delays)
        self._sleep = sleep
        self._retries: set[asyncio.Task[bool]] = set()

    async def scheduled(  # `timeout`: the cycle's bound (within the reservation's lease)
        self,
        *,
        pod: PodInfo,
        node: str,
        scheduler_name: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        body = self._body(
            pod=pod,
            scheduler_name=scheduler_name,
            type_="Normal",
            reason="Scheduled",
            action="Binding",
            note=f"Successfully assigned {pod.namespace}/{pod.name} to {node}",
        )
        try:
            await self._post(
                body,
                namespace=pod.namespace,
                limit=self._timeout if timeout is None else min(self._timeout, timeout),
            )
        except Unavailable as error:
            log.warning(
                "the Scheduled event of pod %s/%s (bound to %s) was not written: %s; "
                "trying again in the background",
                pod.namespace,
                pod.name,
                node,
                error,
            )
            retry = asyncio.create_task(self.retry(body, namespace=pod.namespace), name=f"event {pod.uid}")
            self._retries.add(retry)
            retry.add_done_callback(self._retries.discard)

    async def retry(self, body: dict[str, Any], *, namespace: str) -> bool:
        """POST `body` again after each delay until it is written; returns whether it was."""
        for delay in self._retry_delays:
            await self._sleep(delay)
            try:
                await self._post(body, namespace=namespace, limit=self._timeout)
            except Conflict:  # an earlier try landed, its answer did not
                return True
            except Unavailable as error:
                log.debug("event %s/%s still not written: %s", namespace, body["metadata"]["name"], error)
                continue
            except Exception as error:  # refused for good (e.g. the namespace is being deleted)
                log.warning("event %s/%s not written: %s", namespace, body["metadata"]["name"], error)
                return False
            return True
        log.warning(
            "gave up writing event %s/%s (%s) after %d tries: the apiserver kept turning it away",
            namespace,
            body["metadata"]["name"],
            body["reason"],
            len(self._retry_delays) + 1,
        )
        return False

    async def failed_scheduling(self, *, pod: PodInfo, message: str, scheduler_name: str) -> None:
        await self._create(
            pod=pod,
            scheduler_name=scheduler_name,
            type_="Warning",
            reason="FailedScheduling",
            action="Scheduling",
            note=message,
            limit=self._timeout,
        )

    async def warning(self, *, pod: PodInfo, reason: str, action: str, note: str, reporter: str) -> None:
        """Any other Warning event about a pod (e.g. reconciliation's ReservationMissing)."""
        await self._create(
            pod=pod,
            scheduler_name=reporter,
            type_="Warning",
            reason=reason,
            action=action,
            note=note,
            limit=self._timeout,
        )

    async def _create(
        self,
        *,
        pod: PodInfo,
        scheduler_name: str,
        type_: str,
        reason: str,
        action: str,
        note: str,
        limit: float,
    ) -> None:
        body = self._body(
            pod=pod, scheduler_name=scheduler_name, type_=type_, reason=reason, action=action, note=note
        )
        await self._post(body, namespace=pod.namespace, limit=limit)

    def _body(
        self, *, pod: PodInfo, scheduler_name: str, type_: str, reason: str, action: str, note: str
    ) -> dict[str, Any]:
        return event_body(
            pod=pod,
            resource_version=pod.resource_version,
            scheduler_name=scheduler_name,
            hostname=self._hostname,
            type_=type_,
            reason=reason,
            action=action,
            note=note,
            now=datetime.datetime.now(datetime.UTC),
        )

    async def _post(self, body: dict[str, Any], *, namespace: str, limit: float) -> None:
        self._counter.add(kind="event")
        status, payload = await answer_of(
            self._api,
            "POST",
            resources.EVENTS_V1.path(namespace=namespace),
            body=body,
            request_timeout=limit,
            what="event not written",
        )
        if status >= 300:
            raise from_status(status, payload, what="event not written")
