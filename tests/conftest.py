"""Shared fixtures: one real control plane per test session, a fresh namespace per test.

The plane is started only when a test asks for it, so unit tests run without it.

The real-cluster suites (tests/cluster, the controller scenarios of tests/chaos) use a second plane,
`cluster`, with kube-controller-manager, kwok and kube-scheduler. It is separate, not the shared one:
node lifecycle, pod GC and namespace deletion would change what the other suites' kubelet-less nodes
and never-deleted namespaces rely on.

Every test lands in exactly one tier, decided here from what it uses (`tier_of`), never from a marker
its file must remember: `unit` (no plane), `plane` (the shared `controlplane`), `cluster` (the
`cluster` plane) or `slow` (tests/chaos, tests/benchmarks, `SLOW_FIXTURES`, the measured `SLOW_TESTS`,
and tests that start a plane of their own: those carry `@pytest.mark.controlplane` and use neither
fixture).
`scripts/test --fast` runs `unit or plane`. A `unit` test cannot start a plane by mistake: in it,
`ControlPlane.start` fails and `BINDERY_CONTROLPLANE_BIN` points at a directory without etcd or
kube-apiserver, so child processes fail too (`_unit_tests_start_no_plane`).
"""

from __future__ import annotations

import gc
import pathlib
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, NoReturn

import pytest
from kubernetes_asyncio import client, config

from bindery.controller.install import apply_crd, grant_operator
from bindery.devcluster import binaries
from bindery.devcluster.plane import ControlPlane
from bindery.devcluster.postgres import PostgresServer

#: The operator's least-privilege identity (bindery.controller.rbac), on either plane.
OPERATOR_USER = "bindery-operator"

# -- tiers ----------------------------------------------------------------------------------------

#: Fastest first; `scripts/test --fast` runs the first two.
TIERS = ("unit", "plane", "cluster", "slow")
#: Directories under tests/ whose every test is slow by nature (seeded fault runs, benchmark smokes).
SLOW_DIRECTORIES = ("chaos", "benchmarks")
#: Fixtures that make a test slow wherever it is: `image` builds the container image with buildah
#: (tests/image; seconds when cached, minutes cold).
SLOW_FIXTURES = ("image",)
#: Tests (a file, or file::function for every parametrization of it) that took 15 s or more in
#: `scripts/test --fast --durations=0` (2 shared cores, load 2-7); the figure is setup+call+teardown.
SLOW_TESTS = (
    # 13-16 s: a reserve waits out the PostgreSQL lock_timeout (10 s) behind a stopped holder
    "rm/test_refrm_pgstore.py::test_a_replica_stopped_while_it_holds_the_placement_lock_stalls_the_others_for_seconds_not_hours",
    # 29 s, 16 s and 15 s: a leader and a standby as processes, SIGKILLed and SIGSTOPped
    "operator/test_leader_processes.py",
    # 26 s (call): 25 s of node events while a PDB-blocked preemptor backs off
    "operator/test_preemption_plane.py::test_a_preemptor_blocked_by_a_pdb_backs_off_instead_of_looping",
    # 83 s
    "operator/test_ghosts.py::test_five_thousand_pods_come_and_go_and_leave_no_per_pod_memory",
    # 16 s: 300 pods of 37 KB created, then listed under tracemalloc
    "operator/test_tenant_memory.py::test_listing_a_tenants_large_preset_pods_holds_one_small_page_at_a_time",
    # 38 s
    "operator/test_explain.py::test_explain_says_why_a_pod_is_pending_or_where_it_was_bound",
    # 33 s for each of its two parameters
    "operator/test_binding_409.py::test_a_pod_bound_to_our_node_by_someone_else_is_not_taken_as_ours",
    # 26 s
    "operator/test_audit.py::test_audit_command_finds_a_leak_that_the_operator_did_not_make",
    # 18 s
    "operator/test_supervisor.py::test_an_rm_down_while_the_operator_starts_is_picked_up_when_it_comes_back",
    # 16 s
    "operator/test_leader.py::test_a_standby_does_not_take_a_live_lease_whose_renew_time_looks_stale",
    # 16 s: schemathesis against the reference RM
    "rm/test_refrm_fuzz.py::test_reference_rm_matches_its_contract",
    # 17 s (2.7 s setup, 14.6 s the kit's lease waits): the whole kit against an RM on PostgreSQL
    "rm/test_refrm_postgres.py::test_conformance_kit_against_a_reference_rm_process_on_postgres",
    # 15 s: the chart installed, its two processes run under its identities
    "chart/test_chart_e2e.py",
    # 16 s to 25 s (call 11 s to 15 s; 25 s beside an e2e.test build): two schedulers' rounds on the
    # cluster plane, the reference RM and the operator as processes
    "placement/test_side_by_side.py",
    # 30 s (16 s call): the issue-21 preemption scenario under kube-scheduler, then under Bindery
    # (the reference RM and the operator as processes) on the cluster plane
    "placement/test_preemption_side_by_side.py",
    # 15-20 s each (call): the operator (or the leader of two) as a process SIGKILLed mid-preemption,
    # or restarted on a pod nominated by the dead one
    "operator/test_preemption_crash.py",
    # 14 s call, 18 s with setup: the operator as a process SIGKILLed mid gang preemption
    "operator/test_gang_preemption_crash.py",
    # 11-15 s and 11-17 s (call; 30-42 s for both with the cluster plane): 100 pods in 10 Deployments
    # with hard spread or anti-affinity at maxInFlight 256, the operator SIGKILLed mid-burst in the
    # second; the full 1,000-pod run is a command (the module's docstring)
    "placement/test_rules_burst.py",
    # 22 s (call, load 2-7): six bare pods behind a Service under both schedulers; its
    # ScheduleAnyway sibling stays in CI, and the cycle tests cover the Service selectors
    "placement/test_soft_spread.py::test_six_bare_pods_a_service_selects_spread_over_three_zones_under_binpack",
    # 23 s: slurmrestd tries a SIGKILLed slurmctld for ~9 s before it answers, then the restart
    "slurm/test_adapter.py::test_slurmctld_down_answers_unavailable_and_its_restart_keeps_the_reservations",
    # 17 s: CI's 10 conformance checks against the adapter, a group filling the pool and a batch among them
    "slurm/test_adapter.py::test_the_conformance_kit_passes_against_the_adapter",
    # 20 s, 38 s, 19 s, 31 s (runs with the cluster plane up): Deployments bound through a live
    # Slurm, the adapter or slurmctld SIGKILLed mid-burst, a pod queued behind site jobs
    "cluster/test_slurm_cluster.py",
)
_TESTS = pathlib.Path(__file__).parent
_TIERS_KEY = pytest.StashKey[list[tuple[pytest.Item, str]]]()


