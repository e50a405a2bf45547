"""What a pod group's members and its PodGroup say while the group is not placed.

Every waiting or refused member gets ``FailedScheduling`` and ``PodScheduled=False`` saying why,
throttled like a cycle's reports (a group waits pass after pass, and each pass would say it again);
the PodGroup gets the ``PodGroupScheduled`` condition as kube-scheduler writes it
(:func:`bindery.scheduling.podgroups.scheduled_conditions`). Both are informative: a write that
fails is logged, and the next pass writes it again.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import time
from collections.abc import Awaitable, Callable, Sequence

from bindery.apiserver import ApiClient, patch, resources
from bindery.controller.metrics import Metrics
from bindery.scheduling.decisions import REASON_UNSCHEDULABLE, Outcome
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.podgroups import PodGroupInfo, scheduled_conditions
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import PodGone
from bindery.scheduling.throttle import EventThrottle
from bindery.typedefs import Logger

__all__ = ["READ_SECONDS", "Reporter"]

#: Bound of one apiserver read or write of a pass (the PodGroup, a member, the PodGroup's status).
READ_SECONDS = 10.0


class Reporter:
    """Reports the members of one profile's pod groups and writes their PodGroups' condition."""

    def __init__(
        self,
        *,
        profile: Callable[[], Profile],
        ports: Callable[[], Ports],
        api: ApiClient,
        logger: Logger,
        metrics: Metrics,
    ) -> None:
        self._profile = profile
        self._ports = ports
        self._api = api
        self._logger = logger
        self._metrics = metrics
        #: Per member: the last ``FailedScheduling`` sent (forget a member once it left its group).
        self.throttle = EventThrottle()

    async def set_condition(self, info: PodGroupInfo, *, scheduled: bool, reason: str, message: str) -> None:
        conditions = scheduled_conditions(
            group=info,
            scheduled=scheduled,
            reason=reason,
            message=message,
            now=datetime.datetime.now(datetime.UTC),
        )
        if conditions is None:
            return
        try:
            await patch(  # a merge patch, as for any custom resource
                self._api,
                resources.PODGROUPS,
                namespace=info.namespace,
                name=info.name,
                subresource="status",
                body={"status": {"conditions": conditions}},
                request_timeout=READ_SECONDS,
            )
        except Exception as error:  # status is informative; the next pass writes it again
            self._logger.warning(f"could not write the status of PodGroup {info.key}: {error}")

    async def fail(
        self, info: PodGroupInfo, members: Sequence[PodInfo], message: str, *, reason: str, started: float
    ) -> None:
        """Report the members and the PodGroup, and count one failed attempt per member."""
        await self.report(members, message, reason=reason)
        await self.set_condition(info, scheduled=False, reason=reason, message=message)
        for pod in members:
            self._metrics.attempt(
                resource_manager=self._profile().name,
                uid=pod.uid,
                outcome=Outcome.UNSCHEDULABLE if reason == REASON_UNSCHEDULABLE else Outcome.ERROR,
                seconds=time.perf_counter() - started,
            )

    async def report(
        self, members: Sequence[PodInfo], message: str, *, reason: str, event_key: str | None = None
    ) -> None:
        """FailedScheduling (throttled) and PodScheduled=False (if changed) on every member.

        The throttle admits one event per member and `event_key` (the reason by default) per
        interval: a refusal said once, never repeated, takes a key of its own, so that the "waiting
        for members" just before it does not swallow it."""
        ports = self._ports()
        key = event_key or reason
        await asyncio.gather(*(self._report_one(ports, pod, message, reason, key) for pod in members))

    async def _report_one(self, ports: Ports, pod: PodInfo, message: str, reason: str, key: str) -> None:
        event = self.throttle.admit(uid=pod.uid, key=key, message=message)
        writes: list[Callable[[], Awaitable[None]]] = []
        if event is not None:
            writes.append(
                functools.partial(
                    ports.events.failed_scheduling, pod=pod, message=event, scheduler_name=pod.scheduler_name
                )
            )
        if pod.unschedulable_condition != (reason, message):
            writes.append(
                functools.partial(
                    ports.conditions.pod_scheduled_false, pod=pod, reason=reason, message=message
                )
            )
        for write in writes:
            try:
                await write()
            except PodGone:
                return
            except Exception as error:
                self._logger.warning(f"could not report pod {pod.key} waiting with its group: {error}")
