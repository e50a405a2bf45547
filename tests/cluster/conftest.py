"""Fixtures of the real-cluster suite: a plane of its own with kube-controller-manager, kwok and
kube-scheduler, so pods made by controllers run on kwok nodes beside pods of another scheduler.

It is a separate plane, not the session's shared one: node lifecycle, pod GC and namespace deletion
would change what the other suites' kubelet-less nodes and never-deleted namespaces rely on.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from kubernetes_asyncio import client

from bindery.controller.install import apply_crd, grant_operator
from bindery.devcluster.plane import ControlPlane
from tests.conftest import api_client_for

OPERATOR_USER = "bindery-operator"


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
