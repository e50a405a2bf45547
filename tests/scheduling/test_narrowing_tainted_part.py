"""Found in review: `narrowing` picks a domain's part (hostname In [...]) among the pod's *candidates*, which
ignore taints and cordons: the part may hold only nodes the pod cannot run on, so the RM refuses a
pod that fits elsewhere (parked as Unschedulable, FailedScheduling, a preemption plan asked)."""

from __future__ import annotations

import asyncio

from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import Reservation, ReservationRequest
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.fakes import Calls
from tests.scheduling.test_inflight_domains import HOST, ZONE, Cluster, PickingRM, spread_pod

TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


class TaintAwareRM(PickingRM):
    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.requests.append(request)
        for _ in range(self.latency):
            await asyncio.sleep(0)
        allowed = sorted(n.name for n in self.allowed(request) if not n.taints and not n.unschedulable)
        if not allowed:
            raise RMUnschedulable("no node allowed (test)", reason="no node allowed (test)")
        return self.reservation(request, allowed[0])


async def test_no_pod_of_a_burst_is_refused_when_every_zone_has_free_untainted_nodes() -> None:
    # per zone: a tainted control-plane node first by name ("a-cp-…"), then two workers
    nodes = [
        NodeProjection(name=f"a-cp-{z}", labels={HOST: f"a-cp-{z}", ZONE: f"z{z}"}, taints=(TAINT,))
        for z in range(3)
    ] + [NodeProjection(name=f"w{i}", labels={HOST: f"w{i}", ZONE: f"z{i % 3}"}) for i in range(6)]
    rm = TaintAwareRM(Calls(), nodes, seed=0)
    infos = [spread_pod(f"p{i}") for i in range(6)]
    outcomes = await Cluster(rm).run(infos)
    refused = {
        i.name: o.failure.message for i, o in zip(infos, outcomes, strict=True) if not o.bound and o.failure
    }
    assert not refused, refused
