"""The real container image: built by scripts/image (buildah, cached by its inputs), run by podman.

Heavy: the first build on a machine makes a Debian base and downloads the locked wheels (minutes);
later runs reuse the cached build (seconds). Every test module here is marked `image`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("BINDERY_IMAGE_CACHE", pathlib.Path.home() / ".cache/bindery/image"))
#: The chart's securityContext, as podman flags: non-root numeric user, read-only root filesystem
#: with an emptyDir-like /tmp, no capabilities, no privilege escalation.
USER = "10001:10001"
CHART_LIKE = (
    "--read-only",
    "--read-only-tmpfs=false",
    "--tmpfs=/tmp:rw,size=64m,mode=1777",
    f"--user={USER}",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    # This machine's root may not raise limits (no CAP_SYS_RESOURCE): podman's defaults exceed them.
    "--ulimit=nofile=4096:4096",
    "--ulimit=nproc=4096:4096",
)


@dataclasses.dataclass(frozen=True)
class Image:
    ref: str
    summary: dict[str, Any]
    podman: tuple[str, ...]

    def run_argv(self, *args: str, entrypoint: str | None = None, options: Sequence[str] = ()) -> list[str]:
        """`podman run` of this image as the chart runs it, on the host's network."""
        argv = [*self.podman, "run", "--rm", "--pull=never", "--network=host", *CHART_LIKE, *options]
        if entrypoint is not None:
            argv.append(f"--entrypoint={entrypoint}")
        return [*argv, self.ref, *args]

    def run(
        self, *args: str, entrypoint: str | None = None, options: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.run_argv(*args, entrypoint=entrypoint, options=options),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    def inspect(self) -> dict[str, Any]:
        out = subprocess.run(
            [*self.podman, "image", "inspect", self.ref],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        (found,) = json.loads(out)
        return dict(found)


@pytest.fixture(scope="session")
def image() -> Image:
    """The image built from ./Dockerfile by scripts/image (a cached build when nothing changed)."""
    proc = subprocess.run(
        [str(REPO / "scripts" / "image")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    assert proc.returncode == 0, f"scripts/image failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    print(proc.stdout)
    summary = json.loads((CACHE / "current.json").read_text())
    return Image(ref=summary["image"], summary=summary, podman=tuple(summary["podman"]))
