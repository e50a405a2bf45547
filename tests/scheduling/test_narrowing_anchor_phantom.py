"""Found in review: the anchor assumption (a narrowed pod counted on one node of its zone before the RM
names its node) is read by *other* pods' hostname rules: a pod of another Deployment whose cycle
began earlier (so it does not wait for the narrowed one) is sent next to the anchor, where the
narrowed pod never lands: its required pod affinity is broken."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import Reservation, ReservationRequest
from bindery.scheduling.podspec import PodInfo
from tests.scheduling.fakes import Calls
from tests.scheduling.test_inflight_domains import HOST, Cluster, PickingRM, spread_pod, zoned_nodes


def pod(name: str, labels: dict[str, str], affinity: dict[str, Any]) -> PodInfo:
    return PodInfo.from_body(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels},
            "spec": {"schedulerName": "bindery", "containers": [{"name": "c"}], "affinity": affinity},
        }
    )


class GatedRM(PickingRM):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gates: dict[str, asyncio.Event] = {}
        self.pick: dict[str, Any] = {}

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.requests.append(request)
        uid = request.pod.uid
        if uid in self.gates:
            await self.gates[uid].wait()
        else:
            await asyncio.sleep(0)
        allowed = sorted(n.name for n in self.allowed(request))
        if not allowed:
            raise RMUnschedulable("no node allowed (test)", reason="no node allowed (test)")
        node = self.pick[uid](allowed) if uid in self.pick else allowed[-1]
        return self.reservation(request, node)


async def until(condition: Callable[[], bool], *, what: str, turns: int = 10_000) -> None:
    """Let the cycles run (event loop turns, no clock) until `condition` holds; fail past `turns`."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not reached within {turns} loop turns: {what}")


async def test_an_earlier_pods_hostname_affinity_is_not_satisfied_by_an_anchor() -> None:
    rm = GatedRM(Calls(), zoned_nodes(9), seed=0)
    cluster = Cluster(rm)
    to_q = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "q"}}}
        ]
    }
    x = pod("x", {"app": "x"}, {"podAntiAffinity": to_q})  # q waits for x's node (symmetry)
    q = pod(
        "q",
        {"app": "q"},
        {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "g"}}}
                ]
            }
        },
    )
    g = [spread_pod(f"g{i}") for i in range(3)]
    rm.gates = {"uid-x": asyncio.Event(), "uid-g1": asyncio.Event()}
    anchors: dict[str, str] = {}

    def next_to_anchor(allowed: list[str]) -> str:
        g1 = cluster.cache.get("uid-g1")
        if g1 is None:  # not assumed anywhere yet (the code before narrowing)
            return allowed[0]
        anchors["g1"] = g1.node
        return g1.node if g1.node in allowed else allowed[0]

    rm.pick["uid-q"] = next_to_anchor

    # g1 lands on the last node of its region, not on its anchor (the first)
    def requested() -> set[str]:
        return {r.pod.uid for r in rm.requests}

    tasks = {"x": asyncio.create_task(cluster.cycle(x))}
    await until(lambda: "uid-x" in requested(), what="x held at the RM")
    tasks["q"] = asyncio.create_task(cluster.cycle(q))
    await until(lambda: len(cluster.cache.in_flight) == 2, what="q's cycle begun (before the g pods')")
    for info in g:
        tasks[info.name] = asyncio.create_task(cluster.cycle(info))
    await until(lambda: "uid-g1" in requested(), what="g1 held at the RM, narrowed")
    rm.gates["uid-x"].set()
    q_outcome = await tasks["q"]
    rm.gates["uid-g1"].set()
    outcomes = {name: await task for name, task in tasks.items()}
    bound = {name: o.node for name, o in outcomes.items() if o.bound}
    if not q_outcome.bound:  # refused (no g pod placed yet): what a sequential scheduler does
        return
    g_nodes = {bound[name] for name in ("g0", "g1", "g2") if name in bound}
    assert bound["q"] in g_nodes, f"q on {bound['q']} (g1's anchor {anchors.get('g1')}), g pods on {bound}"
