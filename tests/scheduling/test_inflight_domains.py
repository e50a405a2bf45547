"""A burst of one group's pods with a zone spread and hostname anti-affinity: the later pods go on
once the earlier ones were sent to a zone each, instead of waiting for their nodes.

The fake RM picks a random node among those the request allows (its own matcher, below), answers
after the test lets it, and may refuse; the placements are checked by a checker written here from
the rules' definitions (no code shared with Bindery's filters).
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import pytest

from bindery.adapters.placed import PlacedPodCache
from bindery.rm.errors import RMUnschedulable
from bindery.rm.models import Reservation, ReservationRequest, ReservationState
from bindery.scheduling.cycle import CycleOutcome, schedule_one
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.fakes import Calls, FakeBinder, FakeConditions, FakeEvents, FakeNodes, FakePods, FakeRM

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def allows(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    for requirement in term.get("matchExpressions") or ():
        value = labels.get(requirement["key"])
        values = requirement.get("values") or []
        op = requirement["operator"]
        if (
            (op == "In" and value not in values)
            or (op == "NotIn" and value in values)
            or (op == "Exists" and value is None)
            or (op == "DoesNotExist" and value is not None)
        ):
            return False
    for requirement in term.get("matchFields") or ():
        values = requirement.get("values") or []
        if (requirement["operator"] == "In") != (name in values):
            return False
    return True


class PickingRM(FakeRM):
    """Places each pod on a random node its request allows and fitting `room` pods per node,
    `latency` event-loop turns after the call; refuses the uids in `refuse`."""

    def __init__(self, calls: Calls, nodes: Sequence[NodeProjection], *, seed: int) -> None:
        super().__init__(calls)
        self.nodes = nodes
        self.random = random.Random(seed)
        self.refuse: set[str] = set()
        self.inside = 0
        self.most_inside = 0
        self.latency = 20

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.requests.append(request)
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            for _ in range(self.latency):  # other cycles run meanwhile, as during an RM round trip
                await asyncio.sleep(0)
            if request.pod.uid in self.refuse:
                self.refuse.discard(request.pod.uid)
                raise RMUnschedulable("no room in the zone (test)", reason="no room in the zone (test)")
            allowed = self.allowed(request)
            if not allowed:
                raise RMUnschedulable("no node allowed (test)", reason="no node allowed (test)")
            node = self.random.choice(sorted(n.name for n in allowed))
        finally:
            self.inside -= 1
        return self.reservation(request, node)

    def allowed(self, request: ReservationRequest) -> list[NodeProjection]:
        """The nodes the request's required node affinity allows, in order."""
        terms = request.placement.model_dump(by_alias=True, exclude_none=True)["requiredNodeAffinity"]
        return [n for n in self.nodes if not terms or any(allows(t, n.labels, n.name) for t in terms)]

    @staticmethod
    def reservation(request: ReservationRequest, node: str) -> Reservation:
        return Reservation(
            id=f"r-{request.pod.uid}",
            node=node,
            state=ReservationState.RESERVED,
            pod_uid=request.pod.uid,
            scheduler_name=request.pod.scheduler_name,
        )


def zoned_nodes(count: int) -> list[NodeProjection]:
    """Nodes n0… with their own hostnames, in zones z0, z1, z2 in turn."""
    return [NodeProjection(name=f"n{i}", labels={HOST: f"n{i}", ZONE: f"z{i % 3}"}) for i in range(count)]


class Cluster:
    """The nodes behind `rm`, the placed-pod cache and the ports one profile's cycles share."""

    def __init__(self, rm: PickingRM) -> None:
        calls = rm.calls
        nodes = list(rm.nodes)
        self.cache = PlacedPodCache(nodes=lambda: nodes)
        self.pods = FakePods(calls)
        self.ports = Ports(
            nodes=FakeNodes(calls, {n.name: n for n in nodes}),
            pods=self.pods,
            binder=FakeBinder(calls),
            events=FakeEvents(calls),
            conditions=FakeConditions(calls),
            placed=self.cache,
        )
        self.profile = Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=rm)

    def cycle(self, pod: PodInfo) -> Coroutine[Any, Any, CycleOutcome]:
        self.pods.pods[pod.uid] = pod
        return schedule_one(pod=pod, profile=self.profile, ports=self.ports)

    async def run(self, pods: Sequence[PodInfo]) -> list[CycleOutcome]:
        """The pods' cycles, all at once."""
        return list(await asyncio.gather(*map(self.cycle, pods)))


def spread_pod(name: str, *, group: str = "g", keys: Sequence[str] = (ZONE,)) -> PodInfo:
    selector = {"matchLabels": {"app": group}}
    return PodInfo.from_body(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"app": group}},
            "spec": {
                "schedulerName": "bindery",
                "containers": [{"name": "c"}],
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": key,
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": selector,
                    }
                    for key in keys
                ],
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": HOST, "labelSelector": selector}
                        ]
                    }
                },
            },
        }
    )


