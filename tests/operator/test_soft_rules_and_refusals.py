"""Issue 19 on a real plane: soft node rules reach the reference RM, Gt/Lt tolerations are carried,
and a pod with DRA claims for an RM without `devices` is refused with nothing reserved.

The reference RM runs as its own process mirroring the stage's nodes (tests/realrm.py), so what it
decides comes from the Node objects the apiserver holds, not from a fake. The plane runs with
TaintTolerationComparisonOperators on (bindery.devcluster.plane.FEATURE_GATES), or the apiserver
would refuse the Gt/Lt pods themselves.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.apiserver import create, resources
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import Bindery, RealStage, condition, eventually, read_pod, real_stage_of
from tests.operator.test_failures import _failed

pytestmark = pytest.mark.controlplane

_SLA_KEY = "example.com/sla"


async def _unschedulable_because(stage: RealStage, name: str, words: str) -> dict[str, Any] | None:
    cond = await _failed(stage.api, stage.namespace, name, "Unschedulable")
    return cond if cond is not None and words in str(cond.get("message")) else None


def _toleration(operator: str, value: str) -> dict[str, str]:
    return {"key": _SLA_KEY, "operator": operator, "value": value, "effect": "NoSchedule"}


async def test_dra_claims_for_an_rm_without_devices_are_refused_and_nothing_is_reserved(
    *, real_stage: RealStage, kube_api: client.ApiClient, bindery: Bindery
) -> None:
    """Before: refused by field (SchedulerError), whatever the RM. Now the claims go through the
    DynamicResources plugin: a claim to allocate for an RM whose /v1/info does not list `devices` is
    unschedulable with a reason saying so, and a template's claim not created yet makes the pod wait;
    neither is reserved or bound."""
    stage = real_stage
    device_class = f"gpu-{stage.namespace}.example.com"
    await create(
        kube_api,
        resources.DEVICE_CLASSES,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{device_class}'"}}]},
        },
    )
    await create(
        kube_api,
        resources.RESOURCE_CLAIMS,
        namespace=stage.namespace,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
            },
        },
    )
    async with stage.served():
        await stage.create("claims", resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu"}])
        await stage.create(
            "template", resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        )
        cond = await eventually(
            functools.partial(_unschedulable_because, stage, "claims", "does not offer the devices feature"),
            within=30,
            what="PodScheduled=False (Unschedulable): the RM does not offer devices",
        )
        assert f"{stage.namespace}/gpu" in cond["message"]
        await eventually(
            functools.partial(_unschedulable_because, stage, "template", "waiting for the ResourceClaim"),
            within=30,
            what="PodScheduled=False (Unschedulable): the template's claim is not created yet",
        )
        for name in ("claims", "template"):
            uid = (await read_pod(stage.api, namespace=stage.namespace, name=name))["metadata"]["uid"]
            assert await stage.reservations_of(uid) == []
            assert await stage.node_of(name) is None


async def test_gt_and_lt_tolerations_are_matched_numerically_by_the_reference_rm(
    *, real_stage: RealStage, kube_api: client.ApiClient, bindery: Bindery
) -> None:
    """Before: every pod with a Gt/Lt toleration got a 400 (InvalidRequest) from the RM, retried for
    ever. Now: `Gt 900` and `Lt 1000` tolerate the node's taint `example.com/sla=950`, `Gt 960` does
    not, and its reason names the taint."""
    stage = real_stage
    await client.CoreV1Api(kube_api).patch_node(
        name=stage.node,
        body={"spec": {"taints": [{"key": _SLA_KEY, "value": "950", "effect": "NoSchedule"}]}},
    )
    async with stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
        await stage.create("plain")  # its refusal shows the RM's mirror has the taint
        await eventually(
            lambda: _unschedulable_because(stage, "plain", f"untolerated taint {{{_SLA_KEY}: 950}}"),
            within=30,
            what="the untolerating pod refused for the taint",
        )
        await stage.create("above-900", tolerations=[_toleration("Gt", "900")])
        await stage.create("below-1000", tolerations=[_toleration("Lt", "1000")])
        await stage.create("above-960", tolerations=[_toleration("Gt", "960")])
        for name in ("above-900", "below-1000"):
            assert (
                await eventually(functools.partial(stage.node_of, name), within=30, what=f"{name} bound")
                == stage.node
            )
        cond = await eventually(
            lambda: _unschedulable_because(stage, "above-960", f"untolerated taint {{{_SLA_KEY}: 950}}"),
            within=30,
            what="Gt 960 refused for the taint",
        )
        assert cond["reason"] == "Unschedulable"
        assert await stage.node_of("above-960") is None


async def test_a_preferred_node_wins_over_binpack(
    *, real_stage: RealStage, kube_api: client.ApiClient, bindery: Bindery
) -> None:
    """Two nodes of the stage's pool; the SSD one holds a pod, so binpack alone would put the next
    pod there too. A pod preferring nodes without `disk` lands on the other one. Before: the
    preference was dropped and binpack put it on the SSD node."""
    stage = real_stage
    pool = stage.node.removeprefix("real-")
    ssd = f"{stage.node}-ssd"
    await create_node(
        kube_api,
        name=ssd,
        capacity={"cpu": "4", "memory": "8Gi", "pods": "20"},
        labels={"bindery.dev/test-pool": pool, "disk": "ssd"},
    )
    try:
        async with stage.served():
            await stage.create("on-ssd", nodeSelector={"disk": "ssd"})  # also: the mirror has the node
            assert await eventually(lambda: stage.node_of("on-ssd"), within=30, what="on-ssd bound") == ssd
            no_disk = {"matchExpressions": [{"key": "disk", "operator": "DoesNotExist"}]}
            await stage.create(
                "prefers-plain",
                affinity={
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 10, "preference": no_disk}
                        ]
                    }
                },
            )
            bound = await eventually(lambda: stage.node_of("prefers-plain"), within=30, what="bound")
            assert bound == stage.node, f"binpack's SSD node {ssd} won over the preference"
            pod = await read_pod(kube_api, namespace=stage.namespace, name="prefers-plain")
            assert (condition(pod) or {}).get("status") == "True"
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(kube_api).delete_node(name=ssd)


@pytest.fixture
async def v1_1_stage(
    controlplane: ControlPlane, kube_api: client.ApiClient, crd: None, namespace: str, tmp_path: pathlib.Path
) -> AsyncIterator[RealStage]:
    """`real_stage` whose reference RM serves as a contract v1.1 RM (`--no-cluster-id`): it refuses
    preferredNodeAffinity and Gt/Lt tolerations with 400, as every v1.1 RM refuses unknown fields."""
    async with real_stage_of(
        controlplane=controlplane,
        api=kube_api,
        namespace=namespace,
        directory=tmp_path / "rm",
        rm_options=["--no-cluster-id"],
    ) as stage:
        yield stage


async def test_a_v1_1_rm_gets_no_preferences_and_a_gt_pod_is_refused_with_a_reason(
    *, v1_1_stage: RealStage, bindery: Bindery
) -> None:
    """Before: the Gt pod got InvalidRequest (the RM's 400) at every attempt. Now it is Unschedulable,
    saying the RM lacks toleration-comparisons, with nothing reserved; a pod with a preferred term
    binds (the client left the field out, or the RM would have answered 400)."""
    stage = v1_1_stage
    preferred = [{"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}}]
    async with stage.served():
        await stage.create("gt", tolerations=[_toleration("Gt", "900")])
        await stage.create(
            "prefers",
            affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}},
        )
        assert (
            await eventually(lambda: stage.node_of("prefers"), within=30, what="prefers bound") == stage.node
        )
        cond = await eventually(
            lambda: _unschedulable_because(stage, "gt", "toleration-comparisons"),
            within=30,
            what="the Gt pod refused for the missing feature",
        )
        assert "cannot take the pod" in cond["message"]
        assert "spec.tolerations" in cond["message"]
        uid = (await read_pod(stage.api, namespace=stage.namespace, name="gt"))["metadata"]["uid"]
        assert await stage.reservations_of(uid) == []
