"""What a tenant who may only create pods costs the operator and the reference RM in memory (issue 20).

Run:  .venv/bin/python benchmarks/tenant_memory.py [--unserved 100] [--tolerations 20000]
        [--preset 300] [--preset-tolerations 1000] [--settle 45] [--out tenant-memory-results]

One dev control plane (``bindery.devcluster``'s ControlPlane, through ``ceiling.py``'s helpers: the
same launcher, Api, pod bodies and ``Plane.bindery``, which starts a fresh reference RM with
``--mirror-nodes`` and ``bindery run``, each its own process), four Nodes, then two runs of the
operator and the RM:

* **idle**: one pod of the served name (``bindery-tenant``) bound, then ``--settle`` seconds;
* **loaded**: first ``--unserved`` pending pods of ``schedulerName: nobody`` whose spec carries
  ``--tolerations`` tolerations (20,000: about 1.5 MB of JSON each), and ``--preset`` pods of the
  served name created with ``spec.nodeName`` set (``--preset-tolerations`` each); then both
  processes start (so their first lists hold all of it, as after a restart), one pod of the served
  name is bound, and ``--settle`` seconds pass (a reconcile pass and an unbound-pod sweep run).

Printed: each process's RSS (``VmRSS``) at the end of each run and its peak (``VmHWM``), and the
growth from idle. The issue's goal: within 50 MB of idle. Figures, not a timed assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

import ceiling
from ceiling import Api, BindWatch, Plane, create_namespace, create_pods, make_nodes, pod_body, rss_mb, say

SERVED = "bindery-tenant"
UNSERVED = "nobody"
NODES = 4


def with_tolerations(body: dict[str, Any], count: int) -> dict[str, Any]:
    body["spec"]["tolerations"] = [
        {"key": f"tenant.example/k{i:05d}", "operator": "Equal", "value": "v", "effect": "NoSchedule"}
        for i in range(count)
    ]
    return body


async def one_run(api: Api, plane: Plane, *, label: str, settle: float) -> dict[str, dict[str, float]]:
    """Start the RM and the operator, bind one pod of the served name, settle, read their memory."""
    namespace = f"probe-{label}"
    await create_namespace(api, namespace)
    watch = BindWatch(api, namespace=namespace, on_first=lambda: None)
    await watch.start()
    try:
        async with plane.bindery(SERVED, max_in_flight=16) as serving:
            await create_pods(
                api, namespace=namespace, bodies=[pod_body(name="probe", scheduler_name=SERVED, index=0)]
            )
            if not await watch.wait(1, within=300):
                raise RuntimeError(f"{label}: the probe pod of {SERVED} was not bound within 300 s")
            await asyncio.sleep(settle)
            figures = {
                name: {"rss_mb": rss_mb(pid), "peak_mb": rss_mb(pid, "VmHWM")}
                for name, pid in serving.processes.items()
            }
    finally:
        await watch.stop()
    for name, row in figures.items():
        say(f"  {label}: {name}: RSS {row['rss_mb']:.1f} MB, peak {row['peak_mb']:.1f} MB")
    return figures


async def run(args: argparse.Namespace, plane: Any, workdir: pathlib.Path) -> dict[str, Any]:
    async with Api(plane.kubeconfig) as api:
        nodes = await make_nodes(api, count=NODES, kwok=False)
        await ceiling.install_bindery(plane)
        await create_namespace(api, "bindery-system")
        bench = Plane(plane, workdir, api)
        idle = await one_run(api, bench, label="idle", settle=args.settle)
        await create_namespace(api, "tenant")
        unserved = [
            with_tolerations(
                pod_body(name=f"big-{i:03d}", scheduler_name=UNSERVED, index=i), args.tolerations
            )
            for i in range(args.unserved)
        ]
        size_mb = len(json.dumps(unserved[0])) / 1e6 if unserved else 0.0
        took = await create_pods(api, namespace="tenant", bodies=unserved)
        del unserved
        say(f"{args.unserved} pending pods of {UNSERVED!r}, {size_mb:.2f} MB of JSON each, in {took:.1f}s")
        preset = [
            with_tolerations(
                pod_body(name=f"preset-{i:03d}", scheduler_name=SERVED, index=i, node=nodes[i % len(nodes)]),
                args.preset_tolerations,
            )
            for i in range(args.preset)
        ]
        took = await create_pods(api, namespace="tenant", bodies=preset)
        say(f"{args.preset} pods of {SERVED!r} with spec.nodeName preset in {took:.1f}s")
        loaded = await one_run(api, bench, label="loaded", settle=args.settle)
    return {"idle": idle, "loaded": loaded, "pod_json_mb": size_mb}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unserved", type=int, default=100, help="pending pods of schedulerName nobody")
    parser.add_argument("--tolerations", type=int, default=20_000, help="tolerations per unserved pod")
    parser.add_argument(
        "--preset", type=int, default=300, help="pods of the served name with nodeName preset"
    )
    parser.add_argument("--preset-tolerations", type=int, default=1_000, help="tolerations per preset pod")
    parser.add_argument("--settle", type=float, default=45.0, help="seconds after the probe pod is bound")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tenant-memory-results"))
    args = parser.parse_args(argv)
    from bindery.devcluster.plane import ControlPlane

    say(f"starting etcd + kube-apiserver on 127.0.0.1 ({os.cpu_count()} CPUs) ...")
    with tempfile.TemporaryDirectory(prefix="tenant-memory-") as directory, ControlPlane.start() as plane:
        report = asyncio.run(run(args, plane, pathlib.Path(directory)))
    commit = subprocess.run(
        ["git", "-C", str(ceiling.HERE), "rev-parse", "--short", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout.strip()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    say(
        f"\n== {args.unserved} pods of {UNSERVED!r} × {args.tolerations} tolerations, "
        f"{args.preset} preset pods of {SERVED!r} × {args.preset_tolerations}; commit {commit}, {stamp} =="
    )
    say("| process | idle RSS MB | loaded RSS MB | growth MB | idle peak MB | loaded peak MB |")
    say("|---|---:|---:|---:|---:|---:|")
    for name in report["idle"]:
        idle, loaded = report["idle"][name], report["loaded"][name]
        say(
            f"| {name} | {idle['rss_mb']:.1f} | {loaded['rss_mb']:.1f} | "
            f"{loaded['rss_mb'] - idle['rss_mb']:+.1f} | {idle['peak_mb']:.1f} | {loaded['peak_mb']:.1f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    report.update({"commit": commit, "when": stamp, "args": {k: str(v) for k, v in vars(args).items()}})
    (args.out / "tenant_memory.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
