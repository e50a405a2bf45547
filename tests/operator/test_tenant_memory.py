"""A tenant who may only create pods cannot make the operator hold their specs (issue 20, scenario 2).

Every unbound pod of any scheduler name used to be projected whole (tolerations, labels, affinity
copied into a `PodInfo`), so a hundred pods of 1.5 MB specs with `schedulerName: nobody` took the
operator past its 512 Mi limit, and again on every restart's list. What is measured here is what
the operator *keeps* (and, at start, what its list holds at once): Python's own allocation tracer
over the operator thread's allocations, not the projection's code, so the measure cannot agree with
a bug by construction. The positive event that proves the pods were handled before measuring: a pod
of the served name, created after them, is bound.
"""

from __future__ import annotations

import gc
import pathlib
import re
import tracemalloc
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from bindery.apiserver import api as k8s
from bindery.apiserver import resources
from bindery.controller.reservations.boundpods import list_bound_pods
from tests.operator.conftest import Bindery, Stage, events_of, eventually, pod_body

#: Tolerations per tenant pod: about 100 KB of JSON each (the issue's 1.5 MB, scaled to stay fast).
TOLERATIONS = 1_400
TENANT_PODS = 100
#: What a hundred such pods may leave behind in the operator, all structures together (a pod's
#: identity is a few hundred bytes; its tolerations, parsed, about 0.6 MB).
KEPT_BUDGET = 4 * 1024 * 1024
#: Frames recorded per allocation: enough to reach a `bindery` frame from inside json and the
#: client (more slows every allocation of the process, the fake RM's too, past its timeouts).
FRAMES = 8


def tolerations(count: int) -> list[dict[str, Any]]:
    return [
        {"key": f"tenant.example/k{i:05d}", "operator": "Equal", "value": "v", "effect": "NoSchedule"}
        for i in range(count)
    ]


async def create_tenant_pods(api: client.ApiClient, *, namespace: str) -> None:
    """Raw JSON in and out (the client's model classes would parse every toleration twice)."""
    many = tolerations(TOLERATIONS)
    for i in range(TENANT_PODS):
        body = pod_body(name=f"tenant-{i:03d}", scheduler_name="nobody", tolerations=many)
        await k8s.create(api, resources.PODS, namespace=namespace, body=body)


def kept_by_bindery() -> int:
    """Bytes alive now that were allocated with a frame of the `bindery` package on the stack."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*/bindery/*", all_frames=True)]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


async def bound(stage: Stage, name: str) -> None:
    await eventually(lambda: stage.node_of(name), within=60, what=f"pod {name} bound")


async def test_pods_of_an_unserved_name_leave_nothing_behind(stage: Stage, bindery: Bindery) -> None:
    """Created while the operator runs: each arrives as a watch event."""
    async with stage.served():
        await stage.create("first")
        await bound(stage, "first")
        tracemalloc.start(FRAMES)
        try:
            before = kept_by_bindery()
            await create_tenant_pods(stage.api, namespace=stage.namespace)
            await stage.create("last")  # handled after the tenant's pods, whatever the order of watches
            await bound(stage, "last")
            kept = kept_by_bindery() - before
        finally:
            tracemalloc.stop()
    print(f"kept by the operator for {TENANT_PODS} unserved pods: {kept / 2**20:.2f} MiB")
    assert kept < KEPT_BUDGET, (
        f"the operator keeps {kept / 2**20:.1f} MiB for {TENANT_PODS} pods it does not serve"
    )


async def test_a_restart_does_not_read_the_specs_of_an_unserved_name(
    stage: Stage, operator_kubeconfig: pathlib.Path
) -> None:
    """Created before the operator starts: all of them are in its first list."""
    await create_tenant_pods(stage.api, namespace=stage.namespace)
    operator = Bindery(kubeconfig=operator_kubeconfig)
    tracemalloc.start(FRAMES)
    try:
        await operator.start()
        try:
            async with stage.served():
                await stage.create("last")
                await bound(stage, "last")
                kept = kept_by_bindery()
                _, peak = tracemalloc.get_traced_memory()
        finally:
            await operator.stop()
    finally:
        tracemalloc.stop()
    print(f"after the first list: kept {kept / 2**20:.2f} MiB, peak {peak / 2**20:.2f} MiB")
    # The list of every unbound pod used to be held whole (all pages, ~10 MB of JSON parsed into
    # ~60 MB of objects) before any pod was projected, and each projection then kept its copy.
    assert kept < KEPT_BUDGET + 8 * 2**20, f"the operator keeps {kept / 2**20:.1f} MiB after its list"
    assert peak < 40 * 2**20, f"the operator held {peak / 2**20:.1f} MiB at once while starting"


async def test_a_served_pod_past_the_contracts_limits_is_refused_and_not_kept(
    stage: Stage, bindery: Bindery
) -> None:
    """Contract v1 carries at most 256 tolerations; the pod's 300 are refused with a reason."""
    async with stage.served():
        created = await stage.create("wide", tolerations=tolerations(300))
        uid = created["metadata"]["uid"]

        async def refusal() -> list[str]:
            notes = [
                str(e.get("note") or "")
                for e in await events_of(stage.api, namespace=stage.namespace, pod_name="wide")
            ]
            return [n for n in notes if "spec.tolerations" in n and "256" in n]

        notes = await eventually(refusal, within=30, what="a FailedScheduling event naming spec.tolerations")
        projection = bindery.runtime.pods.get(uid)
        assert projection is None or not projection.tolerations, "the refused pod was projected whole"
        assert re.search(r"spec.tolerations has 30\d entries", notes[0]), notes  # admission adds two
    assert await stage.node_of("wide") is None


#: Pods created with spec.nodeName preset, and tolerations each (about 37 KB of JSON per pod).
PRESET_PODS = 300
PRESET_TOLERATIONS = 500
#: What listing them may hold at once. Measured (tracemalloc, all allocations of the process):
#: 80.8 MiB with pages of 500 (all 300 pods in one page), 45.7 MiB with 100, 23.1 MiB with 50.
PRESET_PEAK_BUDGET = 40 * 2**20


async def test_listing_a_tenants_large_preset_pods_holds_one_small_page_at_a_time(
    kube_api: client.ApiClient, namespace: str, uniq: Callable[[str], str]
) -> None:
    """A reconcile pass lists every bound pod of its names, and anyone may create bound pods of any
    size (spec.nodeName preset). Each page is parsed whole before it is reduced: with pages of 500
    pods of 75 KB, the operator's RSS stayed 135 MB up after a pass (benchmarks/tenant_memory.py).
    The peak while listing 300 pods of 37 KB (each about 0.4 MB once parsed) is that of one page
    of POD_PAGE_SIZE pods, not of all of them."""
    scheduler = uniq("preset")
    many = tolerations(PRESET_TOLERATIONS)
    for i in range(PRESET_PODS):
        body = pod_body(name=f"preset-{i:03d}", scheduler_name=scheduler, tolerations=many)
        body["spec"]["nodeName"] = "nowhere"  # no kubelet: the pods stay Pending, bound
        await k8s.create(kube_api, resources.PODS, namespace=namespace, body=body)
    tracemalloc.start(FRAMES)
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        items, _ = await list_bound_pods(api=kube_api, scheduler_name=scheduler, namespace=namespace)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(items) == PRESET_PODS
    held = peak - base
    print(f"peak while listing {PRESET_PODS} preset pods: {held / 2**20:.1f} MiB")
    assert held < PRESET_PEAK_BUDGET, f"listing held {held / 2**20:.1f} MiB at once"
