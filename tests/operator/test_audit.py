"""`bindery audit`: its pure findings, and the command against the real plane and reference RM."""

from __future__ import annotations

import asyncio
import datetime
import json
import pathlib
import sys
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.audit.findings import leaked_reservations, unexplained_pending
from bindery.rm.models import PodIdentity, Reservation, ReservationRequest
from tests.operator.conftest import create_pod, eventually, node_of, pod_body
from tests.realrm import scene

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)


def _pod(name: str, uid: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "creationTimestamp": "2026-12-02T11:50:00Z",
        },
        "spec": {"schedulerName": "s", "containers": [], **spec},
        "status": {"phase": "Pending"},
    }


def _reservation(rid: str, *, uid: str, name: str, state: str = "committed") -> Reservation:
    return Reservation.model_validate(
        {
            "id": rid,
            "node": "n1",
            "state": state,
            "podUid": uid,
            "schedulerName": "s",
            "namespace": "ns",
            "name": name,
            "idempotencyKey": uid,
        }
    )


def test_every_kind_of_leak_is_named() -> None:
    replaced = _pod("b", "other")
    finished = _pod("c", "3", nodeName="n1")
    finished["status"]["phase"] = "Succeeded"
    pods = [replaced, finished, _pod("d", "4", nodeName="n2"), _pod("e", "5"), _pod("f", "6")]
    found = leaked_reservations(
        resource_manager="rm",
        pods=pods,
        reservations=[
            _reservation("gone", uid="1", name="a"),
            _reservation("replaced", uid="2", name="b"),
            _reservation("finished", uid="3", name="c"),
            _reservation("elsewhere", uid="4", name="d"),
            _reservation("unbound", uid="5", name="e"),
            _reservation("in-flight", uid="6", name="f", state="reserved"),  # a cycle: not a leak
            _reservation("done", uid="1", name="a", state="released"),  # not active
        ],
    )
    assert [(f.subject, f.message.split(", but ")[1]) for f in found] == [
        ("reservation gone", "pod ns/a (1) no longer exists"),
        ("reservation replaced", "pod ns/b (2) was replaced by another pod of that name (other)"),
        ("reservation finished", "pod ns/c (3) has finished (Succeeded)"),
        ("reservation elsewhere", "pod ns/d (4) is bound to n2, not to the reserved node"),
        ("reservation unbound", "pod ns/e (5) is committed but not bound to any node"),
    ]


def test_pending_pods_need_an_explanation_after_the_grace_period() -> None:
    explained = _pod("explained", "1")
    explained["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    ]
    young = _pod("young", "2")
    young["metadata"]["creationTimestamp"] = "2026-12-02T11:59:50Z"
    pods = [
        explained,
        young,
        _pod("gated", "3", schedulingGates=[{"name": "g"}]),
        _pod("other", "4", schedulerName="default-scheduler"),
        _pod("silent", "5"),
    ]
    found = unexplained_pending(pods=pods, served={"s": "rm"}, now=NOW, grace=datetime.timedelta(seconds=60))
    assert [(f.subject, f.resource_manager) for f in found] == [("pod ns/silent", "rm")]
    assert found[0].message.startswith("pending for 600s with scheduler name 's'")


async def _audit(kubeconfig: pathlib.Path, *args: str) -> tuple[int, dict[str, Any]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bindery",
        "audit",
        "--kubeconfig",
        str(kubeconfig),
        "-o",
        "json",
        *args,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, json.loads(out)


@pytest.mark.controlplane
async def test_audit_command_finds_a_leak_that_the_operator_did_not_make(
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
        rm, scheduler, node, rm_name = stage.rm, stage.scheduler, stage.node, stage.rm_name
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler))
        await eventually(lambda: node_of(kube_api, namespace=namespace, name="p"), within=60, what="bound")

        def ours(report: dict[str, Any]) -> list[dict[str, Any]]:
            return [f for f in report["findings"] if f["resourceManager"] == rm_name or node in f["subject"]]

        async def clean() -> bool:
            _, report = await _audit(controlplane.kubeconfig, "-n", namespace)
            return not ours(report)

        await eventually(clean, within=60, what="a clean audit once the pod's reservation is committed")

        async with rm.client() as direct:
            leaked = await direct.reserve(
                ReservationRequest(
                    pod=PodIdentity(
                        uid="u-ghost", namespace=namespace, name="ghost", scheduler_name=scheduler
                    ),
                    resources={"cpu": "100m"},
                    idempotency_key="u-ghost",
                    ttl_seconds=600,
                )
            )
            await direct.commit(leaked.id)
            status, report = await _audit(controlplane.kubeconfig, "-n", namespace)
            assert status == 1
            assert ours(report) == [
                {
                    "kind": "leaked",
                    "subject": f"reservation {leaked.id}",
                    "message": (
                        f"committed on node {node}, but pod {namespace}/ghost (u-ghost) no longer exists"
                    ),
                    "resourceManager": rm_name,
                }
            ]
            await direct.release(leaked.id)
        rm.kill()
        await rm.wait()
        status, report = await _audit(controlplane.kubeconfig, "-n", namespace)
        assert any(rm_name in gap for gap in report["gaps"]), report
        assert status in (1, 2)  # other tests' leftovers may be findings; the gap is what matters here


def test_table_lists_findings_then_gaps_then_a_verdict() -> None:
    from bindery.audit import Audit, Finding
    from bindery.audit.collect import table

    audit = Audit(
        findings=[Finding(kind="overcommitted", subject="node n1", message="too much")],
        gaps=["could not list the reservations of ResourceManager 'x': down"],
        checked={"resourceManagers": 1, "pods": 3},
    )
    assert table(audit).splitlines() == [
        "KIND           OBJECT   RESOURCE MANAGER  WHAT IS WRONG",
        "overcommitted  node n1  -                 too much",
        "could not check: could not list the reservations of ResourceManager 'x': down",
        "1 finding(s); audit incomplete (1 resource managers, 3 pods)",
    ]
    assert table(Audit(checked={"pods": 0})) == "no findings (0 pods)"
