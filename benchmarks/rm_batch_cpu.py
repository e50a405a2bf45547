"""The reference RM's CPU per reserve+commit pair: single calls against ``POST /v1/batch``.

Run:  .venv/bin/python benchmarks/rm_batch_cpu.py [--pairs 2000] [--nodes 500] [--batch-sizes 16 64]

For each mode a fresh reference RM runs as its own process (``bindery rm serve``, SQLite with
``synchronous=FULL``) with an inventory of ``--nodes`` nodes; this process drives ``--pairs`` pods
through reserve then commit, and reads the RM's CPU (utime + stime from ``/proc/PID/stat``) before
and after.  Modes:

* ``singles``: ``--concurrency`` workers, each pod one ``POST /v1/reservations`` then one
  ``POST /v1/reservations/{id}/commit`` (what Bindery sends without batches);
* ``batch N``: ``--streams`` concurrent streams, each sending N reserves as one batch, then the N
  commits of what it got as another (two RM round trips and two transactions per N pods).

``--rules`` gives every reserve what Bindery sends for ceiling.py's ``--shape rules`` pods (a hard
zone spread and a hostname anti-affinity over the pod's group, groups of half the nodes): one
node term, ``kubernetes.io/hostname NotIn`` the group's nodes so far (split at 256 values) and
``topology.kubernetes.io/zone In`` its least used zones, updated from each answer.

It prints figures and asserts nothing.  Requests go through a bare aiohttp session, so the driver's
own CPU stays small; the RM's CPU is what is measured.  Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import yaml

from bindery.reference_rm.cli import serve_command, served_url

TOKEN = "benchmark-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TICKS = os.sysconf("SC_CLK_TCK")


def inventory(nodes: int, pods: int) -> list[dict[str, object]]:
    """``nodes`` nodes with room for ``pods`` pods in all (at least 110 each, as kubelet's default)."""
    per_node = max(110, -(-pods // nodes))
    return [
        {
            "name": f"node-{index:04d}",
            "labels": {
                "zone": f"z{index % 3}",
                "kubernetes.io/hostname": f"node-{index:04d}",
                "topology.kubernetes.io/zone": f"zone-{index % 3}",
            },
            "allocatable": {"cpu": str(per_node), "memory": f"{per_node}Gi", "pods": str(per_node)},
        }
        for index in range(nodes)
    ]


class Rules:
    """The node requirements of ceiling.py's rules pods, as Bindery sends them, kept up to date."""

    def __init__(self, groups: int) -> None:
        self.groups = groups
        self.taken: dict[int, list[str]] = {}
        self.zones: dict[int, dict[str, int]] = {}

    def group(self, uid: str) -> int:
        return int(uid.rsplit("-", 1)[1]) % self.groups

    def placement(self, uid: str) -> dict[str, Any]:
        group = self.group(uid)
        names = sorted(self.taken.get(group, []))
        counts = self.zones.setdefault(group, {f"zone-{z}": 0 for z in range(3)})
        low = min(counts.values())
        expressions: list[dict[str, Any]] = [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": names[i : i + 256]}
            for i in range(0, len(names), 256)
        ]
        zones = sorted(zone for zone, count in counts.items() if count <= low)
        expressions.append({"key": "topology.kubernetes.io/zone", "operator": "In", "values": zones})
        return {"requiredNodeAffinity": [{"matchExpressions": expressions}]}

    def placed(self, uid: str, node: str) -> None:
        group = self.group(uid)
        self.taken.setdefault(group, []).append(node)
        self.zones[group][f"zone-{int(node.rsplit('-', 1)[1]) % 3}"] += 1


RULES: list[Rules] = []  # one when --rules


def placed(uid: str, reservation: dict[str, Any]) -> None:
    if RULES:
        RULES[0].placed(uid, reservation["node"])


def reserve_body(uid: str) -> dict[str, Any]:
    extra = {"placement": RULES[0].placement(uid)} if RULES else {}
    return {
        **extra,
        "pod": {
            "uid": uid,
            "namespace": "bench",
            "name": f"pod-{uid}",
            "schedulerName": "bindery",
            "labels": {"app": "bench"},
        },
        "resources": {"cpu": "100m", "memory": "128Mi"},
        "idempotencyKey": uid,
        "ttlSeconds": 300,
    }


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15 of stat)


@asynccontextmanager
async def rm_process(
    workdir: pathlib.Path, nodes: int, pods: int, log_level: str
) -> AsyncIterator[tuple[str, int]]:
    inventory_file = workdir / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump({"nodes": inventory(nodes, pods)}))
    token_file = workdir / "token"
    token_file.write_text(TOKEN)
    options = ["--inventory", str(inventory_file), "--log-level", log_level]
    process = await asyncio.create_subprocess_exec(
        *serve_command(db=workdir / "rm.sqlite", token_file=token_file, options=options),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        url = served_url(await asyncio.wait_for(process.stdout.readline(), timeout=60))
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


async def singles(http: aiohttp.ClientSession, url: str, uids: list[str], concurrency: int) -> int:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for uid in uids:
        queue.put_nowait(uid)
    done = 0

    async def worker() -> None:
        nonlocal done
        while not queue.empty():
            uid = queue.get_nowait()
            async with http.post(f"{url}/v1/reservations", json=reserve_body(uid), headers=AUTH) as response:
                assert response.status == 201, await response.text()
                reservation = await response.json()
            placed(uid, reservation)
            commit = f"{url}/v1/reservations/{reservation['id']}/commit"
            async with http.post(commit, params={"podUid": uid}, headers=AUTH) as response:
                assert response.status == 200, await response.text()
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


async def batches(http: aiohttp.ClientSession, url: str, uids: list[str], size: int, streams: int) -> int:
    chunks = [uids[start : start + size] for start in range(0, len(uids), size)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)
    done = 0

    async def send(operations: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async with http.post(f"{url}/v1/batch", json={"operations": operations}, headers=AUTH) as response:
            assert response.status == 200, await response.text()
            results: list[dict[str, Any]] = (await response.json(loads=json.loads))["results"]
            return results

    async def stream() -> None:
        nonlocal done
        while not queue.empty():
            chunk = queue.get_nowait()
            reserved = await send([{"reserve": reserve_body(uid)} for uid in chunk])
            assert all(result["status"] == 201 for result in reserved), reserved[:2]
            for result, uid in zip(reserved, chunk, strict=True):
                placed(uid, result["reservation"])
            commits = [
                {"commit": {"reservationId": result["reservation"]["id"], "podUid": uid}}
                for result, uid in zip(reserved, chunk, strict=True)
            ]
            committed = await send(commits)
            assert all(result["status"] == 200 for result in committed), committed[:2]
            done += len(chunk)

    await asyncio.gather(*(stream() for _ in range(streams)))
    return done


Mode = Callable[[aiohttp.ClientSession, str, list[str]], Awaitable[int]]


async def measure(name: str, mode: Mode, args: argparse.Namespace) -> dict[str, float | str]:
    with tempfile.TemporaryDirectory(prefix="rm-batch-cpu-") as directory:
        async with (
            rm_process(pathlib.Path(directory), args.nodes, args.pairs + args.warmup, args.log_level) as (
                url,
                pid,
            ),
            aiohttp.ClientSession() as http,
        ):
            await mode(http, url, [f"warm-{i}" for i in range(args.warmup)])
            uids = [f"{name.replace(' ', '')}-{i}" for i in range(args.pairs)]
            cpu_before, wall_before = cpu_seconds(pid), time.perf_counter()
            pairs = await mode(http, url, uids)
            cpu, wall = cpu_seconds(pid) - cpu_before, time.perf_counter() - wall_before
    return {
        "mode": name,
        "pairs": pairs,
        "rm_cpu_ms_per_pair": 1000 * cpu / pairs,
        "pairs_per_s": pairs / wall,
        "rm_cpu_s": cpu,
        "wall_s": wall,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2000, help="pods reserved and committed per mode")
    parser.add_argument("--nodes", type=int, default=500, help="inventory nodes of the RM")
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[16, 64])
    parser.add_argument("--concurrency", type=int, default=16, help="workers for single calls")
    parser.add_argument("--streams", type=int, default=2, help="concurrent streams of batches")
    parser.add_argument("--warmup", type=int, default=64, help="pairs before measuring, per mode")
    parser.add_argument("--log-level", default="INFO", help="the RM's (INFO logs a line per operation)")
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    parser.add_argument("--rules", action="store_true", help="every pod's zone spread and anti-affinity")
    args = parser.parse_args()

    def single_mode(http: aiohttp.ClientSession, url: str, uids: list[str]) -> Awaitable[int]:
        return singles(http, url, uids, args.concurrency)

    def batch_mode(size: int) -> Mode:
        return lambda http, url, uids: batches(http, url, uids, size, args.streams)

    modes: list[tuple[str, Mode]] = [("singles", single_mode)]
    modes += [(f"batch {size}", batch_mode(size)) for size in args.batch_sizes]
    rows = []
    for name, mode in modes:
        RULES.clear()
        if args.rules:
            RULES.append(Rules(max(1, -(-(args.pairs + args.warmup) // max(1, args.nodes // 2)))))
        rows.append(await measure(name, mode, args))
    base = float(rows[0]["rm_cpu_ms_per_pair"])
    print(
        f"reference RM, {args.nodes} nodes, {args.pairs} reserve+commit pairs per mode, log level "
        f"{args.log_level} (singles: {args.concurrency} workers; batches: {args.streams} streams)"
    )
    print(
        f"{'mode':10} {'RM CPU ms/pair':>15} {'vs singles':>11} {'pairs/s':>9} {'RM CPU s':>9} {'wall s':>7}"
    )
    for row in rows:
        per_pair = float(row["rm_cpu_ms_per_pair"])
        print(
            f"{row['mode']:10} {per_pair:15.3f} {base / per_pair:10.2f}x "
            f"{row['pairs_per_s']:9.0f} {row['rm_cpu_s']:9.2f} {row['wall_s']:7.2f}"
        )
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    asyncio.run(main())
