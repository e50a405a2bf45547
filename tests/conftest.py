"""Shared fixtures: one real control plane per test session, a fresh namespace per test.

The plane is started only when a test asks for it, so unit tests run without it.

The real-cluster suites (tests/cluster, the controller scenarios of tests/chaos) use a second plane,
`cluster`, with kube-controller-manager, kwok and kube-scheduler. It is separate, not the shared one:
node lifecycle, pod GC and namespace deletion would change what the other suites' kubelet-less nodes
and never-deleted namespaces rely on.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from kubernetes_asyncio import client, config

from bindery.controller.install import apply_crd, grant_operator
from bindery.devcluster.plane import ControlPlane

#: The operator's least-privilege identity (bindery.controller.rbac), on either plane.
OPERATOR_USER = "bindery-operator"


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


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    with ControlPlane.start(controllers=True, kwok=True, kube_scheduler=True) as plane:
        yield plane


@pytest.fixture(scope="session")
async def cluster_api(cluster: ControlPlane) -> AsyncIterator[client.ApiClient]:
    api = await api_client_for(str(cluster.kubeconfig))
    try:
        await apply_crd(api=api)
        yield api
    finally:
        await api.close()


@pytest.fixture(scope="session")
async def cluster_operator_kubeconfig(cluster: ControlPlane, cluster_api: client.ApiClient) -> pathlib.Path:
    """The operator's least-privilege identity on the cluster plane (bindery.controller.rbac)."""
    await grant_operator(api=cluster_api, user=OPERATOR_USER)
    return cluster.mint_kubeconfig(user=OPERATOR_USER)


@pytest.fixture
async def cluster_namespace(cluster_api: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace; the namespace controller really deletes it (and its pods) afterwards."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(cluster_api)
    await core.create_namespace(body={"metadata": {"name": name}})
    yield name
    try:
        await core.delete_namespace(name=name)
    except client.ApiException as exc:
        if exc.status != 404:  # a test may have deleted it itself
            raise
