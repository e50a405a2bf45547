"""One source of cluster credentials for both Kopf's watches and Bindery's own writes.

Kopf needs a `ConnectionInfo` (login handler) and the kube ports need a kubernetes_asyncio
`ApiClient`. Both are built from the same kubernetes_asyncio `Configuration`, loaded from an explicit
kubeconfig, $KUBECONFIG / ~/.kube/config, or the in-cluster service account, so they always act as
the same identity (which matters for RBAC and for counting the operator's writes).
"""

from __future__ import annotations

import os
import pathlib

import kopf
from kubernetes_asyncio import client, config


async def load_configuration(*, kubeconfig: pathlib.Path | None) -> client.Configuration:
    configuration = client.Configuration()
    path = kubeconfig or _default_kubeconfig()
    if path is not None:
        await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    return configuration


def _default_kubeconfig() -> pathlib.Path | None:
    env = os.environ.get("KUBECONFIG")
    if env:
        return pathlib.Path(env.split(os.pathsep)[0])
    home = pathlib.Path.home() / ".kube" / "config"
    if home.exists():
        return home
    return None


def connection_info(*, configuration: client.Configuration) -> kopf.ConnectionInfo:
    """Kopf's view of the same credentials (certificate, token or both)."""
    # kubernetes_asyncio keeps the token under "BearerToken" (older releases: "authorization"),
    # as "Bearer <token>"; both kubeconfig tokens and the in-cluster ServiceAccount token land there.
    api_key = configuration.api_key or {}
    authorization = api_key.get("BearerToken") or api_key.get("authorization") or ""
    token = authorization.removeprefix("Bearer ").strip() or None
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
        token=token,
        scheme="Bearer" if token else None,
    )
