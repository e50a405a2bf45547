"""Issue 20, scenario 3: a namespace whose pods never fit does not starve another namespace.

On the real apiserver with the fake RM refusing every pod of namespace A: a pod of namespace B,
newer than 200 pods of A at the same priority, is tried within the first pods and binds; and the
pods of A, once refused, are not retried on a timer while nothing happened that could make them fit.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from tests.operator.conftest import Bindery, Stage, create_pod, eventually, node_of, now, pod_body
from tests.operator.fakerm import FakeRM

pytestmark = pytest.mark.controlplane

BACKLOG = 200


@pytest.fixture
async def other_namespace(kube_api: client.ApiClient) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube_api)
    await core.create_namespace(body={"metadata": {"name": name}})
    yield name
    await core.delete_namespace(name=name)


async def _remembered(bindery: Bindery, count: int) -> bool:
    return len(bindery.runtime.pods) >= count


async def test_a_pod_of_another_namespace_binds_past_a_backlog_that_never_fits(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    other_namespace: str,
    bindery: Bindery,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    fake_rm.refuse_namespaces = {namespace}
    for i in range(BACKLOG):
        await create_pod(
            kube_api, namespace=namespace, body=pod_body(name=f"a{i}", scheduler_name=stage.scheduler)
        )
    await create_pod(
        kube_api, namespace=other_namespace, body=pod_body(name="b", scheduler_name=stage.scheduler)
    )
    # Pods of a name nobody claims are not followed, so the ResourceManager comes first, one cycle
    # at a time, and its first reserve is held until every pod is queued: from then on the order is
    # the queue's alone, the backlog of A older than B.
    gate = asyncio.Event()

    async def hold(name: str) -> None:
        await gate.wait()

    fake_rm.on_attempt = hold
    async with stage.served(maxInFlight=1, backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
        await eventually(lambda: _remembered(bindery, BACKLOG + 1), what="the pods in the watch")
        await eventually(lambda: now(len(fake_rm.reserve_attempts) == 1), what="the first reserve held")
        gate.set()
        assert await eventually(
            lambda: node_of(kube_api, namespace=other_namespace, name="b"), within=120, what="b bound"
        )
        # The namespaces take turns: b goes at most one pod of A after the one in flight when it was
        # queued. The served name's list routes A's 200 pods and b in one pass, and the first cycle
        # may take a0 before b is queued; A's lane then already holds the next turn (a1), as in
        # any round-robin. Ordered by age, as before issue 20, b came after all 200.
        tried_before_b = fake_rm.reserve_attempts.index("b")
        assert tried_before_b <= 2, f"{tried_before_b} pods of namespace A were tried before b"

        # Every pod of A refused once; then a new pod of B binds. On the old 0.2-0.5 s backoff timer
        # the refused pods came back meanwhile (all older than it); parked, they wait for an event.
        everyone = {f"a{i}" for i in range(BACKLOG)}
        await eventually(
            lambda: now(everyone <= set(fake_rm.reserve_attempts)), within=120, what="every pod of A tried"
        )
        await create_pod(
            kube_api, namespace=other_namespace, body=pod_body(name="b2", scheduler_name=stage.scheduler)
        )
        assert await eventually(
            lambda: node_of(kube_api, namespace=other_namespace, name="b2"), within=120, what="b2 bound"
        )
        retried = {name: n for name, n in collections.Counter(fake_rm.reserve_attempts).items() if n > 1}
        assert not retried, f"pods of A retried with nothing changed: {sorted(retried.items())[:5]}"
