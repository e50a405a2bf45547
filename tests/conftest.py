"""Shared fixtures: one real control plane per test session, a fresh namespace per test.

The plane is started only when a test asks for it, so unit tests run without it.

The real-cluster suites (tests/cluster, the controller scenarios of tests/chaos) use a second plane,
`cluster`, with kube-controller-manager, kwok and kube-scheduler. It is separate, not the shared one:
node lifecycle, pod GC and namespace deletion would change what the other suites' kubelet-less nodes
and never-deleted namespaces rely on.

Every test lands in exactly one tier, decided here from what it uses (`tier_of`), never from a marker
its file must remember: `unit` (no plane), `plane` (the shared `controlplane`), `cluster` (the
`cluster` plane) or `slow` (tests/chaos, tests/benchmarks, the files in `SLOW_FILES`, and tests that
start a plane of their own: those carry `@pytest.mark.controlplane` and use neither fixture).
`scripts/test --fast` runs `unit or plane`. A `unit` test cannot start a plane by mistake: in it,
`ControlPlane.start` fails and `BINDERY_CONTROLPLANE_BIN` points at a directory without etcd or
kube-apiserver, so child processes fail too (`_unit_tests_start_no_plane`).
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, NoReturn

import pytest
from kubernetes_asyncio import client, config

from bindery.controller.install import apply_crd, grant_operator
from bindery.devcluster import binaries
from bindery.devcluster.plane import ControlPlane

#: The operator's least-privilege identity (bindery.controller.rbac), on either plane.
OPERATOR_USER = "bindery-operator"

# -- tiers ----------------------------------------------------------------------------------------

#: Fastest first; `scripts/test --fast` runs the first two.
TIERS = ("unit", "plane", "cluster", "slow")
#: Directories under tests/ whose every test is slow by nature (seeded fault runs, benchmark smokes).
SLOW_DIRECTORIES = ("chaos", "benchmarks")
#: Files whose tests each take many seconds on the shared plane (measured with --durations).
SLOW_FILES: tuple[str, ...] = ()
_TESTS = pathlib.Path(__file__).parent
_TIERS_KEY = pytest.StashKey[list[tuple[pytest.Item, str]]]()


def tier_of(path: pathlib.Path, fixturenames: Iterable[str], markers: Iterable[str]) -> str:
    """The tier of a test in `path` (under tests/) that uses `fixturenames` (pytest's closure,
    so fixtures of fixtures count) and carries `markers`."""
    fixtures, marks = set(fixturenames), set(markers)
    relative = path.resolve().relative_to(_TESTS.resolve())
    if "slow" in marks or relative.parts[0] in SLOW_DIRECTORIES or relative.as_posix() in SLOW_FILES:
        return "slow"
    if "cluster" in fixtures:
        return "cluster"
    if "controlplane" in fixtures:
        return "plane"
    if "controlplane" in marks:  # a plane of its own, started by the test or a child process
        return "slow"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the stash holds every collected test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = config.stash.setdefault(_TIERS_KEY, [])
    for item in items:
        tier = tier_of(
            item.path,
            getattr(item, "fixturenames", ()),
            (mark.name for mark in item.iter_markers()),
        )
        item.add_marker(tier)
        tiers.append((item, tier))


def collected_items(config: pytest.Config) -> list[tuple[pytest.Item, str]]:
    """Every test this session collected, selected or not, with its tier (for tests/test_tiers.py)."""
    collected: list[tuple[pytest.Item, str]] = config.stash.get(_TIERS_KEY, [])
    return list(collected)


@pytest.fixture(scope="session")
def _no_plane_bin(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A BINDERY_CONTROLPLANE_BIN holding helm alone: unit tests may render charts, not start planes."""
    directory = tmp_path_factory.mktemp("unit-tier-has-no-control-plane")
    helm = binaries.bin_dir() / "helm"
    if helm.is_file():
        (directory / "helm").symlink_to(helm)
    return directory


class PlaneInUnitTier(Exception):
    """A test in the unit tier tried to start a control plane."""


@pytest.fixture(autouse=True)
def _unit_tests_start_no_plane(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, _no_plane_bin: pathlib.Path
) -> None:
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*_: Any, **__: Any) -> NoReturn:
        raise PlaneInUnitTier(
            f"{request.node.nodeid} starts a control plane but is in the unit tier: use the"
            " `controlplane` or `cluster` fixture, or mark it `@pytest.mark.controlplane` (slow tier)."
        )

    monkeypatch.setattr(ControlPlane, "start", refuse)
    monkeypatch.setenv("BINDERY_CONTROLPLANE_BIN", str(_no_plane_bin))


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
