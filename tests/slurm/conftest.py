"""Fixtures for the Slurm bed: Debian's Slurm 22.05 on loopback (bindery.devcluster.slurm).

The packages are fetched once per version into the cache. A test here is skipped only when
they cannot be had on this machine (not root, no Debian package index, no mirror); the reason
says which. Everything else that goes wrong fails.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from bindery.devcluster.slurm import SlurmBed, SlurmNode, SlurmUnavailable, ensure_slurm
from bindery.slurm_rm.cli import BANNER

NODES = (SlurmNode("slurm-0", cpus=4, memory_mib=8192), SlurmNode("slurm-1", cpus=4, memory_mib=8192))


@pytest.fixture(scope="session")
def slurm_root() -> pathlib.Path:
    if os.geteuid() != 0:
        pytest.skip("the Slurm bed runs slurmd, which starts job steps as their user: it needs root")
    try:
        return ensure_slurm()
    except SlurmUnavailable as exc:
        pytest.skip(f"Debian's Slurm packages are not available here: {exc}")


@pytest.fixture
def slurm_bed(slurm_root: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBed]:
    """A fresh bed per test: a test that SIGKILLs slurmctld leaves nothing to the next."""
    bed = SlurmBed(tmp_path_factory.mktemp("slurm"), NODES, root=slurm_root)
    bed.start()
    try:
        yield bed
    finally:
        bed.stop()


@dataclasses.dataclass
class AdapterProcess:
    """``bindery rm slurm`` as its own process; ``restart`` after ``kill`` starts a fresh one."""

    bed: SlurmBed
    token_file: pathlib.Path
    options: tuple[str, ...] = ()
    node_map: str = ""  # default: every bed node maps to a Kubernetes node of the same name
    listen: str = "127.0.0.1:0"  # set to the last URL's host:port to restart at the same address
    url: str = ""
    process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        node_map = self.node_map or ",".join(f"{node.name}={node.name}" for node in self.bed.nodes)
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "bindery.slurm_rm.cli", "--slurmrestd", self.bed.url,
                "--node-map", node_map, "--listen", self.listen, "--token-file", str(self.token_file),
                *self.options,
            ],
            stdout=subprocess.PIPE,
            stderr=open(self.bed.workdir / "log" / "adapter.log", "a"),  # noqa: SIM115
            text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith(BANNER), f"the adapter did not start: {line!r} (see {self.bed.workdir}/log)"
        self.url = line.removeprefix(BANNER).strip()

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        self.process.wait(timeout=30)

    def client(self) -> httpx.Client:
        token = self.token_file.read_text().strip()
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.fixture
def slurm_adapter(slurm_bed: SlurmBed) -> Iterator[AdapterProcess]:
    token_file = slurm_bed.workdir / "token"
    token_file.write_text("slurm-adapter-test-token\n")
    adapter = AdapterProcess(slurm_bed, token_file)
    adapter.start()
    try:
        yield adapter
    finally:
        if adapter.process is not None and adapter.process.poll() is None:
            adapter.kill(signal.SIGTERM)
