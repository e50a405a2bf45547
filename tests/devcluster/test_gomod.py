"""The dev plane's Go build never rewrites its pins (issue 20, item 12).

The build ran every Go command with ``-mod=mod``: a wrapper module whose ``go.mod`` lacked a
requirement was completed on the fly from the module proxy and rewritten, so a pin could drift
without a reviewed diff. The build's environment is now ``-mod=readonly``: such a build fails,
naming the package, and leaves the module files as they were.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

from bindery.devcluster import binaries


def test_a_build_missing_a_pin_fails_and_rewrites_nothing(tmp_path: pathlib.Path) -> None:
    module = binaries.GOMOD_DIR / "kwok"
    for name in ("go.sum", "tools.go"):
        shutil.copy(module / name, tmp_path / name)
    pinned = (module / "go.mod").read_text()
    assert "require sigs.k8s.io/kwok v0.8.0\n" in pinned
    (tmp_path / "go.mod").write_text(pinned.replace("require sigs.k8s.io/kwok v0.8.0\n", ""))
    before = {name: (tmp_path / name).read_text() for name in ("go.mod", "go.sum")}
    # `-n` only prints the commands: loading the packages is what would complete go.mod.
    result = subprocess.run(
        ["go", "build", "-n", "sigs.k8s.io/kwok/cmd/kwok"],
        cwd=tmp_path,
        env=binaries.go_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    after = {name: (tmp_path / name).read_text() for name in ("go.mod", "go.sum")}
    assert after == before, f"the build rewrote the module files:\n{result.stderr[-2000:]}"
    assert result.returncode != 0, "the build succeeded without the pin"
    assert "sigs.k8s.io/kwok/cmd/kwok" in result.stderr
    assert "-mod=readonly" in result.stderr
