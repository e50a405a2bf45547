"""What a pod's departure from the unbound-pod watch says about the copy a cycle assumed on a node.

A Binding moves the pod out of the watch's ``spec.nodeName=`` selector: the apiserver reports that as
DELETED with the pod's last matching state, so without ``spec.nodeName``, exactly like a pod deleted
while pending. Taking it as a deletion dropped the assumed copy of every pod this process bound, in
the milliseconds before the placed-pod watch reported it bound: a topology-spread pod evaluated in
that gap did not count it and was placed beside it (side by side with kube-scheduler, spread 5 of 6).
"""

from __future__ import annotations

import logging
import types
from typing import Any

from kubernetes_asyncio import client

from bindery.adapters import KubeConditionWriter, KubeEventSink
from bindery.controller.metrics import Metrics
from bindery.controller.profile.pending import PendingPods
from tests.scheduling.fakes import pod


def _last_unbound_state(uid: str, namespace: str, name: str, scheduler: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": namespace, "name": name},
        "spec": {"schedulerName": scheduler, "containers": []},
        "status": {"phase": "Pending"},
    }


async def _departure(*, bound_by_us: bool) -> list[str]:
    web = pod("web")
    binder = types.SimpleNamespace(
        bound_recently=lambda uid: bound_by_us and uid == web.uid, remembered=lambda: 0
    )
    binder.forget = lambda uid: None
    forgotten: list[str] = []
    async with client.ApiClient() as api:
        pending = PendingPods(
            api=api,
            binder=binder,  # type: ignore[arg-type]
            events=KubeEventSink(api=api),
            conditions=KubeConditionWriter(api=api),
            runners=dict,
            leading=lambda: True,
            sweep_interval=lambda: 30.0,
            metrics=Metrics(),
            logger=logging.getLogger("test"),
        )
        pending.forget_placed = forgotten.append
        body = _last_unbound_state(web.uid, web.namespace, web.name, web.scheduler_name)
        await pending.on_pod_event(event_type="DELETED", body=body)
    return forgotten


async def test_a_pod_this_process_bound_keeps_its_assumed_copy_when_it_leaves_the_unbound_pods() -> None:
    assert await _departure(bound_by_us=True) == []


async def test_a_pod_deleted_while_pending_loses_its_assumed_copy() -> None:
    assert await _departure(bound_by_us=False) == [pod("web").uid]
