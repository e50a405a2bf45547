"""Fixtures for the Slurm bed: Debian's Slurm 22.05 on loopback (bindery.devcluster.slurm).

The packages are fetched once per version into the cache. A test here is skipped only when
they cannot be had on this machine (not root, no Debian package index, no mirror); the reason
says which. Everything else that goes wrong fails.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

from bindery.devcluster.slurm import SlurmBed, SlurmNode, SlurmUnavailable, ensure_slurm

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
