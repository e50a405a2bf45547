"""The operator's cluster credentials: one kubernetes_asyncio `Configuration`, loaded from an
explicit kubeconfig, $KUBECONFIG / ~/.kube/config, or the in-cluster service account. Bindery's
own requests (through this package) and Kopf's watches (`bindery.controller.startup.connection` turns the
same Configuration into Kopf's `ConnectionInfo`) act as the same identity, which matters for RBAC
and for counting the operator's writes.

Tokens read from a file rotate: the kubelet rewrites the projected ServiceAccount token
(/var/run/secrets/kubernetes.io/serviceaccount/token) well before it expires (about hourly), and a
kubeconfig may name a `tokenFile` that something else refreshes. Both connections follow the file:

- Kopf: the login handler reloads the configuration, so it reads the file afresh; Kopf calls it at
  startup and again whenever a request answers 401 (kopf._cogs.clients.auth.reauthenticated_request
  invalidates the credentials in its vault and waits for a re-login).
- The ApiClient for Bindery's writes: kubernetes_asyncio calls `refresh_api_key_hook` before every
  request; `TokenFile` stats the file there and re-reads it only when it changed (one `stat` per
  write, no read), so the first request after a rotation already carries the new token. (In a
  cluster kubernetes_asyncio alone would re-read the file once a minute; a kubeconfig `tokenFile`
  it would never re-read.)

The environment is read once per ApiClient, not per request (`resolve_environment_once`).
kubernetes_asyncio's aiohttp session trusts the environment, so aiohttp sends every request through
a worker thread twice, to search ~/.netrc and to read the proxy variables: about 1.6 ms of CPU per
bound pod (its two writes), a fifth of the operator's. The proxy variables (HTTPS_PROXY, NO_PROXY,
...) still apply, resolved for the apiserver at startup.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import yaml
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.incluster_config import SERVICE_TOKEN_FILENAME
from yarl import URL

__all__ = ["TokenFile", "kubeconfig_token_file", "load_configuration", "resolve_environment_once"]


async def load_configuration(*, kubeconfig: pathlib.Path | None) -> client.Configuration:
    configuration = client.Configuration()
    path = kubeconfig or _default_kubeconfig()
    if path is not None:
        await config.load_kube_config(config_file=str(path), client_configuration=configuration)
        token_path = kubeconfig_token_file(kubeconfig=path)
    else:
        config.load_incluster_config(client_configuration=configuration)
        token_path = pathlib.Path(SERVICE_TOKEN_FILENAME)
    if token_path is not None:
        TokenFile(path=token_path).follow(configuration=configuration)
    return configuration


def kubeconfig_token_file(*, kubeconfig: pathlib.Path) -> pathlib.Path | None:
    """The current context's user's `tokenFile` (relative paths are relative to the kubeconfig)."""
    document: dict[str, Any] = yaml.safe_load(kubeconfig.read_text()) or {}
    contexts = {c.get("name"): c.get("context") or {} for c in document.get("contexts") or ()}
    user_name = contexts.get(document.get("current-context"), {}).get("user")
    users = {u.get("name"): u.get("user") or {} for u in document.get("users") or ()}
    token_file = users.get(user_name, {}).get("tokenFile")
    if not token_file:
        return None
    return kubeconfig.parent / os.path.expanduser(str(token_file))


class TokenFile:
    """A bearer token kept in a file that is replaced on rotation (re-read when its stat changes)."""

    def __init__(self, *, path: pathlib.Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None

    def current(self) -> str | None:
        """The token now in the file; the last one read if the file is briefly missing or empty."""
        try:
            info = self.path.stat()
        except OSError:
            return self._token
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp != self._stamp:
            try:
                token = self.path.read_text().strip()
            except OSError:
                return self._token
            if token:
                self._stamp, self._token = stamp, token
        return self._token

    def follow(self, *, configuration: client.Configuration) -> None:
        """Make every request of clients built on `configuration` carry the file's current token."""

        def refresh(target: client.Configuration, *_: Any) -> None:
            token = self.current()
            if token is not None:
                target.api_key["BearerToken"] = f"Bearer {token}"

        configuration.refresh_api_key_hook = refresh
        refresh(configuration)


def _default_kubeconfig() -> pathlib.Path | None:
    env = os.environ.get("KUBECONFIG")
    if env:
        return pathlib.Path(env.split(os.pathsep)[0])
    home = pathlib.Path.home() / ".kube" / "config"
    if home.exists():
        return home
    return None


def resolve_environment_once(*, api: client.ApiClient) -> None:
    """Give `api` the environment's proxy for its apiserver now and stop aiohttp reading it per request.

    An explicit proxy (kubeconfig `proxy-url`) wins, as before. ~/.netrc is no longer consulted:
    aiohttp refuses its credentials next to a bearer token anyway, and the apiserver has no basic
    authentication.
    """
    rest = api.rest_client
    if not rest.proxy:
        try:
            proxy, auth = get_env_proxy_for_url(URL(api.configuration.host))
        except LookupError:
            pass  # no proxy variable for this scheme, or NO_PROXY names the apiserver
        else:
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {**(rest.proxy_headers or {}), "Proxy-Authorization": auth.encode()}
    rest.pool_manager._trust_env = False
