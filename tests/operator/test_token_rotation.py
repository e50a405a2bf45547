"""A rotated ServiceAccount token is picked up by Kopf's watches and by Bindery's writes.

In a cluster the kubelet replaces the projected token file before the old token expires. Here two
real ServiceAccount tokens are minted with the TokenRequest API, each bound to its own Secret:
deleting a bound object invalidates its tokens at once (the apiserver checks the object still
exists), which needs no controller-manager, unlike deleting the ServiceAccount's tokens by expiry
(TokenRequest refuses lifetimes under 10 minutes). The operator starts with token A in its token
file, the file is swapped to token B, A is revoked, and a new pod must still be bound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import ssl
from collections.abc import Callable

import httpx
import pytest
import yaml
from kubernetes_asyncio import client

from bindery.controller.startup.connection import TokenFile
from bindery.controller.startup.entry import EmbeddedOperator
from bindery.controller.startup.install import grant_operator
from bindery.controller.startup.options import OperatorOptions
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import Stage, eventually

WATCH_TIMEOUT = 2  # seconds: Kopf re-watches (and so re-authenticates) this often


async def mint_bound_token(core: client.CoreV1Api, *, namespace: str, sa: str, secret: str) -> str:
    """A token of `sa` that is valid only while Secret `secret` exists (TokenRequest boundObjectRef)."""
    created = await core.create_namespaced_secret(
        namespace=namespace, body={"metadata": {"name": secret}, "stringData": {"purpose": "token binding"}}
    )
    request = await core.create_namespaced_service_account_token(
        name=sa,
        namespace=namespace,
        body={
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "name": secret,
                    "uid": created.metadata.uid,
                },
            }
        },
    )
    token: str = request.status.token
    return token


def replace_atomically(path: pathlib.Path, content: str) -> None:
    """As the kubelet's atomic writer does: the new file appears under the name in one rename."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(content)
    os.replace(staged, path)


async def status_with(plane: ControlPlane, token: str) -> int:
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=plane.ca_file)) as http:
        answer = await http.get(f"{plane.server}/api", headers={"Authorization": f"Bearer {token}"})
    return answer.status_code


@pytest.mark.controlplane
async def test_the_operator_keeps_scheduling_after_its_token_is_rotated_and_revoked(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    uniq: Callable[[str], str],
    stage: Stage,
    tmp_path: pathlib.Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kopf")
    core = client.CoreV1Api(kube_api)
    sa = "bindery"
    await core.create_namespaced_service_account(namespace=namespace, body={"metadata": {"name": sa}})
    role = uniq("bindery-rotation")
    await grant_operator(api=kube_api, user=f"system:serviceaccount:{namespace}:{sa}", name=role)
    token_a = await mint_bound_token(core, namespace=namespace, sa=sa, secret="bound-a")
    token_b = await mint_bound_token(core, namespace=namespace, sa=sa, secret="bound-b")
    token_file = tmp_path / "token"
    token_file.write_text(token_a)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": controlplane.server,
                            "certificate-authority": str(controlplane.ca_file),
                        },
                    }
                ],
                "users": [{"name": "sa", "user": {"tokenFile": "token"}}],  # relative to the kubeconfig
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
                "current-context": "c",
            }
        )
    )
    node = stage.node
    operator = EmbeddedOperator(
        options=OperatorOptions(kubeconfig=kubeconfig, probe_interval=2.0, watch_timeout=WATCH_TIMEOUT)
    )
    await operator.start()
    try:
        async with stage.served():
            await stage.create("before")
            assert await eventually(lambda: stage.node_of("before"), what="bound with A") == node

            replace_atomically(token_file, token_b)
            await core.delete_namespaced_secret(name="bound-a", namespace=namespace)
            # The apiserver caches token reviews for a few seconds: wait until A is really refused.
            await eventually(lambda: _refused(controlplane, token_a), within=30, what="token A to be refused")
            assert await status_with(controlplane, token_b) == 200
            # Every Kopf watch has re-watched since (with A it would get 401 and log in again).
            await asyncio.sleep(WATCH_TIMEOUT * 2)

            await stage.create("after")
            assert await eventually(lambda: stage.node_of("after"), what="bound with B") == node
    finally:
        await operator.stop()
        rbac = client.RbacAuthorizationV1Api(kube_api)
        await rbac.delete_cluster_role_binding(name=role)
        await rbac.delete_cluster_role(name=role)


def test_a_token_file_is_reread_only_when_it_changes(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    tokens = TokenFile(path=path)
    assert tokens.current() == "one"
    replace_atomically(path, "two")
    assert tokens.current() == "two"
    path.unlink()  # mid-rotation: keep the last token rather than none
    assert tokens.current() == "two"
    path.write_text("")
    assert tokens.current() == "two"
    replace_atomically(path, "three")
    assert tokens.current() == "three"


async def _refused(plane: ControlPlane, token: str) -> bool:
    return await status_with(plane, token) == 401
