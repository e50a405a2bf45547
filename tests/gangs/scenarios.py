"""Gang scenarios run the same way under Bindery (through the reference RM) and under kube-scheduler's
GangScheduling, so their outcomes can be compared (tests/gangs/compare.py) and asserted
(tests/gangs/test_gangs.py).

Each scenario owns a pool of kwok nodes (a label of its own), creates PodGroups
(scheduling.k8s.io/v1alpha2) and their member pods with the given scheduler name, and returns what
happened: which members were bound where, and how long from the last member's creation (or the room
being freed) to every member bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_kwok_node
from tests.workloads import POOL, eventually

ZONE = "topology.kubernetes.io/zone"
Layout = tuple[Mapping[str, Mapping[str, str]], Mapping[str, str]]
#: Each scenario's pool: node name suffix → extra labels, and CPUs by suffix. A harness that starts
#: a resource manager mirroring the pool creates it first (``Stage.pool`` is then a no-op), so the
#: RM starts with every node's capacity known.
LAYOUTS: dict[str, Layout] = {
    "room_for_seven": ({"0": {}, "1": {}}, {"0": "4", "1": "4"}),
    "two_groups": ({"0": {}, "1": {}}, {"0": "3", "1": "3"}),
    "topology": (
        {"a0": {ZONE: "a"}, "a1": {ZONE: "a"}, "b0": {ZONE: "b"}},
        {"a0": "2", "a1": "2", "b0": "3"},
    ),
}


@dataclasses.dataclass
class Result:
    scenario: str
    outcome: str
    #: seconds from the last member's creation (or the room freed) to all members bound
    seconds: float | None = None
    #: (b): seconds from the first group's pods deleted (finished) to the second group all bound
    follow_seconds: float | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


def pod_group(name: str, *, min_count: int, topology: Sequence[str] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if topology:
        spec["schedulingConstraints"] = {"topology": [{"key": key} for key in topology]}
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": spec,
    }


def member(name: str, *, group: str | None, scheduler: str, pool: str, cpu: str = "1") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "nodeSelector": {POOL: pool},
        "containers": [
            {"name": "main", "image": "registry.invalid/app:1", "resources": {"requests": {"cpu": cpu}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": {"name": name, "labels": {"gang": group or "none"}}, "spec": spec}


class Stage:
    """One namespace and one scheduler name on the plane; creates pools, groups and pods."""

    def __init__(
        self, *, api: client.ApiClient, namespace: str, scheduler: str, pool: str | None = None
    ) -> None:
        self.api = api
        #: the pool label value of this stage's nodes (a reference RM mirrors just these)
        self.pool_id = pool or uuid.uuid4().hex[:6]
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.scheduler = scheduler
        self.nodes: list[str] = []
        #: called with a group's name once every member is explained and none bound (the tests
        #: check there that the RM holds nothing for it)
        self.on_pending: Callable[[str], Awaitable[None]] | None = None

    async def pool(self, nodes: Mapping[str, Mapping[str, str]], cpu: Mapping[str, str]) -> str:
        """kwok nodes by name suffix → extra labels, with `cpu` each; returns the pool label value.

        Created once: a second call (the scenario's, after its harness made the pool) does nothing.
        """
        pool = self.pool_id
        if self.nodes:
            return pool
        for suffix, labels in nodes.items():
            name = f"gang-{pool}-{suffix}"
            await create_kwok_node(
                self.api,
                name=name,
                capacity={"cpu": cpu[suffix], "memory": "64Gi", "pods": "110"},
                labels={POOL: pool, **labels},
            )
            self.nodes.append(name)

        async def ready() -> bool:
            listed = await self.core.list_node(label_selector=f"{POOL}={pool}")
            return len(listed.items) == len(nodes) and all(
                any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
                for n in listed.items
            )

        await eventually(ready, within=60, what="kwok reporting the gang pool Ready")
        return pool

    async def cleanup(self) -> None:
        for name in self.nodes:
            with contextlib.suppress(client.ApiException):
                await self.core.delete_node(name=name)

    async def group(self, name: str, *, min_count: int, topology: Sequence[str] = ()) -> None:
        await self.custom.create_namespaced_custom_object(
            "scheduling.k8s.io",
            "v1alpha2",
            self.namespace,
            "podgroups",
            pod_group(name, min_count=min_count, topology=topology),
        )

    async def members(self, group: str | None, names: Sequence[str], *, pool: str) -> float:
        """Create the pods; returns the loop time right after the last was created."""
        for name in names:
            await self.core.create_namespaced_pod(
                self.namespace, member(name, group=group, scheduler=self.scheduler, pool=pool)
            )
        return asyncio.get_running_loop().time()

    async def pods(self, group: str) -> list[dict[str, Any]]:
        response = await self.core.list_namespaced_pod(
            self.namespace, label_selector=f"gang={group}", _preload_content=False
        )
        items: list[dict[str, Any]] = (await response.json())["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    async def bound(self, group: str) -> dict[str, str]:
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in await self.pods(group)
            if p["spec"].get("nodeName")
        }

    async def all_bound(self, group: str, count: int, *, since: float, within: float = 90.0) -> float:
        """Seconds from `since` to every one of `count` members bound (polled every 50 ms)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        bound: dict[str, str] = {}
        while loop.time() < deadline:
            bound = await self.bound(group)
            if len(bound) == count:
                return loop.time() - since
            await asyncio.sleep(0.05)
        raise AssertionError(
            f"only {len(bound)} of {count} members of {group} bound after {within:g}s: {bound}"
        )

    async def explained(self, group: str, count: int, *, within: float = 60.0) -> list[str]:
        """Wait until each of `count` unbound members carries PodScheduled=False; returns the messages."""

        async def messages() -> list[str] | None:
            found = []
            for pod in await self.pods(group):
                if pod["spec"].get("nodeName"):
                    return None
                condition = next(
                    (
                        c
                        for c in (pod.get("status") or {}).get("conditions") or ()
                        if c["type"] == "PodScheduled"
                    ),
                    None,
                )
                if condition is None or condition["status"] != "False" or not condition.get("message"):
                    return None
                found.append(str(condition["message"]))
            return found if len(found) == count else None

        try:
            found = await eventually(
                messages, within=within, what=f"every member of {group} explained and unbound"
            )
        except AssertionError as error:
            state = [
                (
                    p["metadata"]["name"],
                    p["spec"].get("nodeName"),
                    [
                        (c["status"], c.get("reason"), (c.get("message") or "")[:80])
                        for c in (p.get("status") or {}).get("conditions") or ()
                        if c["type"] == "PodScheduled"
                    ],
                )
                for p in await self.pods(group)
            ]
            raise AssertionError(f"{error}; the members now: {state}") from None
        if self.on_pending is not None:
            await self.on_pending(group)
        return found

    async def messages(self, group: str) -> list[str]:
        """The PodScheduled=False messages of the group's pods now (unbound ones only)."""
        found = []
        for pod in await self.pods(group):
            for condition in (pod.get("status") or {}).get("conditions") or ():
                if condition["type"] == "PodScheduled" and condition["status"] == "False":
                    found.append(str(condition.get("message") or ""))
        return found

    async def delete(self, group: str) -> float:
        """Delete the group's pods (they finished); returns the loop time the deletion was sent."""
        sent = asyncio.get_running_loop().time()
        await self.core.delete_collection_namespaced_pod(
            self.namespace, label_selector=f"gang={group}", grace_period_seconds=0
        )

        async def gone() -> bool:
            response = await self.core.list_namespaced_pod(self.namespace, label_selector=f"gang={group}")
            return not response.items

        await eventually(gone, within=60, what=f"the pods of {group} gone")
        return sent

    async def zones(self, bound: Mapping[str, str]) -> set[str]:
        zones = set()
        for node in set(bound.values()):
            zones.add((await self.core.read_node(node)).metadata.labels.get(ZONE, ""))
        return zones


async def resource_manager_ready(api: client.ApiClient, name: str) -> None:
    """Wait until the operator reports the ResourceManager Ready (its profile schedules), so that a
    scenario's times do not include the operator's start."""

    async def ready() -> bool:
        body = await client.CustomObjectsApi(api).get_cluster_custom_object(
            "bindery.dev", "v1alpha1", "resourcemanagers", name
        )
        conditions = (body.get("status") or {}).get("conditions") or ()
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    await eventually(ready, within=60, what=f"ResourceManager {name} Ready")


# -- the scenarios ---------------------------------------------------------------------------------


async def room_for_seven(stage: Stage) -> Result:
    """(a) A group of 8 x 1 CPU on 8 CPU with one taken by another pod: none bound, every member
    explained; the other pod deleted: all 8 bound."""
    result = Result(scenario="(a) 8 pods, room for 7, then room freed", outcome="")
    pool = await stage.pool(*LAYOUTS["room_for_seven"])
    await stage.members(None, ["blocker"], pool=pool)
    await stage.all_bound("none", 1, since=0.0)
    await stage.group("big", min_count=8)
    await stage.members("big", [f"big-{i}" for i in range(8)], pool=pool)
    messages = await stage.explained("big", 8)
    result.notes.append(f"pending reason: {messages[0]}")
    freed = await stage.delete("none")
    result.seconds = await stage.all_bound("big", 8, since=freed)
    result.outcome = "0/8 bound while 7 fit; 8/8 once room freed"
    return result


async def two_groups(stage: Stage, *, within: float = 90.0) -> Result:
    """(b) Two groups of 4 x 1 CPU on 6 CPU: one fully bound, the other fully pending; the first
    deleted (finished): the second fully bound."""
    result = Result(scenario="(b) two groups of 4, room for 6", outcome="")
    pool = await stage.pool(*LAYOUTS["two_groups"])
    await stage.group("left", min_count=4)
    await stage.group("right", min_count=4)
    # Interleaved creation: a pod-by-pod scheduler would split the room between the groups.
    created = 0.0
    for i in range(4):
        await stage.members("left", [f"left-{i}"], pool=pool)
        created = await stage.members("right", [f"right-{i}"], pool=pool)

    async def one_whole() -> str | None:
        left, right = len(await stage.bound("left")), len(await stage.bound("right"))
        if {left, right} == {0, 4}:
            return "left" if left == 4 else "right"
        return None

    try:
        first = await eventually(
            one_whole, within=within, what="one group fully bound, the other not at all", every=0.05
        )
    except AssertionError:
        split = (len(await stage.bound("left")), len(await stage.bound("right")))
        reasons = sorted({m[:100] for m in await stage.messages("left") + await stage.messages("right")})
        result.outcome = f"NEITHER group placed within {within:g} s: {split[0]}+{split[1]} bound"
        result.notes.append(f"waiting members say: {reasons}")
        return result
    result.seconds = asyncio.get_running_loop().time() - created
    second = "right" if first == "left" else "left"
    await stage.explained(second, 4)
    counts = sorted((len(await stage.bound("left")), len(await stage.bound("right"))))
    assert counts == [0, 4], f"a partial placement while the other group waited: {counts}"
    freed = await stage.delete(first)
    result.follow_seconds = await stage.all_bound(second, 4, since=freed)
    result.outcome = "one group 4/4, the other 0/4 (explained); the other 4/4 once the first finished"
    return result


async def topology(stage: Stage) -> Result:
    """(c) A group of 4 x 1 CPU asking for one zone, on zone a (2 nodes x 2 CPU) and zone b (1 x 3 CPU
    with 1 CPU more on a second node): all members within one zone."""
    result = Result(scenario="(c) topology: 4 pods within one zone", outcome="")
    pool = await stage.pool(*LAYOUTS["topology"])
    await stage.group("zoned", min_count=4, topology=[ZONE])
    created = await stage.members("zoned", [f"zoned-{i}" for i in range(4)], pool=pool)
    result.seconds = await stage.all_bound("zoned", 4, since=created)
    zones = await stage.zones(await stage.bound("zoned"))
    result.outcome = f"4/4 bound in zone(s) {sorted(zones)}"
    result.notes.append(f"zones: {sorted(zones)}")
    return result


SCENARIOS = (room_for_seven, two_groups, topology)
