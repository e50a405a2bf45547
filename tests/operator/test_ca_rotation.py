"""A CA rotated in `spec.tls.caSecretRef` is picked up at the next probe, without a restart.

The operator rebuilds its RM client when the credentials' digest changes; the digest covered the
token and the client certificate but not the CA, so a CA Secret updated in place (cert-manager
renewing a CA, an operator fixing a wrong bundle) was never read into a new client: the RM stayed
unreachable until the operator restarted. The reference RM serves HTTPS with a certificate of one
CA; the ResourceManager first trusts another, then the Secret is updated to the right one.
"""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.pki import CertificateAuthority
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import Bindery, eventually, resource_manager
from tests.realrm import RMProcess

pytestmark = pytest.mark.controlplane


async def _ready(api: client.ApiClient, name: str) -> dict[str, Any]:
    body: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
        group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=name
    )
    found = (body.get("status") or {}).get("conditions") or ()
    return next((c for c in found if c["type"] == "Ready"), {})


async def test_a_ca_rotated_in_its_secret_reaches_the_rm_client(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> None:
    right, wrong = (
        CertificateAuthority.create(common_name="rm-ca"),
        CertificateAuthority.create(common_name="other"),
    )
    cert, key = right.issue_server(hosts=["localhost"], ips=["127.0.0.1"]).write(
        directory=tmp_path, stem="rm"
    )
    token = uuid.uuid4().hex[:6]
    name, ca_secret, token_secret = f"rm-ca-{token}", f"rm-ca-{token}", f"rm-token-{token}"
    core = client.CoreV1Api(kube_api)
    labels = {CREDENTIALS_LABEL: "true"}
    async with RMProcess(
        kubeconfig=controlplane.kubeconfig,
        directory=tmp_path / "rm",
        node_selector=f"bindery.dev/test-pool={token}",
        options=["--tls-cert", str(cert), "--tls-key", str(key)],
    ) as rm:
        assert rm.url.startswith("https://"), rm.url
        await core.create_namespaced_secret(
            namespace=namespace,
            body={"metadata": {"name": token_secret, "labels": labels}, "stringData": {"token": rm.token}},
        )
        await core.create_namespaced_secret(
            namespace=namespace,
            body={
                "metadata": {"name": ca_secret, "labels": labels},
                "stringData": {"ca.crt": wrong.cert_pem.decode()},
            },
        )
        async with resource_manager(
            kube_api,
            name=name,
            scheduler_names=[f"s-{token}"],
            endpoint=rm.url,
            auth={"tokenSecretRef": {"namespace": namespace, "name": token_secret}},
            tls={"caSecretRef": {"namespace": namespace, "name": ca_secret}},
        ):

            async def unreachable() -> bool:
                return (await _ready(kube_api, name)).get("reason") == "Unreachable"

            await eventually(
                unreachable, within=60, what="Ready=False/Unreachable: the RM's CA is not trusted"
            )

            await core.patch_namespaced_secret(
                name=ca_secret, namespace=namespace, body={"stringData": {"ca.crt": right.cert_pem.decode()}}
            )

            async def scheduling() -> bool:
                return (await _ready(kube_api, name)).get("reason") == "Scheduling"

            await eventually(scheduling, within=60, what="Ready=True once the CA Secret holds the RM's CA")
