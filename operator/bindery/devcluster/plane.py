"""Start etcd and kube-apiserver on loopback, with their own PKI, and stop them cleanly.

One implementation serves the test suite, the demo and the benchmarks. The plane is
deliberately minimal:

* etcd runs with ``--unsafe-no-fsync`` in a temporary data directory: nothing here
  needs durability, and fsync dominates its latency on small disks.
* kube-apiserver runs RBAC authorization (least-privilege tests need it) and
  authenticates clients by certificates from the plane's own CA.
* The admission plugins ``ServiceAccount`` and ``TaintNodesByCondition`` are off.
  No kube-controller-manager runs, so nothing would create the default
  ServiceAccount a pod needs to pass ``ServiceAccount`` admission, and nothing would
  remove the ``node.kubernetes.io/not-ready`` taint that ``TaintNodesByCondition``
  puts on every new Node, so hand-made Nodes would never be schedulable.

The kube-apiserver can be killed and started again with the same flags while etcd keeps running
(:meth:`ControlPlane.restart_apiserver`): what a control-plane upgrade or crash does to clients,
whose watches end and whose writes are refused meanwhile, with every object kept.

Nothing may outlive the plane, even when the Python process that started it is
killed: every server runs in its own process group, and a small watchdog process
holds the read end of a pipe from us. When the pipe closes (normal stop, crash or
SIGKILL alike) the watchdog kills those process groups and removes the temporary
directory.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import pathlib
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml

from bindery.devcluster import binaries, pki

SERVICE_CIDR = "10.0.0.0/24"
ADMIN_USER = "bindery-admin"

# Runs as a separate process; it must not import bindery (the tree may be gone by then).
_WATCHDOG = r"""
import os, shutil, signal, sys, time
workdir = sys.argv[1]
pgids = []
for line in sys.stdin:
    line = line.strip()
    if line == "done":
        pgids = []
        break
    if line:
        pgids.append(int(line))
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
    if pgids and sig == signal.SIGTERM:
        time.sleep(2)