def tier_of(path: pathlib.Path, name: str, fixturenames: Iterable[str], markers: Iterable[str]) -> str:
    """The tier of test function `name` in `path` (under tests/) that uses `fixturenames`
    (pytest's closure, so fixtures of fixtures count) and carries `markers`."""
    fixtures, marks = set(fixturenames), set(markers)
    tests, resolved = _TESTS.resolve(), path.resolve()
    relative = resolved.relative_to(tests).as_posix() if resolved.is_relative_to(tests) else ""
    if (
        "slow" in marks
        or relative.split("/")[0] in SLOW_DIRECTORIES
        or fixtures.intersection(SLOW_FIXTURES)
        or relative in SLOW_TESTS
        or f"{relative}::{name}" in SLOW_TESTS
    ):
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
            getattr(item, "originalname", item.name),
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


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    """Tests call `bindery run` and `bindery rm serve` in-process, and their main tunes the cyclic
    collector (bindery.collector): frozen objects and high thresholds must not leak into the tests
    that follow in the same worker (nor let a later check of that tuning pass on another's)."""
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    yield
    if gc.get_freeze_count() != frozen:
        gc.unfreeze()
    gc.set_threshold(*threshold)


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


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL per session (bindery.devcluster.postgres), on loopback in a temporary
    directory; tests that crash it restart it before they end (``postgres_db`` checks)."""
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_db(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh database on the session's PostgreSQL; its URL. ``PGPASSWORD`` is set for the test
    (libpq reads it, in this process and in the RM processes a test starts), so the URL carries none."""
    if not postgres.running:  # a previous test crashed it and failed before restarting it
        postgres.restart()
    monkeypatch.setenv("PGPASSWORD", postgres.password)
    with postgres.database(f"t_{uuid.uuid4().hex[:12]}") as url:
        yield url
