"""Reserve latency and throughput of the reference RM, measured through Bindery's real client.

Run:  .venv/bin/python benchmarks/rm_bench.py [--requests 2000] [--concurrency 32] [--nodes 50]
      [--postgres REPLICAS]

The RM runs as its own process (``python -m bindery.reference_rm.cli serve``, as in a deployment) on
loopback with a fresh SQLite file; this process drives ``--requests`` reserve calls from
``--concurrency`` concurrent clients (one ResourceManagerClient each) and prints latency
percentiles and throughput.  Every reservation is durable (SQLite synchronous=FULL) before the RM
answers, so the figures include an fsync per reserve.  ``--in-process`` runs the RM in this
process's event loop instead (no separate process; both compete for one core).  ``--postgres N``
starts a PostgreSQL of its own (bindery.devcluster.postgres, fsync on) and N RM processes on one
database; the clients are spread over the replicas round robin.
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
from collections.abc import AsyncIterator, Sequence

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
async def rm_process(
    workdir: pathlib.Path, nodes: int, policy: str, *, db: str | None = None, extra: Sequence[str] = ()
) -> AsyncIterator[str]:
    inventory_file = workdir / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump({"nodes": inventory(nodes)}))
    token_file = workdir / "token"
    token_file.write_text(TOKEN)
    options = ["--inventory", str(inventory_file), "--policy", policy, "--log-level", "WARNING", *extra]
    process = await asyncio.create_subprocess_exec(
        *serve_command(db=db or workdir / "rm.sqlite", token_file=token_file, options=options),
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        yield served_url(await asyncio.wait_for(process.stdout.readline(), timeout=60))
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


@contextlib.asynccontextmanager
async def rm_replicas_on_postgres(
    workdir: pathlib.Path, nodes: int, policy: str, replicas: int
) -> AsyncIterator[list[str]]:
    from bindery.devcluster.postgres import PostgresServer

    server = PostgresServer.start(durable=True)
    try:
        db = server.create_database("bench")
        extra = ["--db-password-file", str(server.password_file)]
        async with contextlib.AsyncExitStack() as stack:
            urls = [
                await stack.enter_async_context(rm_process(workdir, nodes, policy, db=db, extra=extra))
                for _ in range(replicas)
            ]
            yield urls
    finally:
        server.stop()


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
    urls: Sequence[str], requests: list[ReservationRequest], concurrency: int
) -> tuple[list[float], int, float]:
    queue: asyncio.Queue[ReservationRequest] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)
    latencies: list[float] = []
    unschedulable = 0

    async def worker(index: int) -> None:
        nonlocal unschedulable
        async with ResourceManagerClient(
            base_url=urls[index % len(urls)], token=TOKEN, allow_insecure_http=True, read_timeout=30.0
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
    await asyncio.gather(*(worker(index) for index in range(concurrency)))
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
    parser.add_argument(
        "--postgres", type=int, default=0, metavar="REPLICAS", help="this many RM processes on one PostgreSQL"
    )
    args = parser.parse_args()
    rng = random.Random(1)
    requests = [make_request(rng, index) for index in range(args.requests)]
    with tempfile.TemporaryDirectory(prefix="rm-bench-") as directory:
        workdir = pathlib.Path(directory)
        async with contextlib.AsyncExitStack() as stack:
            if args.postgres:
                urls = await stack.enter_async_context(
                    rm_replicas_on_postgres(workdir, args.nodes, args.policy, args.postgres)
                )
            else:
                server = rm_in_process if args.in_process else rm_process
                urls = [await stack.enter_async_context(server(workdir, args.nodes, args.policy))]
            # Warm up connections and code paths outside the measurement.
            await drive(
                urls, [make_request(rng, 10**9 + i) for i in range(args.concurrency)], args.concurrency
            )
            latencies, unschedulable, elapsed = await drive(urls, requests, args.concurrency)
    latencies.sort()
    ms = [value * 1000 for value in latencies]
    print(
        f"reference RM reserve ({'in-process' if args.in_process else 'separate process'}, "
        f"policy {args.policy}, {args.nodes} nodes, "
        + (
            f"PostgreSQL fsync=on, {args.postgres} replica(s))"
            if args.postgres
            else "SQLite synchronous=FULL)"
        )
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