shutil.rmtree(workdir, ignore_errors=True)
"""


class ControlPlaneError(RuntimeError):
    """The control plane did not start, or a server in it died."""


#: Listening ports are picked below Linux's default ephemeral range (32768-60999): a port the
#: kernel hands out for port 0 or an outgoing connection can be handed out again, to etcd's next
#: port or to any client, before the server meant to listen there has started.
_PORT_RANGE = (20000, 32767)


#: kube-controller-manager's controllers in a plane started with ``controllers=True``: those that
#: make and remove pods, finish namespace deletion, bind volumes and collect garbage. Node
#: lifecycle stays off: Nodes made by ``nodes.create_node`` have no kubelet to heartbeat, and it
#: would taint them unreachable and evict their pods (kwok's nodes heartbeat, the others do not).
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "statefulset-controller",
    "daemonset-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "serviceaccount-controller",
    "pod-garbage-collector-controller",
    # Creates the ResourceClaims of pods that name a ResourceClaimTemplate (DRA), and writes
    # pod.status.resourceClaimStatuses, which the DynamicResources plugins of both schedulers wait for.
    "resourceclaim-controller",
)
#: The Workload API (scheduling.k8s.io/v1alpha2: Workload, PodGroup) and kube-scheduler's gang
#: scheduling, alpha in 1.36: every component of the plane runs with the same gates, so Bindery's
#: pod groups and kube-scheduler's can be compared on one cluster. ``WorkloadWithJob`` lets the Job
#: controller create a Job's Workload and PodGroup; ``TopologyAwareWorkloadScheduling`` serves
#: ``spec.schedulingConstraints.topology``. Checked on the v1.36.3 binaries (tests/devcluster).
#: ``TaintTolerationComparisonOperators`` (alpha since 1.35) lets pods carry ``Gt``/``Lt``
#: tolerations, so contract v1.2's ``toleration-comparisons`` is tested beside kube-scheduler's.
FEATURE_GATES = (
    "GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true,WorkloadWithJob=true,"
    "TaintTolerationComparisonOperators=true"
)
WORKLOAD_API = "scheduling.k8s.io/v1alpha2=true"
#: Added to kwok's pod-delete stage (see :func:`kwok_stages`).
KWOK_NOT_DELETED_AT_ONCE = {
    "key": ".metadata.deletionGracePeriodSeconds != 0",
    "operator": "In",
    "values": ["true"],
}


def kwok_stages(text: str) -> str:
    """kwok's stages (the bundle built with it) with its pod-delete stage limited to pods deleted
    with a grace period.

    kwok v0.8.0 deletes a pod that has a ``deletionTimestamp`` by *name*, with no UID precondition
    (``PodController.deleteResource``). A pod deleted with grace 0 is already gone from the
    apiserver when kwok's DELETE arrives, a few milliseconds later: usually a 404, but a pod created
    under the same name in between is deleted instead. Kubernetes' e2e tests do exactly that
    (``runPodAndGetNodeName`` deletes ``without-label`` with grace 0 and the next step creates
    another ``without-label``), and the recreated pod vanished after the scheduler had placed it.
    The apiserver removes a grace-0 pod itself (at once, or when its last finalizer goes), so kwok
    has nothing to do for it.
    """
    documents = [doc for doc in yaml.safe_load_all(text) if doc]
    for doc in documents:
        if doc.get("kind") == "Stage" and doc.get("metadata", {}).get("name") == "pod-delete":
            expressions = doc["spec"].setdefault("selector", {}).setdefault("matchExpressions", [])
            if KWOK_NOT_DELETED_AT_ONCE not in expressions:
                expressions.append(dict(KWOK_NOT_DELETED_AT_ONCE))
            break
    else:
        raise ControlPlaneError("kwok's stages have no pod-delete stage; the kwok bundle changed")
    return yaml.safe_dump_all(documents, sort_keys=False)


#: The label that puts a Node in kwok's care (see ``nodes.create_kwok_node``).
KWOK_NODE_LABEL = ("bindery.dev/kwok", "true")

_PORT_TAKEN = "address already in use"
_LAUNCH_ATTEMPTS = 3


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nobody listens on, outside the ephemeral range.

    All are held open until all are chosen, so one call never returns the same port twice. A port
    can still be taken between this call and the server's start; `ControlPlane.start` retries then.
    """
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            candidate = random.randint(*_PORT_RANGE)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    """One loopback port nobody listens on (see `free_ports`)."""
    return free_ports(1)[0]


