"""The RM client's CPU per pod with and without batching, and how many batches in flight.

Run:  .venv/bin/python benchmarks/rm_client_batch_cpu.py [--pods 2000] [--concurrency 16] [--bind-ms 3]

Each simulated cycle makes the two RM calls of a scheduled pod (reserve, then commit) with
``--bind-ms`` of waiting between them (the Binding and the event POSTs), ``--concurrency`` cycles at
once (as Bindery's maxInFlight). The reference RM runs as its own process on loopback (as in
rm_bench.py), so ``time.process_time`` here is the client's CPU alone. Variants: batching off
(every call alone, as with a v1.0 RM) and ``batches_in_flight`` 1, 2 and 4; for each, the client's
CPU per pod, pods/s, and HTTP requests per pod (2.0 = no batching at all).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from rm_bench import TOKEN, make_request, rm_process  # benchmarks/ is sys.path[0] when run as a script

from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import ReservationRequest

VARIANTS: dict[str, dict[str, Any]] = {
    "batching off": {"batching": False},
    "1 batch in flight": {"batches_in_flight": 1},
    "2 batches in flight": {"batches_in_flight": 2},
    "4 batches in flight": {"batches_in_flight": 4},
}


async def run(
    url: str, requests: list[ReservationRequest], *, concurrency: int, bind_ms: float, options: dict[str, Any]
) -> tuple[float, float, float]:
    """(client CPU ms per pod, pods/s, HTTP requests per pod)."""
    async with ResourceManagerClient(base_url=url, token=TOKEN, allow_insecure_http=True, **options) as rm:
        sent = 0
        call = rm._call

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal sent
            sent += 1
            return await call(*args, **kwargs)

        rm._call = counted  # type: ignore[method-assign]
        queue: asyncio.Queue[ReservationRequest] = asyncio.Queue()
        for request in requests:
            queue.put_nowait(request)

        async def cycle() -> None:
            while not queue.empty():
                request = queue.get_nowait()
                try:
                    reservation = await rm.reserve(request)
                except RMUnschedulable:
                    continue
                await asyncio.sleep(bind_ms / 1000)
                await rm.commit(reservation.id, pod_uid=request.pod.uid)

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(cycle() for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu * 1000 / len(requests), len(requests) / wall, sent / len(requests)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000, help="simulated cycles per round (default 2000)")
    parser.add_argument("--concurrency", type=int, default=16, help="as Bindery's maxInFlight (default 16)")
    parser.add_argument("--bind-ms", type=float, default=3.0, help="wait between reserve and commit (ms)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, medians printed (default 3)")
    args = parser.parse_args()
    rng = random.Random(1)
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in VARIANTS}
    serial = 0
    with tempfile.TemporaryDirectory(prefix="rm-batch-cpu-") as directory:
        async with rm_process(pathlib.Path(directory), 500, "spread") as url:
            for _ in range(args.repeat):
                for name, options in VARIANTS.items():
                    requests = [make_request(rng, serial + i) for i in range(args.pods)]
                    serial += args.pods
                    figures[name].append(
                        await run(
                            url, requests, concurrency=args.concurrency, bind_ms=args.bind_ms, options=options
                        )
                    )
    print(
        f"reserve + commit per pod against the reference RM (own process, loopback http), {args.pods} pods "
        f"per round, {args.concurrency} cycles at once, {args.bind_ms:g} ms between the calls, medians of "
        f"{args.repeat} rounds"
    )
    print("| client | client CPU ms per pod | pods/s | HTTP requests per pod |\n|---|---:|---:|---:|")
    for name, runs in figures.items():
        cpu = statistics.median(c for c, _, _ in runs)
        rate = statistics.median(r for _, r, _ in runs)
        per_pod = statistics.median(s for _, _, s in runs)
        print(f"| {name} | {cpu:.2f} | {rate:.0f} | {per_pod:.2f} |")
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    asyncio.run(main())
