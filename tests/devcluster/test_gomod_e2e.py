"""The wrapper module that builds Kubernetes' own ``e2e.test`` (``build --e2e``) is consistent with
the plane's, without building anything: the same Kubernetes release, every staging module pinned at
its matching release, ``go.sum`` complete for every package ``go test -c`` compiles, and a cache key
of its own (a change to it must not rebuild the plane, nor one to the plane rebuild it)."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from bindery.devcluster import binaries

E2E = binaries.GOMOD_DIR / binaries.E2E_MODULE
PLANE = binaries.GOMOD_DIR / "kubernetes"


def replaces(go_mod: pathlib.Path) -> dict[str, str]:
    block = re.search(r"^replace \((.*?)^\)", go_mod.read_text(), re.M | re.S)
    assert block is not None, f"{go_mod} has no replace block"
    return dict(re.findall(r"^\s*(\S+) => \S+ (\S+)$", block.group(1), re.M))


def test_the_e2e_module_pins_the_planes_kubernetes_and_every_staging_module() -> None:
    text = (E2E / "go.mod").read_text()
    assert re.search(rf"^\s*k8s\.io/kubernetes {re.escape(binaries.KUBERNETES_VERSION)}$", text, re.M)
    staging = "v0." + binaries.KUBERNETES_VERSION.removeprefix("v1.")
    e2e, plane = replaces(E2E / "go.mod"), replaces(PLANE / "go.mod")
    assert set(e2e.values()) == {staging}
    # The plane's replaces, plus sample-apiserver (test/e2e/apimachinery imports it).
    assert e2e == {**plane, "k8s.io/sample-apiserver": staging}


def test_go_sum_resolves_every_package_of_e2e_test_without_rewriting_anything() -> None:
    """`go list -test -deps` loads what `go test -c` compiles; read-only, a missing requirement or
    checksum fails here (naming it) instead of at the end of a long build."""
    before = {name: (E2E / name).read_bytes() for name in ("go.mod", "go.sum")}
    result = subprocess.run(
        ["go", "list", "-test", "-deps", binaries.E2E_PACKAGE],
        cwd=E2E,
        env=binaries.go_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{binaries.E2E_PACKAGE}.test" in result.stdout.split()
    assert "k8s.io/kubernetes/test/e2e/scheduling" in result.stdout.split()
    assert {name: (E2E / name).read_bytes() for name in ("go.mod", "go.sum")} == before


def test_the_e2e_binary_has_a_cache_key_of_its_own(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gomod = tmp_path / "gomod"
    shutil.copytree(binaries.GOMOD_DIR, gomod)
    monkeypatch.setattr(binaries, "GOMOD_DIR", gomod)
    plane, e2e = binaries.cache_key(), binaries.e2e_cache_key()
    (gomod / "e2e" / "go.sum").write_text((gomod / "e2e" / "go.sum").read_text() + "\n")
    assert binaries.cache_key() == plane
    assert binaries.e2e_cache_key() != e2e
    (gomod / "kwok" / "go.sum").write_text((gomod / "kwok" / "go.sum").read_text() + "\n")
    assert binaries.cache_key() != plane
    assert binaries.e2e_binary().parent.parent == binaries.cache_root().parent / "e2e"
