"""The built image, run for real: its user, its read-only root, its packages, its SBOM, and its two
processes (the operator and the reference RM) scheduling pods on the dev control plane.

Each container runs as the chart's Deployments run it: the image's own ENTRYPOINT (operator) or
command [bindery] (RM), the arguments read back from the Deployments `helm install` created (only
listen addresses and ports are moved to free loopback ports, since the containers share the host's
network), UID 10001, a read-only root filesystem with a tmpfs /tmp, no capabilities, and the
in-cluster configuration a pod gets: KUBERNETES_SERVICE_HOST/PORT and a ServiceAccount token, CA
and namespace mounted at /var/run/secrets/kubernetes.io/serviceaccount. No kubeconfig is mounted.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import time
import tomllib
import urllib.parse
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client
from packaging.markers import Marker
from packaging.utils import canonicalize_name

from bindery.devcluster import binaries
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane, free_ports
from tests.image.conftest import REPO, Image

pytestmark = pytest.mark.image

T = TypeVar("T")
CHART = REPO / "charts" / "bindery"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _locked() -> dict[str, str]:
    """requirements.lock's packages that apply to the image (Linux, CPython 3.11): name -> version."""
    text = (REPO / "requirements.lock").read_text()
    env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "python_version": "3.11"}
    locked: dict[str, str] = {}
    for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)(?:\s*;\s*([^\\\n]+))?", text, re.M):
        name, version, marker = m.group(1), m.group(2), m.group(3)
        if marker is None or Marker(marker.strip()).evaluate(env):
            locked[str(canonicalize_name(name))] = version
    return locked


def test_runs_as_uid_10001_on_a_read_only_root(image: Image) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    answered = image.run("--version", entrypoint="bindery")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.strip() == f"bindery {version}"

    config = image.inspect()["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["bindery", "run"]
    # Without --user: the image's own USER applies.
    probe = (
        "import os, pathlib; print(os.getuid(), os.getgid())\n"
        "for p in ('/opt/bindery/x', '/x', '/tmp/x'):\n"
        "    try: pathlib.Path(p).write_text('x'); print(p, 'written')\n"
        "    except OSError as e: print(p, e.strerror)\n"
    )
    argv = [a for a in image.run_argv("-c", probe, entrypoint="python3") if not a.startswith("--user=")]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "10001 10001",
        "/opt/bindery/x Read-only file system",
        "/x Read-only file system",
        "/tmp/x written",
    ]


def test_entrypoint_and_packaged_resources(image: Image) -> None:
    run_help = image.run("--help")  # the ENTRYPOINT, `bindery run`
    assert run_help.returncode == 0, run_help.stderr
    assert "usage: bindery run" in run_help.stdout
    assert "--liveness" in run_help.stdout, "the chart's probes rely on `bindery run --liveness=URL`"
    rm_help = image.run("rm", "serve", "--help", entrypoint="bindery")
    assert rm_help.returncode == 0, rm_help.stderr
    assert "--token-file" in rm_help.stdout
    # The contract and the CRD are force-included into the wheel; the installed copies are the repo's.
    read = (
        "import importlib.resources as r, sys; "
        "sys.stdout.write(r.files(sys.argv[1]).joinpath(sys.argv[2]).read_text())"
    )
    for package, resource, source in (
        ("bindery.rm", "openapi.yaml", REPO / "contract/v1/openapi.yaml"),
        (
            "bindery.controller",
            "resourcemanagers.bindery.dev.yaml",
            REPO / "crds/resourcemanagers.bindery.dev.yaml",
        ),
    ):
        proc = image.run("-c", read, package, resource, entrypoint="python")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == source.read_text(), resource


def test_installed_packages_are_exactly_the_lock(image: Image) -> None:
    listing = image.run(
        "-c",
        "import importlib.metadata as m, json; "
        "print(json.dumps(sorted((d.metadata['Name'], d.version) for d in m.distributions())))",
        entrypoint="python",
    )
    assert listing.returncode == 0, listing.stderr
    installed = {canonicalize_name(name): version for name, version in json.loads(listing.stdout)}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    expected = {**_locked(), canonicalize_name(project["name"]): project["version"]}
    assert installed == expected
    # The virtualenv has neither pip nor setuptools: nothing to build or install with at run time.
    assert not {"pip", "setuptools", "wheel"} & set(installed)


def test_sbom_lists_what_the_image_holds(image: Image) -> None:
    bom = json.loads(pathlib.Path(image.summary["sbom"]).read_text())
    assert bom["bomFormat"] == "CycloneDX"
    purls = {c["purl"] for c in bom["components"] if "purl" in c}
    for name, version in _locked().items():
        assert f"pkg:pypi/{name}@{version}" in purls, name
    dpkg = image.run("-W", "-f=${Package} ${Version}\n", entrypoint="dpkg-query")
    assert dpkg.returncode == 0, dpkg.stderr
    debs = {tuple(line.split()) for line in dpkg.stdout.splitlines()}
    assert ("python3.11", next(v for n, v in debs if n == "python3.11")) in debs
    for name, version in debs:
        assert any(p.startswith(f"pkg:deb/debian/{name}@{version}?") for p in purls), name


