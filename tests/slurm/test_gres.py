"""Extended resources as Slurm GRES: a pod asking for ``nvidia.com/gpu`` gets a placeholder job
that Slurm itself allocated that many GPUs on its node, and Slurm's count keeps reservations from
sharing a GPU. The bed's nodes have counted GPUs (gres.conf ``File=`` stand-ins)."""

from __future__ import annotations

import pathlib
import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from bindery.devcluster.slurm import SlurmBed, SlurmNode
from tests.slurm.conftest import AdapterProcess
from tests.slurm.test_adapter import _state, _until

GPU_NODES = (SlurmNode("slurm-0", gpus=1), SlurmNode("slurm-1", gpus=1))


@pytest.fixture
def gpu_adapter(
    slurm_root: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AdapterProcess]:
    """Two Slurm nodes of 4 CPUs and 1 GPU each, and the adapter with its default GRES map."""
    bed = SlurmBed(tmp_path_factory.mktemp("slurm-gpu"), GPU_NODES, root=slurm_root)
    bed.start()
    token_file = bed.workdir / "token"
    token_file.write_text("slurm-gres-test-token\n")
    adapter = AdapterProcess(bed, token_file)
    try:
        adapter.start()
        yield adapter
    finally:
        if adapter.process is not None and adapter.process.poll() is None:
            adapter.kill(signal.SIGTERM)
        bed.stop()


def _body(uid: str, **resources: str) -> dict[str, Any]:
    return {
        "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "slurm-gres"},
        "resources": {"cpu": "1", "memory": "64Mi", **resources},
        "idempotencyKey": uid,
        "ttlSeconds": 60,
    }


def _gpu(uid: str, count: int = 1) -> dict[str, Any]:
    return _body(uid, **{"nvidia.com/gpu": str(count)})


def _gpus_allocated(bed: SlurmBed, job_id: str) -> list[str]:
    """The GPUs Slurm allocated the job, from ``scontrol -d show job``: e.g. ``['gpu:1(IDX:0)']``."""
    return re.findall(r"GRES=(gpu:\d+\(IDX:[^)]*\))", bed.run_client("scontrol", "-d", "show", "job", job_id))


def test_a_pod_asking_for_a_gpu_gets_a_running_job_slurm_allocated_one(gpu_adapter: AdapterProcess) -> None:
    bed = gpu_adapter.bed
    with gpu_adapter.client() as client:
        made = client.post("/v1/reservations", json=_gpu("gpu-pod"))
        assert made.status_code == 201, made.text
    job_id = made.json()["id"].removeprefix("slurm-")
    row = next(row for row in bed.squeue() if row["id"] == job_id)
    assert (row["state"], row["nodes"]) == ("RUNNING", made.json()["node"])
    assert "TresPerNode=gres:gpu:1" in bed.run_client("scontrol", "show", "job", job_id)
    assert _gpus_allocated(bed, job_id) == ["gpu:1(IDX:0)"]


def test_a_pod_asking_for_more_gpus_than_a_node_has_is_refused_and_leaves_no_job(
    gpu_adapter: AdapterProcess,
) -> None:
    bed = gpu_adapter.bed
    with gpu_adapter.client() as client:
        refused = client.post("/v1/reservations", json=_gpu("two-gpus", 2))
        assert refused.status_code == 409, refused.text
        assert refused.json()["reason"] == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
        # An extended resource the adapter does not map is refused too, saying so, never dropped.
        fpga = client.post("/v1/reservations", json=_body("fpga", **{"example.com/fpga": "1"}))
        assert fpga.status_code == 409, fpga.text
        assert "2 Insufficient example.com/fpga (mapped to no Slurm GRES" in fpga.json()["reason"]
        assert bed.squeue() == []
        # The refusal was about the count: one GPU fits.
        one = client.post("/v1/reservations", json=_gpu("one-gpu"))
        assert one.status_code == 201, one.text


def test_gpus_are_not_overcommitted_the_third_pod_waits_in_slurms_queue(gpu_adapter: AdapterProcess) -> None:
    """2 nodes x 1 GPU, 3 one-GPU pods with CPUs to spare: two run, the third waits for a GPU."""
    bed = gpu_adapter.bed
    with gpu_adapter.client() as client:
        first = client.post("/v1/reservations", json=_gpu("gpu-a"))
        second = client.post("/v1/reservations", json=_gpu("gpu-b"))
        assert (first.status_code, second.status_code) == (201, 201), (first.text, second.text)
        assert {first.json()["node"], second.json()["node"]} == {"slurm-0", "slurm-1"}
        third = client.post("/v1/reservations", json=_gpu("gpu-c"))
        assert third.status_code == 409, third.text
        assert "PENDING: Resources" in third.json()["reason"], third.json()["reason"]
        running = [row for row in bed.squeue() if row["state"] == "RUNNING"]
        assert sorted(row["name"] for row in running) == ["bindery:ns/gpu-a", "bindery:ns/gpu-b"]
        for row in running:
            assert _gpus_allocated(bed, row["id"]) == ["gpu:1(IDX:0)"]
        # The first pod's reservation ends: its GPU goes to the pod that waited.
        released = client.delete(f"/v1/reservations/{first.json()['id']}", params={"podUid": "gpu-a"})
        assert released.status_code == 204

        def granted() -> dict[str, Any] | None:
            answer = client.post("/v1/reservations", json=_gpu("gpu-c"))
            return answer.json() if answer.status_code == 201 else None

        waited = _until(granted, 30, "the third GPU pod's reserve answered 201")
    assert waited["node"] == first.json()["node"]
    job_id = waited["id"].removeprefix("slurm-")
    assert _state(bed, job_id) == "RUNNING"
    assert _gpus_allocated(bed, job_id) == ["gpu:1(IDX:0)"]


def _gpu_group(name: str, count: int) -> dict[str, Any]:
    members = [
        {
            "pod": {
                "uid": f"{name}-{i}",
                "namespace": "ns",
                "name": f"{name}-{i}",
                "schedulerName": "slurm-gres",
            },
            "resources": {"cpu": "1", "memory": "64Mi", "nvidia.com/gpu": "1"},
        }
        for i in range(count)
    ]
    group = {"namespace": "ns", "name": name, "schedulerName": "slurm-gres"}
    return {"group": group, "members": members, "idempotencyKey": name, "ttlSeconds": 60}


def test_a_group_is_placed_by_free_gpus_all_or_nothing(gpu_adapter: AdapterProcess) -> None:
    """Groups never queue, so the adapter's own count of free GPUs decides: 3 one-GPU members do
    not fit 2 one-GPU nodes (refused before any job is submitted, though CPUs are plenty); 2 do."""
    bed = gpu_adapter.bed
    with gpu_adapter.client() as client:
        refused = client.post("/v1/reservation-groups", json=_gpu_group("gang3", 3))
        assert refused.status_code == 409, refused.text
        reason = refused.json()["reason"]
        assert "could place only 2 of them" in reason, reason
        assert "Insufficient nvidia.com/gpu" in reason, reason
        assert bed.squeue() == []
        placed = client.post("/v1/reservation-groups", json=_gpu_group("gang2", 2))
        assert placed.status_code == 201, placed.text
        assert sorted(m["node"] for m in placed.json()["members"]) == ["slurm-0", "slurm-1"]
    for row in bed.squeue():
        assert row["state"] == "RUNNING"
        assert _gpus_allocated(bed, row["id"]) == ["gpu:1(IDX:0)"]
