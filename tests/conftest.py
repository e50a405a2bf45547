"""Shared fixtures: one real control plane per test session, a fresh namespace per test.

The plane is started only when a test asks for it, so unit tests run without it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from kubernetes_asyncio import client, config

from bindery.devcluster.plane import ControlPlane


@pytest.fixture(scope="session")
def controlplane() -> Iterator[ControlPlane]:
    with ControlPlane.start() as plane:
        yield plane


async def api_client_for(kubeconfig: str) -> client.ApiClient:
    """An ApiClient authenticated by the given kubeconfig (the caller closes it)."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration=configuration)


@pytest.fixture(scope="session")
async def kube_api(controlplane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api = await api_client_for(str(controlplane.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
async def namespace(kube_api: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace. It is deleted afterwards, but with no controller-manager running it
    stays Terminating: that is harmless, since no later test reuses the name."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube_api)
    await core.create_namespace(body={"metadata": {"name": name}})
    yield name
    await core.delete_namespace(name=name)