def _tail(path: pathlib.Path, *, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclasses.dataclass
class _Server:
    name: str
    proc: subprocess.Popen[bytes]
    log: pathlib.Path


@dataclasses.dataclass(kw_only=True)
class ControlPlane:
    """A running etcd + kube-apiserver. Use :meth:`start` (a context manager) to get one."""

    workdir: pathlib.Path
    bin_dir: pathlib.Path
    server: str
    ca_file: pathlib.Path
    kubeconfig: pathlib.Path
    _ca: pki.CertificateAuthority
    _servers: list[_Server] = dataclasses.field(default_factory=list)
    _watchdog: subprocess.Popen[bytes] | None = None
    _apiserver_argv: list[str] = dataclasses.field(default_factory=list)
    _apiserver_starts: int = 0

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        *,
        bin_dir: pathlib.Path | None = None,
        timeout: float = 90.0,
        extra_apiserver_args: Sequence[str] = (),
        controllers: bool = False,
        kwok: bool = False,
        kube_scheduler: bool = False,
    ) -> Iterator[ControlPlane]:
        """Start a plane, yield it, and stop it on exit (also on errors and signals).

        ``controllers``: also run kube-controller-manager (:data:`CONTROLLERS`), so Deployments,
        Jobs and DaemonSets make pods and namespaces finish deleting. ``kwok``: also run kwok, which
        makes Nodes labelled :data:`KWOK_NODE_LABEL` Ready, keeps their Leases renewed, turns pods
        bound to them Running (Job pods then Succeeded) and finishes their deletion.
        ``kube_scheduler``: also run kube-scheduler, for the pods of the default scheduler name.
        """
        bin_dir = bin_dir or binaries.ensure_built(quiet=True)
        for attempt in range(1, _LAUNCH_ATTEMPTS + 1):
            try:
                plane = cls._launch(
                    bin_dir=bin_dir,
                    timeout=timeout,
                    extra_apiserver_args=extra_apiserver_args,
                    controllers=controllers,
                    kwok=kwok,
                    kube_scheduler=kube_scheduler,
                )
                break
            except ControlPlaneError as exc:
                # Another process took a chosen port before its server listened: new ports.
                if _PORT_TAKEN not in str(exc) or attempt == _LAUNCH_ATTEMPTS:
                    raise
        with _signals_stop(plane):
            try:
                yield plane
            finally:
                plane.stop()

    @classmethod
    def _launch(
        cls,
        *,
        bin_dir: pathlib.Path,
        timeout: float,
        extra_apiserver_args: Sequence[str],
        controllers: bool,
        kwok: bool,
        kube_scheduler: bool,
    ) -> ControlPlane:
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="bindery-plane-"))
        watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(workdir)],
            stdin=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C in the terminal must not kill it before it cleans up
        )
        ca = pki.CertificateAuthority.create()
        certs = workdir / "pki"
        certs.mkdir()
        ca_file = certs / "ca.crt"
        ca_file.write_bytes(ca.cert_pem)
        ports = free_ports(6)
        apiserver_port, etcd_client_port, etcd_peer_port, manager_port, kwok_port, scheduler_port = ports
        plane = cls(
            workdir=workdir,
            bin_dir=bin_dir,
            server=f"https://127.0.0.1:{apiserver_port}",
            ca_file=ca_file,
            kubeconfig=workdir / "admin.kubeconfig",
            _ca=ca,
            _watchdog=watchdog,
        )
        try:
            plane.mint_kubeconfig(user=ADMIN_USER, groups=["system:masters"], path=plane.kubeconfig)
            etcd_url = plane._start_etcd(client=etcd_client_port, peer=etcd_peer_port)
            plane._start_apiserver(port=apiserver_port, etcd_url=etcd_url, extra=extra_apiserver_args)
            plane._wait_ready(timeout=timeout)
            health: list[str] = []
            if controllers:
                plane._start_controller_manager(port=manager_port)
                health.append(f"https://127.0.0.1:{manager_port}/healthz")
            if kwok:
                plane._start_kwok(port=kwok_port)
                health.append(f"http://127.0.0.1:{kwok_port}/healthz")
            if kube_scheduler:
                plane._start_kube_scheduler(port=scheduler_port)
                health.append(f"https://127.0.0.1:{scheduler_port}/healthz")
            for url in health:
                plane._wait_healthy(url, timeout=timeout)
        except BaseException:
            plane.stop()
            raise
        return plane

    def _spawn(self, name: str, argv: Sequence[str]) -> _Server:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as a whole
            )
        server = _Server(name=name, proc=proc, log=log)
        self._servers.append(server)
        self._tell_watchdog(str(proc.pid))
        return server

    def _tell_watchdog(self, line: str) -> None:
        if self._watchdog and self._watchdog.stdin:
            with contextlib.suppress(BrokenPipeError):
                self._watchdog.stdin.write(f"{line}\n".encode())
                self._watchdog.stdin.flush()

    def _start_etcd(self, *, client: int, peer: int) -> str:
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        return url

    def _start_apiserver(self, *, port: int, etcd_url: str, extra: Sequence[str]) -> None:
        certs = self.workdir / "pki"
        serving = self._ca.issue_server(
            hosts=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ips=["127.0.0.1", "10.0.0.1"],
        )
        cert, key = serving.write(directory=certs, stem="apiserver")
        sa = pki.service_account_keys()
        sa_pub, sa_key = sa.write(directory=certs, stem="sa")
        self._apiserver_argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--cert-dir={certs}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={self.ca_file}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            # The apiserver advertises itself in the `kubernetes` Endpoints; with no default
            # route on these machines it cannot guess an address, so give it loopback.
            "--advertise-address=127.0.0.1",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--authorization-mode=RBAC",
            # No controller-manager runs: see the module docstring for why these two are off.
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--enable-priority-and-fairness=false",
            f"--feature-gates={FEATURE_GATES}",
            f"--runtime-config={WORKLOAD_API}",
            *extra,
        ]
        self._spawn_apiserver()

    def _start_controller_manager(self, *, port: int) -> None:
        certs = self.workdir / "pki"
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                f"--cert-dir={certs / 'kube-controller-manager'}",
                f"--root-ca-file={self.ca_file}",
                f"--service-account-private-key-file={certs / 'sa.key'}",
                "--use-service-account-credentials=false",
                # The default 20 requests/s would pace a 60-replica Deployment over seconds.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                f"--feature-gates={FEATURE_GATES}",
                "--v=1",
            ],
        )

    def _start_kube_scheduler(self, *, port: int) -> None:
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                f"--cert-dir={self.workdir / 'pki' / 'kube-scheduler'}",
                f"--feature-gates={FEATURE_GATES}",
            ],
        )

    def _start_kwok(self, *, port: int) -> None:
        key, value = KWOK_NODE_LABEL
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text(kwok_stages((self.bin_dir / "kwok-stages.yaml").read_text()))
        self._spawn(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--manage-nodes-with-label-selector={key}={value}",
                f"--config={stages}",
                f"--server-address=127.0.0.1:{port}",
                "--cidr=10.244.0.0/16",
                "--node-ip=127.0.0.1",
            ],
        )

    def _spawn_apiserver(self) -> None:
        self._apiserver_starts += 1
        suffix = "" if self._apiserver_starts == 1 else f"-{self._apiserver_starts}"
        self._spawn(f"kube-apiserver{suffix}", self._apiserver_argv)

    # ---- apiserver restarts (etcd keeps running) ------------------------------------------------

    def stop_apiserver(self, *, sig: signal.Signals = signal.SIGKILL) -> None:
        """Kill the kube-apiserver (SIGKILL by default, a crash) and wait for it; etcd keeps running.

        Clients see refused connections until :meth:`start_apiserver`; watches end at once.
        """
        for server in [s for s in self._servers if s.name.startswith("kube-apiserver")]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, sig)
            try:
                server.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.proc.pid, signal.SIGKILL)
                server.proc.wait()
            self._servers.remove(server)

    def start_apiserver(self, *, timeout: float = 90.0) -> None:
        """Start the kube-apiserver again with the same flags (port, certificates, etcd) and wait
        until it is ready; every kubeconfig minted before keeps working."""
        if any(s.name.startswith("kube-apiserver") for s in self._servers):
            raise ControlPlaneError("the kube-apiserver is running; stop_apiserver() first")
        self._spawn_apiserver()
        self._wait_ready(timeout=timeout)

    def restart_apiserver(self, *, down_seconds: float = 0.0, timeout: float = 90.0) -> None:
        """Kill the kube-apiserver, leave it down `down_seconds`, start it again (etcd kept)."""
        self.stop_apiserver()
        time.sleep(down_seconds)
        self.start_apiserver(timeout=timeout)

    def _ssl_context(self, *, user_cert: pathlib.Path, user_key: pathlib.Path) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(user_cert), str(user_key))
        return ctx

    def _wait_ready(self, *, timeout: float) -> None:
        admin_cert, admin_key = (
            self.workdir / "pki" / f"{ADMIN_USER}.crt",
            self.workdir / "pki" / f"{ADMIN_USER}.key",
        )
        ctx = self._ssl_context(user_cert=admin_cert, user_key=admin_key)
        self._poll(f"{self.server}/readyz", context=ctx, timeout=timeout, what="the control plane")

    def _wait_healthy(self, url: str, *, timeout: float) -> None:
        """Until a component started after the apiserver answers its /healthz (it serves its own
        self-signed certificate)."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # loopback, its own throw-away certificate
        self._poll(url, context=ctx if url.startswith("https") else None, timeout=timeout, what=url)

    def _poll(self, url: str, *, context: ssl.SSLContext | None, timeout: float, what: str) -> None:
        """Until `url` answers 200; fails at once, with the logs, if any server exited meanwhile."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for server in self._servers:
                if server.proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{server.name} exited with code {server.proc.returncode} while the control plane "
                        f"was starting.\n{self.describe_logs()}"
                    )
            try:
                with urllib.request.urlopen(url, context=context, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as e:
                last = f"{url} answered {e.code}"
            except (urllib.error.URLError, OSError) as e:
                last = f"{url} unreachable: {e}"
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{what} was not ready within {timeout:.0f}s ({last}).\n{self.describe_logs()}"
        )

    def describe_logs(self) -> str:
        parts = [f"--- last lines of {s.name} ({s.log}) ---\n{_tail(s.log)}" for s in self._servers]
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL) and remove the temporary directory."""
        for server in reversed(self._servers):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGTERM)
        for server in reversed(self._servers):
            try:
                # The plane's data is throw-away: a short grace period, not a graceful drain.
                server.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.proc.pid, signal.SIGKILL)
                server.proc.wait()
        self._servers.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._watchdog is not None:
            self._tell_watchdog("done")
            if self._watchdog.stdin:
                with contextlib.suppress(BrokenPipeError):
                    self._watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None

    # ---- identities ------------------------------------------------------------------------

    def mint_kubeconfig(
        self,
        *,
        user: str,
        groups: Sequence[str] = (),
        path: pathlib.Path | None = None,
        server: str | None = None,
    ) -> pathlib.Path:
        """Write a kubeconfig that authenticates as ``user`` in ``groups`` (a client certificate).

        ``server`` points it elsewhere than the apiserver: at a proxy serving a certificate from
        :meth:`issue_serving_certificate`. The client certificate and key are also left in
        ``pki/<user>.crt`` and ``.key`` for such a proxy to present upstream.
        """
        pair = self._ca.issue_client(user=user, groups=groups)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
        pair.write(directory=self.workdir / "pki", stem=safe)
        path = path or self.workdir / f"{safe}.kubeconfig"
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "bindery-dev",
                    "cluster": {
                        "server": server or self.server,
                        "certificate-authority-data": _b64(self._ca.cert_pem),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": _b64(pair.cert_pem),
                        "client-key-data": _b64(pair.key_pem),
                    },
                }
            ],
            "contexts": [{"name": "bindery-dev", "context": {"cluster": "bindery-dev", "user": user}}],
            "current-context": "bindery-dev",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def issue_serving_certificate(self, *, stem: str) -> tuple[pathlib.Path, pathlib.Path]:
        """A certificate for 127.0.0.1/localhost signed by the plane's CA: (cert, key) files in pki/."""
        pair = self._ca.issue_server(hosts=["localhost"], ips=["127.0.0.1"])
        return pair.write(directory=self.workdir / "pki", stem=stem)

    @property
    def env(self) -> dict[str, str]:
        """The environment for `kubectl` and `helm` subprocesses: admin kubeconfig, binaries on PATH."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            # Helm keeps caches and config per user; keep them inside the plane's temp dir.
            "HELM_CACHE_HOME": str(self.workdir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.workdir / "helm" / "data"),
        }

    def kubectl(
        self, *args: str, kubeconfig: pathlib.Path | None = None, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = self.env
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            env=env,
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )


@contextlib.contextmanager
def _signals_stop(plane: ControlPlane) -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into a clean stop while the plane runs (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: types.FrameType | None) -> None:
        plane.stop()
        raise SystemExit(128 + signum)

    previous: Mapping[int, Any] = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
