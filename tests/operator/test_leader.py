"""Leader election: exactly one replica schedules; a standby takes over when the leader stops."""

from __future__ import annotations

import datetime
import pathlib
from collections.abc import Callable

import pytest
from kubernetes_asyncio import client

from bindery.controller.embedded import EmbeddedOperator
from bindery.controller.leader import LeaseTiming, claimed_spec, may_acquire, micro_time
from bindery.controller.options import OperatorOptions
from bindery.controller.rbac import LEADER_ELECTION_RULES
from bindery.devcluster.nodes import create_node
from tests.operator.conftest import (
    OPERATOR_USER,
    create_pod,
    eventually,
    pod_body,
    read_pod,
    resource_manager,
)
from tests.operator.fakerm import FakeRM

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def _lease(holder: str, renewed: datetime.datetime, duration: int = 15) -> dict[str, object]:
    return {
        "spec": {"holderIdentity": holder, "renewTime": micro_time(renewed), "leaseDurationSeconds": duration}
    }


def test_a_held_lease_is_taken_only_after_it_expires() -> None:
    assert may_acquire(lease=None, identity="me", now=NOW)
    assert may_acquire(lease=_lease("me", NOW), identity="me", now=NOW)
    assert not may_acquire(
        lease=_lease("other", NOW - datetime.timedelta(seconds=10)), identity="me", now=NOW
    )
    assert may_acquire(lease=_lease("other", NOW - datetime.timedelta(seconds=16)), identity="me", now=NOW)


def test_claiming_counts_transitions_and_keeps_acquire_time_while_renewing() -> None:
    timing = LeaseTiming()
    first = claimed_spec(lease=None, identity="me", now=NOW, timing=timing)
    assert first["leaseTransitions"] == 0
    later = NOW + datetime.timedelta(seconds=2)
    renewed = claimed_spec(lease={"spec": first}, identity="me", now=later, timing=timing)
    assert renewed["acquireTime"] == first["acquireTime"]
    assert renewed["renewTime"] == micro_time(later)
    taken = claimed_spec(lease={"spec": renewed}, identity="other", now=later, timing=timing)
    assert taken["leaseTransitions"] == 1
    assert taken["holderIdentity"] == "other"


@pytest.mark.controlplane
async def test_one_leader_schedules_and_a_standby_takes_over(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    fake_rm: FakeRM,
    uniq: Callable[[str], str],
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube_api)
    await rbac.create_namespaced_role(
        namespace=namespace, body={"metadata": {"name": "bindery-leases"}, "rules": LEADER_ELECTION_RULES}
    )
    await rbac.create_namespaced_role_binding(
        namespace=namespace,
        body={
            "metadata": {"name": "bindery-leases"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bindery-leases"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
        },
    )
    options = OperatorOptions(
        kubeconfig=operator_kubeconfig,
        probe_interval=1.0,
        leader_election=True,
        lease_namespace=namespace,
        lease_name=uniq("lease"),
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.5,
    )
    replicas = [EmbeddedOperator(options=options), EmbeddedOperator(options=options)]
    node, scheduler = uniq("n"), uniq("sched")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 10
    for replica in replicas:
        await replica.start()
    try:
        async with resource_manager(
            kube_api, name=uniq("rm"), scheduler_names=[scheduler], endpoint=fake_rm.url
        ):
            await eventually(lambda: _async(sum(r.runtime.leading for r in replicas) == 1), what="one leader")
            await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="first", scheduler_name=scheduler)
            )
            await eventually(lambda: _node_of(kube_api, namespace, "first"), what="first bound")
            leader = next(r for r in replicas if r.runtime.leading)
            standby = next(r for r in replicas if r is not leader)
            assert sum(r.runtime.writes.snapshot().get("binding", 0) for r in replicas) == 1
            await leader.stop()
            await eventually(lambda: _async(standby.runtime.leading), within=15, what="the standby leading")
            await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="second", scheduler_name=scheduler)
            )
            await eventually(lambda: _node_of(kube_api, namespace, "second"), what="second bound")
            assert standby.runtime.writes.snapshot().get("binding") == 1
            assert len(fake_rm.reservations) == 2
    finally:
        for replica in replicas:
            await replica.stop()


async def _node_of(api: client.ApiClient, namespace: str, name: str) -> str | None:
    node: str | None = (await read_pod(api, namespace=namespace, name=name))["spec"].get("nodeName")
    return node


async def _async(value: bool) -> bool:
    return value
