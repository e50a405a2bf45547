"""The Slurm bed itself: jobs submitted through slurmrestd run where they are told, can be
cancelled, and survive a SIGKILLed slurmctld. The adapter's tests build on these facts."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx

from bindery.devcluster.slurm import API, SlurmBed


def _rest(bed: SlurmBed) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(bed.socket)), base_url="http://slurmrestd", timeout=30
    )


def _submit(client: httpx.Client, node: str, name: str) -> int:
    body = {
        "script": "#!/bin/sh\nexec sleep 100000\n",
        "job": {
            "name": name,
            "nodelist": node,
            "cpus_per_task": 1,
            "memory_per_node": 256,
            "current_working_directory": "/tmp",
            "standard_output": "/dev/null",
            "environment": {"PATH": "/bin:/usr/bin"},
        },
    }
    answer = client.post(f"/slurm/{API}/job/submit", json=body).json()
    assert not answer["errors"], answer["errors"]
    return int(answer["job_id"])


def _job(client: httpx.Client, job_id: int) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = client.get(f"/slurm/{API}/job/{job_id}").json()["jobs"]
    return jobs[0]


def _until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_a_job_submitted_through_slurmrestd_runs_on_the_node_it_names(slurm_bed: SlurmBed) -> None:
    with _rest(slurm_bed) as client:
        job_id = _submit(client, "slurm-1", "bed-runs")
        _until(lambda: _job(client, job_id)["job_state"] == "RUNNING", 30, "job RUNNING")
        assert _job(client, job_id)["nodes"] == "slurm-1"
    rows = [row for row in slurm_bed.squeue() if row["id"] == str(job_id)]
    assert [(row["state"], row["nodes"], row["name"]) for row in rows] == [("RUNNING", "slurm-1", "bed-runs")]


def test_a_cancelled_job_ends(slurm_bed: SlurmBed) -> None:
    with _rest(slurm_bed) as client:
        job_id = _submit(client, "slurm-0", "bed-cancel")
        _until(lambda: _job(client, job_id)["job_state"] == "RUNNING", 30, "job RUNNING")
        assert client.delete(f"/slurm/{API}/job/{job_id}").json()["errors"] == []
        _until(lambda: _job(client, job_id)["job_state"] == "CANCELLED", 30, "job CANCELLED")


def test_slurmctld_sigkilled_and_restarted_keeps_the_running_job(slurm_bed: SlurmBed) -> None:
    with _rest(slurm_bed) as client:
        job_id = _submit(client, "slurm-1", "bed-survives")
        _until(lambda: _job(client, job_id)["job_state"] == "RUNNING", 30, "job RUNNING")
    slurm_bed.kill("slurmctld", signal.SIGKILL)
    slurm_bed.start_slurmctld()
    slurm_bed.wait_idle(timeout=60)
    with _rest(slurm_bed) as client:
        _until(lambda: _job(client, job_id)["job_state"] == "RUNNING", 30, "job RUNNING after restart")
        job = _job(client, job_id)
    assert (job["nodes"], job["name"]) == ("slurm-1", "bed-survives")
