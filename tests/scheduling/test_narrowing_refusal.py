"""Found in review: a narrowed pod the RM refuses late leaves the later pods' spread counted against a
phantom: a DoNotSchedule zone spread is broken among the bound pods."""

from __future__ import annotations

import asyncio
import collections

from bindery.kube.placed import PlacedPodCache
from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import Reservation, ReservationRequest, ReservationState
from bindery.scheduling.cycle import schedule_one
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.fakes import Calls, FakeBinder, FakeConditions, FakeEvents, FakeNodes, FakePods
from tests.scheduling.test_inflight_domains import HOST, ZONE, PickingRM, _allows, spread_pod


class FullZoneRM(PickingRM):
    """Zone z0 is full: a request allowing only z0 nodes is refused, slowly (a retried 503, a slow
    search); otherwise the last allowed node with room, after the usual latency."""

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.requests.append(request)
        terms = request.placement.model_dump(by_alias=True, exclude_none=True)["requiredNodeAffinity"]
        allowed = [n for n in self.nodes if not terms or any(_allows(t, n.labels, n.name) for t in terms)]
        room = [n.name for n in allowed if n.labels[ZONE] != "z0"]
        for _ in range(self.latency if room else 400):
            await asyncio.sleep(0)
        if not room:
            raise RMUnschedulable("zone z0 is full (test)", reason="zone z0 is full (test)")
        return Reservation(
            id=f"r-{request.pod.uid}",
            node=sorted(room)[-1],
            state=ReservationState.RESERVED,
            pod_uid=request.pod.uid,
            scheduler_name=request.pod.scheduler_name,
        )


async def test_a_late_refusal_of_a_narrowed_pod_leaves_bound_pods_skewed_past_max_skew() -> None:
    calls = Calls()
    nodes = [NodeProjection(name=f"n{i}", labels={HOST: f"n{i}", ZONE: f"z{i % 3}"}) for i in range(6)]
    cache = PlacedPodCache(nodes=lambda: nodes)
    rm = FullZoneRM(calls, nodes, seed=0)
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
    outcomes = await asyncio.gather(*(schedule_one(pod=i, profile=profile, ports=ports) for i in infos))
    zone = {n.name: n.labels[ZONE] for n in nodes}
    bound = {i.name: o.node for i, o in zip(infos, outcomes, strict=True) if o.bound}
    per_zone = collections.Counter(zone[node] for node in bound.values() if node)
    counts = [per_zone.get(z, 0) for z in ("z0", "z1", "z2")]
    # kube-scheduler, one pod at a time, counts z0 (eligible, 0 pods) and binds no pod past skew 1
    assert max(counts) - min(counts) <= 1, f"bound {bound}: zone counts {counts}"
