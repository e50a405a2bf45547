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

Inside `unit`, the tests that start no process and open no socket are also `pure` (`is_pure`, from
what the test's file imports and the fixtures it uses): `scripts/test --pure`, the loop a contributor
runs on every save, needs neither the plane's binaries nor PostgreSQL. A pure test that connects,
binds or starts a process anyway fails at once (`_pure_tests_do_no_io`), in every run, CI's included:
a wrongly classified test fails instead of slowing the loop.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import gc
import inspect
import pathlib
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, NoReturn

import pytest
from kubernetes_asyncio import client, config

from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.devcluster import binaries
from bindery.devcluster.plane import ControlPlane
from bindery.devcluster.postgres import PostgresServer

#: The operator's least-privilege identity (bindery.controller.startup.rbac), on either plane.
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
    # 25 s: 1,001 members of one pod group created and refused
    "operator/test_podgroup_caps.py::test_a_group_of_1001_members_is_refused_on_its_members_and_its_podgroup",
    # 20 s: two unbound-pod sweeps (5 s reconcile interval) watched through a counting proxy
    "operator/test_podgroup_reads.py",
    # 13-16 s: a reserve waits out the PostgreSQL lock_timeout (10 s) behind a stopped holder
    "rm/test_refrm_pgstore.py::test_a_replica_stopped_while_it_holds_the_placement_lock_stalls_the_others_for_seconds_not_hours",
    # 29 s, 16 s and 15 s: a leader and a standby as processes, SIGKILLed and SIGSTOPped
    "operator/test_leader_processes.py",
    # 20-31 s: two replicas with a Lease per ResourceManager, one SIGKILLed
    "operator/test_lease_per_rm.py::test_two_replicas_each_lead_one_resource_manager_and_a_sigkill_stops_only_its_own",
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
#: What makes a `unit` test impure (it may start a process or open a socket), read from its file and
#: the tests/ helpers that file imports: a module imported from (or below) one of these, ...
IO_MODULES = (
    "subprocess",
    "socket",
    "multiprocessing",
    "aiohttp",  # web servers and real HTTP clients
    "bindery.devcluster",  # the plane, PostgreSQL, Slurm: processes
    "bindery.cli",  # `bindery run`, `rm serve` in-process: servers on loopback
    "bindery.controller.startup.entry",
    "bindery.reference_rm.cli",
    "bindery.reference_rm.server",
    "bindery.reference_rm.serve_reference_rm",  # re-exported by the package
    "bindery.slurm_rm.cli",
)
#: ... or an attribute of these names (asyncio's processes, servers and connections) ...
IO_CALLS = (
    "create_subprocess_exec",
    "create_subprocess_shell",
    "open_connection",
    "open_unix_connection",
    "start_server",
    "start_unix_server",
    "create_server",
    "create_connection",
)
#: ... or one of these fixtures of tests/conftest.py. A fixture of another conftest.py makes a test
#: impure when that conftest.py is impure by the two rules above.
IO_FIXTURES = ("postgres", "postgres_db", "controlplane", "cluster")
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


def _imported(tree: ast.AST) -> Iterator[str]:
    """Every module `tree` imports, at its top or inside a function."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


@functools.cache
def file_does_io(path: pathlib.Path) -> str | None:
    """What in the file at `path`, or in a tests/ module it imports, may start a process or open a
    socket (an `IO_MODULES` import, an `IO_CALLS` attribute); None when nothing does."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in IO_CALLS:
            return f"{path.name}:{node.lineno} uses {node.attr}"
        if (  # request.getfixturevalue("postgres_db"): a fixture outside pytest's closure
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getfixturevalue"
            and any(isinstance(a, ast.Constant) and a.value in IO_FIXTURES for a in node.args)
        ):
            return f"{path.name}:{node.lineno} gets fixture {ast.unparse(node.args[0])}"
    for module in _imported(tree):
        if any(module == io or module.startswith(f"{io}.") for io in IO_MODULES):
            return f"{path.name} imports {module}"
        if module.startswith("tests."):
            helper = _TESTS.parent.joinpath(*module.split("."))
            for candidate in (helper.with_suffix(".py"), helper / "__init__.py"):
                if candidate.is_file() and candidate != path and (found := file_does_io(candidate)):
                    return found
    return None


def is_pure(path: pathlib.Path, fixtures: Iterable[tuple[str, pathlib.Path]]) -> bool:
    """Whether a `unit` test in `path` that uses `fixtures` (name, the file defining it; pytest's
    closure) starts no process and opens no socket, as far as its files and fixtures say."""
    if file_does_io(path):
        return False
    root = _TESTS / "conftest.py"
    for name, defined_in in fixtures:
        if defined_in == root:
            if name in IO_FIXTURES:
                return False
        elif defined_in != path and defined_in.is_relative_to(_TESTS) and file_does_io(defined_in):
            return False
    return True


def _fixture_files(item: pytest.Item) -> Iterator[tuple[str, pathlib.Path]]:
    info = getattr(item, "_fixtureinfo", None)
    for name, definitions in info.name2fixturedefs.items() if info is not None else ():
        for definition in definitions:
            source = inspect.getsourcefile(definition.func)
            if source is not None:
                yield name, pathlib.Path(source).resolve()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pure",
        action="store_true",
        help="run only the pure tests (tests/conftest.py is_pure); files that may do I/O are not imported",
    )


def pytest_ignore_collect(collection_path: pathlib.Path, config: pytest.Config) -> bool | None:
    """With --pure, a test file that may do I/O is not even imported: importing every test module
    (schemathesis, Kopf, the servers) took longer than the pure tests' run."""
    if not config.getoption("pure") or not collection_path.name.startswith("test_"):
        return None
    return True if collection_path.suffix == ".py" and file_does_io(collection_path.resolve()) else None


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
        if tier == "unit" and is_pure(item.path.resolve(), _fixture_files(item)):
            item.add_marker("pure")
        tiers.append((item, tier))
    if config.getoption("pure"):
        kept = [item for item in items if item.get_closest_marker("pure") is not None]
        config.hook.pytest_deselected(
            items=[item for item in items if item.get_closest_marker("pure") is None]
        )
        items[:] = kept


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


class IOInPureTest(Exception):
    """A test classified `pure` started a process or opened a socket."""


def refuse_io(nodeid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Until `monkeypatch` undoes it: connecting or binding a socket, or starting a process, raises
    IOInPureTest naming test `nodeid`."""

    def refuse(what: str) -> Any:
        def refused(*_: Any, **__: Any) -> NoReturn:
            raise IOInPureTest(
                f"{nodeid} {what} but is classified pure (scripts/test --pure runs it on every"
                " save): add the module it goes through to IO_MODULES in tests/conftest.py, so"
                " that its file leaves the pure selection."
            )

        return refused

    monkeypatch.setattr(socket.socket, "connect", refuse("connects a socket"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connects a socket"))
    monkeypatch.setattr(socket.socket, "bind", refuse("binds a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("starts a process"))
    monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse("starts a process"))
    monkeypatch.setattr(asyncio, "create_subprocess_shell", refuse("starts a process"))


@pytest.fixture(autouse=True)
def _pure_tests_do_no_io(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("pure") is not None:
        refuse_io(request.node.nodeid, monkeypatch)


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
    """The operator's least-privilege identity on the cluster plane (bindery.controller.startup.rbac)."""
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
