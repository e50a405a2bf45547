"""The launcher and the built binaries: versions, real scheduling onto helper-made Nodes, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
from kubernetes_asyncio import client

from bindery.devcluster import binaries
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane, ControlPlaneError, free_port, free_ports
from tests.devcluster.test_apiserver_semantics import pod_body

pytestmark = pytest.mark.controlplane


def test_versions_are_the_pinned_ones(controlplane: ControlPlane) -> None:
    server = json.loads(controlplane.kubectl("get", "--raw", "/version").stdout)
    assert server["gitVersion"] == binaries.KUBERNETES_VERSION
    out = json.loads(controlplane.kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == binaries.KUBERNETES_VERSION
    assert out["serverVersion"]["gitVersion"] == binaries.KUBERNETES_VERSION
    helm = subprocess.run(
        ["helm", "version", "--short"], env=controlplane.env, capture_output=True, text=True, check=True
    )
    assert helm.stdout.startswith(binaries.HELM_VERSION)
    etcd = subprocess.run([str(controlplane.bin_dir / "etcd"), "--version"], capture_output=True, text=True)
    assert f"etcd Version: {binaries.ETCD_VERSION.lstrip('v')}" in etcd.stdout


async def test_kube_scheduler_schedules_onto_helper_nodes(
    controlplane: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    await create_node(
        kube_api, name=f"{namespace}-small", capacity={"cpu": "1", "memory": "1Gi", "pods": "10"}
    )
    await create_node(
        kube_api,
        name=f"{namespace}-big",
        capacity={"cpu": "8", "memory": "16Gi", "pods": "10", "nvidia.com/gpu": "2"},
    )
    core = client.CoreV1Api(kube_api)
    body = pod_body("needs-4-cpus", scheduler="default-scheduler", cpu="4")
    await core.create_namespaced_pod(namespace=namespace, body=body)
    port = free_port()
    scheduler = subprocess.Popen(
        [
            str(controlplane.bin_dir / "kube-scheduler"),
            f"--kubeconfig={controlplane.kubeconfig}",
            "--leader-elect=false",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        node = None
        for _ in range(300):
            pod = await core.read_namespaced_pod(name="needs-4-cpus", namespace=namespace)
            node = pod.spec.node_name
            if node:
                break
            await asyncio.sleep(0.1)
        assert node == f"{namespace}-big"
    finally:
        os.killpg(scheduler.pid, signal.SIGKILL)
        scheduler.wait()


def test_a_plane_that_cannot_start_quotes_its_logs() -> None:
    with (
        pytest.raises(ControlPlaneError) as exc,
        ControlPlane.start(extra_apiserver_args=["--no-such-flag"], timeout=30),
    ):
        pass
    message = str(exc.value)
    assert "kube-apiserver exited" in message
    assert "unknown flag: --no-such-flag" in message
    assert "last lines of etcd" in message


def test_a_port_taken_before_the_apiserver_listens_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process takes the apiserver's port between its choice and the start (CI saw this):
    the plane starts again on new ports instead of failing."""
    from bindery.devcluster import plane as plane_module

    real = plane_module.free_ports
    calls: list[list[int]] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]

        def first_one_busy(count: int) -> list[int]:
            ports = real(count)
            if not calls:
                ports[0] = busy  # the apiserver's
            calls.append(ports)
            return ports

        monkeypatch.setattr(plane_module, "free_ports", first_one_busy)
        with ControlPlane.start(timeout=60) as started:
            assert started.server != f"https://127.0.0.1:{busy}"
            assert started.kubectl("get", "--raw", "/readyz").stdout == "ok"
    assert len(calls) == 2
    assert calls[0][0] == busy


def test_free_ports_are_distinct_and_outside_the_ephemeral_range() -> None:
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(20000 <= port < 32768 for port in ports)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return stat.split(")")[-1].split()[0] != "Z"


def test_nothing_survives_a_killed_owner(tmp_path: pathlib.Path) -> None:
    """SIGKILL the Python process that started the plane: its servers and temp dir still go."""
    script = (
        "import json, sys\n"
        "from bindery.devcluster.plane import ControlPlane\n"
        "with ControlPlane.start() as p:\n"
        "    info = {'pids': [s.proc.pid for s in p._servers], 'dir': str(p.workdir)}\n"
        "    print(json.dumps(info), flush=True)\n"
        "    sys.stdin.read()\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    info = json.loads(owner.stdout.readline())
    assert all(_alive(pid) for pid in info["pids"])
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        any(_alive(p) for p in info["pids"]) or os.path.exists(info["dir"])
    ):
        time.sleep(0.2)
    assert not any(_alive(p) for p in info["pids"])
    assert not os.path.exists(info["dir"])


def test_helm_assumes_the_pinned_kubernetes_minor(controlplane: ControlPlane, tmp_path: pathlib.Path) -> None:
    """`helm template` (no cluster) checks charts' kubeVersion against the version stamped into helm."""
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: probe\nversion: 0.1.0\nkubeVersion: '>=1.29.0-0'\n"
    )
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n"
    )
    out = subprocess.run(["helm", "template", str(chart)], env=controlplane.env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert "kube: 'v1.36.0'" in out.stdout


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_up_prints_the_kubeconfig_and_stops_on_a_signal_sent_at_once(stop: signal.Signals) -> None:
    """The signal arrives the moment the kubeconfig line is read: the plane still stops cleanly."""
    up = subprocess.Popen([sys.executable, "-m", "bindery.devcluster", "up"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert up.stdout is not None
    kubeconfig = pathlib.Path(up.stdout.readline().strip())
    up.send_signal(stop)
    _, err = up.communicate(timeout=30)
    assert up.returncode == 0, err
    assert kubeconfig.name == "admin.kubeconfig"
    assert f"stopping on {stop.name}" in err
    assert not kubeconfig.parent.exists()
