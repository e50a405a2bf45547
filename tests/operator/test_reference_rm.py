"""Against the reference RM (real HTTP, bearer token, SQLite): binding, commit, token rotation."""

from __future__ import annotations

import base64
import pathlib
from collections.abc import Callable
from decimal import Decimal

import pytest
from kubernetes_asyncio import client

from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.nodes import create_node
from bindery.reference_rm.placement import InventoryNode
from bindery.reference_rm.server import serve_reference_rm
from bindery.rm.client import ResourceManagerClient
from tests.operator.conftest import Bindery, create_pod, eventually, pod_body, read_pod, resource_manager

pytestmark = pytest.mark.controlplane


async def _node_of(api: client.ApiClient, namespace: str, name: str) -> str | None:
    node: str | None = (await read_pod(api, namespace=namespace, name=name))["spec"].get("nodeName")
    return node


async def test_binds_with_the_reference_rm_and_survives_a_token_rotation(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    uniq: Callable[[str], str],
    tmp_path: pathlib.Path,
) -> None:
    node = uniq("ref")
    scheduler = uniq("sched")
    await create_node(kube_api, name=node)
    token_file = tmp_path / "token"
    token_file.write_text("token-one")
    secret = uniq("rm-token")
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_secret(
        namespace=namespace,
        body={
            "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
            "stringData": {"token": "token-one"},
        },
    )
    inventory = [
        InventoryNode(
            name=node, allocatable={"cpu": Decimal(4), "memory": Decimal(8 * 2**30), "pods": Decimal(110)}
        )
    ]
    async with (
        serve_reference_rm(db_path=tmp_path / "rm.sqlite", token_file=token_file, inventory=inventory) as rm,
        resource_manager(
            kube_api,
            name=uniq("rm"),
            scheduler_names=[scheduler],
            endpoint=rm.url,
            auth={"tokenSecretRef": {"namespace": namespace, "name": secret}},
            backoff={"initialSeconds": 0.2, "maxSeconds": 1},
        ),
    ):
        first = await create_pod(
            kube_api, namespace=namespace, body=pod_body(name="one", scheduler_name=scheduler)
        )
        assert await eventually(lambda: _node_of(kube_api, namespace, "one"), what="the first bind") == node

        async with ResourceManagerClient(
            base_url=rm.url, token="token-one", allow_insecure_http=True
        ) as check:

            async def committed() -> bool:
                found = await check.list_reservations(pod_uid=first["metadata"]["uid"])
                return [r.state for r in found] == ["committed"]

            await eventually(committed, what="the reservation committed at the reference RM")

        token_file.write_text("token-two")  # the RM rotates first; the operator follows the Secret
        await core.patch_namespaced_secret(
            name=secret,
            namespace=namespace,
            body={"data": {"token": base64.b64encode(b"token-two").decode()}},
        )
        await create_pod(kube_api, namespace=namespace, body=pod_body(name="two", scheduler_name=scheduler))
        assert (
            await eventually(
                lambda: _node_of(kube_api, namespace, "two"), within=30, what="bind after rotation"
            )
            == node
        )
