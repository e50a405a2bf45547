"""The operator's scheduling queues, served read-only beside its metrics for `bindery explain`.

When the next attempt at a pending pod is due lives only in the operator's memory (its queue and
backoff), so the operator serves it as JSON on the metrics port:

* `GET /debug/queue`: whether this replica leads, and each ResourceManager's queue depths;
* `GET /debug/queue/{namespace}/{name}[?uid=UID]`: where that pod waits, after how many failed
  attempts, and when it is tried next (404 with a JSON reason when no queue holds it); for a
  preemptor whose last plan failed, until when it asks for no plan and why
  (``preemption_backoff``); for a preemptor whose plan is confirmed, the plan, its victims, what it
  waits for and when its lease ends (``preemption_plan``); for a member of a pod group, which
  preempts as a whole, its group's back-off or plan (``preemption_group`` names the group).

`bindery explain` reaches it through the apiserver's service proxy, as `kubectl get --raw
/api/v1/namespaces/NS/services/NAME:metrics/proxy/debug/queue` does, or at `--operator-url`. A
standby replica answers too (its queue is kept warm) with `"leading": false`: only the leader's
attempt counts and backoffs are real. Nothing here writes, and no pod field beyond its name, UID and
queue position is served (no tokens, no spec).

Who may ask (issue 20, scenario 9): the view used to answer for any pending pod of the cluster
(whether it exists, its UID, its scheduler name) to anyone who reached the metrics port, and a
lookup by name scanned every remembered pod on the scheduling event loop. Now a pod of a scheduler
name no ResourceManager serves gets the same 404 as a pod that does not exist (`served`), a lookup
by name goes through the pods' name index, and the view is served beside /metrics only when that
listens on loopback; elsewhere only at an address the operator is given for it explicitly
(`bindery run --debug-addr`). Wherever served, it answers only a bearer token the apiserver accepts
of a user RBAC lets `get` the URL (bindery.adapters.access). See
:class:`bindery.controller.metrics.MetricsServer` and the runtime's start.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from bindery.controller.preemption import PendingPlan
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.queue import SchedulingQueue

__all__ = ["QueueView"]


class _HasQueue(Protocol):
    @property
    def queue(self) -> SchedulingQueue: ...

    def preemption_backoff(self, uid: str) -> tuple[float, str] | None:
        """Seconds until the pod may preempt again, and why its last plan failed; None if it may."""
        ...

    def preemption_plan(self, uid: str) -> PendingPlan | None:
        """The pod's confirmed preemption plan while it waits; None without one."""
        ...


class _Pods(Protocol):
    def get(self, uid: str) -> PodInfo | None: ...

    def find(self, *, namespace: str, name: str) -> PodInfo | None: ...


class QueueView:
    """Answers the two read-only questions above from the runtime's live state."""

    def __init__(
        self,
        *,
        runners: Callable[[], Mapping[str, _HasQueue]],
        pods: _Pods,
        leading: Callable[[], bool],
        served: Callable[[str], bool],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`served(scheduler_name)`: whether a ResourceManager serves that name (others are unknown here)."""
        self._runners = runners
        self._pods = pods
        self._served = served
        self._leading = leading
        self._wall_clock = wall_clock

    def summary(self) -> dict[str, Any]:
        return {
            "leading": self._leading(),
            "resource_managers": {
                name: {
                    "active": stats.active,
                    "backoff": stats.backoff,
                    "unschedulable": stats.unschedulable,
                    "in_flight": stats.in_flight,
                    "binding": stats.binding,
                }
                for name, runner in sorted(self._runners().items())
                for stats in (runner.queue.stats(),)
            },
        }

    def pod(self, *, namespace: str, name: str, uid: str | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) for one pod: 200 with its position, or 404 saying why there is none."""
        key = f"{namespace}/{name}"
        answer: dict[str, Any] = {"pod": key, "uid": uid, "leading": self._leading()}
        known = self._find(key=key, uid=uid)
        if known is None:
            answer["message"] = (
                "the operator holds no unbound pod of that name"
                + (" and UID" if uid else "")
                + " (it is bound, gone, gated, or its watch has not delivered it yet)"
            )
            return 404, answer
        answer["uid"] = known.uid
        for rm_name, runner in sorted(self._runners().items()):
            position = runner.queue.position(known.uid)
            if position is None:
                continue
            ready_in = round(position.ready_in, 3) if position.ready_in is not None else None
            due = (
                datetime.datetime.fromtimestamp(self._wall_clock() + ready_in, datetime.UTC)
                if ready_in is not None
                else None
            )
            answer.update(
                resource_manager=rm_name,
                queue=position.queue,
                attempts=position.attempts,
                next_attempt_in_seconds=ready_in,
                next_attempt_at=due.isoformat(timespec="seconds") if due is not None else None,
                waits_for_capacity=position.waits_for_capacity,
            )
            self._preemption(answer, runner, known.uid)
            return 200, answer
        if known.scheduling_group:
            answer["message"] = (
                f'the pod is a member of pod group "{known.scheduling_group}": its group is placed as a '
                "whole, outside the per-pod queue (see the group's PodGroupScheduled condition)"
            )
            # A group preempts as a whole: its back-off and plan are kept under the group's key
            # (bindery.scheduling.preemption.Preemptor.of_group), not under any member's UID.
            group = f"group/{known.namespace}/{known.scheduling_group}"
            for _, runner in sorted(self._runners().items()):
                if self._preemption(answer, runner, group):
                    answer["preemption_group"] = f"{known.namespace}/{known.scheduling_group}"
                    break
            return 404, answer
        answer["message"] = (
            "the operator holds the pod but no ResourceManager's queue does (it is refused by a "
            "ResourceManager's namespaceSelector, waits for its namespace to be seen, or its "
            "ResourceManager has no running profile yet)"
        )
        return 404, answer

    def _preemption(self, answer: dict[str, Any], runner: _HasQueue, key: str) -> bool:
        """Add the back-off and the confirmed plan kept under ``key`` (a pod's UID or a group's
        key) to ``answer``; True when there was either."""
        backoff = runner.preemption_backoff(key)
        if backoff is not None:
            left, why = backoff
            until = datetime.datetime.fromtimestamp(self._wall_clock() + left, datetime.UTC)
            answer["preemption_backoff"] = {
                "seconds": round(left, 3),
                "until": until.isoformat(timespec="seconds"),
                "reason": why,
            }
        pending = runner.preemption_plan(key)
        if pending is not None:
            answer["preemption_plan"] = self._plan(pending)
        return backoff is not None or pending is not None

    def _plan(self, pending: PendingPlan) -> dict[str, Any]:
        until = datetime.datetime.fromtimestamp(self._wall_clock() + pending.lease_left, datetime.UTC)
        return {
            "id": pending.plan_id,
            "node": pending.node,
            "victims": [{"pod": key, "state": state} for key, state in pending.victims],
            "waits_for": pending.waits_for,
            "lease_until": until.isoformat(timespec="seconds"),
            "lease_seconds": round(pending.lease_left, 3),
        }

    def _find(self, *, key: str, uid: str | None) -> PodInfo | None:
        """The pod by UID (its name must match) or by name, if its scheduler name is served."""
        if uid:
            pod = self._pods.get(uid)
            pod = pod if pod is not None and pod.key == key else None
        else:
            namespace, _, name = key.partition("/")
            pod = self._pods.find(namespace=namespace, name=name)
        return pod if pod is not None and self._served(pod.scheduler_name) else None
