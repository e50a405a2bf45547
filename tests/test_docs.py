"""ARCHITECTURE.md and CONTRIBUTING.md checked against the code, so the map cannot drift from it.

Each says what a reader relies on: the package tree lists every module, a sentence "`x/` imports
only …" names exactly the rooms `x/` imports (read from the import graph import-linter builds, with
grimp), and CONTRIBUTING's layer block is the layers contract of pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import tomllib
from types import ModuleType

import grimp
import pytest

REPO = pathlib.Path(__file__).parent.parent
PACKAGE = REPO / "operator" / "bindery"
ARCHITECTURE = (REPO / "ARCHITECTURE.md").read_text()
CONTRIBUTING = (REPO / "CONTRIBUTING.md").read_text()


def listed_in_tree(text: str) -> set[str]:
    """The paths (`bindery/x/y.py`, `bindery/x/`) of the package tree's fenced block: an entry is
    the first word of a line, two spaces of indent per level; other lines continue a description."""
    block = text.split("## The package tree", 1)[1].split("```", 2)[1]
    path: list[str] = []
    listed = set()
    for line in block.splitlines()[1:]:
        name = line.split()[0] if line.strip() else ""
        if not name.endswith(("/", ".py")):
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        path = [*path[:depth], name]
        listed.add("".join(path))
    return listed


def modules_on_disk() -> set[str]:
    """Every module and package of bindery/ as the tree names it (a package's `__init__.py` is the
    package's own line; directories without one, the Go modules', are data)."""
    found = {"bindery/"}
    for path in PACKAGE.rglob("*"):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if path.is_dir() and (path / "__init__.py").is_file():
            found.add(f"{relative}/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            found.add(relative)
    return found


def test_the_package_tree_lists_every_module_and_nothing_else() -> None:
    listed = listed_in_tree(ARCHITECTURE)
    assert sorted(modules_on_disk() - listed) == [], "add these to ARCHITECTURE.md's package tree"
    gone = sorted(path for path in listed if not (PACKAGE.parent / path).exists())
    assert gone == [], "ARCHITECTURE.md's package tree lists modules that are gone"


_CLAIM = re.compile(r"`(\w+)/` imports only ((?:`\w+(?:/|\.py)`(?:, | and )?)+)")


def claims(text: str) -> dict[str, set[str]]:
    """Every "`x/` imports only `a/`, `b.py` and `c/`" of `text`: x → {a/, b.py, c/}."""
    flat = " ".join(text.split())
    found = {match[1]: set(re.findall(r"`([^`]+)`", match[2])) for match in _CLAIM.finditer(flat)}
    assert flat.count("imports only") - flat.count("imports only from") == len(found), (
        "a claim of 'imports only' this test cannot read: write it as `x/` imports only `a/`, `b.py` and `c/`"
    )
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("bindery", cache_dir=None)


def rooms_imported(graph: grimp.ImportGraph, package: str) -> set[str]:
    """The rooms of bindery (`rm/`, `quantity.py`) that modules of bindery.`package` import."""
    inside = f"bindery.{package}"
    rooms = set()
    for module in graph.find_descendants(inside) | {inside}:
        for imported in graph.find_modules_directly_imported_by(module):
            if not imported.startswith("bindery.") or imported == inside or imported.startswith(f"{inside}."):
                continue
            room = ".".join(imported.split(".")[:2])
            rooms.add(f"{room.removeprefix('bindery.')}{'/' if graph.find_children(room) else '.py'}")
    return rooms


def test_every_imports_only_claim_of_the_architecture_names_exactly_what_is_imported(
    graph: grimp.ImportGraph,
) -> None:
    found = claims(ARCHITECTURE)
    assert {"reference_rm", "slurm_rm"} <= found.keys()
    wrong = {
        package: {"claimed": sorted(rooms), "imported": sorted(rooms_imported(graph, package))}
        for package, rooms in found.items()
        if rooms != rooms_imported(graph, package)
    }
    assert wrong == {}


def test_a_false_claim_is_caught(graph: grimp.ImportGraph) -> None:
    """What ARCHITECTURE.md said before: the Slurm adapter imports only the contract."""
    [(package, rooms)] = claims("`slurm_rm/` imports only `rm/`.").items()
    assert rooms != rooms_imported(graph, package)
    assert "constraints.py" in rooms_imported(graph, package) - rooms


def test_contributings_layer_block_is_the_layers_contract_of_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    expected = "\n".join(layers)
    block = CONTRIBUTING.split("## Layers", 1)[1].split("```", 2)[1].strip()
    assert block == expected, f"CONTRIBUTING.md's layer block must read, from pyproject.toml:\n{expected}"


def _circles_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("circles", REPO / "scripts" / "lib" / "circles.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The import circles left inside packages (`scripts/circles` prints the imports that close them):
#: none is left, so a new one fails here.
KNOWN_CIRCLES: dict[str, list[list[str]]] = {}


def test_no_new_import_circle_inside_a_package(graph: grimp.ImportGraph) -> None:
    circles = _circles_script().circles
    packages = {module.rsplit(".", 1)[0] for module in graph.modules if "." in module}
    found = {package: found for package in sorted(packages) if (found := circles(graph, package))}
    assert found == KNOWN_CIRCLES


def test_the_circle_finder_finds_a_circle_of_two(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "looped").mkdir()
    (tmp_path / "looped" / "__init__.py").write_text("")
    (tmp_path / "looped" / "a.py").write_text("from looped import b\n")
    (tmp_path / "looped" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from looped import a\n"
    )
    (tmp_path / "looped" / "c.py").write_text("from looped import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    script = _circles_script()
    looped = grimp.build_graph("looped", cache_dir=None)
    assert script.circles(looped, "looped") == [["a", "b"]]
