"""What pod groups that cannot be met cost the apiserver while they wait.

Run:  .venv/bin/python benchmarks/podgroup_wait.py [--groups 1000] [--window 60]

A dev control plane of its own (etcd and kube-apiserver only, so nothing else lists), one Node,
the reference RM and ``bindery run``, each its own process (``ceiling.py``'s ``Plane.bindery``).
Then ``--groups`` PodGroups of ``minCount: 2`` with one member each: none can ever be placed. Once
every member was told why it waits (``PodScheduled=False``), the window begins: the apiserver's own
``apiserver_request_total`` is read at its start and at its end (``--window`` seconds later, the
driver sends nothing in between), and the requests per second are printed by verb and resource.
The budget: fewer than 5 LIST/s. Figures, not a timed assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import ceiling
from ceiling import POOL, POOL_LABEL, Api, Plane, create_namespace, create_pods, make_nodes, say

SERVED = "bindery-gangs"
NAMESPACE = "gangs"
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def group_body(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": f"g{index:05d}"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }


def member_body(index: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"g{index:05d}-0"},
        "spec": {
            "schedulerName": SERVED,
            "schedulingGroup": {"podGroupName": f"g{index:05d}"},
            "nodeSelector": {POOL_LABEL: POOL},
            "containers": [
                {"name": "main", "image": "registry.invalid/app:1", "resources": {"requests": {"cpu": "10m"}}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


async def requests_by_kind(api: Api) -> collections.Counter[tuple[str, str]]:
    """The apiserver's request counters summed by (verb, resource[/subresource])."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in (await api.text("/metrics")).splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        counts[(labels.get("verb", ""), resource)] += int(float(match["value"]))
    return counts


async def told(api: Api) -> int:
    """How many members carry PodScheduled=False."""
    items, _ = await api.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods")
    return sum(
        1
        for pod in items
        if any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in (pod.get("status") or {}).get("conditions") or ()
        )
    )


async def run(args: argparse.Namespace, plane: Any, workdir: pathlib.Path) -> dict[str, float]:
    async with Api(plane.kubeconfig) as api:
        await make_nodes(api, count=1, kwok=False)
        await ceiling.install_bindery(plane)
        bench = Plane(plane, workdir, api)
        await create_namespace(api, "bindery-system")
        await create_namespace(api, NAMESPACE)
        async with bench.bindery(SERVED, max_in_flight=16):
            gate = asyncio.Semaphore(16)

            async def one_group(index: int) -> None:
                async with gate:
                    await api.call(
                        "POST",
                        f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{NAMESPACE}/podgroups",
                        group_body(index),
                    )

            await asyncio.gather(*(one_group(i) for i in range(args.groups)))
            await create_pods(api, namespace=NAMESPACE, bodies=[member_body(i) for i in range(args.groups)])
            say(f"{args.groups} PodGroups and members created; waiting until every member is told why ...")
            deadline = time.monotonic() + args.within
            while (done := await told(api)) < args.groups:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {done} of {args.groups} members told within {args.within:g}s")
                await asyncio.sleep(5.0)
            say(f"every member told; measuring {args.window:g} s of waiting ...")
            before = await requests_by_kind(api)
            started = time.monotonic()
            await asyncio.sleep(args.window)
            after = await requests_by_kind(api)
            seconds = time.monotonic() - started
    rates = {
        f"{verb} {resource}": (after[(verb, resource)] - before[(verb, resource)]) / seconds
        for verb, resource in after
    }
    return {kind: rate for kind, rate in sorted(rates.items()) if rate > 0}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1000, help="PodGroups of minCount 2, one member each")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured once all wait")
    parser.add_argument(
        "--within", type=float, default=600.0, help="seconds allowed for every member's report"
    )
    args = parser.parse_args(argv)
    from bindery.devcluster.plane import ControlPlane

    say(f"starting etcd + kube-apiserver on 127.0.0.1 ({os.cpu_count()} CPUs) ...")
    with tempfile.TemporaryDirectory(prefix="podgroup-wait-") as directory, ControlPlane.start() as plane:
        rates = asyncio.run(run(args, plane, pathlib.Path(directory)))
    commit = subprocess.run(
        ["git", "-C", str(ceiling.HERE), "rev-parse", "--short", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout.strip()
    lists = sum(rate for kind, rate in rates.items() if kind.startswith("LIST "))
    say(f"\n== {args.groups} waiting pod groups, {args.window:g} s, commit {commit} ==")
    say("| verb resource | requests/s |")
    say("|---|---:|")
    for kind, rate in rates.items():
        say(f"| {kind} | {rate:.2f} |")
    say(f"LIST/s in all: {lists:.2f} (budget < 5)")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