def violations(placements: Mapping[str, str], zone_of: Mapping[str, str]) -> list[str]:
    """The group's rules over its final placements: one pod per node, zones within one pod."""
    found: list[str] = []
    per_node = collections.Counter(placements.values())
    found += [f"{count} pods on node {node}" for node, count in per_node.items() if count > 1]
    per_zone = collections.Counter(zone_of[node] for node in placements.values())
    counts = [per_zone.get(zone, 0) for zone in sorted(set(zone_of.values()))]
    if counts and max(counts) - min(counts) > 1:
        found.append(f"zone counts {counts} skew past 1")
    return found


async def burst(
    *, pods: int, nodes: int, seed: int, refuse: int = 0, keys: Sequence[str] = (ZONE,)
) -> tuple[PickingRM, dict[str, str], list[CycleOutcome]]:
    rm = PickingRM(Calls(), zoned_nodes(nodes), seed=seed)
    rm.refuse = {f"uid-p{i}" for i in random.Random(seed).sample(range(pods), refuse)}
    cluster = Cluster(rm)
    infos = [spread_pod(f"p{i}", keys=keys) for i in range(pods)]
    outcomes = await cluster.run(infos)
    placements = {info.uid: o.node for info, o in zip(infos, outcomes, strict=True) if o.bound and o.node}
    # The pods not bound once more, at once (a NodeCheck refusal is retried, as the queue would).
    again = [info for info, outcome in zip(infos, outcomes, strict=True) if not outcome.bound]
    retried = await cluster.run(again)
    placements.update(
        {info.uid: o.node for info, o in zip(again, retried, strict=True) if o.bound and o.node}
    )
    return rm, placements, outcomes


async def test_a_groups_pods_are_reserved_many_at_a_time_over_three_zones_and_break_no_rule() -> None:
    """Before, each pod waited for the node of every earlier one: one reserve at a time. Now each
    goes to a part of a zone (five nodes per zone, twelve pods: parts of two or three nodes)."""
    rm, placements, outcomes = await burst(pods=12, nodes=15, seed=1)
    assert all(outcome.outcome is Outcome.BOUND for outcome in outcomes), [o.failure for o in outcomes]
    assert violations(placements, {f"n{i}": f"z{i % 3}" for i in range(15)}) == []
    assert rm.most_inside >= 6


@pytest.mark.parametrize("seed", range(8))
async def test_random_bursts_with_refusals_break_no_rule_among_the_bound(seed: int) -> None:
    """An earlier pod the RM refuses was counted in its zone by the pods that went on meanwhile;
    NodeCheck counts the pods as they are when each binds, so no bound pod breaks the rules."""
    nodes = 9 + seed
    rm, placements, _ = await burst(pods=nodes - 2, nodes=nodes, seed=seed, refuse=2)
    assert violations(placements, {f"n{i}": f"z{i % 3}" for i in range(nodes)}) == []
    assert len(placements) >= nodes - 2 - 2 - 3  # the refused ones, and a few that may follow them
    assert rm.most_inside >= 2


async def test_a_pod_whose_narrowed_request_the_rm_refused_is_sent_again_without_the_narrowing() -> None:
    """The zone chosen for it may be full while another has room: its next cycle lets the RM choose."""
    rm = PickingRM(Calls(), zoned_nodes(3), seed=0)  # one node per zone
    cluster = Cluster(rm)
    pods = [spread_pod(f"p{i}") for i in range(4)]

    def zone_ins(uid: str) -> list[list[list[str]]]:
        """Per request of the pod: the values of each zone ``In`` it carries."""
        found = []
        for request in [r for r in rm.requests if r.pod.uid == uid]:
            placement = request.placement.model_dump(by_alias=True, exclude_none=True)
            found.append(
                [
                    list(r["values"])
                    for term in placement["requiredNodeAffinity"]
                    for r in term["matchExpressions"]
                    if r["key"] == ZONE and r["operator"] == "In"
                ]
            )
        return found

    rm.refuse = {"uid-p1"}
    first = await cluster.run(pods[:3])
    assert [o.bound for o in first] == [True, True, True]
    # p1 was narrowed (p2 in flight behind it): the spread's two zones and one of them chosen;
    # refused there, it was reserved again in the same cycle with the spread's zones only.
    narrowed, wide = zone_ins("uid-p1")
    assert [len(zones) for zones in narrowed] == [2, 1]
    assert [len(zones) for zones in wide] == [2]
    assert next(r for r in rm.requests if r.pod.uid == "uid-p1").preemption_policy is None
    assert not cluster.cache.in_flight.may_narrow("uid-p1")
    assert violations({o.node: o.node for o in first if o.node}, {f"n{i}": f"z{i}" for i in range(3)}) == []


async def test_a_spread_over_hostnames_too_needs_the_earlier_pods_nodes() -> None:
    """A pod counted in a zone is not counted on a host: with a hostname spread as well, the group's
    pods wait for each other's nodes, as before."""
    rm, placements, outcomes = await burst(pods=6, nodes=9, seed=2, keys=(ZONE, HOST))
    assert all(o.bound for o in outcomes)
    assert rm.most_inside == 1
    assert violations(placements, {f"n{i}": f"z{i % 3}" for i in range(9)}) == []
