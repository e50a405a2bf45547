"""`bindery demo --rm slurm`: the same demo with a real Slurm as the resource manager.

A platform team wiring Slurm into Kubernetes wants to see the two side by side: the pods Bindery
binds, and the placeholder jobs Slurm runs for them. So the demo starts Debian's Slurm on loopback
(munged, slurmctld, one slurmd per pool node, slurmrestd: `bindery.devcluster.slurm`, fetched once
into the cache), the adapter `bindery rm slurm` as its own process, as it runs in a cluster, and a
ResourceManager pointing at it. The pool's kwok nodes carry the Slurm nodes' names, so the node map
is the identity, with the pool label the pods select on.

Slurm owns the pool here: it knows nothing of pods another scheduler places, so the demo puts no
kube-scheduler workload on these nodes (in a real cluster, give Slurm's nodes a taint only
Bindery's pods tolerate).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import secrets
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence

import yaml

from bindery.devcluster.slurm import SlurmBed, SlurmNode, SlurmUnavailable, ensure_slurm

#: The adapter prints this, then its URL, once it serves (bindery.slurm_rm.cli.BANNER).
_BANNER = "Slurm RM serving contract v1 at "
RESOURCE_MANAGER = "slurm"
#: How long the adapter may take to print its banner (it reaches slurmrestd first).
BANNER_WAIT_SECONDS = 60.0
#: Memory each Slurm node advertises (the kwok nodes' 32Gi); slurmd's config_overrides lets a
#: loopback bed advertise more than the host has.
NODE_MEMORY_MIB = 32 * 1024


class SlurmDemoUnavailable(RuntimeError):
    """The machine cannot run the Slurm bed; the message says why and what to do."""


def prepare(*, say: object) -> pathlib.Path:
    """Slurm's packages, fetched once; refused early, before a control plane is started for nothing."""
    if os.geteuid() != 0:
        raise SlurmDemoUnavailable(
            "bindery demo --rm slurm runs slurmd, which starts job steps as their user, so it needs "
            "root: run `sudo scripts/demo --rm slurm`"
        )
    try:
        return ensure_slurm(log=say)
    except SlurmUnavailable as exc:
        raise SlurmDemoUnavailable(f"Debian's Slurm packages cannot be had here: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class SlurmStage:
    bed: SlurmBed
    url: str
    token: str


@contextlib.contextmanager
def slurm_stage(
    *, root: pathlib.Path, workdir: pathlib.Path, nodes: Sequence[str], cpus: int, labels: dict[str, str]
) -> Iterator[SlurmStage]:
    """The bed and the adapter until the demo ends; every job is cancelled and every daemon ended."""
    bed = SlurmBed(
        workdir / "slurm", [SlurmNode(n, cpus=cpus, memory_mib=NODE_MEMORY_MIB) for n in nodes], root=root
    )
    bed.start()
    adapter: subprocess.Popen[str] | None = None
    try:
        token = secrets.token_urlsafe(24)
        token_file = workdir / "slurm-adapter.token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        node_map = workdir / "node-map.yaml"
        node_map.write_text(
            yaml.safe_dump(
                {"nodes": [{"name": n, "labels": {**labels, "kubernetes.io/hostname": n}} for n in nodes]}
            )
        )
        # The child keeps its own copy of the log's descriptor.
        with open(bed.workdir / "log" / "adapter.log", "a") as log:
            adapter = subprocess.Popen(
                [
                    sys.executable, "-m", "bindery.slurm_rm.cli", "--slurmrestd", bed.url,
                    "--node-map", str(node_map), "--listen", "127.0.0.1:0",
                    "--token-file", str(token_file),
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )  # fmt: skip
        assert adapter.stdout is not None
        # The banner, or nothing within the wait: an adapter stuck before serving must not hang the demo.
        with selectors.DefaultSelector() as ready:
            ready.register(adapter.stdout, selectors.EVENT_READ)
            line = adapter.stdout.readline() if ready.select(timeout=BANNER_WAIT_SECONDS) else ""
        if not line.startswith(_BANNER):
            raise RuntimeError(
                f"the Slurm adapter did not start serving within {BANNER_WAIT_SECONDS:g}s "
                f"(see {bed.workdir / 'log' / 'adapter.log'})"
            )
        yield SlurmStage(bed=bed, url=line.removeprefix(_BANNER).strip(), token=token)
    finally:
        if adapter is not None and adapter.poll() is None:
            adapter.send_signal(signal.SIGTERM)
            try:
                adapter.wait(timeout=15)
            except subprocess.TimeoutExpired:
                adapter.kill()
        bed.stop()


def squeue_table(bed: SlurmBed) -> list[str]:
    """`squeue` as a user would run it against the bed: Bindery's placeholder jobs and their nodes."""
    out = bed.run_client("squeue", "--sort=j", "-o", "%.8i %.42j %.9T %.10M %.8N %.4C %r")
    return out.rstrip("\n").splitlines()
