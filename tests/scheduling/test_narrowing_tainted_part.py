"""Found in review: `narrowing` picks a domain's part (hostname In [...]) among the pod's *candidates*, which
ignore taints and cordons: the part may hold only nodes the pod cannot run on, so the RM refuses a
pod that fits elsewhere (parked as Unschedulable, FailedScheduling, a preemption plan asked)."""

from __future__ import annotations

import asyncio

from bindery.kube.placed import PlacedPodCache
from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import Reservation, ReservationRequest, ReservationState
from bindery.scheduling.cycle import schedule_one
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.fakes import Calls, FakeBinder, FakeConditions, FakeEvents, FakeNodes, FakePods
from tests.scheduling.test_inflight_domains import HOST, ZONE, PickingRM, _allows, spread_pod

TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


class TaintAwareRM(PickingRM):
    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.requests.append(request)
        for _ in range(self.latency):
            await asyncio.sleep(0)
        terms = request.placement.model_dump(by_alias=True, exclude_none=True)["requiredNodeAffinity"]
        allowed = sorted(
            n.name
            for n in self.nodes
            if not n.taints
            and not n.unschedulable
            and (not terms or any(_allows(t, n.labels, n.name) for t in terms))
        )
        if not allowed:
            raise RMUnschedulable("no node allowed (test)", reason="no node allowed (test)")
        return Reservation(
            id=f"r-{request.pod.uid}",
            node=allowed[0],
            state=ReservationState.RESERVED,
            pod_uid=request.pod.uid,
            scheduler_name=request.pod.scheduler_name,
        )


async def test_no_pod_of_a_burst_is_refused_when_every_zone_has_free_untainted_nodes() -> None:
    calls = Calls()
    # per zone: a tainted control-plane node first by name ("a-cp-…"), then two workers
    nodes = [
        NodeProjection(name=f"a-cp-{z}", labels={HOST: f"a-cp-{z}", ZONE: f"z{z}"}, taints=(TAINT,))
        for z in range(3)
    ] + [NodeProjection(name=f"w{i}", labels={HOST: f"w{i}", ZONE: f"z{i % 3}"}) for i in range(6)]
    cache = PlacedPodCache(nodes=lambda: nodes)
    rm = TaintAwareRM(calls, nodes, seed=0)
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
    infos = [spread_pod(f"p{i}") for i in range(6)]
    for info in infos:
        fake_pods.pods[info.uid] = info
    outcomes = await asyncio.gather(*(schedule_one(pod=i, profile=profile, ports=ports) for i in infos))
    refused = {
        i.name: o.failure.message for i, o in zip(infos, outcomes, strict=True) if not o.bound and o.failure
    }
    assert not refused, refused
