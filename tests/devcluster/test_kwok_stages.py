"""kwok's pod-delete stage on the project's planes: a pod deleted with grace 0 and recreated under
its name is not deleted by kwok (the PodTopologySpread e2e setup's "without-label" vanished so)."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_kwok_node
from bindery.devcluster.plane import KWOK_NOT_DELETED_AT_ONCE, ControlPlane, ControlPlaneError, kwok_stages
from tests.workloads import eventually

STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-ready}
spec: {resourceRef: {apiGroup: v1, kind: Pod}, next: {statusTemplate: "phase: Running\\n"}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
  next: {delete: true}
"""


def test_only_the_pod_delete_stage_is_limited_to_pods_deleted_with_a_grace_period() -> None:
    ready, delete = yaml.safe_load_all(kwok_stages(STAGES))
    assert ready == next(yaml.safe_load_all(STAGES))
    assert delete["spec"]["selector"]["matchExpressions"] == [
        {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
        KWOK_NOT_DELETED_AT_ONCE,
    ]
    assert kwok_stages(kwok_stages(STAGES)) == kwok_stages(STAGES)


def test_a_bundle_without_a_pod_delete_stage_is_an_error_not_a_silent_pass() -> None:
    with pytest.raises(ControlPlaneError, match="no pod-delete stage"):
        kwok_stages(STAGES.split("---", maxsplit=1)[0])


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/pause"}]},
    }


async def test_kwok_leaves_a_pod_deleted_with_grace_0_to_the_apiserver(
    cluster: ControlPlane, cluster_api: client.ApiClient, cluster_namespace: str
) -> None:
    """kwok v0.8.0 deletes by name, so any DELETE it sends for a pod the apiserver removes itself
    may hit a pod created under that name meanwhile. A finalizer keeps the grace-0 pod in place,
    so kwok's pod-delete stage, if it fires, answers 200 and logs "Delete pod" for it; a pod deleted
    gracefully afterwards is deleted by kwok, the sign it has played the stages of both."""
    core = client.CoreV1Api(cluster_api)
    ns = cluster_namespace
    node = f"kw-{uuid.uuid4().hex[:8]}"
    await create_kwok_node(cluster_api, name=node)
    try:
        held = _pod("without-label", node)
        held["metadata"]["finalizers"] = ["bindery.dev/test-hold"]
        for body in (held, _pod("sentinel", node)):
            await core.create_namespaced_pod(ns, body)

        async def running() -> bool:
            pods = (await core.list_namespaced_pod(ns)).items
            return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

        await eventually(running, within=30, what="both pods Running")
        await core.delete_namespaced_pod("without-label", ns, grace_period_seconds=0)
        await core.delete_namespaced_pod("sentinel", ns)

        async def sentinel_gone() -> bool:
            try:
                await core.read_namespaced_pod("sentinel", ns)
            except client.ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        await eventually(sentinel_gone, within=30, what="kwok deleting the gracefully deleted sentinel")
        log = (cluster.workdir / "kwok.log").read_text()
        deleted = [
            line for line in log.splitlines() if "Delete pod" in line and f'"{ns}/without-label"' in line
        ]
        assert deleted == [], deleted
    finally:
        with contextlib.suppress(client.ApiException):
            await core.patch_namespaced_pod("without-label", ns, {"metadata": {"finalizers": None}})
        await core.delete_node(node)
