"""`bindery run --log-format json`: one JSON object per line; a line about a pod names the pod, its
UID, its ResourceManager and its reservation; the RM's token never appears. The operator and the
reference RM run as processes; the pod is scheduled for real."""

from __future__ import annotations

import json
import pathlib
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import create_pod, delete_rm, eventually, node_of, pod_body
from tests.realrm import RMProcess, operator_process, serve_with

pytestmark = pytest.mark.controlplane


async def test_json_logs_carry_the_pod_and_its_reservation_and_never_the_token(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    token = uuid.uuid4().hex[:8]
    node, scheduler, rm_name = f"json-{token}", f"sched-{token}", f"rm-{token}"
    await create_node(kube_api, name=node, labels={"bindery.dev/test-pool": token})
    try:
        async with (
            RMProcess(
                kubeconfig=controlplane.kubeconfig,
                directory=tmp_path,
                node_selector=f"bindery.dev/test-pool={token}",
            ) as rm,
            operator_process(
                kubeconfig=operator_kubeconfig, directory=tmp_path, args=["--log-format", "json"]
            ) as operator,
        ):
            await serve_with(kube_api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=namespace)
            created = await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler)
            )
            await eventually(
                lambda: node_of(kube_api, namespace=namespace, name="p"), within=60, what="bound"
            )
            await operator.wait_for_log('"bound pod ', within=30)
            lines = [line for line in operator.log().splitlines() if line.strip()]
            entries: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line is JSON
            assert rm.token not in operator.log()
            [bound] = [e for e in entries if e["message"].startswith("bound pod ")]
            [reservation] = [r for r in await rm.reservations() if r.pod_uid == created["metadata"]["uid"]]
            assert bound["pod"] == f"{namespace}/p"
            assert bound["pod_uid"] == created["metadata"]["uid"]
            assert bound["resource_manager"] == rm_name
            assert bound["reservation"] == reservation.id
            assert {"time", "level", "logger", "message"} <= set(bound)
            # Lines that are not about a pod carry no pod fields.
            assert any("pod" not in e for e in entries)
    finally:
        await delete_rm(kube_api, name=rm_name)
        await client.CoreV1Api(kube_api).delete_node(node)
