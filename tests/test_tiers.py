"""The tiers of tests/conftest.py: every test has one, and no plane-starting test is a unit test.

`scripts/test --fast` trusts the `unit` tier to start no process of the control plane; these tests
are what keeps that true when someone adds a test that starts one without the shared fixtures.
`scripts/test --pure` trusts the `pure` part of `unit` to start no process and open no socket: the
tests below check how a file is classified and that a pure test's I/O fails. How long the pure run
takes is measured by running it (CONTRIBUTING.md), not asserted here.
"""

from __future__ import annotations

import asyncio
import inspect
import pathlib
import socket
import subprocess
import sys

import pytest

from bindery.devcluster import binaries
from bindery.devcluster.plane import ControlPlane
from tests.conftest import (
    SLOW_TESTS,
    TIERS,
    IOInPureTest,
    PlaneInUnitTier,
    collected_items,
    file_does_io,
    is_pure,
    refuse_io,
    tier_of,
)

TESTS = pathlib.Path(__file__).parent


@pytest.mark.parametrize(
    ("path", "name", "fixtures", "markers", "tier"),
    [
        ("rm/test_rm_models.py", "test_x", ["tmp_path"], [], "unit"),
        ("operator/test_binding.py", "test_x", ["stage", "controlplane"], ["controlplane"], "plane"),
        ("gangs/test_gangs.py", "test_x", ["cluster_api", "cluster"], ["controlplane"], "cluster"),
        ("devcluster/test_plane_restart.py", "test_x", [], ["controlplane"], "slow"),
        ("chaos/test_soak.py", "test_x", ["controlplane"], ["chaos", "controlplane"], "slow"),
        ("benchmarks/test_placement_bench_smoke.py", "test_x", [], [], "slow"),
        ("rm/test_rm_models.py", "test_x", [], ["slow"], "slow"),
        ("chart/test_dockerfile.py", "test_x", ["image"], [], "slow"),
        ("operator/test_leader_processes.py", "test_x", ["controlplane"], ["controlplane"], "slow"),
        ("rm/test_refrm_fuzz.py", "test_reference_rm_matches_its_contract", [], [], "slow"),
        ("rm/test_refrm_fuzz.py", "test_another", [], [], "unit"),
    ],
)
def test_the_tier_follows_from_the_fixtures_the_directory_and_the_marks(
    path: str, name: str, fixtures: list[str], markers: list[str], tier: str
) -> None:
    assert tier_of(TESTS / path, name, fixtures, markers) == tier


def test_every_measured_slow_test_still_exists(request: pytest.FixtureRequest) -> None:
    """A renamed or deleted test must leave SLOW_TESTS too, or the entry silently stops working."""
    items = collected_items(request.config)
    collected = {item.nodeid.split("[")[0].removeprefix("tests/") for item, _ in items}
    files = {nodeid.split("::")[0] for nodeid in collected}
    if not files >= {entry.split("::")[0] for entry in SLOW_TESTS}:
        pytest.skip("not every test file was collected in this session")
    assert [entry for entry in SLOW_TESTS if entry not in collected and entry not in files] == []


def test_every_selected_test_has_exactly_one_tier(request: pytest.FixtureRequest) -> None:
    wrong = {
        item.nodeid: tiers
        for item in request.session.items
        if len(tiers := [t for t in TIERS if item.get_closest_marker(t) is not None]) != 1
    }
    assert wrong == {}


def test_no_test_that_starts_a_plane_itself_is_in_the_unit_tier(request: pytest.FixtureRequest) -> None:
    """Read the body of every collected test (selected or not): one that calls ControlPlane.start
    must be in another tier. Tests that start a plane through a helper or a child process are
    caught when they run, by the guard below."""
    starts = []
    for item, tier in collected_items(request.config):
        function = getattr(item, "function", None)
        if tier != "unit" or function is None or item.path == pathlib.Path(__file__):  # not this file's
            continue
        if "ControlPlane.start" in inspect.getsource(function):
            starts.append(item.nodeid)
    assert starts == [], "mark these @pytest.mark.controlplane (slow tier) or use the fixtures"


