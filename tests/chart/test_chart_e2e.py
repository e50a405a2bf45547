"""End to end under the chart's own identities: install, then schedule a pod.

The test control plane runs no controller-manager, so the chart's Deployments never get pods.
Instead the two processes they describe run here, started with the containers' own arguments
(read back from the installed Deployments; only addresses and file paths are moved to loopback
and a temp dir) and authenticated as the chart's ServiceAccounts with tokens from the TokenRequest
API (`kubectl create token`). The RBAC under test is therefore exactly what the chart installed:
an admin kubeconfig appears nowhere in either process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import pathlib
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from bindery.devcluster.pki import CertificateAuthority
from bindery.devcluster.plane import ControlPlane, free_port, free_ports
from tests.chart import charttools as ct

pytestmark = pytest.mark.controlplane

BINDERY = pathlib.Path(sys.executable).with_name("bindery")  # the console script, as in the image
T = TypeVar("T")


def _sa_kubeconfig(plane: ControlPlane, *, namespace: str, sa: str, path: pathlib.Path) -> pathlib.Path:
    """A kubeconfig holding a bound ServiceAccount token (TokenRequest), as a pod would get."""
    token = plane.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": plane.server, "certificate-authority": str(plane.ca_file)}}
        ],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": sa, "namespace": namespace}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _container(plane: ControlPlane, *, namespace: str, deployment: str) -> dict[str, Any]:
    dep = json.loads(plane.kubectl("get", "deployment", deployment, "-n", namespace, "-o", "json").stdout)
    containers: list[dict[str, Any]] = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _volumes(plane: ControlPlane, *, namespace: str, deployment: str) -> dict[str, Any]:
    out = plane.kubectl("get", "deployment", deployment, "-n", namespace, "-o", "json").stdout
    return {v["name"]: v for v in json.loads(out)["spec"]["template"]["spec"]["volumes"]}


def _relocate(args: Sequence[str], moves: dict[str, str]) -> list[str]:
    """Replace the value of each `--flag=value` named in moves; every other argument is kept."""
    out = []
    seen = set()
    for arg in args:
        flag, sep, _ = arg.partition("=")
        if sep and flag in moves:
            out.append(f"{flag}={moves[flag]}")
            seen.add(flag)
        else:
            out.append(arg)
    assert seen == set(moves), f"the chart no longer passes {sorted(set(moves) - seen)}: {list(args)}"
    return out


@contextlib.contextmanager
def _process(
    argv: Sequence[str], *, log: pathlib.Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


async def _eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    logs: Sequence[pathlib.Path],
    procs: Sequence[subprocess.Popen[bytes]],
    within: float = 60,
) -> T:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(
                    f"{proc.args!r} exited {proc.returncode} while waiting for {what}\n" + _tails(logs)
                )
        result = await check()
        if result is not None and result is not False:
            return result
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out after {within:.0f}s waiting for {what}\n" + _tails(logs))


def _tails(logs: Sequence[pathlib.Path]) -> str:
    return "\n".join(
        f"--- {p.name} ---\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:]) for p in logs
    )


def _fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return ""


def _values_default(key: str) -> Any:
    """A default from the chart's values.yaml: what this install (no override of it) uses."""
    tree: Any = yaml.safe_load((ct.CHART / "values.yaml").read_text())
    for part in key.split("."):
        tree = tree[part]
    return tree


def _healthz(url: str) -> bool:
    """As the kubelet probes: an HTTPS probe does not verify the certificate."""
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=2, context=unverified) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


