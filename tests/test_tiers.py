"""The tiers of tests/conftest.py: every test has one, and no plane-starting test is a unit test.

`scripts/test --fast` trusts the `unit` tier to start no process of the control plane; these tests
are what keeps that true when someone adds a test that starts one without the shared fixtures.
"""

from __future__ import annotations

import inspect
import pathlib

import pytest

from bindery.devcluster import binaries
from bindery.devcluster.plane import ControlPlane
from tests.conftest import SLOW_TESTS, TIERS, PlaneInUnitTier, collected_items, tier_of

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
