"""Reserve latency and throughput of the reference RM, measured through Bindery's real client.

Run:  .venv/bin/python benchmarks/rm_bench.py [--requests 2000] [--concurrency 32] [--nodes 50]

The RM runs as its own process (``python -m bindery.reference_rm.cli serve``, as in a deployment) on
loopback with a fresh SQLite file; this process drives ``--requests`` reserve calls from
``--concurrency`` concurrent clients (one ResourceManagerClient each) and prints latency
percentiles and throughput.  Every reservation is durable (SQLite synchronous=FULL) before the RM
answers, so the figures include an fsync per reserve.  ``--in-process`` runs the RM in this
process's event loop instead (no separate process; both compete for one core).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator

import yaml

from bindery.reference_rm import InventoryNode, serve_reference_rm
from bindery.reference_rm.cli import serve_command, served_url
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import PodIdentity, ReservationRequest

TOKEN = "benchmark-token"


def inventory(nodes: int) -> list[dict[str, object]]:
    return [
        {
            "name": f"node-{index:03d}",
            "labels": {"zone": f"z{index % 3}"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
        }
        for index in range(nodes)
    ]


@contextlib.asynccontextmanager
async def rm_process(workdir: pathlib.Path, nodes: int, policy: str) -> AsyncIterator[str]:
    inventory_file = workdir / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump({"nodes": inventory(nodes)}))
    token_file = workdir / "token"
    token_file.write_text(TOKEN)
    options = ["--inventory", str(inventory_file), "--policy", policy, "--log-level", "WARNING"]
    process = await asyncio.create_subprocess_exec(
        *serve_command(db=workdir / "rm.sqlite", token_file=token_file, options=options),
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        yield served_url(await asyncio.wait_for(process.stdout.readline(), timeout=60))
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


@contextlib.asynccontextmanager
async def rm_in_process(workdir: pathlib.Path, nodes: int, policy: str) -> AsyncIterator[str]:
    from bindery.reference_rm.inventory import parse_inventory
    from bindery.reference_rm.placement import Policy

    parsed: list[InventoryNode] = list(parse_inventory({"nodes": inventory(nodes)}))
    async with serve_reference_rm(
        db_path=workdir / "rm.sqlite", inventory=parsed, token=TOKEN, policy=Policy(policy), max_pending=10**6
    ) as server:
        yield server.url


def make_request(rng: random.Random, index: int) -> ReservationRequest:
    resources = {
        "cpu": rng.choice(["100m", "250m", "500m"]),
        "memory": rng.choice(["128Mi", "256Mi", "512Mi"]),
    }
    if rng.random() < 0.1:
        resources["nvidia.com/gpu"] = "1"
    uid = f"bench-{index}"
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="bench", name=uid, scheduler_name="bindery"),
        resources=resources,
        idempotency_key=uid,
        ttl_seconds=600,
    )


async def drive(
    url: str, requests: list[ReservationRequest], concurrency: int
) -> tuple[list[float], int, float]:
    queue: asyncio.Queue[ReservationRequest] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)
    latencies: list[float] = []
    unschedulable = 0

    async def worker() -> None:
        nonlocal unschedulable
        async with ResourceManagerClient(
            base_url=url, token=TOKEN, allow_insecure_http=True, read_timeout=30.0
        ) as client:
            while not queue.empty():
                request = queue.get_nowait()
                started = time.perf_counter()
                try:
                    await client.reserve(request)
                except RMUnschedulable:
                    unschedulable += 1
                latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, unschedulable, time.perf_counter() - started


def percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--policy", choices=["binpack", "spread"], default="binpack")
    parser.add_argument("--in-process", action="store_true", help="run the RM in this process")
    args = parser.parse_args()
    rng = random.Random(1)
    requests = [make_request(rng, index) for index in range(args.requests)]
    with tempfile.TemporaryDirectory(prefix="rm-bench-") as directory:
        server = rm_in_process if args.in_process else rm_process
        async with server(pathlib.Path(directory), args.nodes, args.policy) as url:
            # Warm up connections and code paths outside the measurement.
            await drive(
                url, [make_request(rng, 10**9 + i) for i in range(args.concurrency)], args.concurrency
            )
            latencies, unschedulable, elapsed = await drive(url, requests, args.concurrency)
    latencies.sort()
    ms = [value * 1000 for value in latencies]
    print(
        f"reference RM reserve ({'in-process' if args.in_process else 'separate process'}, "
        f"policy {args.policy}, {args.nodes} nodes, SQLite synchronous=FULL)"
    )
    print(
        f"  requests     {len(latencies)} from {args.concurrency} concurrent clients "
        f"({unschedulable} unschedulable)"
    )
    print(
        f"  latency ms   p50 {percentile(ms, 0.50):.2f}  p90 {percentile(ms, 0.90):.2f}  "
        f"p99 {percentile(ms, 0.99):.2f}  max {ms[-1]:.2f}  mean {statistics.fmean(ms):.2f}"
    )
    print(f"  throughput   {len(latencies) / elapsed:.0f} reserves/s over {elapsed:.2f}s")
    print(f"  machine      {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    asyncio.run(main())
