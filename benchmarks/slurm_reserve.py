"""Reserve latency through Slurm against the reference RM, for the same pods (issue 23).

Starts a Slurm bed (bindery.devcluster.slurm; root, Debian's packages), `bindery rm slurm` in front
of it and `bindery rm serve --inventory` with the same two nodes, then for each RM reserves and
commits PODS one-CPU pods one after another and releases them. Prints the median and the slowest
reserve (request to answer, as Bindery's client sees it) and the total. Figures only: the
machine is shared, nothing is asserted.

    .venv/bin/python benchmarks/slurm_reserve.py [--pods 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import httpx
import yaml

from bindery.devcluster.slurm import SlurmBed, SlurmNode, ensure_slurm
from bindery.reference_rm.cli import serve_command, served_url
from bindery.slurm_rm.cli import BANNER

NODES = (SlurmNode("bench-0", cpus=4, memory_mib=8192), SlurmNode("bench-1", cpus=4, memory_mib=8192))


def _body(uid: str) -> dict[str, object]:
    return {
        "pod": {"uid": uid, "namespace": "bench", "name": uid, "schedulerName": "bench"},
        "resources": {"cpu": "1", "memory": "64Mi"},
        "idempotencyKey": uid,
        "ttlSeconds": 60,
    }


def _round(url: str, token: str, pods: int) -> tuple[list[float], float]:
    latencies = []
    ids = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        start = time.perf_counter()
        for _ in range(pods):
            t0 = time.perf_counter()
            answer = client.post("/v1/reservations", json=_body(uuid.uuid4().hex))
            latencies.append(time.perf_counter() - t0)
            if answer.status_code != 201:
                raise SystemExit(f"reserve answered {answer.status_code}: {answer.text}")
            ids.append(answer.json()["id"])
            client.post(f"/v1/reservations/{ids[-1]}/commit").raise_for_status()
        total = time.perf_counter() - start
        for reservation_id in ids:
            client.delete(f"/v1/reservations/{reservation_id}").raise_for_status()
    return latencies, total


def _start(argv: list[str], banner_prefix: str) -> tuple[subprocess.Popen[bytes], str]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.decode().startswith(banner_prefix):
        raise SystemExit(f"{argv[2]} did not start: {line!r}")
    return process, served_url(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=8, help="pods per round (the two nodes hold 8)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="slurm-bench-"))
    token = uuid.uuid4().hex
    (work / "token").write_text(token)
    inventory = {
        "nodes": [
            {
                "name": n.name,
                "allocatable": {"cpu": str(n.cpus), "memory": f"{n.memory_mib}Mi", "pods": "110"},
            }
            for n in NODES
        ]
    }
    (work / "inventory.yaml").write_text(yaml.safe_dump(inventory))
    bed = SlurmBed(work / "slurm", NODES, root=ensure_slurm())
    bed.start()
    processes = []
    try:
        node_map = ",".join(f"{n.name}={n.name}" for n in NODES)
        slurm_rm, slurm_url = _start(
            [sys.executable, "-m", "bindery.slurm_rm.cli", "--slurmrestd", bed.url, "--node-map", node_map,
             "--listen", "127.0.0.1:0", "--token-file", str(work / "token")],
            BANNER,
        )  # fmt: skip
        processes.append(slurm_rm)
        reference, reference_url = _start(
            serve_command(
                db=work / "rm.db",
                token_file=work / "token",
                options=["--inventory", str(work / "inventory.yaml")],
            ),
            "reference RM",
        )
        processes.append(reference)
        print(f"{args.pods} pods x {args.rounds} rounds, reserve + commit one after another, then release")
        for name, url in (("reference RM", reference_url), ("Slurm adapter", slurm_url)):
            for number in range(args.rounds):
                latencies, total = _round(url, token, args.pods)
                median, slowest = statistics.median(latencies) * 1000, max(latencies) * 1000
                print(
                    f"{name:14} round {number + 1}: reserve median {median:7.1f} ms,"
                    f" slowest {slowest:7.1f} ms; {args.pods} pods reserved+committed in {total:6.2f} s"
                )
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
        bed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
