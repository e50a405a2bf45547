"""Kopf's view of the operator's credentials, and where the rest of them now live.

Kopf needs a `ConnectionInfo` (login handler) and Bindery's own requests a kubernetes_asyncio
`ApiClient`; both are built from the one `Configuration` that :mod:`bindery.apiserver.connection` loads
(token-file rotation and the once-read proxy environment are explained there), so they always act
as the same identity. Kopf follows a rotated token through its login handler: it reloads the
configuration, so it reads the file afresh; Kopf calls it at startup and again whenever a request
answers 401 (kopf._cogs.clients.auth.reauthenticated_request invalidates the credentials in its
vault and waits for a re-login).
"""

from __future__ import annotations

from typing import Any

import kopf

from bindery.apiserver.connection import (
    TokenFile,
    kubeconfig_token_file,
    load_configuration,
    resolve_environment_once,
)

# Re-exported: the runtime (converted after the groups branch merges) and tests import them here.
__all__ = [
    "TokenFile",
    "connection_info",
    "kubeconfig_token_file",
    "load_configuration",
    "resolve_environment_once",
]


def connection_info(*, configuration: Any) -> kopf.ConnectionInfo:
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
