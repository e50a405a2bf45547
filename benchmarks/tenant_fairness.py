"""Namespace B's time to bind while namespace A has N pods that never fit (issue 20, scenario 3).

Run:  .venv/bin/python benchmarks/tenant_fairness.py [--backlogs 0,1000,5000,10000] [--probes 5]
      [--nodes 4] [--max-in-flight 256] [--share N] [--within 120] [--out tenant-fairness.json]

The launcher and helpers of ``ceiling.py``: one dev control plane, ``--nodes`` Nodes of 64 CPU,
and Bindery as deployed (the reference RM with ``--mirror-nodes`` and ``bindery run``, each its own
process), serving one scheduler name for the whole run. For each backlog N:

1. N pods of namespace A asking for 1000 CPUs (no node has that many: the RM refuses every one);
2. **right after**: one pod of namespace B created as soon as the last pod of A was, while A's
   pods are still being tried for the first time: its time to bind (create sent → bind seen by a
   watch);
3. **after A's first pass**: once every pod of A has its FailedScheduling event (each was tried;
   Bindery parks them now, it retried them on a 1-10 s timer before), ``--probes`` pods of B one
   after the other: their times to bind (median and max);
4. the pods are deleted before the next N (not after the last: the plane goes with them).

``--share N`` sets the ResourceManager's ``maxInFlightPerNamespace`` (unset by default).

Flat is the goal: B's time to bind should not depend on how many pods of A wait. A figure, never a
test: nothing here asserts a time. A probe not bound within ``--within`` seconds is shown as such.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

import ceiling as bench

SCHEDULER = "bindery-fair"
UNFIT_CPU = "1000"  # more than any node's 64 CPUs


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlogs", default="0,1000,5000,10000", help="pods of A, comma-separated")
    parser.add_argument("--probes", type=int, default=5, help="pods of namespace B timed once A is parked")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--max-in-flight", type=int, default=256, help="the ResourceManager's maxInFlight")
    parser.add_argument("--share", type=int, default=None, help="spec.maxInFlightPerNamespace (unset)")
    parser.add_argument("--within", type=float, default=120.0, help="seconds a probe may take to bind")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    args.backlogs = [int(n) for n in str(args.backlogs).split(",") if n.strip()]
    return args


async def time_to_bind(api: bench.Api, *, namespace: str, name: str, within: float) -> float | None:
    """Create one pod of the served name; seconds from its create to its bind seen, None if not bound."""
    watch = bench.BindWatch(api, namespace=namespace, on_first=lambda: None)
    await watch.start()
    try:
        sent = time.time()
        body = bench.pod_body(name=name, scheduler_name=SCHEDULER, index=0)
        await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        deadline = time.monotonic() + within
        while name not in watch.bound_at:  # this pod: an earlier probe of B may bind meanwhile
            if time.monotonic() > deadline:
                return None
            await watch.wait(len(watch.bound_at) + 1, within=min(1.0, max(deadline - time.monotonic(), 0.0)))
        return watch.bound_at[name] - sent
    finally:
        await watch.stop()


async def merge_patch(api: bench.Api, path: str, body: dict[str, Any]) -> None:
    assert api.session is not None
    headers = {"Content-Type": "application/merge-patch+json"}
    async with api.session.patch(api.server + path, data=json.dumps(body), headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"PATCH {path} answered HTTP {response.status}: {await response.text()}")


def shown(seconds: float | None, within: float) -> str:
    return f"{seconds:.2f}" if seconds is not None else f"> {within:g} (not bound)"


async def delete_all(api: bench.Api, *, namespace: str) -> None:
    """ceiling.py's collection delete; a client timeout (10,000 pods outlast its 120 s) is retried."""
    for _ in range(5):
        try:
            await bench.delete_pods(api, namespace=namespace)
            return
        except TimeoutError:
            continue


