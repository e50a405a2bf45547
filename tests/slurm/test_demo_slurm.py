"""`bindery demo --rm slurm` end to end: Slurm's own `squeue` agrees with where the pods went."""

from __future__ import annotations

import asyncio
import pathlib
import re
import sys

import pytest

pytestmark = pytest.mark.controlplane


async def test_the_slurm_demo_shows_one_running_job_per_pod_on_its_node(slurm_root: pathlib.Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bindery", "demo", "--rm", "slurm",
        "--pods", "6", "--job-pods", "2", "--gang-pods", "2", "--nodes", "2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), timeout=300)
    text = output.decode()
    assert process.returncode == 0, text
    assert "bound 10/10 pods" in text, text
    assert "kube-scheduler placed" not in text, text  # Slurm owns the pool: nothing else on it
    pods = dict(re.findall(r"^(api-\S+)\s+(pool-\d)\s+\d+ ms\s+Running$", text, flags=re.MULTILINE))
    assert len(pods) == 6, text
    # squeue's rows, as Slurm reports them: one RUNNING placeholder per running pod, on its node;
    # the finished Job and gang pods released theirs (no job without a running pod).
    jobs = re.findall(
        r"^\s+\d+\s+bindery:bindery-demo/(\S+)\s+(\S+)\s+\S+\s+(pool-\d)\s+\d+", text, flags=re.MULTILINE
    )
    assert sorted((name, node) for name, state, node in jobs if state == "RUNNING") == sorted(pods.items()), (
        text
    )
