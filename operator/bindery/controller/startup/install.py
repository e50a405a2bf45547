"""Install the CRD and the operator's RBAC through the API (demo and tests; the chart does it in clusters)."""

from __future__ import annotations

import asyncio
import pathlib
from importlib import resources as package_resources
from typing import Any

import yaml

from bindery.apiserver import (
    ApiClient,
    Conflict,
    NotFound,
    Unavailable,
    create,
    get,
    replace,
    request,
    resources,
)
from bindery.controller.startup.rbac import DEBUG_READER_RULES, cluster_role, cluster_role_binding

CRD_NAME = f"{resources.RESOURCE_MANAGERS.plural}.{resources.RESOURCE_MANAGERS.group}"
CRD_FILE = f"{CRD_NAME}.yaml"


def crd_manifest() -> dict[str, Any]:
    """The CRD from the package (wheel) or the repository's crds/ directory."""
    packaged = package_resources.files("bindery.controller").joinpath(CRD_FILE)
    if packaged.is_file():
        text = packaged.read_text()
    else:
        text = (pathlib.Path(__file__).resolve().parents[4] / "crds" / CRD_FILE).read_text()
    manifest: dict[str, Any] = yaml.safe_load(text)
    return manifest


async def apply_crd(*, api: ApiClient, wait_seconds: float = 30.0) -> None:
    """Create or replace the CRD and wait until it is Established."""
    manifest = crd_manifest()
    try:
        current = await get(api, resources.CRDS, name=CRD_NAME)
    except NotFound:
        await create(api, resources.CRDS, body=manifest)
    else:
        manifest["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await replace(api, resources.CRDS, name=CRD_NAME, body=manifest)
    await _wait_established(api=api, wait_seconds=wait_seconds)


async def _wait_established(*, api: ApiClient, wait_seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while loop.time() < deadline:
        crd = await get(api, resources.CRDS, name=CRD_NAME)
        conditions = (crd.get("status") or {}).get("conditions") or []
        established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
        if established and await _served(api):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"CRD {CRD_NAME} was not Established within {wait_seconds:g}s")


async def _served(api: ApiClient) -> bool:
    """Established can precede the storage being ready (429 'storage is (re)initializing')."""
    try:
        await request(api, "GET", resources.RESOURCE_MANAGERS.path(), query={"limit": 1})
    except (NotFound, Unavailable) as exc:
        if isinstance(exc, NotFound) or exc.status in (429, 503):
            return False
        raise
    return True


async def grant_operator(*, api: ApiClient, user: str, name: str = "bindery-operator") -> None:
    """Bind exactly the operator's ClusterRole to `user` (idempotent).

    An existing role is brought up to date: one left by an earlier version (a kept demo plane) lacks
    the verbs newer code needs, and the operator would fail with 403s far from their cause."""
    await _apply_grant(
        api=api, role=cluster_role(name=name), binding=cluster_role_binding(name=name, user=user)
    )


async def grant_debug_reader(*, api: ApiClient, user: str, name: str = "bindery-debug-reader") -> None:
    """Let `user` read the operator's queue views (rbac.DEBUG_READER_RULES; idempotent)."""
    await _apply_grant(
        api=api,
        role=cluster_role(name=name, rules=DEBUG_READER_RULES),
        binding=cluster_role_binding(name=name, user=user),
    )


async def _apply_grant(*, api: ApiClient, role: dict[str, Any], binding: dict[str, Any]) -> None:
    """Create the role and its binding, or bring them up to date: the role's rules are replaced, the
    user is added to the binding's subjects (others stay). RBAC objects take a PUT without
    resourceVersion; a binding's roleRef is immutable, and both name the same role here."""
    for resource, body, field in (
        (resources.CLUSTER_ROLES, role, "rules"),
        (resources.CLUSTER_ROLE_BINDINGS, binding, "subjects"),
    ):
        name = body["metadata"]["name"]
        try:
            await create(api, resource, body=body)
        except Conflict:  # AlreadyExists
            current = await get(api, resource, name=name)
            wanted = dict(body)
            if field == "subjects":  # add the user; never drop whoever else the binding grants
                kept = list(current.get("subjects") or [])
                wanted["subjects"] = kept + [s for s in body["subjects"] if s not in kept]
            if current.get(field) != wanted[field]:
                await replace(api, resource, name=name, body=wanted)
