"""Build the control-plane binaries from pinned Go modules, once per version.

These machines have no container runtime and no download sites, but they reach
the Go module proxy, so the binaries are compiled from the modules in ``gomod/``
(one wrapper module each, because ``k8s.io/kubernetes`` and etcd's server module
both replace their sibling modules with local paths that a dependent must pin).

Output goes to ``$XDG_CACHE_HOME/bindery/controlplane/<key>/bin`` (``~/.cache`` by
default), where ``<key>`` names the versions and hashes the module files and the
Go version, so a change of pin rebuilds and an unchanged tree rebuilds nothing.
A binary is written under a temporary name and renamed into place, so a killed
build never leaves a half-written file that a later run would trust.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

GOMOD_DIR = pathlib.Path(__file__).parent / "gomod"

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
HELM_VERSION = "v3.21.4"
KWOK_VERSION = "v0.8.0"

# What `git describe` would say for these releases; kube-apiserver's /version,
# `kubectl version` and Helm's kubeVersion checks all read these stamps.
_K8S_COMMIT = "0000000000000000000000000000000000000000"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bundle:
    """Files shipped inside a Go module (not compiled), concatenated into one output file."""

    output: str
    module: str
    files: tuple[str, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """One `go build` invocation: a wrapper module and the packages it builds."""

    module: str
    packages: tuple[str, ...]
    outputs: tuple[str, ...]
    ldflags: tuple[str, ...]
    bundles: tuple[Bundle, ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        """Everything this target puts into the bin directory."""
        return (*self.outputs, *(bundle.output for bundle in self.bundles))


def _k8s_ldflags() -> tuple[str, ...]:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    build_date = "2026-01-01T00:00:00Z"  # fixed, so the build is reproducible
    flags: list[str] = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitCommit={_K8S_COMMIT}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={build_date}",
        ]
    return tuple(flags)


TARGETS: tuple[Target, ...] = (
    Target(
        module="etcd",
        packages=("go.etcd.io/etcd/server/v3",),
        outputs=("etcd",),
        ldflags=(),
    ),
    Target(
        module="kubernetes",
        packages=(
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubectl",
        ),
        outputs=("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
        ldflags=_k8s_ldflags(),
    ),
    Target(
        module="kwok",
        packages=("sigs.k8s.io/kwok/cmd/kwok",),
        outputs=("kwok",),
        ldflags=(),
        # kwok does nothing without stages; these ship in its module: nodes turn Ready and renew
        # their Leases, bound pods turn Running, Job pods complete, deleted pods go away.
        bundles=(
            Bundle(
                output="kwok-stages.yaml",
                module="sigs.k8s.io/kwok",
                files=(
                    "kustomize/stage/node/fast/node-initialize.yaml",
                    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
                    "kustomize/stage/pod/fast/pod-ready.yaml",
                    "kustomize/stage/pod/fast/pod-complete.yaml",
                    "kustomize/stage/pod/fast/pod-delete.yaml",
                ),
            ),
        ),
    ),
    Target(
        module="helm",
        packages=("helm.sh/helm/v3/cmd/helm",),
        outputs=("helm",),
        ldflags=(
            f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
            # The Kubernetes version Helm assumes for `helm template` and `helm lint` (its own
            # Makefile stamps the client-go minor it was built with, v0.36 here); unstamped it
            # assumes v1.20 and fails charts whose kubeVersion asks for more.
            *(
                f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersion{part}={value}"
                for pkg in ("chartutil", "lint/rules")
                for part, value in (("Major", "1"), ("Minor", "36"))
            ),
        ),
    ),
)


def cache_root() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "bindery" / "controlplane"


def _go_version() -> str:
    try:
        out = subprocess.run(["go", "env", "GOVERSION"], check=True, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise SystemExit(
            "bindery: the Go toolchain is not on PATH; it is needed once to build the dev "
            "control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, "
            "helm, kwok)."
        ) from e
    return out.stdout.strip()


def cache_key() -> str:
    digest = hashlib.sha256(_go_version().encode())
    for target in TARGETS:
        digest.update(repr(target).encode())
        for name in ("go.mod", "go.sum", "tools.go"):
            digest.update((GOMOD_DIR / target.module / name).read_bytes())
    versions = f"k8s-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}-helm-{HELM_VERSION}-kwok-{KWOK_VERSION}"
    return f"{versions}-{digest.hexdigest()[:12]}"


def bin_dir() -> pathlib.Path:
    """Where the binaries of the pinned versions live (built or not)."""
    override = os.environ.get("BINDERY_CONTROLPLANE_BIN")
    if override:
        return pathlib.Path(override)
    return cache_root() / cache_key() / "bin"


def go_env() -> dict[str, str]:
    """The environment of every Go command of the build: ``-mod=readonly``.

    The modules in ``gomod/`` pin every version and checksum. With ``-mod=mod`` (what this used)
    a ``go.mod`` missing a requirement was completed on the fly with whatever the proxy served
    as latest, and ``go.sum`` rewritten to match: a pin could drift without a diff anyone reviewed.
    Read-only, such a build fails and says which entry is missing, and nothing is rewritten.
    """
    return {**os.environ, "GOFLAGS": "-mod=readonly"}


def _log(msg: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] bindery-build: {msg}", file=sys.stderr, flush=True)


def _build(target: Target, dest: pathlib.Path) -> None:
    staging = dest / f".partial-{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    cmd = [
        "go",
        "build",
        "-trimpath",
        "-buildvcs=false",
        "-ldflags",
        " ".join(("-s", "-w", *target.ldflags)),
        "-o",
        str(staging) + os.sep,
        *target.packages,
    ]
    env = {**go_env(), "CGO_ENABLED": "0"}
    started = time.monotonic()
    _log(f"building {', '.join(target.outputs)} (go build in {target.module}/; minutes on a cold cache)")
    # Stream the Go tool's output: a cold build is long and should visibly make progress.
    proc = subprocess.Popen(cmd, cwd=GOMOD_DIR / target.module, env=env)
    while True:
        try:
            rc = proc.wait(timeout=60)
            break
        except subprocess.TimeoutExpired:
            _log(f"  still building {target.module} ... {time.monotonic() - started:.0f}s")
    if rc != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise SystemExit(f"bindery: `go build` of {target.module} failed (exit {rc}); see its output above.")
    # go build names outputs after the last element of each package path.
    for pkg, out in zip(target.packages, target.outputs, strict=True):
        built = staging / pkg.rstrip("/").rsplit("/", 1)[-1]
        if pkg == "go.etcd.io/etcd/server/v3":
            built = staging / "server"
        os.replace(built, dest / out)
    shutil.rmtree(staging, ignore_errors=True)
    for bundle in target.bundles:
        _write_bundle(target, bundle, dest)
    _log(f"built {', '.join(target.files)} in {time.monotonic() - started:.0f}s")


def _write_bundle(target: Target, bundle: Bundle, dest: pathlib.Path) -> None:
    """Concatenate files of a module the build just downloaded (as YAML documents) into `dest`."""
    env = go_env()
    found = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", bundle.module],
        cwd=GOMOD_DIR / target.module,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    root = pathlib.Path(found.stdout.strip())
    documents = [(root / name).read_text().strip() for name in bundle.files]
    partial = dest / f".{bundle.output}.partial-{os.getpid()}"
    partial.write_text("\n---\n".join(documents) + "\n")
    os.replace(partial, dest / bundle.output)


def ensure_built(*, quiet: bool = False) -> pathlib.Path:
    """Build whatever is missing and return the directory holding the binaries."""
    dest = bin_dir()
    missing = [t for t in TARGETS if not all((dest / o).is_file() for o in t.files)]
    if not missing:
        if not quiet:
            _log(f"up to date: {dest}")
        return dest
    if os.environ.get("BINDERY_CONTROLPLANE_BIN"):
        raise SystemExit(f"bindery: BINDERY_CONTROLPLANE_BIN={dest} lacks {missing[0].outputs}.")
    dest.mkdir(parents=True, exist_ok=True)
    for target in missing:
        _build(target, dest)
    return dest


def binary(name: str) -> pathlib.Path:
    path = bin_dir() / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: run `python -m bindery.devcluster build` to build the dev control plane."
        )
    return path


# Kubernetes' own end-to-end suite (``go test -c k8s.io/kubernetes/test/e2e``), for
# scripts/e2e-upstream. Not part of the plane: it is a large build (minutes on 2 cores even with a
# warm Go cache) that only the upstream-e2e run needs, so it has its own wrapper module, its own
# cache directory and its own flag (`build --e2e`), and no change to it invalidates the plane's key.
E2E_MODULE = "e2e"
E2E_PACKAGE = "k8s.io/kubernetes/test/e2e"


def e2e_cache_root() -> pathlib.Path:
    return cache_root().parent / "e2e"


def e2e_cache_key() -> str:
    digest = hashlib.sha256(_go_version().encode())
    digest.update(repr((E2E_PACKAGE, _k8s_ldflags())).encode())
    for name in ("go.mod", "go.sum", "tools.go"):
        digest.update((GOMOD_DIR / E2E_MODULE / name).read_bytes())
    return f"k8s-{KUBERNETES_VERSION}-{digest.hexdigest()[:12]}"


def e2e_binary() -> pathlib.Path:
    """Where ``e2e.test`` of the pinned Kubernetes version lives (built or not)."""
    override = os.environ.get("BINDERY_E2E_TEST")
    if override:
        return pathlib.Path(override)
    return e2e_cache_root() / e2e_cache_key() / "e2e.test"


def ensure_e2e_built(*, quiet: bool = False) -> pathlib.Path:
    """Build ``e2e.test`` unless it is there; returns its path."""
    dest = e2e_binary()
    if dest.is_file():
        if not quiet:
            _log(f"up to date: {dest}")
        return dest
    if os.environ.get("BINDERY_E2E_TEST"):
        raise SystemExit(f"bindery: BINDERY_E2E_TEST={dest} does not exist.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.parent / f".e2e.test.partial-{os.getpid()}"
    cmd = [
        "go",
        "test",
        "-c",
        "-trimpath",
        "-buildvcs=false",
        "-ldflags",
        " ".join(("-s", "-w", *_k8s_ldflags())),
        "-o",
        str(partial),
        E2E_PACKAGE,
    ]
    started = time.monotonic()
    _log(
        f"building e2e.test of Kubernetes {KUBERNETES_VERSION} (go test -c in {E2E_MODULE}/; long on 2 cores)"
    )
    proc = subprocess.Popen(cmd, cwd=GOMOD_DIR / E2E_MODULE, env={**go_env(), "CGO_ENABLED": "0"})
    while True:
        try:
            rc = proc.wait(timeout=60)
            break
        except subprocess.TimeoutExpired:
            _log(f"  still building e2e.test ... {time.monotonic() - started:.0f}s")
    if rc != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"bindery: `go test -c {E2E_PACKAGE}` failed (exit {rc}); see its output above.")
    os.replace(partial, dest)
    _log(f"built {dest} in {time.monotonic() - started:.0f}s")
    return dest


# The reference RM's device allocator (``gomod/devalloc``): a small main on Kubernetes' own
# structured allocator, run by the RM as a helper process. Like e2e.test it has its own wrapper
# module, cache directory and key, so the plane's key is untouched; it is built on first use.
DEVALLOC_MODULE = "devalloc"


def devalloc_cache_root() -> pathlib.Path:
    return cache_root().parent / "devalloc"


def devalloc_cache_key() -> str:
    digest = hashlib.sha256(_go_version().encode())
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((GOMOD_DIR / DEVALLOC_MODULE / name).read_bytes())
    return f"k8s-{KUBERNETES_VERSION}-{digest.hexdigest()[:12]}"


def devalloc_binary() -> pathlib.Path:
    """Where the device allocator of the pinned Kubernetes version lives (built or not)."""
    override = os.environ.get("BINDERY_DEVALLOC")
    if override:
        return pathlib.Path(override)
    return devalloc_cache_root() / devalloc_cache_key() / "devalloc"


def ensure_devalloc_built(*, quiet: bool = False) -> pathlib.Path:
    """Build the device allocator unless it is there; returns its path."""
    dest = devalloc_binary()
    if dest.is_file():
        if not quiet:
            _log(f"up to date: {dest}")
        return dest
    if os.environ.get("BINDERY_DEVALLOC"):
        raise SystemExit(f"bindery: BINDERY_DEVALLOC={dest} does not exist.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.parent / f".devalloc.partial-{os.getpid()}"
    cmd = ["go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", str(partial), "."]
    started = time.monotonic()
    _log(f"building the device allocator (go build in {DEVALLOC_MODULE}/; a minute on a cold cache)")
    env = {**go_env(), "CGO_ENABLED": "0"}
    rc = subprocess.run(cmd, cwd=GOMOD_DIR / DEVALLOC_MODULE, env=env, check=False).returncode
    if rc != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(
            f"bindery: `go build` of {DEVALLOC_MODULE} failed (exit {rc}); see its output above."
        )
    os.replace(partial, dest)
    _log(f"built {dest} in {time.monotonic() - started:.0f}s")
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bindery.devcluster build")
    parser.add_argument("--print-dir", action="store_true", help="print the binaries' directory and exit")
    parser.add_argument(
        "--e2e",
        action="store_true",
        help="build (or print, with --print-dir) Kubernetes' e2e.test instead of the plane",
    )
    parser.add_argument(
        "--devalloc",
        action="store_true",
        help="build (or print, with --print-dir) the reference RM's device allocator instead of the plane",
    )
    args = parser.parse_args(argv)
    if args.print_dir:
        print(e2e_binary() if args.e2e else devalloc_binary() if args.devalloc else bin_dir())
        return 0
    started = time.monotonic()
    if args.e2e:
        path = ensure_e2e_built()
    elif args.devalloc:
        path = ensure_devalloc_built()
    else:
        path = ensure_built()
    _log(f"done in {time.monotonic() - started:.1f}s")
    print(path)
    return 0
