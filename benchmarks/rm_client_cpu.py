"""CPU that Bindery's process spends per RM call, by HTTP client library.

Run:  .venv/bin/python benchmarks/rm_client_cpu.py [--requests 1000] [--concurrency 16]

bind_throughput.py's profile shows the operator thread spending most of its CPU inside httpx /
httpcore on the two RM calls of every cycle (reserve and commit), while its two apiserver writes
go through kubernetes_asyncio's aiohttp and cost far less. This isolates that: the reference RM
runs as its own process on loopback (as in rm_bench.py), and this process sends the same
``POST /v1/reservations`` bodies at the same concurrency three ways, measuring its own CPU time
(``time.process_time``, so the RM's work is not counted) per call:

* ``ResourceManagerClient`` — Bindery's client (httpx's API sending through aiohttp, see
  ``bindery.rm.transport``, plus validation, retries, breaker);
* a bare ``httpx.AsyncClient`` — the same library with nothing of Bindery's around it;
* a bare ``aiohttp.ClientSession`` — the library kubernetes_asyncio (and Kopf) already use.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
from rm_bench import TOKEN, make_request, rm_process  # benchmarks/ is sys.path[0] when run as a script

from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import ReservationRequest

Send = Callable[[ReservationRequest], Awaitable[None]]


async def drive(send: Send, requests: list[ReservationRequest], concurrency: int) -> tuple[float, float]:
    """Returns (client CPU seconds, wall seconds) for all requests."""
    queue: asyncio.Queue[ReservationRequest] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)

    async def worker() -> None:
        while not queue.empty():
            await send(queue.get_nowait())

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - cpu, time.perf_counter() - wall


def body(request: ReservationRequest) -> bytes:
    return json.dumps(request.model_dump(mode="json", by_alias=True, exclude_none=True)).encode()


async def with_bindery_client(
    url: str, requests: list[ReservationRequest], concurrency: int
) -> tuple[float, float]:
    async with ResourceManagerClient(base_url=url, token=TOKEN, allow_insecure_http=True) as rm:

        async def send(request: ReservationRequest) -> None:
            with contextlib.suppress(RMUnschedulable):
                await rm.reserve(request)

        return await drive(send, requests, concurrency)


HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


async def with_httpx(url: str, requests: list[ReservationRequest], concurrency: int) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=url, headers=HEADERS) as http:

        async def send(request: ReservationRequest) -> None:
            response = await http.post("/v1/reservations", content=body(request))
            if response.status_code not in (200, 201):
                raise RuntimeError(f"reserve answered {response.status_code}: {response.text}")
            json.loads(response.content)

        return await drive(send, requests, concurrency)


async def with_aiohttp(url: str, requests: list[ReservationRequest], concurrency: int) -> tuple[float, float]:
    async with aiohttp.ClientSession(base_url=url, headers=HEADERS) as http:

        async def send(request: ReservationRequest) -> None:
            async with http.post("/v1/reservations", data=body(request)) as response:
                payload = await response.read()
                if response.status not in (200, 201):
                    raise RuntimeError(f"reserve answered {response.status}: {payload!r}")
                json.loads(payload)

        return await drive(send, requests, concurrency)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="reserve calls per client (default 1000)")
    parser.add_argument("--concurrency", type=int, default=16, help="as Bindery's maxInFlight (default 16)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, medians printed (default 3)")
    args = parser.parse_args()
    rng = random.Random(1)
    clients = {
        "ResourceManagerClient (httpx over aiohttp)": with_bindery_client,
        "bare httpx.AsyncClient": with_httpx,
        "bare aiohttp.ClientSession": with_aiohttp,
    }
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
    serial = 0
    with tempfile.TemporaryDirectory(prefix="rm-client-cpu-") as directory:
        # Enough room that every reserve succeeds: 200 nodes of 64 CPUs.
        async with rm_process(pathlib.Path(directory), 200, "spread") as url:
            for _ in range(args.repeat):
                for name, run in clients.items():
                    warm = [make_request(rng, 10**9 + serial + i) for i in range(args.concurrency)]
                    serial += args.concurrency
                    await run(url, warm, args.concurrency)
                    batch = [make_request(rng, serial + i) for i in range(args.requests)]
                    serial += args.requests
                    figures[name].append(await run(url, batch, args.concurrency))
    print(
        f"reserve calls to the reference RM (own process, loopback http), {args.requests} per round, "
        f"concurrency {args.concurrency}, medians of {args.repeat} rounds"
    )
    print("| client | client CPU ms per call | calls/s |\n|---|---:|---:|")
    for name, runs in figures.items():
        cpu = statistics.median(c for c, _ in runs) * 1000 / args.requests
        rate = statistics.median(args.requests / w for _, w in runs)
        print(f"| {name} | {cpu:.2f} | {rate:.0f} |")
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    asyncio.run(main())
