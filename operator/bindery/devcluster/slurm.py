"""A real Slurm on loopback, from Debian's own packages, for tests and for poking at.

The Slurm adapter (:mod:`bindery.slurm_rm`) puts Bindery in front of a real Slurm, so its tests
need slurmctld, one slurmd per node, slurmrestd and munge, not a fake. Debian 12 ships Slurm
22.05.8. The packages are fetched with ``apt-get download`` (no installation, nothing written
under ``/usr``) and unpacked with ``dpkg-deb -x`` into ``$XDG_CACHE_HOME/bindery/slurm/<version>/root``,
once per version, as the Go binaries are built once per pin. Only Debian's package index must be reachable.

How one host runs N nodes: Debian's build has multiple-slurmd, so every ``NodeName`` line gets
its own ``Port=``, ``%n`` goes into the slurmd spool, pid and log paths, and each node is one
``slurmd -N <name>``. slurmd's compiled-in ``/usr/sbin/slurmstepd`` is replaced by its ``-d``
option, the compiled-in plugin directory by ``PluginDir=``, the library path by
``LD_LIBRARY_PATH``. There is no systemd and cgroups are v1: ``proctrack/linuxproc`` and
``task/none``. ``SlurmdParameters=config_overrides`` lets a node advertise the CPUs and memory of
the configuration, not of this 2-core machine. slurmrestd serves a unix socket with
``rest_auth/local`` (peer credentials; root needs ``SLURMRESTD_SECURITY=disable_user_check``).

Everything runs as the calling user (root: slurmd must start job steps), in a work directory
of its own, on free loopback ports, so several beds can run side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from bindery.devcluster.plane import free_ports

# Everything slurmctld, slurmd, slurmrestd and the clients load that a Debian 12 base image lacks.
PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurmrestd",
    "slurm-client",
    "slurm-wlm-basic-plugins",
    "munge",
    "libmunge2",
    "libhwloc15",
    "libhttp-parser2.9",
)
SLURM_PACKAGE = "slurmctld"  # its version names the cache directory
API = "v0.0.38"  # the newest slurmrestd API of 22.05

_LIB = "usr/lib/x86_64-linux-gnu"
_DAEMONS = (
    "usr/sbin/munged",
    "usr/sbin/slurmctld-wlm",
    "usr/sbin/slurmd-wlm",
    "usr/sbin/slurmstepd-wlm",
    "usr/sbin/slurmrestd",
)


_SUN_PATH_MAX = 107  # a unix socket's path, without its terminating NUL
_SHORT_TMP = "/tmp" if os.path.isdir("/tmp") else None  # not $TMPDIR, which may be long


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be set up on this machine; the message says why and what to do."""


def cache_root() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "bindery" / "slurm"


