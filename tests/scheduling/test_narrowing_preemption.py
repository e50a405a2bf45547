"""Found in review: a narrowed request (zone In [one], maybe hostname In [a few]) still asks the RM for a
preemption plan: with no room in that part the RM proposes evicting lower-priority pods there,
while the zones the spread allows have room (kube-scheduler preempts only when no node fits)."""

from __future__ import annotations

import asyncio

from bindery.kube.placed import PlacedPodCache
from bindery.scheduling.cycle import schedule_one
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.fakes import Calls, FakeBinder, FakeConditions, FakeEvents, FakeNodes, FakePods
from tests.scheduling.test_inflight_domains import HOST, ZONE, PickingRM, spread_pod


async def test_a_narrowed_request_asks_for_no_preemption_plan() -> None:
    calls = Calls()
    nodes = [NodeProjection(name=f"n{i}", labels={HOST: f"n{i}", ZONE: f"z{i % 3}"}) for i in range(6)]
    cache = PlacedPodCache(nodes=lambda: nodes)
    rm = PickingRM(calls, nodes, seed=0)
    fake_pods = FakePods(calls)
    ports = Ports(
        nodes=FakeNodes(calls, {n.name: n for n in nodes}),
        pods=fake_pods,
        binder=FakeBinder(calls),
        events=FakeEvents(calls),
        conditions=FakeConditions(calls),
        placed=cache,
    )
    profile = Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=rm)
    infos = [spread_pod(f"p{i}") for i in range(4)]
    for info in infos:
        fake_pods.pods[info.uid] = info
    await asyncio.gather(*(schedule_one(pod=i, profile=profile, ports=ports) for i in infos))

    def narrowed(request) -> bool:  # type: ignore[no-untyped-def]
        terms = request.placement.model_dump(by_alias=True, exclude_none=True)["requiredNodeAffinity"]
        return any(
            e["key"] == ZONE and e["operator"] == "In" and len(e["values"]) == 1
            for t in terms
            for e in t["matchExpressions"]
        )

    first = next(r for r in rm.requests if narrowed(r))
    affinity = first.placement.model_dump(by_alias=True, exclude_none=True)["requiredNodeAffinity"]
    assert first.preemption_policy != "PreemptLowerPriority", (
        f"narrowed request {affinity} asks for a preemption plan ({first.preemption_policy})"
    )
