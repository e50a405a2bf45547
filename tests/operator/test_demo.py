"""`bindery demo` works end to end (its own control plane, reference RM and operator)."""

from __future__ import annotations

import asyncio
import re
import sys

import pytest

pytestmark = pytest.mark.controlplane


async def test_the_demo_runs_a_deployment_and_a_job_beside_kube_scheduler() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bindery",
        "demo",
        "--pods",
        "12",
        "--job-pods",
        "6",
        "--gang-pods",
        "4",
        "--nodes",
        "2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    text = output.decode()
    assert process.returncode == 0, text
    assert "kube-scheduler placed a DaemonSet" in text
    assert "bound 22/22 pods" in text
    assert re.search(r"writes per bound pod \(counted by the operator\): 2\.00", text), text
    assert re.search(r"Bindings per bound pod \(apiserver_request_total\): 1\.00", text), text
    rows = re.findall(r"^(api|batch|gang)-\S+\s+(pool-\d)\s+\d+ ms\s+(\w+)$", text, flags=re.MULTILINE)
    assert len(rows) == 22, text
    assert {node for _, node, _ in rows} <= {"pool-1", "pool-2"}
    assert {phase for kind, _, phase in rows if kind == "api"} == {"Running"}
    assert {phase for kind, _, phase in rows if kind in ("batch", "gang")} == {"Succeeded"}
    # The gang: an Indexed Job whose PodGroup the Job controller made, placed in one group reservation.
    assert "the gang: 4 pods bound together" in text, text
    assert "PodGroupScheduled=True (Scheduled" in text, text
    # What each node holds: Bindery's 12 running pods, the default scheduler's 2 per node.
    holds = re.findall(r"^(pool-\d)\s+(\d+)\s+(\d+)\s+\S+ / 8$", text, flags=re.MULTILINE)
    assert sum(int(ours) for _, ours, _ in holds) == 12, text
    assert all(int(default) == 2 for _, _, default in holds), text
    assert "OS signals are ignored" not in text  # the demo owns signals; Kopf's warning is noise
    assert "WARNING" not in text, text
