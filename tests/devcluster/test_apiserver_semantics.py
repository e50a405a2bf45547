"""The apiserver behaviours Bindery relies on, proven against the real kube-apiserver."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from bindery.devcluster.plane import ControlPlane
from tests.conftest import api_client_for

pytestmark = pytest.mark.controlplane


def pod_body(name: str, *, scheduler: str = "bindery", cpu: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/pause:1"}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu, "memory": "64Mi"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"schedulerName": scheduler, "containers": [container]},
    }


def binding(
    pod: Any, node: str, *, uid: str | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": pod.metadata.name, "uid": uid or pod.metadata.uid}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def bind(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> None:
    # The generated client cannot deserialize the Status that the binding endpoint returns, so
    # the raw response is read; without preloading, the client does not raise on errors either.
    resp = await core.create_namespaced_pod_binding(
        name=body["metadata"]["name"], namespace=namespace, body=body, _preload_content=False
    )
    try:
        if resp.status >= 400:
            exc = ApiException(status=resp.status, reason=resp.reason)
            exc.body = (await resp.read()).decode()
            raise exc
    finally:
        resp.release()


async def test_binding_sets_node_name_and_pod_scheduled(kube_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    pod = await core.create_namespaced_pod(namespace=namespace, body=pod_body("p"))
    await bind(core, namespace, binding(pod, "node-a"))
    stored = await core.read_namespaced_pod(name="p", namespace=namespace)
    assert stored.spec.node_name == "node-a"
    conditions = {c.type: c for c in stored.status.conditions or []}
    assert conditions["PodScheduled"].status == "True"


@pytest.mark.parametrize("second_node", ["node-a", "node-b"])
async def test_second_binding_is_rejected_with_409(
    kube_api: client.ApiClient, namespace: str, second_node: str
) -> None:
    core = client.CoreV1Api(kube_api)
    pod = await core.create_namespaced_pod(namespace=namespace, body=pod_body("p"))
    await bind(core, namespace, binding(pod, "node-a"))
    with pytest.raises(ApiException) as exc:
        await bind(core, namespace, binding(pod, second_node))
    assert exc.value.status == 409
    stored = await core.read_namespaced_pod(name="p", namespace=namespace)
    assert stored.spec.node_name == "node-a"


async def test_binding_with_a_foreign_uid_is_rejected_with_409(
    kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    pod = await core.create_namespaced_pod(namespace=namespace, body=pod_body("p"))
    with pytest.raises(ApiException) as exc:
        await bind(core, namespace, binding(pod, "node-a", uid="00000000-0000-0000-0000-000000000000"))
    assert exc.value.status == 409
    assert exc.value.body is not None
    assert "uid" in json.loads(exc.value.body)["message"].lower()
    stored = await core.read_namespaced_pod(name="p", namespace=namespace)
    assert stored.spec.node_name is None


async def test_binding_annotations_are_copied_onto_the_pod(
    kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    pod = await core.create_namespaced_pod(namespace=namespace, body=pod_body("p"))
    await bind(core, namespace, binding(pod, "node-a", annotations={"bindery.dev/reservation-id": "r-123"}))
    stored = await core.read_namespaced_pod(name="p", namespace=namespace)
    assert stored.metadata.annotations == {"bindery.dev/reservation-id": "r-123"}


async def test_field_selector_watch_sees_only_unbound_pods_of_a_scheduler(
    kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_pod(
        namespace=namespace, body=pod_body("other", scheduler="default-scheduler")
    )
    mine = await core.create_namespaced_pod(namespace=namespace, body=pod_body("mine"))
    events: list[tuple[str, str]] = []
    w = watch.Watch()

    async def consume() -> None:
        async for event in w.stream(
            core.list_namespaced_pod,
            namespace=namespace,
            field_selector="spec.schedulerName=bindery,spec.nodeName=",
            timeout_seconds=30,
        ):
            events.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                return

    task = asyncio.create_task(consume())
    while not events:  # the initial ADDED proves the watch is established
        await asyncio.sleep(0.05)
    await bind(core, namespace, binding(mine, "node-a"))
    await asyncio.wait_for(task, timeout=30)
    w.stop()
    assert events == [("ADDED", "mine"), ("DELETED", "mine")]


async def test_binding_needs_rbac(
    controlplane: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    pod = await core.create_namespaced_pod(namespace=namespace, body=pod_body("p"))
    kubeconfig = controlplane.mint_kubeconfig(user="binder-without-rbac")
    user_api = await api_client_for(str(kubeconfig))
    try:
        user_core = client.CoreV1Api(user_api)
        with pytest.raises(ApiException) as exc:
            await bind(user_core, namespace, binding(pod, "node-a"))
        assert exc.value.status == 403

        rbac = client.RbacAuthorizationV1Api(kube_api)
        await rbac.create_namespaced_role(
            namespace=namespace,
            body={
                "metadata": {"name": "binder"},
                "rules": [{"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}],
            },
        )
        await rbac.create_namespaced_role_binding(
            namespace=namespace,
            body={
                "metadata": {"name": "binder"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "binder"},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "binder-without-rbac"}
                ],
            },
        )
        for _ in range(50):  # the authorizer's cache catches up within moments
            try:
                await bind(user_core, namespace, binding(pod, "node-a"))
                break
            except ApiException as e:
                if e.status != 403:
                    raise
                await asyncio.sleep(0.1)
        stored = await core.read_namespaced_pod(name="p", namespace=namespace)
        assert stored.spec.node_name == "node-a"
    finally:
        await user_api.close()
