"""Found in review: a narrowed pod the RM refuses late leaves the later pods' spread counted against a
phantom: a DoNotSchedule zone spread is broken among the bound pods."""

from __future__ import annotations

import asyncio
import collections

from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import Reservation, ReservationRequest
from tests.scheduling.fakes import Calls
from tests.scheduling.test_inflight_domains import ZONE, Cluster, PickingRM, spread_pod, zoned_nodes


class FullZoneRM(PickingRM):
    """Zone z0 is full: a request allowing only z0 nodes is refused, slowly (a retried 503, a slow
    search); otherwise the last allowed node with room, after the usual latency."""

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.requests.append(request)
        allowed = self.allowed(request)
        room = [n.name for n in allowed if n.labels[ZONE] != "z0"]
        for _ in range(self.latency if room else 400):
            await asyncio.sleep(0)
        if not room:
            raise RMUnschedulable("zone z0 is full (test)", reason="zone z0 is full (test)")
        return self.reservation(request, sorted(room)[-1])


async def test_a_late_refusal_of_a_narrowed_pod_leaves_no_bound_pod_past_max_skew() -> None:
    rm = FullZoneRM(Calls(), zoned_nodes(6), seed=0)
    nodes = rm.nodes
    cluster = Cluster(rm)
    infos = [spread_pod(f"p{i}") for i in range(4)]
    outcomes = await cluster.run(infos)
    zone = {n.name: n.labels[ZONE] for n in nodes}
    bound = {i.name: o.node for i, o in zip(infos, outcomes, strict=True) if o.bound}
    per_zone = collections.Counter(zone[node] for node in bound.values() if node)
    counts = [per_zone.get(z, 0) for z in ("z0", "z1", "z2")]
    # kube-scheduler, one pod at a time, counts z0 (eligible, 0 pods) and binds no pod past skew 1
    assert max(counts) - min(counts) <= 1, f"bound {bound}: zone counts {counts}"
