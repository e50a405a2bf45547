"""Reserve and commit latency and throughput of the reference RM, through Bindery's real client.

Run:  .venv/bin/python benchmarks/rm_bench.py [--requests 2000] [--concurrency 32] [--nodes 50]
      [--postgres REPLICAS]

The RM runs as its own process (``python -m bindery.reference_rm.cli serve``, as in a deployment) on
loopback with a fresh SQLite file; this process drives ``--requests`` reserve calls from
``--concurrency`` concurrent clients (one ResourceManagerClient each), then commits every placed
reservation the same way, and prints latency percentiles and throughput of each phase.  Every
reservation is durable (SQLite synchronous=FULL) before the RM answers, so the figures include an
fsync per reserve and per commit.  ``--in-process`` runs the RM in this
process's event loop instead (no separate process; both compete for one core).  ``--postgres N``
starts a PostgreSQL of its own (bindery.devcluster.postgres, fsync on) and N RM processes on one
database; with two or more, the clients reach them through a round-robin TCP proxy
(``python -m bindery.devcluster.rrproxy``, its own process, as a Service would spread connections).
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
    """N replicas on one database; their URL, or the round-robin proxy's in front of two or more."""
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
            if replicas > 1:
                urls = [await stack.enter_async_context(round_robin_process(urls))]
            yield urls
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def round_robin_process(upstreams: Sequence[str]) -> AsyncIterator[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bindery.devcluster.rrproxy", *upstreams, stdout=subprocess.PIPE
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
    urls: Sequence[str], requests: list[ReservationRequest], concurrency: int
) -> tuple[list[float], list[float], int, float, float]:
    """Reserve every request, then commit every placed reservation, each phase from `concurrency`
    clients; latencies of both phases, refusals, and each phase's wall time."""
    reserve_ms: list[float] = []
    commit_ms: list[float] = []
    placed: list[tuple[str, str]] = []
    unschedulable = 0
    clients = [
        ResourceManagerClient(
            base_url=urls[index % len(urls)], token=TOKEN, allow_insecure_http=True, read_timeout=30.0
        )
        for index in range(concurrency)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for rm in clients:
            await stack.enter_async_context(rm)
        reserving: asyncio.Queue[ReservationRequest] = asyncio.Queue()
        for request in requests:
            reserving.put_nowait(request)

        async def reserver(rm: ResourceManagerClient) -> None:
            nonlocal unschedulable
            while not reserving.empty():
                request = reserving.get_nowait()
                started = time.perf_counter()
                try:
                    reservation = await rm.reserve(request)
                    placed.append((reservation.id, request.pod.uid))
                except RMUnschedulable:
                    unschedulable += 1
                reserve_ms.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(reserver(rm) for rm in clients))
        reserve_seconds = time.perf_counter() - started
        committing: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        for item in placed:
            committing.put_nowait(item)

        async def committer(rm: ResourceManagerClient) -> None:
            while not committing.empty():
                reservation_id, uid = committing.get_nowait()
                started = time.perf_counter()
                await rm.commit(reservation_id, pod_uid=uid)
                commit_ms.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(committer(rm) for rm in clients))
        commit_seconds = time.perf_counter() - started
    return reserve_ms, commit_ms, unschedulable, reserve_seconds, commit_seconds


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
            reserves, commits, unschedulable, reserve_s, commit_s = await drive(
                urls, requests, args.concurrency
            )
    print(
        f"reference RM ({'in-process' if args.in_process else 'separate process'}, "
        f"policy {args.policy}, {args.nodes} nodes, "
        + (
            f"PostgreSQL fsync=on, {args.postgres} replica(s)"
            + (" behind a round-robin proxy)" if args.postgres > 1 else ")")
            if args.postgres
            else "SQLite synchronous=FULL)"
        )
    )
    print(
        f"  requests     {len(reserves)} from {args.concurrency} concurrent clients "
        f"({unschedulable} unschedulable)"
    )
    for phase, latencies, elapsed in (("reserve", reserves, reserve_s), ("commit", commits, commit_s)):
        ms = sorted(value * 1000 for value in latencies)
        print(
            f"  {phase:<8} ms  p50 {percentile(ms, 0.50):.2f}  p90 {percentile(ms, 0.90):.2f}  "
            f"p99 {percentile(ms, 0.99):.2f}  max {ms[-1]:.2f}  mean {statistics.fmean(ms):.2f}   "
            f"{len(ms) / elapsed:.0f} {phase}s/s over {elapsed:.2f}s"
        )
    print(f"  machine      {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    asyncio.run(main())
