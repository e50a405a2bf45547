"""The shared harness (tests/realrm.py) proves what it claims: its invariant checks catch a leak, a
double schedule and an overcommitted node, and its processes bind a pod end to end."""

from __future__ import annotations

import pathlib
import signal
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.audit.findings import overcommitted_nodes
from bindery.rm.models import PodIdentity, ReservationRequest, ReservationState
from tests.operator.conftest import create_pod, eventually, node_of, pod_body
from tests.realrm import (
    double_schedules,
    invariant_violations,
    reservation_violations,
    scene,
    settled_invariants,
)


def _pod(name: str, uid: str, *, node: str | None = None, cpu: str = "1", phase: str = "Pending") -> Any:
    spec: dict[str, Any] = {
        "schedulerName": "s",
        "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": spec,
        "status": {"phase": phase},
    }


def _reservation(rid: str, *, uid: str, name: str, node: str, state: str) -> Any:
    from bindery.rm.models import Reservation

    return Reservation.model_validate(
        {
            "id": rid,
            "node": node,
            "state": state,
            "podUid": uid,
            "schedulerName": "s",
            "namespace": "ns",
            "name": name,
            "expiresAt": None,
            "idempotencyKey": uid,
        }
    )


def test_overcommit_counts_every_bound_pod_and_skips_finished_ones() -> None:
    node = {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "4", "pods": "10"}}}
    pods = [_pod("a", "1", node="n", cpu="3"), _pod("b", "2", node="n", cpu="2")]
    [finding] = overcommitted_nodes(nodes=[node], pods=pods)
    assert (finding.subject, finding.message) == ("node n", "2 bound pod(s) request 5 cpu; allocatable is 4")
    pods[0]["status"]["phase"] = "Succeeded"
    assert overcommitted_nodes(nodes=[node], pods=pods) == []


def test_reservation_checks_find_leaks_and_unreserved_bound_pods() -> None:
    pods = [_pod("a", "1", node="n"), _pod("b", "2"), _pod("c", "3", node="n")]
    reservations = [
        _reservation("r1", uid="1", name="a", node="n", state="committed"),  # fine
        _reservation("r2", uid="2", name="b", node="n", state="reserved"),  # pending pod: fine
        _reservation("r3", uid="9", name="gone", node="n", state="committed"),  # leaked
    ]
    lines = reservation_violations(
        reservations=reservations, pods=pods, namespace="ns", scheduler_names={"s"}
    )
    assert lines == [
        "reservation r3: committed on node n, but pod ns/gone (9) no longer exists",
        "pod ns/c: bound to n with scheduler name 's', but the resource manager holds no reservation "
        "for it there",
    ]


def test_double_schedule_is_reported() -> None:
    event = {"reason": "Scheduled", "regarding": {"uid": "u", "name": "p"}}
    assert double_schedules([event]) == []
    assert double_schedules([event, event]) == ["pod p (u) was scheduled 2 times"]


@pytest.mark.controlplane
async def test_processes_bind_and_the_leak_check_can_fail(
    *,
    controlplane: Any,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    async with scene(
        kube_api,
        admin_kubeconfig=controlplane.kubeconfig,
        operator_kubeconfig=operator_kubeconfig,
        namespace=namespace,
        directory=tmp_path,
    ) as stage:
        rm, operator, scheduler = stage.rm, stage.operator, stage.scheduler
        for name in ("one", "two", "three"):
            await create_pod(
                kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name=scheduler)
            )
        for name in ("one", "two", "three"):
            await eventually(
                lambda name=name: node_of(kube_api, namespace=namespace, name=name),  # type: ignore[misc]
                within=60,
                what=f"pod {name} bound",
            )
        await settled_invariants(api=kube_api, rm=rm, namespace=namespace, scheduler_names=[scheduler])
        committed = [r for r in await rm.reservations() if r.namespace == namespace]
        assert sorted(r.state for r in committed) == [ReservationState.COMMITTED] * 3

        # A reservation for a pod that does not exist is exactly what the check exists to catch.
        async with rm.client() as direct:
            leaked = await direct.reserve(
                ReservationRequest(
                    pod=PodIdentity(
                        uid="ghost-uid", namespace=namespace, name="ghost", scheduler_name=scheduler
                    ),
                    resources={"cpu": "100m"},
                    idempotency_key="ghost-uid",
                    ttl_seconds=300,
                )
            )
            lines = await invariant_violations(
                api=kube_api, rm=rm, namespace=namespace, scheduler_names=[scheduler]
            )
            assert any(leaked.id in line for line in lines), lines
            await direct.release(leaked.id)

        # The RM survives SIGKILL on the same URL with what it acknowledged.
        rm.kill(signal.SIGKILL)
        await rm.restart()
        assert len([r for r in await rm.reservations() if r.namespace == namespace]) == 3
        assert operator.running