def test_in_a_unit_test_a_plane_cannot_start() -> None:
    with pytest.raises(PlaneInUnitTier, match="is in the unit tier"):
        ControlPlane.start()


def test_in_a_unit_test_child_processes_find_no_plane_binaries() -> None:
    """A child (`python -m bindery.devcluster up`, a benchmark) inherits BINDERY_CONTROLPLANE_BIN."""
    with pytest.raises(SystemExit, match=r"unit-tier-has-no-control-plane.* lacks"):
        binaries.ensure_built(quiet=True)


@pytest.mark.parametrize(
    ("source", "pure"),
    [
        ("from bindery.scheduling.queue import SchedulingQueue\n", True),
        ("import subprocess\n", False),
        ("def test_x():\n    import socket\n", False),
        ("from aiohttp import web\n", False),
        ("from bindery.reference_rm import serve_reference_rm\n", False),
        ("from bindery.devcluster.postgres import PostgresServer\n", False),
        # a tests/ helper that imports aiohttp (the fake RM) makes its importer impure
        ("from tests.operator.fakerm import FakeRM\n", False),
        ("from tests.scheduling.fakes import FakeBinder\n", True),
        ("async def test_x():\n    await asyncio.create_subprocess_exec('true')\n", False),
        ("async def test_x():\n    await asyncio.open_connection('127.0.0.1', 1)\n", False),
        ("def test_x(request):\n    request.getfixturevalue('postgres_db')\n", False),
    ],
)
def test_a_file_is_pure_unless_it_or_a_helper_it_imports_may_do_io(
    tmp_path: pathlib.Path, source: str, pure: bool
) -> None:
    path = tmp_path / "test_x.py"
    path.write_text(source)
    assert is_pure(path, [("tmp_path", pathlib.Path(pytest.__file__))]) is pure
    assert (file_does_io(path) is None) is pure


@pytest.mark.parametrize(
    ("fixture", "defined_in", "pure"),
    [
        ("postgres_db", "conftest.py", False),
        ("controlplane", "conftest.py", False),
        ("_collector_restored", "conftest.py", True),
        ("fake_rm", "operator/conftest.py", False),  # a conftest.py that may do I/O
        ("helm", "chart/conftest.py", False),
    ],
)
def test_a_fixture_makes_a_test_impure_when_it_may_do_io(
    tmp_path: pathlib.Path, fixture: str, defined_in: str, pure: bool
) -> None:
    path = tmp_path / "test_x.py"
    path.write_text("def test_x():\n    pass\n")
    assert is_pure(path, [(fixture, (TESTS / defined_in).resolve())]) is pure


def test_the_scheduling_core_is_pure_and_the_reference_rm_over_http_is_not() -> None:
    """A classification that lost every file, or kept every one, would pass the tests above."""
    assert file_does_io((TESTS / "scheduling/test_queue.py").resolve()) is None
    assert file_does_io((TESTS / "scheduling/test_cycle.py").resolve()) is None
    assert file_does_io((TESTS / "rm/test_preemption.py").resolve()) is not None
    assert file_does_io((TESTS / "rm/test_refrm_server.py").resolve()) is not None


def test_every_pure_test_is_a_unit_test(request: pytest.FixtureRequest) -> None:
    wrong = [
        item.nodeid
        for item, tier in collected_items(request.config)
        if item.get_closest_marker("pure") and tier != "unit"
    ]
    assert wrong == []


def test_a_pure_test_that_connects_binds_or_starts_a_process_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_io("tests/test_x.py::test_x", monkeypatch)
    with socket.socket() as sock, pytest.raises(IOInPureTest, match=r"test_x connects a socket"):
        sock.connect(("127.0.0.1", 9))
    with socket.socket() as sock, pytest.raises(IOInPureTest, match=r"test_x binds a socket"):
        sock.bind(("127.0.0.1", 0))
    with pytest.raises(IOInPureTest, match=r"test_x starts a process.*IO_MODULES"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    async def child() -> None:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")

    with pytest.raises(IOInPureTest, match=r"test_x starts a process"):
        asyncio.run(child())
