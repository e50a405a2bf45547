"""Write `PodScheduled=False` onto a pod's status, as kube-scheduler does after a failed attempt.

`PodScheduled=True` is written only to correct a `False` that a failed attempt wrote over the
apiserver's own `True`: when a Binding that got no answer turns out to have bound the pod.

A strategic-merge patch of `status.conditions` merges by condition `type`, so only PodScheduled is
touched and other writers' conditions survive (kube-scheduler's PatchPodStatus does the same).
`metadata.uid` in the patch makes the apiserver refuse it if the name now belongs to another pod.
An identical condition already written for this pod is not written again (a pod retried on
backoff would otherwise cost a write per attempt).

`observedGeneration` is the pod's `metadata.generation` the decision was made on, as kube-scheduler
1.36 writes it on PodScheduled=False (`podutil.CalculatePodConditionObservedGeneration`, with the
PodObservedGenerationTracking gate GA and locked on since 1.35); Bindery's own PodScheduled=True
correction carries it too. Each PATCH has a timeout (the generated client's default is 5 minutes).
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from typing import Any

from bindery.adapters.counters import WriteCounter
from bindery.apiserver import ApiClient, ApiError, NotFound, patch, resources
from bindery.apiserver.api import STRATEGIC_PATCH
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import PodGone

MESSAGE_LIMIT = 4096
#: The longest one PATCH of pods/status may take; it normally takes milliseconds.
CONDITION_TIMEOUT_SECONDS = 10.0


def condition_patch(
    *, uid: str, reason: str, message: str, now: datetime.datetime, generation: int | None = None
) -> dict[str, Any]:
    return _pod_scheduled(
        uid=uid,
        status="False",
        reason=reason,
        message=message[:MESSAGE_LIMIT],
        now=now,
        generation=generation,
    )


def scheduled_patch(*, uid: str, now: datetime.datetime, generation: int | None = None) -> dict[str, Any]:
    """`PodScheduled=True` as the Binding sets it; null drops the failed attempt's reason and message."""
    return _pod_scheduled(uid=uid, status="True", reason=None, message=None, now=now, generation=generation)


def _pod_scheduled(
    *,
    uid: str,
    status: str,
    reason: str | None,
    message: str | None,
    now: datetime.datetime,
    generation: int | None,
) -> dict[str, Any]:
    """A strategic-merge patch of the PodScheduled condition, refused if the name is another pod's."""
    condition: dict[str, Any] = {
        "type": "PodScheduled",
        "status": status,
        "reason": reason,
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if generation:
        condition["observedGeneration"] = generation
    return {"metadata": {"uid": uid}, "status": {"conditions": [condition]}}


class KubeConditionWriter:
    def __init__(
        self,
        *,
        api: ApiClient,
        counter: WriteCounter | None = None,
        timeout: float = CONDITION_TIMEOUT_SECONDS,
    ) -> None:
        self._api = api
        self._counter = counter or WriteCounter()
        self._timeout = timeout
        self._written: dict[str, tuple[str, str]] = {}

    async def pod_scheduled_false(self, *, pod: PodInfo, reason: str, message: str) -> None:
        if self._written.get(pod.uid) == (reason, message):
            return
        body = condition_patch(
            uid=pod.uid,
            reason=reason,
            message=message,
            now=datetime.datetime.now(datetime.UTC),
            generation=pod.generation,
        )
        await self._patch(pod=pod, body=body)
        self._written[pod.uid] = (reason, message)

    async def pod_scheduled_true(self, *, pod: PodInfo) -> None:
        body = scheduled_patch(
            uid=pod.uid, now=datetime.datetime.now(datetime.UTC), generation=pod.generation
        )
        await self._patch(pod=pod, body=body)
        self._written.pop(pod.uid, None)

    async def _patch(self, *, pod: PodInfo, body: dict[str, Any]) -> None:
        self._counter.add(kind="condition")
        try:  # a strategic merge patch, as the generated method sent for a dict body
            await patch(
                self._api,
                resources.PODS,
                namespace=pod.namespace,
                name=pod.name,
                subresource="status",
                body=body,
                content_type=STRATEGIC_PATCH,
                request_timeout=self._timeout,
            )
        except NotFound as error:
            raise PodGone(f"pod {pod.namespace}/{pod.name} no longer exists") from error
        except ApiError as error:
            error.args = (f"PodScheduled condition not written: {error}",)
            raise

    def forget(self, *, uid: str) -> None:
        self._written.pop(uid, None)

    def retain(self, *, uids: Collection[str]) -> int:
        """Drop what was written for pods not in ``uids``; returns how many.

        A write still in flight when its pod is forgotten records the pod after ``forget`` ran; the
        periodic sweep calls this so such an entry does not stay for the operator's lifetime.
        """
        stale = [uid for uid in self._written if uid not in uids]
        for uid in stale:
            del self._written[uid]
        return len(stale)