def _candidate_version(package: str) -> str:
    try:
        out = subprocess.run(
            ["apt-cache", "policy", package], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(
            f"apt-cache is not usable here ({exc}); Slurm comes from Debian's packages"
        ) from exc
    for line in out.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "Candidate" and value.strip() not in ("", "(none)"):
            return value.strip()
    raise SlurmUnavailable(
        f"Debian's package index has no {package} (apt-cache policy {package} shows no candidate); "
        "run `apt-get update` on a Debian 12 host"
    )


def _missing_libraries(root: pathlib.Path) -> list[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": library_path(root)}
    missing: set[str] = set()
    for daemon in _DAEMONS:
        out = subprocess.run(
            ["ldd", str(root / daemon)], capture_output=True, text=True, env=env, timeout=30, check=False
        ).stdout
        missing.update(line.split()[0] for line in out.splitlines() if "not found" in line)
    return sorted(missing)


def library_path(root: pathlib.Path) -> str:
    return f"{root / _LIB}:{root / _LIB / 'slurm-wlm'}"


def ensure_slurm(*, log: Any = None) -> pathlib.Path:
    """The unpacked packages' root (``…/slurm/<version>/root``), fetched once per version.

    Raises SlurmUnavailable with the reason when the packages cannot be had: not Debian, no
    package index, no network to the mirror, not root (``apt-get download`` and slurmd need it).
    """
    version = _candidate_version(SLURM_PACKAGE)
    target = cache_root() / version
    root = target / "root"
    if (target / "complete").exists():
        return root
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise SlurmUnavailable("apt-get and dpkg-deb are needed to fetch Debian's Slurm packages")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        staging = pathlib.Path(tmp)
        # apt drops to the _apt user for downloads; a world-writable directory spares a warning.
        staging.chmod(0o777)
        if log:
            log(f"fetching Debian's Slurm {version} packages into {target}")
        result = subprocess.run(
            ["apt-get", "download", *PACKAGES],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise SlurmUnavailable(
                f"`apt-get download {' '.join(PACKAGES)}` failed ({result.returncode}): "
                f"{result.stderr.strip()[-600:]}; Slurm's tests need Debian's package mirror"
            )
        unpacked = staging / "root"
        for deb in sorted(staging.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True, timeout=120)
        missing = _missing_libraries(unpacked)
        if missing:
            raise SlurmUnavailable(
                f"Slurm {version} needs libraries this host lacks: {', '.join(missing)}; "
                "add their Debian packages to bindery.devcluster.slurm.PACKAGES"
            )
        if root.exists():
            shutil.rmtree(root)
        unpacked.rename(root)
    (target / "complete").write_text(version + "\n")
    return root


@dataclasses.dataclass(frozen=True)
class SlurmNode:
    """One Slurm node: its NodeName and what it advertises."""

    name: str
    cpus: int = 4
    memory_mib: int = 8192
    gpus: int = 0  # GRES ``gpu``, counted only: no device files (see ``_write_config``)


#: How many times ``SlurmBed.start`` picks fresh ports when a daemon finds its port taken.
_LAUNCH_ATTEMPTS = 3


_PORT_TAKEN = "Address already in use"


def _tail(path: pathlib.Path, *, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class SlurmBed:
    """munged, slurmctld, one slurmd per node and slurmrestd, in ``workdir``.

    ``start()`` returns when slurmrestd answers and every node is idle; ``stop()`` cancels every
    job and ends every daemon. Each daemon can be SIGKILLed and started again on its own, which
    is what the chaos tests do.
    """

    def __init__(
        self,
        workdir: pathlib.Path,
        nodes: Sequence[SlurmNode],
        *,
        root: pathlib.Path | None = None,
        partition: str = "main",
    ) -> None:
        self.root = root or ensure_slurm()
        self.workdir = workdir
        self.nodes = tuple(nodes)
        self.partition = partition
        self._pick_ports()
        # The unix sockets live in a short directory of their own, not in ``workdir``: sun_path
        # holds 107 characters, and slurmstepd listens on <SlurmdSpoolDir>/<node>_<job>.<step>,
        # the batch step's id being 4294967291. Under pytest's tmp_path of a long test name
        # (~70 characters) that path is ~115 long, every launch fails and slurmctld requeues the
        # job held: PENDING, reason JobHeldUser.
        self.rundir = pathlib.Path(tempfile.mkdtemp(prefix="bslurm-", dir=_SHORT_TMP))
        self.rundir.chmod(0o711)  # as munged's socket directory was: job steps of other users reach it
        self.spool = self.rundir / "spool"
        self.socket = self.rundir / "slurmrestd.sock"
        self.conf = workdir / "slurm.conf"
        self.munge_socket = self.rundir / "munge.sock"
        for node in self.nodes:
            longest = self.spool / node.name / f"{node.name}_{2**32 - 1}.{2**32 - 5}"
            if len(str(longest)) > _SUN_PATH_MAX:
                raise ValueError(
                    f"Slurm node name {node.name!r} is too long for slurmstepd's socket path "
                    f"({longest}: {len(str(longest))} > {_SUN_PATH_MAX} characters); use a shorter name"
                )
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        #: Where each daemon's latest launch began writing in its log.
        self._log_starts: dict[str, int] = {}

    def _pick_ports(self) -> None:
        """Distinct ports for slurmctld and every slurmd, outside the ephemeral range.

        Ports from separate ``bind(0)`` calls can repeat (the kernel hands a closed port out
        again) and collide with outgoing connections: CI once gave slurmctld slurm-0's port, so
        slurmctld died on "Address already in use" and the clients' calls reached slurmd.
        """
        ctld, *nodes = free_ports(1 + len(self.nodes))
        self.ctld_port = ctld
        self.node_ports = {node.name: port for node, port in zip(self.nodes, nodes, strict=True)}

    # --- environment -------------------------------------------------------------------
    @property
    def url(self) -> str:
        """slurmrestd's address for the adapter: ``unix:`` and the socket path."""
        return f"unix:{self.socket}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "LD_LIBRARY_PATH": library_path(self.root),
            "SLURM_CONF": str(self.conf),
            "SLURMRESTD_SECURITY": "disable_user_check",
        }

    def binary(self, name: str) -> str:
        for sub in ("usr/bin", "usr/sbin"):
            path = self.root / sub / name
            if path.exists():
                return str(path)
        raise FileNotFoundError(name)

    def run_client(self, *argv: str, timeout: float = 30) -> str:
        """Run a Slurm client (``squeue``, ``scontrol``, ``scancel``…) against this bed."""
        result = subprocess.run(
            [self.binary(argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def squeue(self) -> list[dict[str, str]]:
        """Jobs slurmctld holds: id, name, state, node list, reason, comment."""
        out = self.run_client("squeue", "--noheader", "-o", "%i|%j|%T|%N|%r|%k")
        rows = []
        for line in out.splitlines():
            job_id, name, state, nodes, reason, comment = line.split("|", 5)
            rows.append(
                {
                    "id": job_id,
                    "name": name,
                    "state": state,
                    "nodes": nodes,
                    "reason": reason,
                    "comment": comment,
                }
            )
        return rows

    # --- configuration -----------------------------------------------------------------
    def _write_config(self) -> None:
        wd = self.workdir
        for sub in ("munge", "state", "log"):
            (wd / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.spool / node.name).mkdir(parents=True, exist_ok=True)
        (wd / "munge").chmod(0o711)
        key = wd / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o600)
        host = socket.gethostname()
        lines = [
            "ClusterName=bindery",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            f"PluginDir={self.root / _LIB / 'slurm-wlm'}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={wd / 'state'}",
            f"SlurmdSpoolDir={self.spool / '%n'}",
            f"SlurmctldPidFile={wd / 'slurmctld.pid'}",
            f"SlurmdPidFile={wd / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={wd / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={wd / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "KillWait=2",
            "InactiveLimit=0",
            "MinJobAge=60",
            # slurmctld starts a batch job up to 3 s after its submission by default (batched for
            # throughput); a placeholder job is a pod waiting to bind, so start it at once. A pod
            # group's heterogeneous job is started by the backfill scheduler alone (its main loop
            # cannot start components together), every bf_interval (default 30 s): every second here.
            "SchedulerParameters=batch_sched_delay=0,bf_interval=1",
        ]
        if any(node.gpus for node in self.nodes):
            lines.append("GresTypes=gpu")
        for node in self.nodes:
            gres = f" Gres=gpu:{node.gpus}" if node.gpus else ""
            lines.append(
                f"NodeName={node.name} NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={self.node_ports[node.name]} CPUs={node.cpus}"
                f" RealMemory={node.memory_mib}{gres} State=UNKNOWN"
            )
        lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        # GPUs here are counted, not real. slurmd 22.05 drops a GPU without File= ("Removing
        # file-less GPU"), then slurmctld drains the node (count reported lower than configured),
        # so each GPU is an empty file standing in for /dev/nvidiaN: with task/none no device is
        # bound, but Slurm allocates and accounts the count. AutoDetect=off: a build with NVML
        # would otherwise probe this host. slurmd reads gres.conf from slurm.conf's directory.
        gres_lines = ["AutoDetect=off"]
        for node in self.nodes:
            if node.gpus:
                devices = self.rundir / "dev" / node.name
                devices.mkdir(parents=True, exist_ok=True)
                for index in range(node.gpus):
                    (devices / f"gpu{index}").touch()
                gres_lines.append(
                    f"NodeName={node.name} Name=gpu Count={node.gpus} File={devices}/gpu[0-{node.gpus - 1}]"
                )
        (self.conf.parent / "gres.conf").write_text("\n".join(gres_lines) + "\n")

    # --- daemons -----------------------------------------------------------------------
    def _daemon(self, name: str) -> pathlib.Path:
        """``name`` (slurmctld, slurmd, slurmstepd) as a link to Debian's ``<name>-wlm`` binary.

        Slurm decides some things by its program's name (``run_in_daemon``): a ``slurmctld-wlm``
        or ``slurmd-wlm`` is "not a daemon", and skips reading the nodes' ``Gres=`` from
        slurm.conf, so every node had no GRES and a job asking for ``gpu:1`` was refused
        "Requested node configuration is not available" (2014). Debian's own packages run them
        through ``/usr/sbin/<name>`` alternatives links, as this does.
        """
        link = self.rundir / "bin" / name
        if not link.exists():
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(self.root / "usr/sbin" / f"{name}-wlm")
        return link

    def _spawn(self, key: str, argv: Sequence[str]) -> None:
        log = open(self.workdir / "log" / f"{key}.out", "ab")  # noqa: SIM115 - the child owns it
        self._log_starts[key] = log.tell()  # the log is appended to: this launch's lines start here
        with log:
            self._procs[key] = subprocess.Popen(
                argv,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.workdir,
            )

    def start_munged(self) -> None:
        wd = self.workdir / "munge"
        self._spawn(
            "munged",
            [
                str(self.root / "usr/sbin/munged"), "-F", "--force",
                f"--socket={self.munge_socket}", f"--key-file={wd / 'munge.key'}",
                f"--log-file={self.workdir / 'log' / 'munged.log'}", f"--pid-file={wd / 'munged.pid'}",
                f"--seed-file={wd / 'munged.seed'}",
            ],
        )  # fmt: skip
        self._wait(self.munge_socket.exists, 15, "munged to create its socket")

    def start_slurmctld(self) -> None:
        """Start slurmctld; it recovers its jobs from StateSaveLocation, as after a crash."""
        self._spawn("slurmctld", [str(self._daemon("slurmctld")), "-D", "-f", str(self.conf)])

    def start_slurmd(self, name: str) -> None:
        self._spawn(
            f"slurmd-{name}",
            [
                str(self._daemon("slurmd")), "-D", "-N", name, "-f", str(self.conf),
                "-d", str(self._daemon("slurmstepd")),
            ],
        )  # fmt: skip

    def start_slurmrestd(self) -> None:
        self.socket.unlink(missing_ok=True)
        self._spawn(
            "slurmrestd",
            [
                str(self.root / "usr/sbin/slurmrestd"), "-f", str(self.conf), "-a", "rest_auth/local",
                "-s", f"openapi/{API}", f"unix:{self.socket}",
            ],
        )  # fmt: skip
        self._wait(self.socket.exists, 15, "slurmrestd to create its socket")

    def kill(self, key: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal one daemon (``slurmctld``, ``slurmd-<node>``, ``slurmrestd``, ``munged``) and reap it."""
        proc = self._procs.pop(key)
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def signal(self, key: str, sig: signal.Signals) -> None:
        """Send ``sig`` to one daemon and leave it be: SIGSTOP and SIGCONT freeze and thaw it."""
        self._procs[key].send_signal(sig)

    def running(self, key: str) -> bool:
        proc = self._procs.get(key)
        return proc is not None and proc.poll() is None

    def start(self, *, timeout: float = 60) -> None:
        """Start every daemon; on fresh ports again if one found its port taken at start.

        A port free when chosen can be taken before the daemon binds it (another bed, a client's
        outgoing connection). That daemon exits at once, so the bed starts over on new ports, as
        ``ControlPlane.start`` does for etcd and the apiserver.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, _LAUNCH_ATTEMPTS + 1):
            self._write_config()
            try:
                self.start_munged()
                self.start_slurmctld()
                for node in self.nodes:
                    self.start_slurmd(node.name)
                self.start_slurmrestd()
                self.wait_idle(timeout=timeout)
                return
            except BaseException:
                taken = self._port_taken()
                if taken and attempt < _LAUNCH_ATTEMPTS:
                    self._end_daemons()
                    self._pick_ports()
                    continue
                self.stop()
                raise

    def _port_taken(self) -> list[str]:
        """The daemons that have exited because their port was in use."""
        taken = []
        for key, proc in self._procs.items():
            if proc.poll() is not None and _PORT_TAKEN in self._logged(key):
                taken.append(key)
        return taken

    def _logged(self, key: str) -> str:
        """What the daemon's latest launch wrote to its log (not an earlier launch's lines)."""
        try:
            with open(self.workdir / "log" / f"{key}.out", "rb") as log:
                log.seek(self._log_starts.get(key, 0))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_idle(self, *, timeout: float = 60) -> None:
        """Until slurmctld answers and reports every node idle (or allocated: jobs survive restarts)."""

        def ready() -> bool:
            if "slurmctld" in self._procs and not self.running("slurmctld"):
                raise RuntimeError(
                    "slurmctld exited while the bed waited for its nodes: "
                    + _tail(self.workdir / "log" / "slurmctld.out")
                )
            try:
                out = self.run_client("sinfo", "--noheader", "-N", "-o", "%N %t", timeout=10)
            except (RuntimeError, subprocess.TimeoutExpired):
                return False
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return all(states.get(n.name, "").rstrip("*") in ("idle", "alloc", "mix") for n in self.nodes)

        self._wait(ready, timeout, f"every Slurm node idle (logs in {self.workdir / 'log'})")

    def wait_state_saved(self, since: float, *, timeout: float = 30) -> None:
        """Until slurmctld has written its job state after ``since`` (a ``time.time()``).

        slurmctld saves state in the background, a few seconds after a change: a SIGKILL before
        that loses the last submissions and updates (seen: a job submitted and committed <1 s
        before the kill was unknown after the restart).
        """
        path = self.workdir / "state" / "job_state"
        self._wait(
            lambda: path.exists() and path.stat().st_mtime > since, timeout, "slurmctld to save job state"
        )

    def stop(self) -> None:
        """Cancel every job (so no slurmstepd outlives the bed), then end the daemons."""
        if self.running("slurmctld"):
            try:
                jobs = [row["id"] for row in self.squeue()]  # every user's (tests submit as others)
                if jobs:
                    self.run_client("scancel", "--full", *jobs, timeout=15)
                self._wait(lambda: not self.squeue(), 20, "jobs to end")
            except (RuntimeError, TimeoutError, subprocess.TimeoutExpired):
                pass
        self._end_daemons()
        shutil.rmtree(self.rundir, ignore_errors=True)

    def _end_daemons(self) -> None:
        for key in reversed(list(self._procs)):
            self.kill(key, signal.SIGTERM)

    @staticmethod
    def _wait(check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.2)
        raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")

    def __enter__(self) -> SlurmBed:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def unix_socket_of(url: str) -> str | None:
    """The socket path of a ``unix:/path`` address, or None for an http(s) URL."""
    if url.startswith("unix:"):
        return urllib.parse.unquote(url.removeprefix("unix:").removeprefix("//"))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bindery.devcluster.slurm",
        description="Run slurmctld, N slurmd, slurmrestd and munge on loopback until Ctrl-C.",
    )
    parser.add_argument(
        "--nodes", type=int, default=2, help="how many Slurm nodes (named slurm-0, slurm-1, …)"
    )
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--memory-mib", type=int, default=8192)
    parser.add_argument("--gpus", type=int, default=0, help="counted GPUs (GRES gpu) per node")
    parser.add_argument("--workdir", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    try:
        root = ensure_slurm(log=lambda m: print(m, file=sys.stderr))
    except SlurmUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="bindery-slurm-"))
    nodes = [SlurmNode(f"slurm-{i}", args.cpus, args.memory_mib, args.gpus) for i in range(args.nodes)]
    bed = SlurmBed(workdir, nodes, root=root)
    with bed:
        env: Mapping[str, str] = bed.env()
        print(
            json.dumps(
                {
                    "slurmrestd": bed.url,
                    "SLURM_CONF": env["SLURM_CONF"],
                    "LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"],
                    "bin": str(root / "usr/bin"),
                    "nodes": [n.name for n in nodes],
                },
                indent=2,
            ),
            flush=True,
        )
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