async def one_backlog(
    api: bench.Api, *, count: int, args: argparse.Namespace, clean_up: bool
) -> dict[str, Any]:
    tenant_a, tenant_b = f"tenant-a-{count}", f"tenant-b-{count}"
    await bench.create_namespace(api, tenant_a)
    await bench.create_namespace(api, tenant_b)
    bodies = [
        bench.pod_body(name=f"a-{i:05d}", scheduler_name=SCHEDULER, index=i, cpu=UNFIT_CPU)
        for i in range(count)
    ]
    created = await bench.create_pods(api, namespace=tenant_a, bodies=bodies)
    right_after = await time_to_bind(api, namespace=tenant_b, name="b-right-after", within=args.within)
    bench.say(
        f"  A={count}: {count} pods of A created in {created:.1f}s; B right after: "
        f"{shown(right_after, args.within)} s"
    )
    tried = await bench.pending_attempted(api, namespace=tenant_a, count=count, within=120 + count / 20)
    parked: list[float | None] = []
    for probe in range(args.probes):
        parked.append(await time_to_bind(api, namespace=tenant_b, name=f"b-{probe}", within=args.within))
    bound = [t for t in parked if t is not None]
    median = statistics.median(bound) if bound else None
    worst = max(bound) if bound else None
    bench.say(
        f"  A={count}: {tried}/{count} of A tried; B after A's first pass: "
        f"median {shown(median, args.within)} s, "
        f"max {shown(worst, args.within)} s, {len(bound)}/{args.probes} bound"
    )
    if clean_up:
        await delete_all(api, namespace=tenant_a)
        await delete_all(api, namespace=tenant_b)
    return {
        "backlog": count,
        "create_seconds": created,
        "a_tried": tried,
        "b_right_after_seconds": right_after,
        "b_parked_seconds": parked,
        "b_parked_median": median,
        "b_parked_max": worst,
    }


async def run(args: argparse.Namespace, plane: Any, workdir: pathlib.Path) -> list[dict[str, Any]]:
    async with bench.Api(plane.kubeconfig) as api:
        await bench.make_nodes(api, count=args.nodes, kwok=False)
        await bench.install_bindery(plane)
        await bench.create_namespace(api, "bindery-system")
        serving_plane = bench.Plane(plane, workdir, api)
        rows: list[dict[str, Any]] = []
        async with serving_plane.bindery(SCHEDULER, max_in_flight=args.max_in_flight):
            if args.share is not None:  # ceiling.py's ResourceManager is named "reference"
                await merge_patch(
                    api,
                    "/apis/bindery.dev/v1alpha1/resourcemanagers/reference",
                    {"spec": {"maxInFlightPerNamespace": args.share}},
                )
            await bench.create_namespace(api, "warm-up")
            warm = await time_to_bind(api, namespace="warm-up", name="warm-up", within=120)
            bench.say(f"Bindery serving (warm-up pod bound in {shown(warm, 120)} s)")
            for number, count in enumerate(args.backlogs, 1):
                row = await one_backlog(api, count=count, args=args, clean_up=number < len(args.backlogs))
                rows.append(row)
                if args.out is not None:  # after each backlog: a failure later keeps the figures
                    args.out.write_text(json.dumps(rows, indent=2))
        return rows


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    bench.say(f"\n== namespace B's time to bind (s), {args.nodes} nodes, {os.cpu_count()} CPUs ==")
    bench.say(
        "| pods of A (never fit) | B right after A's pods were created "
        "| B after A's first pass: median | max |"
    )
    bench.say("|---:|---:|---:|---:|")
    for row in rows:
        bench.say(
            f"| {row['backlog']} | {shown(row['b_right_after_seconds'], args.within)} "
            f"| {shown(row['b_parked_median'], args.within)} | {shown(row['b_parked_max'], args.within)} |"
        )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from bindery.devcluster.plane import ControlPlane

    bench.say(f"starting etcd + kube-apiserver on 127.0.0.1 ({os.cpu_count()} CPUs) ...")
    with tempfile.TemporaryDirectory(prefix="tenant-fairness-") as directory, ControlPlane.start() as plane:
        rows = asyncio.run(run(args, plane, pathlib.Path(directory)))
    table(rows, args)
    return 0 if all(r["b_right_after_seconds"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
