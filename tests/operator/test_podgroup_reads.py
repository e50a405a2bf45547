"""A waiting pod group costs the apiserver nothing until something it waits for changes.

A group short of members used to GET its PodGroup and LIST every bound pod of its namespace on
each pass, and passed again after every backoff (at most ``spec.backoff.maxSeconds``): a thousand
waiting groups were a hundred LISTs a second. The operator talks to the apiserver through a
counting proxy (tests/operator/apiproxy.py); the window is two of its own unbound-pod sweeps (one
per reconcile interval, 5 s here), in which the old code, with a 0.5 s backoff, passed about
twenty times.
"""

from __future__ import annotations

import pathlib
import urllib.parse
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.conftest import OPERATOR_USER
from tests.gangs.scenarios import member, pod_group
from tests.operator.apiproxy import ApiProxy, serve_api_proxy
from tests.operator.conftest import Bindery, RealStage, eventually

pytestmark = pytest.mark.controlplane


def _member(name: str, *, group: str, stage: RealStage) -> dict[str, Any]:
    body = member(name, group=group, scheduler=stage.scheduler, pool="")
    del body["spec"]["nodeSelector"]  # the reference RM of the stage mirrors its one node only
    return body


def _group_reads(proxy: ApiProxy, since: int, *, namespace: str, group: str) -> list[str]:
    """The requests one group's pass made: a GET of its PodGroup, a LIST of its namespace's pods."""
    reads = []
    for method, path_qs in proxy.requests[since:]:
        url = urllib.parse.urlsplit(path_qs)
        query = urllib.parse.parse_qs(url.query)
        if method != "GET" or query.get("watch", [""])[0].lower() in ("true", "1"):
            continue
        if url.path in (
            f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{namespace}/podgroups/{group}",
            f"/api/v1/namespaces/{namespace}/pods",
        ):
            reads.append(path_qs)
    return reads


async def _message(stage: RealStage, name: str) -> str:
    pod = await client.CoreV1Api(stage.api).read_namespaced_pod(name, stage.namespace)
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return str(condition.message or "")
    return ""


async def test_a_waiting_group_makes_no_periodic_reads_and_is_woken_by_its_members(
    *,
    controlplane: ControlPlane,
    operator_kubeconfig: pathlib.Path,
    real_stage: RealStage,
    tmp_path: pathlib.Path,
) -> None:
    stage = real_stage
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as proxy:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=proxy.url
        )
        operator = Bindery(kubeconfig=kubeconfig)
        await operator.start()
        try:
            async with stage.served(
                backoff={"initialSeconds": 0.5, "maxSeconds": 0.5}, reconcileIntervalSeconds=5
            ):
                await client.CustomObjectsApi(stage.api).create_namespaced_custom_object(
                    "scheduling.k8s.io",
                    "v1alpha2",
                    stage.namespace,
                    "podgroups",
                    pod_group("few", min_count=3),
                )
                core = client.CoreV1Api(stage.api)
                await core.create_namespaced_pod(stage.namespace, _member("few-0", group="few", stage=stage))

                async def told(name: str, present: int) -> str | None:
                    message = await _message(stage, name)
                    return message if f"{present} exist" in message else None

                await eventually(lambda: told("few-0", 1), within=30, what="few-0 told its group waits")
                since = len(proxy.requests)
                sweeps = operator.runtime.pending.sweeps

                async def swept_twice() -> bool:
                    return operator.runtime.pending.sweeps >= sweeps + 2

                await eventually(swept_twice, within=40, what="two unbound-pod sweeps")
                reads = _group_reads(proxy, since, namespace=stage.namespace, group="few")
                assert reads == [], f"{len(reads)} reads while the group waited: {reads[:3]}"

                # A new member wakes the group at once, and it learns of it without a read.
                await core.create_namespaced_pod(stage.namespace, _member("few-1", group="few", stage=stage))
                await eventually(lambda: told("few-1", 2), within=30, what="few-1 told 2 members exist")
                assert _group_reads(proxy, since, namespace=stage.namespace, group="few") == []

                await core.create_namespaced_pod(stage.namespace, _member("few-2", group="few", stage=stage))

                async def all_bound() -> bool:
                    pods = await core.list_namespaced_pod(stage.namespace)
                    return sum(1 for p in pods.items if p.spec.node_name) == 3

                await eventually(all_bound, within=30, what="the whole group bound once it had 3 members")
                await stage.settled()
        finally:
            await operator.stop()
