"""Preemption with the reference RM as two replicas on PostgreSQL behind a round-robin proxy (issue 22).

Why: a preemption plan is proposed by the replica that answered the reserve, and its confirm may
reach the other one (a Service spreads connections, not calls). When plans lived in the proposing
replica's memory the confirm was answered ``404 no preemption plan`` and the other replica could
give the held room away. The scenario of `test_preemption_plane.py` (two 4-CPU nodes, four 2-CPU
pods of priority 10, then one of 100000) must end the same way through two replicas: one victim
evicted, the preemptor bound on its node, one plan proposed and confirmed.
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.devcluster.postgres import PostgresServer
from bindery.devcluster.rrproxy import round_robin_proxy
from tests.operator.conftest import Bindery, eventually, resource_manager
from tests.operator.test_preemption_plane import HIGH, LOW, POOL, Pool
from tests.realrm import RMProcess


class ReplicatedPool(Pool):
    def __init__(self, *, replicas: list[RMProcess], **kwargs: object) -> None:
        super().__init__(rm=replicas[0], **kwargs)  # type: ignore[arg-type]
        self.replicas = replicas

    def said(self, pattern: str) -> list[int]:
        """The replicas (by index) whose log matches ``pattern``."""
        return [
            index
            for index, replica in enumerate(self.replicas)
            if re.search(pattern, replica.log_path.read_text(errors="replace"))
        ]


@pytest.fixture
async def replicated_pool(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    bindery: Bindery,
    postgres: PostgresServer,
    postgres_db: str,
    tmp_path: pathlib.Path,
) -> AsyncIterator[ReplicatedPool]:
    token = uuid.uuid4().hex[:8]
    nodes = [f"pe-{token}-{i}" for i in range(2)]
    scheduling = client.SchedulingV1Api(kube_api)
    for name in nodes:
        await create_node(
            kube_api, name=name, capacity={"cpu": "4", "memory": "16Gi", "pods": "110"}, labels={POOL: token}
        )
    for name, value in (("low", LOW), ("high", HIGH)):
        await scheduling.create_priority_class(
            body={
                "metadata": {"name": f"pc-{token}-{name}"},
                "value": value,
                "preemptionPolicy": "PreemptLowerPriority",
            }
        )
    secret = uuid.uuid4().hex
    try:
        async with contextlib.AsyncExitStack() as stack:
            replicas = [
                await stack.enter_async_context(
                    RMProcess(
                        kubeconfig=controlplane.kubeconfig,
                        directory=tmp_path / f"rm{index}",
                        node_selector=f"{POOL}={token}",
                        db=postgres_db,
                        token=secret,
                        options=["--db-password-file", str(postgres.password_file)],
                    )
                )
                for index in range(2)
            ]
            proxy = await stack.enter_async_context(
                round_robin_proxy(upstreams=[r.url for r in replicas], seed=1)
            )
            await client.CoreV1Api(kube_api).create_namespaced_secret(
                namespace=namespace,
                body={
                    "metadata": {"name": f"rm-token-{token}", "labels": {CREDENTIALS_LABEL: "true"}},
                    "stringData": {"token": secret},
                },
            )
            staged = ReplicatedPool(
                replicas=replicas, api=kube_api, namespace=namespace, token=token, operator=bindery
            )
            async with resource_manager(
                kube_api,
                name=f"rm-{token}",
                scheduler_names=[staged.scheduler],
                endpoint=proxy.url,
                auth={"tokenSecretRef": {"namespace": namespace, "name": f"rm-token-{token}"}},
                backoff={"initialSeconds": 0.2, "maxSeconds": 1},
            ):
                yield staged
    finally:
        for name in nodes:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(kube_api).delete_node(name=name)
        for name in ("low", "high"):
            with contextlib.suppress(client.ApiException):
                await scheduling.delete_priority_class(name=f"pc-{token}-{name}")


async def test_a_high_priority_pod_preempts_through_two_replicas(replicated_pool: ReplicatedPool) -> None:
    pool = replicated_pool
    placed = await pool.fill()
    await pool.create("high", priority_class="high")
    node = await eventually(lambda: pool.node_of("high"), within=60, what="the preemptor bound")
    left = await pool.existing(list(placed))
    assert len(left) == 3, f"expected one victim evicted, {len(left)} low pods left: {left}"
    (victim,) = set(placed) - set(left)
    assert placed[victim] == node
    counts = {o: pool.preemptions(o) for o in ("proposed", "confirmed", "victim_evicted", "cancelled")}
    assert counts == {"proposed": 1, "confirmed": 1, "victim_evicted": 1, "cancelled": 0}
    # Which replica proposed the plan, which confirmed it (the proxy decides; printed, not asserted).
    proposed, confirmed = pool.said(r"plan pln-\w+ for pod"), pool.said("confirmed plan")
    print(f"plan proposed by replica {proposed}, confirmed by replica {confirmed}")
