"""Install the CRD and the operator's RBAC through the API (demo and tests; the chart does it in clusters)."""

from __future__ import annotations

import asyncio
import pathlib
from importlib import resources
from typing import Any

import yaml
from kubernetes_asyncio import client

from bindery.controller.rbac import cluster_role, cluster_role_binding

CRD_NAME = "resourcemanagers.bindery.dev"
CRD_FILE = "resourcemanagers.bindery.dev.yaml"


def crd_manifest() -> dict[str, Any]:
    """The CRD from the package (wheel) or the repository's crds/ directory."""
    packaged = resources.files("bindery.controller").joinpath(CRD_FILE)
    if packaged.is_file():
        text = packaged.read_text()
    else:
        text = (pathlib.Path(__file__).resolve().parents[3] / "crds" / CRD_FILE).read_text()
    manifest: dict[str, Any] = yaml.safe_load(text)
    return manifest


async def apply_crd(*, api: client.ApiClient, wait_seconds: float = 30.0) -> None:
    """Create or replace the CRD and wait until it is Established."""
    ext = client.ApiextensionsV1Api(api)
    manifest = crd_manifest()
    try:
        current = await ext.read_custom_resource_definition(name=CRD_NAME)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        await ext.create_custom_resource_definition(body=manifest)
    else:
        manifest["metadata"]["resourceVersion"] = current.metadata.resource_version
        await ext.replace_custom_resource_definition(name=CRD_NAME, body=manifest)
    await _wait_established(ext=ext, wait_seconds=wait_seconds)


async def _wait_established(*, ext: client.ApiextensionsV1Api, wait_seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while loop.time() < deadline:
        crd = await ext.read_custom_resource_definition(name=CRD_NAME)
        conditions = (crd.status.conditions if crd.status else None) or []
        if any(c.type == "Established" and c.status == "True" for c in conditions) and await _served(ext):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"CRD {CRD_NAME} was not Established within {wait_seconds:g}s")


async def _served(ext: client.ApiextensionsV1Api) -> bool:
    """Established can precede the storage being ready (429 'storage is (re)initializing')."""
    objects = client.CustomObjectsApi(ext.api_client)
    try:
        await objects.list_cluster_custom_object(
            group="bindery.dev", version="v1alpha1", plural="resourcemanagers"
        )
    except client.ApiException as exc:
        if exc.status in (404, 429, 503):
            return False
        raise
    return True


async def grant_operator(*, api: client.ApiClient, user: str, name: str = "bindery-operator") -> None:
    """Bind exactly the operator's ClusterRole to `user` (idempotent)."""
    rbac = client.RbacAuthorizationV1Api(api)
    for create, body in (
        (rbac.create_cluster_role, cluster_role(name=name)),
        (rbac.create_cluster_role_binding, cluster_role_binding(name=name, user=user)),
    ):
        try:
            await create(body=body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