# --- the operator and the reference RM from the image, on the dev plane ----------------------------


@contextlib.contextmanager
def _container(
    image: Image, name: str, argv: Sequence[str], *, log: pathlib.Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # podman passes it on to the container's process
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        subprocess.run([*image.podman, "rm", "--force", "--ignore", name], capture_output=True, check=False)


async def _eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    logs: Sequence[pathlib.Path],
    procs: Sequence[subprocess.Popen[bytes]],
    within: float = 90,
) -> T:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(
                    f"a container exited {proc.returncode} while waiting for {what}\n{_tails(logs)}"
                )
        result = await check()
        if result is not None and result is not False:
            return result
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out after {within:.0f}s waiting for {what}\n{_tails(logs)}")


def _tails(logs: Sequence[pathlib.Path]) -> str:
    return "\n".join(
        f"--- {p.name} ---\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:]) for p in logs
    )


def _healthz(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _deployment_container(plane: ControlPlane, *, namespace: str, name: str) -> dict[str, Any]:
    dep = json.loads(plane.kubectl("get", "deployment", name, "-n", namespace, "-o", "json").stdout)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _relocate(args: Sequence[str], moves: dict[str, str]) -> list[str]:
    """Replace the value of each `--flag=value` named in moves; every other argument is kept."""
    out, seen = [], set()
    for arg in args:
        flag, sep, _ = arg.partition("=")
        if sep and flag in moves:
            out.append(f"{flag}={moves[flag]}")
            seen.add(flag)
        else:
            out.append(arg)
    assert seen == set(moves), f"the chart no longer passes {sorted(set(moves) - seen)}: {list(args)}"
    return out


def _service_account(plane: ControlPlane, *, namespace: str, sa: str, into: pathlib.Path) -> list[str]:
    """What the kubelet mounts for a pod's ServiceAccount, and the env it sets: podman options."""
    into.mkdir()
    token = plane.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    (into / "token").write_text(token)
    (into / "ca.crt").write_bytes(plane.ca_file.read_bytes())
    (into / "namespace").write_text(namespace)
    for f in into.iterdir():
        f.chmod(0o644)
    server = urllib.parse.urlsplit(plane.server)
    return [
        f"--volume={into}:{SA_DIR}:ro",
        f"--env=KUBERNETES_SERVICE_HOST={server.hostname}",
        f"--env=KUBERNETES_SERVICE_PORT={server.port}",
    ]


@pytest.mark.controlplane
async def test_the_images_processes_schedule_pods(
    image: Image,
    controlplane: ControlPlane,
    namespace: str,
    kube_api: client.ApiClient,
    tmp_path: pathlib.Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    release, scheduler, pool = f"img-{tag}", f"image-e2e-{tag}", f"pool-{tag}"
    rm_port, health_port, metrics_port, debug_port = free_ports(4)
    full = f"{release}-bindery"
    helm = str(binaries.binary("helm"))
    subprocess.run(
        [
            helm,
            "install",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--set",
            f"referenceRM.schedulerNames={{{scheduler}}}",
            "--set",
            f"referenceRM.mirrorNodeSelector=bindery.dev/pool={pool}",
            # The RM container listens on the host's loopback instead of behind its Service.
            "--set",
            f"referenceRM.resourceManagerSpec.endpoint=http://127.0.0.1:{rm_port}",
            # Plain HTTP on loopback: the chart's default HTTPS, its generated certificate and the
            # ResourceManager's caSecretRef are proven by tests/chart/test_chart_e2e.py.
            "--set",
            "referenceRM.tls.enabled=false",
        ],
        env=controlplane.env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    nodes = [f"img-node-{tag}-{i}" for i in range(2)]
    for node in nodes:
        await create_node(kube_api, name=node, labels={"bindery.dev/pool": pool})
    core = client.CoreV1Api(kube_api)
    try:
        await _schedule(
            image,
            controlplane,
            namespace=namespace,
            full=full,
            scheduler=scheduler,
            nodes=nodes,
            ports=(rm_port, health_port, metrics_port, debug_port),
            tmp=tmp_path,
            core=core,
        )
    finally:
        subprocess.run(
            [helm, "uninstall", release, "--namespace", namespace],
            env=controlplane.env,
            check=False,
            capture_output=True,
            timeout=120,
        )
        for node in nodes:
            await core.delete_node(name=node)


async def _schedule(
    image: Image,
    plane: ControlPlane,
    *,
    namespace: str,
    full: str,
    scheduler: str,
    nodes: list[str],
    ports: tuple[int, int, int, int],
    tmp: pathlib.Path,
    core: client.CoreV1Api,
) -> None:
    rm_port, health_port, metrics_port, debug_port = ports
    rm = _deployment_container(plane, namespace=namespace, name=f"{full}-rm")
    op = _deployment_container(plane, namespace=namespace, name=full)
    assert rm["command"] == ["bindery"]
    assert "command" not in op, "the operator runs the image's ENTRYPOINT"
    for container in (rm, op):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tmp"] == ["/tmp"]
    rm_args = _relocate(rm["args"], {"--listen": f"127.0.0.1:{rm_port}"})
    op_args = _relocate(
        op["args"],
        {
            "--liveness": f"http://127.0.0.1:{health_port}/healthz",
            "--metrics-addr": f"127.0.0.1:{metrics_port}",
            "--debug-addr": f"127.0.0.1:{debug_port}",  # the host's network: no fixed port
        },
    )

    # The RM's volumes at the chart's own paths: its data dir (writable by the pod's fsGroup) and
    # the token Secret (mode 0440, group 10001 as fsGroup makes it).
    mounts = {m["name"]: m["mountPath"] for m in rm["volumeMounts"]}
    data, token_dir = tmp / "rm-data", tmp / "rm-token"
    data.mkdir()
    os.chown(data, 10001, 10001)
    token_dir.mkdir()
    secret = json.loads(
        plane.kubectl("get", "secret", f"{full}-rm-token", "-n", namespace, "-o", "json").stdout
    )
    (token_dir / "token").write_bytes(base64.b64decode(secret["data"]["token"]))
    os.chown(token_dir / "token", 0, 10001)
    (token_dir / "token").chmod(0o440)

    rm_name, op_name = f"bindery-rm-{tmp.name[-12:]}", f"bindery-op-{tmp.name[-12:]}"
    rm_argv = image.run_argv(
        *rm_args,
        entrypoint="bindery",
        options=[
            f"--name={rm_name}",
            f"--volume={data}:{mounts['data']}",
            f"--volume={token_dir}:{mounts['token']}:ro",
            *_service_account(plane, namespace=namespace, sa=f"{full}-rm", into=tmp / "rm-sa"),
        ],
    )
    op_argv = image.run_argv(
        *op_args,
        options=[
            f"--name={op_name}",
            *_service_account(plane, namespace=namespace, sa=full, into=tmp / "op-sa"),
        ],
    )
    rm_log, op_log = tmp / "rm.log", tmp / "operator.log"
    logs = [rm_log, op_log]
    with (
        _container(image, rm_name, rm_argv, log=rm_log) as rm_proc,
        _container(image, op_name, op_argv, log=op_log) as op_proc,
    ):
        procs = [rm_proc, op_proc]
        probes = [
            (f"http://127.0.0.1:{port}{container[probe]['httpGet']['path']}", f"{name} {probe}")
            for container, port, name in ((op, health_port, "operator"), (rm, rm_port, "reference RM"))
            for probe in ("livenessProbe", "readinessProbe")
        ]
        for url, what in probes:

            async def healthy(url: str = url) -> bool:
                return await asyncio.to_thread(_healthz, url)

            await _eventually(healthy, what=f"the {what} ({url}) to answer 200", logs=logs, procs=procs)

        names = [f"hello-{i}" for i in range(3)]
        for name in names:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": scheduler,
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ],
                },
            }
            await core.create_namespaced_pod(namespace=namespace, body=pod)

        async def all_bound() -> dict[str, str] | None:
            listed = await core.list_namespaced_pod(namespace=namespace)
            bound = {p.metadata.name: p.spec.node_name for p in listed.items if p.spec.node_name}
            return bound if set(bound) == set(names) else None

        placed = await _eventually(all_bound, what="the three pods to be bound", logs=logs, procs=procs)
        assert set(placed.values()) <= set(nodes), placed

        async def scheduled_events() -> list[dict[str, Any]] | None:
            out = plane.kubectl("get", "events.events.k8s.io", "-n", namespace, "-o", "json").stdout
            events = [e for e in json.loads(out)["items"] if e["reason"] == "Scheduled"]
            return events if {e["regarding"]["name"] for e in events} == set(names) else None

        events = await _eventually(scheduled_events, what="the Scheduled events", logs=logs, procs=procs)
        for event in events:
            pod_name = event["regarding"]["name"]
            assert event["reportingController"] == scheduler
            assert event["note"] == f"Successfully assigned {namespace}/{pod_name} to {placed[pod_name]}"

    for log in logs:
        text = log.read_text(errors="replace")
        assert "forbidden" not in text.lower(), f"{log.name} shows a refused request:\n{text[-3000:]}"
        assert "Traceback" not in text, f"{log.name} shows an error:\n{text[-3000:]}"
        assert "Read-only file system" not in text, (
            f"{log.name}: a write to the root filesystem:\n{text[-3000:]}"
        )
