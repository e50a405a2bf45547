"""The reference RM's start at size: launch → serving → ready (its node and pod mirrors listed).

Run:  .venv/bin/python benchmarks/mirror_sync.py [--nodes 5000] [--bound 10000] [--rounds 3]
          [--page-sizes 50,500] [--py-spy rm-sync.txt]

One dev control plane, ``--nodes`` Nodes of the benchmark pool and ``--bound`` pods of another
scheduler bound to them (``benchmarks/startup.py``'s set-up), then ``--rounds`` fresh reference RMs
(``bindery rm serve --mirror-nodes``, each its own process and SQLite file): per round the seconds
from launch to the line with its URL (imports, store), to ``/readyz`` 200 (both mirrors listed), and
the mirrors' own log lines, for each of ``--page-sizes`` (the RM's ``--mirror-pod-page-size``).
``--py-spy FILE`` records the first round's RM (raw folded stacks: ``benchmarks/profile_top.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import ceiling  # the launcher and helpers of benchmarks/ceiling.py
import startup


async def _ready(url: str, *, within: float) -> float:
    """When (time.time()) ``/readyz`` first answered 200."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        while time.monotonic() < deadline:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return time.time()
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"the RM at {url} was not ready within {within:g}s")


async def _round(
    plane: object, workdir: pathlib.Path, number: int, *, py_spy: str | None, page_size: int
) -> tuple[float, float]:
    from bindery.reference_rm.cli import serve_command, served_url

    token_file = workdir / f"token-{number}"
    token_file.write_text(secrets.token_urlsafe(24))
    options = [
        "--mirror-nodes",
        "--node-selector",
        f"{ceiling.POOL_LABEL}={ceiling.POOL}",
        "--kubeconfig",
        str(plane.kubeconfig),  # type: ignore[attr-defined]
        "--log-level",
        "INFO",
        "--mirror-pod-page-size",
        str(page_size),
    ]
    argv = serve_command(db=workdir / f"rm-{number}.sqlite", token_file=token_file, options=options)
    if py_spy:
        spy = shutil.which("py-spy", path=str(pathlib.Path(sys.executable).parent)) or "py-spy"
        argv = [spy, "record", "--format", "raw", "--rate", "200", "--nonblocking", "-o", py_spy, "--", *argv]
    log = workdir / f"rm-{number}.log"
    started = time.time()
    rm = await ceiling.spawn(argv, log=log)
    try:
        url = served_url((await ceiling.wait_for_line(log, "http://", rm, within=120)).encode())
        serving = time.time()
        ready = await _ready(url, within=600)
        if py_spy:  # stop the RM alone: py-spy writes its samples once its child exits
            children = ceiling.read_lines(pathlib.Path(f"/proc/{rm.pid}/task/{rm.pid}/children"))
            for child in " ".join(children).split():
                os.kill(int(child), signal.SIGTERM)
            await asyncio.wait_for(rm.wait(), timeout=60)
    finally:
        await ceiling.stop(rm)
    for line in ceiling.read_lines(log):
        if "mirror:" in line and "match" in line:
            ceiling.say(f"    {line.strip()}")
    return serving - started, ready - started


async def run(args: argparse.Namespace, plane: object, workdir: pathlib.Path) -> None:
    async with ceiling.Api(plane.kubeconfig) as api:  # type: ignore[attr-defined]
        began = time.monotonic()
        nodes = await ceiling.make_nodes(api, count=args.nodes, kwok=False)
        ceiling.say(f"{len(nodes)} nodes in {time.monotonic() - began:.1f}s")
        if args.bound:
            seconds = await startup._bound_pods(api, count=args.bound, nodes=nodes)
            ceiling.say(f"{args.bound} bound pods (another scheduler's) in {seconds:.1f}s")
        rows = []
        number = 0
        for page_size in args.page_sizes:
            serving: list[float] = []
            ready: list[float] = []
            for _ in range(args.rounds):
                spy = args.py_spy if number == 0 else None
                to_serving, to_ready = await _round(plane, workdir, number, py_spy=spy, page_size=page_size)
                number += 1
                ceiling.say(
                    f"  pages of {page_size} pods, round {len(ready) + 1}: launch → serving "
                    f"{to_serving:.2f}s, → ready {to_ready:.2f}s"
                )
                serving.append(to_serving)
                ready.append(to_ready)
            for label, figures in (("launch → serving s", serving), ("launch → ready s", ready)):
                cells = " ".join(f"{f:.2f}" for f in figures)
                median, worst = statistics.median(figures), max(figures)
                rows.append(f"| {page_size} | {label} | {median:.2f} | {worst:.2f} | {cells} |")
        ceiling.say(
            f"\n== reference RM start: {args.nodes} nodes, {args.bound} bound pods, "
            f"{os.cpu_count()} CPUs ==\n"
            "| pod page | figure | median | worst | rounds |\n|---:|---|---:|---:|---|"
        )
        for row in rows:
            ceiling.say(row)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--bound", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--page-sizes",
        type=lambda text: [int(size) for size in text.split(",")],
        default=[500],
        help="--mirror-pod-page-size of the RMs, comma-separated: --rounds each (default 500)",
    )
    parser.add_argument("--py-spy", default=None, help="record the first round's RM to this file")
    args = parser.parse_args(argv)
    from bindery.devcluster.plane import ControlPlane

    ceiling.say(f"starting etcd + kube-apiserver on 127.0.0.1 ({os.cpu_count()} CPUs) ...")
    with tempfile.TemporaryDirectory(prefix="mirror-sync-") as directory, ControlPlane.start() as plane:
        asyncio.run(run(args, plane, pathlib.Path(directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
