"""Inter-pod rules on the real apiserver: zone spread, hostname anti-affinity, host ports, a burst of
related pods at a high maxInFlight, and NodeCheck catching an RM that ignores the constraints.

Four 16-CPU nodes in three zones (a, b, c, a) in a pool of their own; the reference RM runs as its
own process with ``--mirror-nodes`` and its default policy, binpack, which on today's code stacks
every pod on one node. Pods select the pool with a nodeSelector, so other tests' nodes are no
candidates.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import pathlib
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.scheduling.queue import QueuePosition
from tests.gangs.scenarios import pod_group
from tests.operator.conftest import (
    Bindery,
    condition,
    create_pod,
    events_of,
    eventually,
    pod_body,
    read_pod,
    resource_manager,
)
from tests.operator.fakerm import FakeRM
from tests.realrm import RMProcess
from tests.rmproxy import rm_fault_proxy

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
ZONES = ("a", "b", "c", "a")
POOL = "bindery.dev/test-pool"


class Pool:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        namespace: str,
        token: str,
        nodes: list[str],
        kubeconfig: pathlib.Path | None = None,
    ) -> None:
        self.api = api
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.token = token
        self.nodes = nodes
        self.scheduler = f"sched-{token}"
        self.zone_of = {name: ZONES[i] for i, name in enumerate(nodes)}

    def body(self, name: str, **fields: Any) -> dict[str, Any]:
        return pod_body(name=name, scheduler_name=self.scheduler, nodeSelector={POOL: self.token}, **fields)

    async def create(self, name: str, **fields: Any) -> dict[str, Any]:
        return await create_pod(self.api, namespace=self.namespace, body=self.body(name, **fields))

    async def nodes_of(self, names: list[str]) -> dict[str, str | None]:
        return {
            name: (await read_pod(self.api, namespace=self.namespace, name=name))["spec"].get("nodeName")
            for name in names
        }

    async def all_bound(self, names: list[str]) -> dict[str, str] | None:
        found = await self.nodes_of(names)
        return {k: v for k, v in found.items() if v} if all(found.values()) else None


@contextlib.asynccontextmanager
async def pool_nodes(api: client.ApiClient, token: str) -> AsyncIterator[list[str]]:
    names = [f"pr-{token}-{i}" for i in range(len(ZONES))]
    for name, zone in zip(names, ZONES, strict=True):
        await create_node(
            api,
            name=name,
            capacity={"cpu": "16", "memory": "64Gi", "pods": "110"},
            labels={POOL: token, ZONE: zone},
        )
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(api).delete_node(name=name)


@contextlib.asynccontextmanager
async def pool_of(
    *,
    controlplane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    directory: pathlib.Path,
    slow_rm: bool = False,
    node_check: str = "Full",
) -> AsyncIterator[Pool]:
    """The four nodes, the reference RM mirroring them, and a ResourceManager serving the pool.

    `slow_rm`: every reserve is held 0.2-0.4 s by a proxy (tests/rmproxy.py), so that many cycles
    are between their PreFilter and their reservation at once, the window a race would use."""
    token = uuid.uuid4().hex[:8]
    async with (
        pool_nodes(api, token) as nodes,
        RMProcess(
            kubeconfig=controlplane.kubeconfig, directory=directory, node_selector=f"{POOL}={token}"
        ) as rm,
        rm_fault_proxy(
            upstream=rm.url,
            seed=19,
            rate=1.0 if slow_rm else 0.0,
            kinds=("delay",),
            delay=(0.2, 0.4),
            applies=lambda method, path: method == "POST" and path in ("/v1/reservations", "/v1/batch"),
        ) as proxy,
    ):
        secret = f"rm-token-{token}"
        await client.CoreV1Api(api).create_namespaced_secret(
            namespace=namespace,
            body={
                "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
                "stringData": {"token": rm.token},
            },
        )
        staged = Pool(
            api=api, namespace=namespace, token=token, nodes=nodes, kubeconfig=controlplane.kubeconfig
        )
        async with resource_manager(
            api,
            name=f"rm-{token}",
            scheduler_names=[staged.scheduler],
            endpoint=proxy.url,
            auth={"tokenSecretRef": {"namespace": namespace, "name": secret}},
            backoff={"initialSeconds": 0.2, "maxSeconds": 1},
            maxInFlight=64,
            nodeCheck=node_check,
        ):
            yield staged


@pytest.fixture
async def pool(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> AsyncIterator[Pool]:
    async with pool_of(
        controlplane=controlplane, api=kube_api, namespace=namespace, directory=tmp_path / "rm"
    ) as staged:
        yield staged


@pytest.fixture
async def slow_pool(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> AsyncIterator[Pool]:
    async with pool_of(
        controlplane=controlplane, api=kube_api, namespace=namespace, directory=tmp_path / "rm", slow_rm=True
    ) as staged:
        yield staged


@pytest.fixture
async def basic_pool(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    bindery: Bindery,
    tmp_path: pathlib.Path,
) -> AsyncIterator[Pool]:
    async with pool_of(
        controlplane=controlplane,
        api=kube_api,
        namespace=namespace,
        directory=tmp_path / "rm",
        node_check="Basic",
    ) as staged:
        yield staged


def zone_spread(app: str) -> list[dict[str, Any]]:
    return [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": app}},
        }
    ]


def hostname_anti(app: str) -> dict[str, Any]:
    term = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": app}}}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def zone_counts(pool: Pool, placed: Mapping[str, str]) -> dict[str, int]:
    return dict(sorted(collections.Counter(pool.zone_of[node] for node in placed.values()).items()))


async def test_six_pods_with_zone_spread_land_two_per_zone(pool: Pool) -> None:
    names = [f"web-{i}" for i in range(6)]
    for name in names:
        await pool.create(name, labels={"app": "web"}, topologySpreadConstraints=zone_spread("web"))
    placed = await eventually(lambda: pool.all_bound(names), within=60, what="all six pods bound")
    assert zone_counts(pool, placed) == {"a": 2, "b": 2, "c": 2}


async def test_five_pods_with_hostname_anti_affinity_four_bound_one_refused(pool: Pool) -> None:
    names = [f"solo-{i}" for i in range(5)]
    for name in names:
        await pool.create(name, labels={"app": "solo"}, affinity=hostname_anti("solo"))

    async def four_bound() -> dict[str, str] | None:
        found = await pool.nodes_of(names)
        bound = {k: v for k, v in found.items() if v}
        return bound if len(bound) == 4 else None

    bound = await eventually(four_bound, within=60, what="four of five pods bound")
    assert sorted(bound.values()) == sorted(pool.nodes)  # one per node
    (pending,) = set(names) - set(bound)

    async def refused() -> list[str]:
        notes = [
            e.get("note", "") for e in await events_of(pool.api, namespace=pool.namespace, pod_name=pending)
        ]
        return [n for n in notes if "pod anti-affinity excludes all 4 nodes" in n]

    await eventually(
        refused, within=30, what=f"a FailedScheduling event naming the anti-affinity for {pending}"
    )
    pod = await read_pod(pool.api, namespace=pool.namespace, name=pending)
    assert not pod["spec"].get("nodeName")
    # `bindery explain`, as a user runs it, names the rule and the nodes it excludes.
    assert pool.kubeconfig is not None
    explained = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bindery", "explain", pending, "-n", pool.namespace, "--no-operator",
        "--kubeconfig", str(pool.kubeconfig), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(explained.communicate(), timeout=60)
    text = out.decode()
    assert explained.returncode == 0, text + err.decode()
    nodes = ", ".join(sorted(pool.nodes))
    assert f"Placement rules:\n  pod anti-affinity excludes 4 nodes: {nodes}\n" in text, text
    cond = condition(pod)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")


async def test_a_pod_refused_by_anti_affinity_is_woken_by_the_deletion_of_the_pod_in_its_way(
    pool: Pool, bindery: Bindery
) -> None:
    """F4: the refused pod is parked until a placed pod that could lift the refusal changes (here:
    one in its way is deleted), not retried on its backoff (at most 1 s here) whatever happens."""
    names = [f"solo-{i}" for i in range(4)]
    for name in names:
        await pool.create(name, labels={"app": "solo"}, affinity=hostname_anti("solo"))
    placed = await eventually(lambda: pool.all_bound(names), within=60, what="four pods bound")
    late = await pool.create("solo-late", labels={"app": "solo"}, affinity=hostname_anti("solo"))
    uid = late["metadata"]["uid"]
    queue = bindery.runtime.runners[f"rm-{pool.token}"].queue

    async def parked() -> QueuePosition | None:
        position = queue.position(uid)
        return position if position is not None and position.queue == "unschedulable" else None

    position = await eventually(parked, within=30, what="solo-late refused and parked")
    # Parked until an event (or the 5-minute flush), not until its backoff (maxSeconds 1) ends.
    assert (position.ready_in or 0.0) > 10.0, position
    moved = dict(queue.stats().moved).get("placed-pod", 0)
    await client.CoreV1Api(pool.api).delete_namespaced_pod(
        name="solo-0", namespace=pool.namespace, grace_period_seconds=0
    )
    bound = await eventually(lambda: pool.all_bound(["solo-late"]), within=60, what="solo-late bound")
    assert bound["solo-late"] == placed["solo-0"]
    assert dict(queue.stats().moved).get("placed-pod", 0) > moved, queue.stats()


async def test_host_port_conflict_goes_to_another_node(pool: Pool) -> None:
    port = [
        {"name": "c", "image": "registry.invalid/pause", "ports": [{"containerPort": 80, "hostPort": 8080}]}
    ]
    await pool.create("port-0", containers=port)
    first = await eventually(lambda: pool.all_bound(["port-0"]), within=30, what="port-0 bound")
    await pool.create("port-1", containers=port)
    second = await eventually(lambda: pool.all_bound(["port-1"]), within=30, what="port-1 bound")
    assert first["port-0"] != second["port-1"]


async def test_a_burst_of_related_pods_at_high_max_in_flight_violates_nothing(slow_pool: Pool) -> None:
    """15 spread pods and 4 anti-affine pods created at once (maxInFlight 64) against an RM whose
    reserves take 0.2-0.4 s: cycles overlap, and each must count the pods the others are placing."""
    pool = slow_pool
    spread = [f"burst-{i}" for i in range(15)]
    solo = [f"alone-{i}" for i in range(4)]
    await asyncio.gather(
        *(
            pool.create(n, labels={"app": "burst"}, topologySpreadConstraints=zone_spread("burst"))
            for n in spread
        ),
        *(pool.create(n, labels={"app": "alone"}, affinity=hostname_anti("alone")) for n in solo),
    )
    placed = await eventually(lambda: pool.all_bound(spread + solo), within=120, what="the burst bound")
    assert zone_counts(pool, {n: placed[n] for n in spread}) == {"a": 5, "b": 5, "c": 5}
    assert sorted(placed[n] for n in solo) == sorted(pool.nodes)
    # Each placed right the first time: none was refused by NodeCheck's second look (which is what
    # happens to a pod that did not wait for the related pods in flight before it).
    failed = {
        name: notes
        for name in spread + solo
        if (
            notes := [
                e.get("note")
                for e in await events_of(pool.api, namespace=pool.namespace, pod_name=name)
                if e.get("reason") == "FailedScheduling"
            ]
        )
    }
    assert failed == {}


async def test_node_check_refuses_an_rm_that_ignores_the_constraints(
    kube_api: client.ApiClient, crd: None, namespace: str, bindery: Bindery, fake_rm: FakeRM
) -> None:
    """The fake RM ignores node affinity (first node by name with a slot): the second anti-affine
    pod is sent `hostname NotIn (first node)`, gets the first node anyway, and NodeCheck refuses it."""
    token = uuid.uuid4().hex[:8]
    async with pool_nodes(kube_api, token) as nodes:
        fake_rm.slots[nodes[0]] = 5
        staged = Pool(api=kube_api, namespace=namespace, token=token, nodes=nodes)
        async with resource_manager(
            kube_api,
            name=f"rm-{token}",
            scheduler_names=[staged.scheduler],
            endpoint=fake_rm.url,
            backoff={"initialSeconds": 0.2, "maxSeconds": 1},
        ):
            await staged.create("first", labels={"app": "solo"}, affinity=hostname_anti("solo"))
            assert await eventually(lambda: staged.all_bound(["first"]), within=30) == {"first": nodes[0]}
            await staged.create("second", labels={"app": "solo"}, affinity=hostname_anti("solo"))

            async def refused() -> list[str]:
                notes = [
                    e.get("note", "")
                    for e in await events_of(kube_api, namespace=namespace, pod_name="second")
                ]
                return [n for n in notes if f'chose node "{nodes[0]}"' in n and "pod anti-affinity" in n]

            await eventually(refused, within=30, what="NodeCheck refusing the RM's node for the second pod")
            assert (await staged.nodes_of(["second"])) == {"second": None}
            # Nothing is left reserved for the refused pod at the RM.
            second_uid = (await read_pod(kube_api, namespace=namespace, name="second"))["metadata"]["uid"]
            assert await eventually(
                lambda: _none_active(fake_rm, second_uid), within=30, what="the refused reservation released"
            )


async def _none_active(rm: FakeRM, uid: str) -> bool:
    return bool(rm.for_pod(uid)) and all(r["state"] == "released" for r in rm.for_pod(uid))


async def test_pod_group_members_are_kept_off_the_node_their_anti_affinity_excludes(pool: Pool) -> None:
    """A pod group's members are reserved together; their rules against the pods already running
    are sent to the RM with each member (binpack would otherwise fill the busy node first)."""
    await pool.create("busy", labels={"app": "busy"})
    busy = await eventually(lambda: pool.all_bound(["busy"]), within=30, what="busy bound")
    await client.CustomObjectsApi(pool.api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", pool.namespace, "podgroups", pod_group("crew", min_count=2)
    )
    anti = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "busy"}}}
    names = ["crew-0", "crew-1"]
    for name in names:
        await pool.create(
            name,
            labels={"app": "crew"},
            schedulingGroup={"podGroupName": "crew"},
            affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [anti]}},
        )
    placed = await eventually(lambda: pool.all_bound(names), within=60, what="the group bound")
    assert busy["busy"] not in placed.values()


async def test_a_gang_with_schedule_anyway_zone_spread_lands_in_the_zone_kube_scheduler_would_pick(
    pool: Pool,
) -> None:
    """Two web pods in zone a, two in zone b; a gang of two with a ScheduleAnyway zone spread over
    them. kube-scheduler puts both members in zone c (counts 2, 2, 0, then 2, 2, 1). Each member's
    spread reaches the RM as a preference with the group reserve; without it binpack stacks the
    gang on the fullest node, in zone a or b."""
    for zone, names in (("a", ["web-a0", "web-a1"]), ("b", ["web-b0", "web-b1"])):
        term = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}
        for name in names:
            await pool.create(
                name,
                labels={"app": "web"},
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                    }
                },
            )
    running = ["web-a0", "web-a1", "web-b0", "web-b1"]
    await eventually(lambda: pool.all_bound(running), within=30, what="the four web pods bound")
    await client.CustomObjectsApi(pool.api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", pool.namespace, "podgroups", pod_group("gang", min_count=2)
    )
    spread = [{**zone_spread("web")[0], "whenUnsatisfiable": "ScheduleAnyway"}]
    names = ["gang-0", "gang-1"]
    for name in names:
        await pool.create(
            name,
            labels={"app": "web"},
            schedulingGroup={"podGroupName": "gang"},
            topologySpreadConstraints=spread,
        )
    placed = await eventually(lambda: pool.all_bound(names), within=30, what="the gang bound")
    assert zone_counts(pool, placed) == {"c": 2}, placed


async def test_a_gang_refused_by_its_rules_is_woken_by_the_deletion_of_the_pod_in_its_way(
    pool: Pool, bindery: Bindery
) -> None:
    """A busy pod in each zone; a gang anti-affine to them by zone is refused and parked (its next
    look 60 s away, not its backoff of 1 s). Deleting zone c's busy pod wakes it: it binds there.
    The busy pods are bound by nodeName, not by Bindery, so their deletion releases no reservation
    (whose release would wake the group on its own): only the placed-pod change can."""
    for zone, node in (("a", pool.nodes[0]), ("b", pool.nodes[1]), ("c", pool.nodes[2])):
        await pool.create(f"busy-{zone}", labels={"app": "busy"}, nodeName=node)
    await eventually(
        lambda: pool.all_bound(["busy-a", "busy-b", "busy-c"]), within=30, what="a busy pod in each zone"
    )
    await client.CustomObjectsApi(pool.api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", pool.namespace, "podgroups", pod_group("shy", min_count=2)
    )
    anti = {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "busy"}}}
    names = ["shy-0", "shy-1"]
    for name in names:
        await pool.create(
            name,
            labels={"app": "shy"},
            schedulingGroup={"podGroupName": "shy"},
            affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [anti]}},
        )
    groups = bindery.runtime.runners[f"rm-{pool.token}"].podgroups

    async def parked() -> bool:
        group = groups._groups.get((pool.namespace, "shy"))
        return group is not None and group.rules is not None

    await eventually(parked, within=30, what="the gang refused by its rules and parked")
    await client.CoreV1Api(pool.api).delete_namespaced_pod(
        name="busy-c", namespace=pool.namespace, grace_period_seconds=0
    )
    placed = await eventually(lambda: pool.all_bound(names), within=30, what="the gang bound")
    assert zone_counts(pool, placed) == {"c": 2}, placed


async def test_pod_group_members_anti_affine_to_each_other_are_refused_not_stacked(pool: Pool) -> None:
    """Rules between members are not sent to the RM (the members have no nodes yet): the group is
    refused up front, naming the rule, before anything is reserved."""
    await client.CustomObjectsApi(pool.api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", pool.namespace, "podgroups", pod_group("pair", min_count=2)
    )
    names = ["pair-0", "pair-1"]
    for name in names:
        await pool.create(
            name,
            labels={"app": "pair"},
            schedulingGroup={"podGroupName": "pair"},
            affinity=hostname_anti("pair"),
        )

    async def refused() -> list[str]:
        notes = [
            e.get("note", "") for e in await events_of(pool.api, namespace=pool.namespace, pod_name="pair-0")
        ]
        return [n for n in notes if "required pod anti-affinity selects member" in n]

    await eventually(refused, within=60, what="the group refused naming the rule")
    assert await pool.nodes_of(names) == {"pair-0": None, "pair-1": None}


async def test_the_placed_pods_are_synced_only_once_namespace_labels_are_listed(bindery: Bindery) -> None:
    """An anti-affinity term with a namespaceSelector reads namespace labels: a cycle that went on
    before the namespace watch listed would find no namespace in scope and ignore the term."""
    runtime = bindery.runtime
    placed = runtime.placed
    assert placed is not None
    # Polled, each call bounded at 0 s: the cache's events belong to the operator's loop (its own
    # thread), and setting them does not wake a waiter on this test's loop, so one long
    # `wait_synced(30.0)` here returned only when something else woke this loop, 15 s later.
    await eventually(lambda: placed.wait_synced(0.0), within=30, what="the placed-pod cache synced")
    labels = runtime.namespace_labels
    assert labels is not None, "the namespace watch was not started with the placed-pod watch"
    assert labels.lists >= 1
    assert labels.labels("default") is not None


async def test_pod_group_members_sharing_a_host_port_are_not_bound_together_with_node_check_basic(
    basic_pool: Pool,
) -> None:
    """Host ports between members are not sent to the RM, which stacks both on one node; the rules
    are checked again for group members whatever nodeCheck says, so the group is refused."""
    pool = basic_pool
    await client.CustomObjectsApi(pool.api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", pool.namespace, "podgroups", pod_group("duo", min_count=2)
    )
    names = ["duo-0", "duo-1"]
    for name in names:
        await pool.create(
            name,
            schedulingGroup={"podGroupName": "duo"},
            containers=[
                {
                    "name": "c",
                    "image": "registry.invalid/pause",
                    "ports": [{"containerPort": 80, "hostPort": 8080}],
                }
            ],
        )

    async def refused() -> list[str]:
        notes = [
            e.get("note", "") for e in await events_of(pool.api, namespace=pool.namespace, pod_name="duo-0")
        ]
        return [n for n in notes if "host ports" in n]

    await eventually(refused, within=60, what="the group refused for its members' host ports")
    assert await pool.nodes_of(names) == {"duo-0": None, "duo-1": None}
