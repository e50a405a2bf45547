"""The Slurm bed itself: jobs submitted through slurmrestd run where they are told, can be
cancelled, and survive a SIGKILLed slurmctld. The adapter's tests build on these facts."""

from __future__ import annotations

import pathlib
import signal
import socket
import time
from typing import Any

import httpx
import pytest

from bindery.devcluster.slurm import API, SlurmBed, SlurmNode

NODES_FOR_PORTS = (
    SlurmNode("slurm-0", cpus=2, memory_mib=1024),
    SlurmNode("slurm-1", cpus=2, memory_mib=1024),
)


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


def test_a_bed_in_a_deep_work_directory_starts_its_jobs(
    slurm_root: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The cluster-plane suite's beds live in pytest's tmp_path of long test names
    (``…/pytest-341/test_a_deployment_is_bound_thr0/slurm``) with nodes named after kwok's. There
    slurmstepd's socket, ``<SlurmdSpoolDir>/<node>_<job>.4294967291``, is longer than a unix
    socket's 107 characters: every launch failed, slurmctld held the jobs (PENDING, JobHeldUser)."""
    workdir = tmp_path_factory.mktemp("test_a_deployment_is_bound_thr") / "slurm"
    bed = SlurmBed(workdir, [SlurmNode("kwok-1ac42b-0", cpus=2, memory_mib=1024)], root=slurm_root)
    bed.start()
    try:
        with _rest(bed) as client:
            job_id = _submit(client, "kwok-1ac42b-0", "deep")
            deadline = time.monotonic() + 30
            while (job := _job(client, job_id))["job_state"] != "RUNNING" and time.monotonic() < deadline:
                time.sleep(0.2)
        assert (job["job_state"], job["state_reason"]) == ("RUNNING", "None"), (
            workdir,
            job["state_description"],
        )
    finally:
        bed.stop()


def test_a_bed_whose_ports_are_taken_at_start_starts_on_fresh_ports(
    slurm_root: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """CI once gave slurmctld and slurm-0 the same port (two separate ``bind(0)`` calls): slurmctld
    died on "Address already in use", slurmrestd's calls reached slurmd, and the bed waited 60 s
    for idle nodes. Here another process listens on slurmctld's and slurm-1's chosen ports first."""
    bed = SlurmBed(tmp_path_factory.mktemp("slurm"), NODES_FOR_PORTS, root=slurm_root)
    ports = [bed.ctld_port, *bed.node_ports.values()]
    assert len(set(ports)) == len(ports), ports
    squatters = []
    for port in (bed.ctld_port, bed.node_ports["slurm-1"]):
        squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        squatters.append(squatter)
    try:
        bed.start(timeout=60)
        try:
            assert bed.ctld_port != ports[0]
            assert bed.node_ports["slurm-1"] != ports[2]
            with _rest(bed) as client:
                job_id = _submit(client, "slurm-1", "fresh-ports")
                _until(lambda: _job(client, job_id)["job_state"] == "RUNNING", 30, "job RUNNING")
        finally:
            bed.stop()
    finally:
        for squatter in squatters:
            squatter.close()
