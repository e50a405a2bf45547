"""Kubernetes' own scheduling e2e tests, once under kube-scheduler and once under Bindery.

``scripts/e2e-upstream`` runs this (after building ``e2e.test`` with ``build --e2e``). Each run gets a
fresh plane (etcd, kube-apiserver, kube-controller-manager, kwok) with kwok nodes in zones:

- ``kube-scheduler``: the plane's kube-scheduler serves ``default-scheduler`` (the calibration: a
  test it fails here says something about the plane, not about Bindery);
- ``bindery``: kube-scheduler is not started; Bindery serves ``default-scheduler`` (the reference RM
  as its own process, ``--mirror-nodes``, its default policy binpack; ``bindery run`` under the
  operator's least-privilege identity), so every pod the suite creates is Bindery's.

The e2e tests set no ``schedulerName`` (test/e2e/scheduling/predicates.go, ``pausePodConfig``) and
read the ``Scheduled`` / ``FailedScheduling`` events and the pods' nodes, so serving the default
name is all it takes to aim them at Bindery.

    python -m tests.placement.upstream [--focus REGEX] [--skip REGEX] [--nodes N] [--only bindery]

It prints one line per test: ``test | kube-scheduler | Bindery`` and keeps each run's JUnit report
and logs under ``--output`` (default: a temporary directory, printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client, config

from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.devcluster import binaries
from bindery.devcluster.nodes import create_kwok_node
from bindery.devcluster.plane import ControlPlane
from tests.placement.checker import RULES, Violation, check
from tests.realrm import RMProcess, operator_process, serve_with
from tests.workloads import eventually

#: The scheduler's filters: every SchedulerPredicates test (the [Conformance] ones, node affinity,
#: taints, host ports, PodTopologySpread Filtering, scheduling gates, pod overhead), and the one
#: inter-pod (anti-)affinity test of v1.36's e2e suite (required inter-pod affinity is covered by
#: kube's integration tests, not e2e). Seen 2026-12-05 (7032046): all 13 that run pass under both
#: schedulers, and the checker finds 0 violations in either run (about 7 minutes each, 5 of them
#: the 0.0.0.0 host-port test's wait). Preemption is a run of its own (``--focus SchedulerPreemption``,
#: about 8 minutes per scheduler, 7 tests). Seen 2026-12-04, kube-scheduler | Bindery (Bindery's
#: at 834a4c1, after rule preemption, contract v1.2.4): 6 passed under both; "validates various
#: priority Pods preempt expectedly with the async preemption" [Beta] fails under both (it reads the
#: low-priority pods while they terminate; kwok deletes a pod at once:
#: `pods "pod0-0-sched-preemption-low-priority" not found`). "PodTopologySpread Preemption validates
#: proper pods are preempted" failed under Bindery until rule preemption: the hard spread became
#: node constraints counting the pods there now, so the node whose low-priority pods had to go was
#: excluded before the RM looked for victims (contract/v1/README.md, "v1.2.4").
FOCUS = r"\[sig-scheduling\] SchedulerPredicates|\[sig-scheduling\] SchedulerPriorities .*PodAntiAffinity"
#: Left out, for reasons of the plane rather than of a scheduler:
#: - local ephemeral storage needs a kubelet's imagefs/rootfs accounting, which kwok does not fake;
#: - "no conflict between pods with same hostPort but different hostIP" binds 127.0.0.1:54321 and then
#:   the node's InternalIP:54321, expecting no conflict; kwok reports every node's InternalIP as
#:   127.0.0.1, so kube-scheduler rightly refuses the second pod (seen: 300 s timeout, then FAILED).
SKIP = r"local ephemeral storage|same hostPort but different hostIP"
OPERATOR_USER = "bindery-operator"
ZONES = ("zone-a", "zone-b", "zone-c")
RUNS = ("kube-scheduler", "bindery")
#: The table's last row: every pod the suite had bound, judged by tests/placement/checker.py.
CHECKER = "(independent checker: every bound pod, every required rule)"


async def _api(kubeconfig: pathlib.Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration=configuration)


async def _nodes(api: client.ApiClient, count: int) -> None:
    names = [f"e2e-node-{i}" for i in range(count)]
    for i, name in enumerate(names):
        await create_kwok_node(
            api,
            name=name,
            capacity={"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            labels={"topology.kubernetes.io/zone": ZONES[i % len(ZONES)]},
        )
    core = client.CoreV1Api(api)

    async def ready() -> bool:
        listed = await core.list_node()
        return len(listed.items) == count and all(
            any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            and not (n.spec.taints or [])
            for n in listed.items
        )

    await eventually(ready, within=90, what=f"{count} kwok nodes Ready and untainted")


async def publish_root_ca(api: client.ApiClient, ca_pem: str) -> None:
    """Put ``kube-root-ca.crt`` into every namespace, as kube-controller-manager's
    root-ca-certificate-publisher would: the e2e framework waits for it in each test namespace, and
    the plane's controller-manager does not run that controller (no test of the project needs it)."""
    core = client.CoreV1Api(api)
    body = {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": ca_pem}}
    done: set[str] = set()
    while True:
        for ns in (await core.list_namespace()).items:
            name = ns.metadata.name
            if name in done or ns.status.phase != "Active":
                continue
            try:
                await core.create_namespaced_config_map(name, body)
            except client.ApiException as exc:
                if exc.status not in (403, 404, 409):  # terminating, gone, already there
                    raise
            done.add(name)
        await asyncio.sleep(0.5)


async def mirror_extended_resources(api: client.ApiClient) -> None:
    """Copy extended resources from each node's capacity into its allocatable, as a kubelet's
    device plugin registration would: the overhead and preemption tests patch
    ``example.com/beardsecond`` into ``status.capacity`` only, and kwok leaves allocatable alone
    (seen: both schedulers refused the filler pod, "3 Insufficient example.com/beardsecond")."""
    core = client.CoreV1Api(api)
    while True:
        for node in (await core.list_node()).items:
            capacity = node.status.capacity or {}
            allocatable = node.status.allocatable or {}
            changed: dict[str, str | None] = {
                k: v for k, v in capacity.items() if "/" in k and allocatable.get(k) != v
            }
            changed |= {k: None for k in allocatable if "/" in k and k not in capacity}  # removed
            if changed:
                await core.patch_node_status(node.metadata.name, {"status": {"allocatable": changed}})
        await asyncio.sleep(0.5)


def _uid_in(uids: frozenset[str], pod: Mapping[str, Any]) -> bool:
    return str(pod["metadata"]["uid"]) in uids


async def judge_placements(api: client.ApiClient, found: list[Violation]) -> None:
    """Check each pod with the independent checker once, at the first look after it is bound.

    The e2e tests check what they assert, not everything a placement must obey (the hostPort
    [Conformance] test, for one, only waits for its second pod and passes whether it was bound or
    not). Judging each pod once, within a poll of its binding, keeps the checker to the moment of
    placement: the tests remove node labels and delete pods afterwards, which a later snapshot
    would misread as violations.
    """
    judged: set[str] = set()
    core = client.CoreV1Api(api)

    async def items(call: Any, **kwargs: Any) -> list[dict[str, Any]]:
        response = await call(_preload_content=False, **kwargs)
        listed: list[dict[str, Any]] = (await response.json())["items"]
        return listed

    while True:
        pods = await items(core.list_pod_for_all_namespaces)
        fresh = {
            p["metadata"]["uid"]
            for p in pods
            if p["spec"].get("nodeName")
            and p["metadata"]["uid"] not in judged
            and not p["metadata"].get("deletionTimestamp")
        }
        if fresh:
            found += check(
                pods=pods,
                nodes=await items(core.list_node),
                namespaces=await items(core.list_namespace),
                scope=functools.partial(_uid_in, frozenset(fresh)),
            )
            judged |= fresh
        await asyncio.sleep(0.5)


def _e2e(
    *, e2e: pathlib.Path, plane: ControlPlane, focus: str, skip: str, report: pathlib.Path, log: pathlib.Path
) -> int:
    argv = [
        str(e2e),
        f"--kubeconfig={plane.kubeconfig}",
        "--provider=skeleton",
        f"--kubectl-path={plane.bin_dir / 'kubectl'}",
        f"--ginkgo.focus={focus}",
        f"--ginkgo.skip={skip}",
        f"--ginkgo.junit-report={report}",
        "--ginkgo.timeout=2h",
        "--ginkgo.no-color",
        "--ginkgo.v",
        f"--report-dir={report.parent}",
    ]
    print(f"  $ {' '.join(argv)}", flush=True)
    with log.open("wb") as out:
        return subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode


def results(report: pathlib.Path) -> dict[str, str]:
    """Test name -> passed / failed / skipped, from a ginkgo JUnit report."""
    if not report.is_file():
        return {}
    out: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("[It]"):
            continue  # suite set-up and tear-down nodes
        # "[It] [sig-scheduling] SchedulerPredicates [Serial] ... [Conformance] [sig-scheduling, Serial,
        # Conformance]": drop ginkgo's node type and the trailing label list, which repeats the tags.
        name = " ".join(name.removeprefix("[It] ").split())
        name = re.sub(r" \[sig-[^\]]*\]$", "", name)
        if case.find("skipped") is not None:
            status = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            status = "FAILED"
        else:
            status = "passed"
        out[name] = status
    return out


async def one_run(
    which: str, *, e2e: pathlib.Path, output: pathlib.Path, focus: str, skip: str, nodes: int
) -> dict[str, str]:
    directory = output / which
    directory.mkdir(parents=True, exist_ok=True)
    violations: list[Violation] = []
    started = time.monotonic()
    print(f"== {which}: starting a plane", flush=True)
    with ControlPlane.start(controllers=True, kwok=True, kube_scheduler=which == "kube-scheduler") as plane:
        api = await _api(plane.kubeconfig)
        try:
            await _nodes(api, nodes)
            report = directory / "junit.xml"
            log = directory / "e2e.log"
            async with contextlib.AsyncExitStack() as stack:
                publisher = asyncio.create_task(publish_root_ca(api, plane.ca_file.read_text()))
                stack.callback(publisher.cancel)
                judge = asyncio.create_task(judge_placements(api, violations))
                stack.callback(judge.cancel)
                kubelet = asyncio.create_task(mirror_extended_resources(api))
                stack.callback(kubelet.cancel)
                if which == "bindery":
                    await apply_crd(api=api)
                    await grant_operator(api=api, user=OPERATOR_USER)
                    rm = await stack.enter_async_context(
                        RMProcess(kubeconfig=plane.kubeconfig, directory=directory / "rm")
                    )
                    await stack.enter_async_context(
                        operator_process(
                            kubeconfig=plane.mint_kubeconfig(user=OPERATOR_USER), directory=directory / "op"
                        )
                    )
                    await client.CoreV1Api(api).create_namespace(
                        body={"metadata": {"name": "bindery-system"}}
                    )
                    await serve_with(
                        api,
                        rm=rm,
                        name="e2e",
                        scheduler_names=["default-scheduler"],
                        namespace="bindery-system",
                    )
                print(f"== {which}: running e2e.test (log: {log})", flush=True)
                rc = await asyncio.to_thread(
                    _e2e, e2e=e2e, plane=plane, focus=focus, skip=skip, report=report, log=log
                )
            found = results(report)
            (directory / "violations.txt").write_text("".join(f"{v}\n" for v in violations))
            print(f"== {which}: the checker found {len(violations)} violations at placement", flush=True)
            for rule in RULES:
                of_rule = [v for v in violations if v.rule == rule]
                if of_rule:
                    print(f"   {rule}: {len(of_rule)}, e.g. {of_rule[0]}", flush=True)
            found[CHECKER] = f"{len(violations)} violations" if violations else "passed"
            print(
                f"== {which}: e2e.test exit {rc}, {sum(s == 'passed' for s in found.values())} passed, "
                f"{sum(s == 'FAILED' for s in found.values())} failed, in {time.monotonic() - started:.0f}s",
                flush=True,
            )
            return found
        finally:
            await api.close()


def table(runs: dict[str, dict[str, str]]) -> str:
    names = [*sorted({name for found in runs.values() for name in found} - {CHECKER}), CHECKER]
    names = [n for n in names if any(found.get(n, "skipped") != "skipped" for found in runs.values())]
    lines = ["test | kube-scheduler | Bindery", "--- | --- | ---"]
    for name in names:
        lines.append(" | ".join([name, *(runs.get(which, {}).get(name, "-") for which in RUNS)]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/e2e-upstream",
        description="Kubernetes' own scheduling e2e tests, under kube-scheduler and under Bindery.",
    )
    parser.add_argument("--focus", default=FOCUS, help="ginkgo focus regex (default: the filter tests)")
    parser.add_argument("--skip", default=SKIP, help="ginkgo skip regex")
    parser.add_argument(
        "--nodes", type=int, default=3, help="kwok nodes, spread over three zones (default 3)"
    )
    parser.add_argument("--only", choices=RUNS, help="one run instead of both")
    parser.add_argument("--output", type=pathlib.Path, help="where reports and logs go (default: a temp dir)")
    args = parser.parse_args(argv)
    e2e = binaries.ensure_e2e_built(quiet=True)
    output = args.output or pathlib.Path(tempfile.mkdtemp(prefix="bindery-e2e-upstream-"))
    print(f"reports and logs: {output}", flush=True)
    runs: dict[str, dict[str, str]] = {}
    for which in RUNS:
        if args.only and which != args.only:
            continue
        runs[which] = asyncio.run(
            one_run(which, e2e=e2e, output=output, focus=args.focus, skip=args.skip, nodes=args.nodes)
        )
    print("\n" + table(runs))
    bindery = runs.get("bindery", {})
    calibration = runs.get("kube-scheduler", {})
    # Exit 1 when Bindery fails a test kube-scheduler passes on the same plane.
    worse = [
        n
        for n, s in bindery.items()
        if s not in ("passed", "skipped") and calibration.get(n, "passed") == "passed"
    ]
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
