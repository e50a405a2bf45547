"""Helpers for the chart tests: run the real helm and kubectl, render and parse manifests."""

from __future__ import annotations

import json
import pathlib
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "bindery"
CRD_SOURCE = REPO / "crds" / "resourcemanagers.bindery.dev.yaml"
CRD_IN_CHART = CHART / "crds" / "resourcemanagers.bindery.dev.yaml"
CRD_NAME = "resourcemanagers.bindery.dev"

# The dev control plane's version (bindery.devcluster.binaries.KUBERNETES_VERSION). `helm template`
# cannot ask a cluster, and the helm built from source defaults to v1.20, below the chart's
# kubeVersion, so every offline render names the version explicitly.
KUBE_VERSION = "1.36.3"


class CommandFailed(AssertionError):
    def __init__(self, cmd: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"`{' '.join(cmd)}` exited {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}"
            f"\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
        self.proc = proc


def run(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    check: bool = True,
    input: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(cmd), env=dict(env), input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise CommandFailed(cmd, proc)
    return proc


def values_file(values: Mapping[str, Any], directory: pathlib.Path) -> pathlib.Path:
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - the file must outlive this function
        "w", suffix=".yaml", dir=directory, delete=False
    )
    with handle:
        yaml.safe_dump(dict(values), handle)
    return pathlib.Path(handle.name)


def template_args(
    *,
    release: str,
    namespace: str,
    values: Mapping[str, Any] | None,
    tmp: pathlib.Path,
    extra: Iterable[str] = (),
) -> list[str]:
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    if values:
        args += ["--values", str(values_file(values, tmp))]
    return [*args, *extra]


def render(
    *,
    helm: str,
    env: Mapping[str, str],
    tmp: pathlib.Path,
    values: Mapping[str, Any] | None = None,
    release: str = "rel",
    namespace: str = "bindery-system",
    extra: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` → the list of rendered objects (CRDs not included)."""
    args = template_args(release=release, namespace=namespace, values=values, tmp=tmp, extra=extra)
    out = run([helm, *args], env=env).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_error(
    *,
    helm: str,
    env: Mapping[str, str],
    tmp: pathlib.Path,
    values: Mapping[str, Any] | None = None,
    extra: Iterable[str] = (),
) -> str:
    """Render expecting failure; return helm's error output."""
    args = template_args(release="rel", namespace="bindery-system", values=values, tmp=tmp, extra=extra)
    proc = run([helm, *args], env=env, check=False)
    assert proc.returncode != 0, (
        f"helm template accepted values it should reject: {values}\n{proc.stdout[:2000]}"
    )
    return proc.stderr


def by_kind(objects: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> Mapping[str, Any]:
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, (
        f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    )
    return found[0]


def kubectl_json(*args: str, kubectl: str, env: Mapping[str, str], input: str | None = None) -> Any:
    return json.loads(run([kubectl, *args, "-o", "json"], env=env, input=input).stdout)
