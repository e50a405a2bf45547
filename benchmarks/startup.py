"""Start → first bind at size: many Nodes, bound pods, pending pods, Bindery and kube-scheduler.

Run:  .venv/bin/python benchmarks/startup.py [--nodes 5000] [--bound 10000] [--pending 5000] [--rounds 3]

One dev control plane and the ceiling benchmark's launcher (benchmarks/ceiling.py `Plane`): the
reference RM (``bindery rm serve --mirror-nodes``) and the operator (``bindery run``) as their own
processes, as deployed. ``--nodes`` plain Nodes, ``--bound`` pods of another scheduler already
bound to them (``spec.nodeName`` set at creation: what the operator's and the RM's initial lists
of pods on nodes read), and ``--pending`` pods of Bindery's scheduler name waiting. Each round
starts Bindery afresh and reports:

- start → first bind: from launching the RM (the operator follows once the RM serves);
- operator → first bind: from launching the operator, the RM serving;

then stops it, deletes the pods it bound and creates them again pending. Bindery's bytecode is
compiled first, as the image's install does (a checkout run with ``PYTHONDONTWRITEBYTECODE=1``
would compile each module again in every process). kube-scheduler (client
QPS 5000) gets the same rounds on pods of its own (``--kube-rounds``; 0 skips it): its start
includes its informers' lists of the same Nodes and pods. Medians and worst of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import ceiling  # the launcher and helpers of benchmarks/ceiling.py


async def _bound_pods(api: ceiling.Api, *, count: int, nodes: list[str]) -> float:
    await ceiling.create_namespace(api, "bound")
    bodies = [
        ceiling.pod_body(name=f"b-{i:06d}", scheduler_name="elsewhere", index=i, node=nodes[i % len(nodes)])
        for i in range(count)
    ]
    return await ceiling.create_pods(api, namespace="bound", bodies=bodies)


async def _round(
    api: ceiling.Api,
    *,
    start: ceiling.Starter,
    scheduler_name: str,
    namespace: str,
    pending: int,
    within: float,
) -> tuple[float, float]:
    """(launch → first bind, serving → first bind) of one round; the round's pods deleted after."""
    await ceiling.create_namespace(api, namespace)
    bodies = [
        ceiling.pod_body(name=f"p-{i:05d}", scheduler_name=scheduler_name, index=i) for i in range(pending)
    ]
    await ceiling.create_pods(api, namespace=namespace, bodies=bodies)
    watch = ceiling.BindWatch(api, namespace=namespace, on_first=lambda: None)
    await watch.start()
    try:
        started = time.time()
        async with start(scheduler_name):
            serving = time.time()  # the RM serves and the operator was launched (or kube-scheduler)
            if not await watch.wait(1, within=within):
                raise RuntimeError(f"nothing bound within {within:g}s of the start")
            first = min(watch.bound_at.values())
    finally:
        await watch.stop()
    await ceiling.delete_pods(api, namespace=namespace)
    return first - started, first - serving


def _line(label: str, figures: list[float]) -> str:
    cells = " ".join(f"{f:.2f}" for f in figures)
    return f"| {label} | {statistics.median(figures):.2f} | {max(figures):.2f} | {cells} |"


async def run(args: argparse.Namespace, plane: Any, workdir: pathlib.Path) -> None:
    async with ceiling.Api(plane.kubeconfig) as api:
        began = time.monotonic()
        nodes = await ceiling.make_nodes(api, count=args.nodes, kwok=False)
        ceiling.say(f"{len(nodes)} nodes in {time.monotonic() - began:.1f}s")
        if args.bound:
            seconds = await _bound_pods(api, count=args.bound, nodes=nodes)
            ceiling.say(f"{args.bound} bound pods (another scheduler's) in {seconds:.1f}s")
        await ceiling.install_bindery(plane)
        await ceiling.create_namespace(api, "bindery-system")
        bench = ceiling.Plane(plane, workdir, api)
        within = 600.0
        rows: list[str] = []
        runs: list[tuple[str, ceiling.Starter, str, int]] = [
            (
                "Bindery",
                lambda n: bench.bindery(n, max_in_flight=args.max_in_flight),
                "bindery-bench",
                args.rounds,
            ),
            (
                "kube-scheduler qps 5000",
                lambda n: bench.kube_scheduler(n, qps=5000),
                "default-scheduler",
                args.kube_rounds,
            ),
        ]
        for label, start, scheduler_name, rounds in runs:
            launch: list[float] = []
            serving: list[float] = []
            for number in range(rounds):
                total, since = await _round(
                    api,
                    start=start,
                    scheduler_name=scheduler_name,
                    namespace=f"{scheduler_name}-{number}",
                    pending=args.pending,
                    within=within,
                )
                ceiling.say(
                    f"  {label} round {number + 1}: start → first bind {total:.2f}s, serving → {since:.2f}s"
                )
                launch.append(total)
                serving.append(since)
            if rounds:
                rows.append(_line(f"{label}: start → first bind s", launch))
            if rounds and label == "Bindery":
                rows.append(_line(f"{label}: operator launched (RM serving) → first bind s", serving))
        ceiling.say(
            f"\n== start → first bind: {args.nodes} nodes, {args.bound} bound pods, {args.pending} pending, "
            f"{os.cpu_count()} CPUs ==\n| figure | median | worst | rounds |\n|---|---:|---:|---|"
        )
        for row in rows:
            ceiling.say(row)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument(
        "--bound", type=int, default=10000, help="pods of another scheduler, bound (default 10000)"
    )
    parser.add_argument("--pending", type=int, default=5000, help="Bindery's pods waiting (default 5000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kube-rounds", type=int, default=3, help="kube-scheduler's rounds (0 = skip)")
    parser.add_argument("--max-in-flight", type=int, default=256)
    args = parser.parse_args(argv)
    import bindery
    from bindery.devcluster.plane import ControlPlane

    # The image's `pip install` compiles Bindery's bytecode; an editable checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would compile every module again in each process it starts.
    package = pathlib.Path(bindery.__file__).parent
    compileall.compile_dir(str(package), quiet=1)
    ceiling.say(f"bytecode of {package} compiled (as the image's install does)")
    ceiling.say(f"starting etcd + kube-apiserver on 127.0.0.1 ({os.cpu_count()} CPUs) ...")
    with tempfile.TemporaryDirectory(prefix="startup-") as directory, ControlPlane.start() as plane:
        asyncio.run(run(args, plane, pathlib.Path(directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