async def test_operator_schedules_a_pod_under_the_charts_rbac(
    controlplane: ControlPlane, helm: str, namespace: str, kube_api: client.ApiClient, tmp_path: pathlib.Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    release, scheduler, pool = f"e2e-{tag}", f"chart-e2e-{tag}", f"pool-{tag}"
    rm_port, health_port, metrics_port = free_ports(3)
    full = f"{release}-bindery"
    ct.run(
        [
            helm,
            "install",
            release,
            str(ct.CHART),
            "--namespace",
            namespace,
            "--set",
            f"referenceRM.schedulerNames={{{scheduler}}}",
            "--set",
            f"referenceRM.mirrorNodeSelector=bindery.dev/pool={pool}",
            # The RM runs on loopback here instead of behind the in-cluster Service: its certificate
            # (TLS is on by default) also names localhost, which the operator connects to.
            "--set",
            f"referenceRM.resourceManagerSpec.endpoint=https://localhost:{rm_port}",
            "--set",
            "referenceRM.tls.extraDNSNames={localhost}",
            "--set",
            "referenceRM.resourceManagerSpec.reservationTTLSeconds=30",
        ],
        env=controlplane.env,
    )
    node = f"e2e-node-{tag}"
    await create_node(kube_api, name=node, labels={"bindery.dev/pool": pool})
    core = client.CoreV1Api(kube_api)
    try:
        await _schedule_through_the_chart(
            controlplane,
            namespace=namespace,
            full=full,
            scheduler=scheduler,
            node=node,
            rm_port=rm_port,
            health_port=health_port,
            metrics_port=metrics_port,
            tmp=tmp_path,
            core=core,
        )
    finally:
        ct.run([helm, "uninstall", release, "--namespace", namespace], env=controlplane.env)
        await core.delete_node(name=node)


async def test_operator_trusts_the_rm_certificate_of_an_existing_tls_secret(
    controlplane: ControlPlane, helm: str, namespace: str, kube_api: client.ApiClient, tmp_path: pathlib.Path
) -> None:
    """Issue 20, item 6/10: with `referenceRM.tls.existingSecret` (a cert-manager Certificate's
    Secret in practice) the chart generates no CA; the RM serves that certificate and the operator,
    through the installed ResourceManager's caSecretRef, trusts that Secret's `ca.crt`."""
    tag = uuid.uuid4().hex[:6]
    release, scheduler, pool = f"e2e-{tag}", f"chart-e2e-{tag}", f"pool-{tag}"
    rm_port, health_port, metrics_port = free_ports(3)
    full, secret_name = f"{release}-bindery", f"rm-cert-{tag}"
    ca = CertificateAuthority.create(common_name=f"issuer-{tag}")
    serving = ca.issue_server(hosts=["localhost"], ips=["127.0.0.1"])
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_secret(
        namespace=namespace,
        body={
            "metadata": {"name": secret_name, "labels": {"bindery.dev/credentials": "true"}},
            "type": "kubernetes.io/tls",
            "data": {
                key: base64.b64encode(value).decode()
                for key, value in (
                    ("ca.crt", ca.cert_pem),
                    ("tls.crt", serving.cert_pem),
                    ("tls.key", serving.key_pem),
                )
            },
        },
    )
    ct.run(
        [
            helm,
            "install",
            release,
            str(ct.CHART),
            "--namespace",
            namespace,
            "--set",
            f"referenceRM.schedulerNames={{{scheduler}}}",
            "--set",
            f"referenceRM.mirrorNodeSelector=bindery.dev/pool={pool}",
            "--set",
            f"referenceRM.resourceManagerSpec.endpoint=https://localhost:{rm_port}",
            "--set",
            f"referenceRM.tls.existingSecret={secret_name}",
        ],
        env=controlplane.env,
    )
    installed = json.loads(controlplane.kubectl("get", "secrets", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    assert f"{full}-rm-tls" not in {s["metadata"]["name"] for s in installed}
    node = f"e2e-node-{tag}"
    await create_node(kube_api, name=node, labels={"bindery.dev/pool": pool})
    try:
        await _schedule_through_the_chart(
            controlplane,
            namespace=namespace,
            full=full,
            scheduler=scheduler,
            node=node,
            rm_port=rm_port,
            health_port=health_port,
            metrics_port=metrics_port,
            tmp=tmp_path,
            core=core,
            tls_secret=secret_name,
        )
    finally:
        ct.run([helm, "uninstall", release, "--namespace", namespace], env=controlplane.env)
        await core.delete_node(name=node)


async def _schedule_through_the_chart(
    plane: ControlPlane,
    *,
    namespace: str,
    full: str,
    scheduler: str,
    node: str,
    rm_port: int,
    health_port: int,
    metrics_port: int,
    tmp: pathlib.Path,
    core: client.CoreV1Api,
    tls_secret: str | None = None,
) -> None:
    secret = json.loads(
        plane.kubectl("get", "secret", f"{full}-rm-token", "-n", namespace, "-o", "json").stdout
    )
    token_file = tmp / "token"
    token_file.write_bytes(base64.b64decode(secret["data"]["token"]))
    # The RM's certificate and key, as the Deployment mounts them (from <full>-rm-tls unless the
    # release names an existing Secret).
    tls_secret = tls_secret or f"{full}-rm-tls"
    rm_volumes = _volumes(plane, namespace=namespace, deployment=f"{full}-rm")
    assert rm_volumes["tls"]["secret"]["secretName"] == tls_secret
    tls = json.loads(plane.kubectl("get", "secret", tls_secret, "-n", namespace, "-o", "json").stdout)
    for key in ("tls.crt", "tls.key"):
        (tmp / key).write_bytes(base64.b64decode(tls["data"][key]))
    rm_kubeconfig = _sa_kubeconfig(plane, namespace=namespace, sa=f"{full}-rm", path=tmp / "rm.kubeconfig")
    op_kubeconfig = _sa_kubeconfig(plane, namespace=namespace, sa=full, path=tmp / "operator.kubeconfig")

    rm = _container(plane, namespace=namespace, deployment=f"{full}-rm")
    assert rm["command"] == ["bindery"]
    rm_args = _relocate(
        rm["args"],
        {
            "--listen": f"127.0.0.1:{rm_port}",
            "--db": str(tmp / "rm.sqlite"),
            "--token-file": str(token_file),
            "--tls-cert": str(tmp / "tls.crt"),
            "--tls-key": str(tmp / "tls.key"),
        },
    )
    op = _container(plane, namespace=namespace, deployment=full)
    op_args = _relocate(
        op["args"],
        {
            "--liveness": f"http://127.0.0.1:{health_port}/healthz",
            "--metrics-addr": f"127.0.0.1:{metrics_port}",
            "--debug-addr": f"127.0.0.1:{free_port()}",  # the chart's 9091 may be taken on this host
        },
    )

    # Nothing from this test's environment: no KUBECONFIG, so only the minted identities are used.
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    rm_log, op_log = tmp / "rm.log", tmp / "operator.log"
    logs = [rm_log, op_log]
    with (
        _process([str(BINDERY), *rm_args, f"--kubeconfig={rm_kubeconfig}"], log=rm_log, env=env) as rm_proc,
        # ENTRYPOINT ["bindery", "run"] + the container's args.
        _process(
            [str(BINDERY), "run", *op_args, f"--kubeconfig={op_kubeconfig}"], log=op_log, env=env
        ) as op_proc,
    ):
        procs = [rm_proc, op_proc]

        # The probes the chart configures answer 200 from the real processes.
        probes = [
            (
                f"{container[probe]['httpGet'].get('scheme', 'HTTP').lower()}://127.0.0.1:{port}"
                f"{container[probe]['httpGet']['path']}",
                f"{name} {probe}",
            )
            for container, port, name in ((op, health_port, "operator"), (rm, rm_port, "reference RM"))
            for probe in ("livenessProbe", "readinessProbe")
        ]
        for url, what in probes:

            async def healthy(url: str = url) -> bool:
                return await asyncio.to_thread(_healthz, url)

            await _eventually(healthy, what=f"the {what} ({url}) to answer 200", logs=logs, procs=procs)

        async def rm_ready() -> dict[str, Any] | None:
            out = plane.kubectl("get", "resourcemanager", f"{full}-rm", "-o", "json").stdout
            conditions = json.loads(out).get("status", {}).get("conditions", [])
            ready = [c for c in conditions if c["type"] == "Ready" and c["status"] == "True"]
            return ready[0] if ready else None

        await _eventually(
            rm_ready,
            what="the ResourceManager to be Ready (status written by the operator)",
            logs=logs,
            procs=procs,
        )

        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hello"},
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

        async def bound() -> str | None:
            stored = await core.read_namespaced_pod(name="hello", namespace=namespace)
            return stored.spec.node_name  # type: ignore[no-any-return]

        assert await _eventually(bound, what="the pod to be bound", logs=logs, procs=procs) == node

        async def scheduled_event() -> dict[str, Any] | None:
            out = plane.kubectl("get", "events.events.k8s.io", "-n", namespace, "-o", "json").stdout
            events = [
                e
                for e in json.loads(out)["items"]
                if e["regarding"]["name"] == "hello" and e["reason"] == "Scheduled"
            ]
            return events[0] if events else None

        event = await _eventually(scheduled_event, what="the Scheduled event", logs=logs, procs=procs)
        assert event["reportingController"] == scheduler
        assert event["note"] == f"Successfully assigned {namespace}/hello to {node}"

        # What the chart's ServiceMonitor scrapes: its path on the container port the metrics
        # Service targets, served by the real process.
        monitor_path = _values_default("metrics.serviceMonitor.path")
        assert {p["name"] for p in op["ports"]} == {"health", "metrics"}
        url = f"http://127.0.0.1:{metrics_port}{monitor_path}"

        async def scheduled_metric() -> bool:
            text = await asyncio.to_thread(_fetch, url)
            return (
                f'bindery_schedule_attempts_total{{resource_manager="{full}-rm",result="scheduled"}} 1.0'
                in text
            )

        await _eventually(scheduled_metric, what=f"{url} to count the scheduled pod", logs=logs, procs=procs)

    # Every request either process made was allowed: a missing rule shows up in a log as a 403
    # (Kopf: APIForbiddenError, httpx/aiohttp: "Forbidden").
    for log in logs:
        text = log.read_text(errors="replace")
        assert "forbidden" not in text.lower(), f"{log.name} shows a refused request:\n{text[-3000:]}"
        assert "Traceback" not in text, f"{log.name} shows an error:\n{text[-3000:]}"
