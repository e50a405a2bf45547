"""Which reserves go to the RM in a request of their own (bindery.rm.batching: urgent calls).

A reserve another cycle may wait for (a pod with inter-pod rules: its Deployment's later pods wait
for its zone or its node) is urgent; a plain pod's is not, and leaves with the commits queued
meanwhile: on a plain backlog the separate requests bought nothing and cost the RM one request
more per few pods.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from bindery.rm.batching import URGENT_RESERVE
from bindery.rm.models import Reservation, ReservationRequest
from bindery.scheduling.podspec import PodInfo
from tests.scheduling.fakes import Calls
from tests.scheduling.test_inflight_domains import HOST, Cluster, PickingRM, spread_pod, zoned_nodes
from tests.scheduling.test_narrowing_anchor_phantom import until


class UrgencyRM(PickingRM):
    """Records whether each reserve was sent as urgent (the caller's URGENT_RESERVE)."""

    def __init__(self) -> None:
        super().__init__(Calls(), zoned_nodes(9), seed=0)
        self.urgent: dict[str, bool] = {}
        self.held: dict[str, asyncio.Event] = {}  # reserves answered only once their event is set

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.urgent[request.pod.uid] = URGENT_RESERVE.get()
        if (gate := self.held.get(request.pod.uid)) is not None:
            await gate.wait()
        return await super().reserve(request)


def plain_pod(name: str) -> PodInfo:
    return PodInfo.from_body(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"app": "plain"}},
            "spec": {"schedulerName": "bindery", "containers": [{"name": "c"}]},
        }
    )


async def test_a_plain_pods_reserve_is_not_urgent_and_a_pod_with_rules_is() -> None:
    rm = UrgencyRM()
    cluster = Cluster(rm)
    outcomes = await cluster.run([plain_pod("a"), plain_pod("b"), spread_pod("s1"), spread_pod("s2")])
    assert all(o.bound for o in outcomes), [o.failure for o in outcomes]
    assert rm.urgent == {"uid-a": False, "uid-b": False, "uid-s1": True, "uid-s2": True}


async def test_without_a_placed_pod_cache_every_reserve_stays_urgent() -> None:
    rm = UrgencyRM()
    cluster = Cluster(rm)
    cluster.ports = dataclasses.replace(cluster.ports, placed=None)
    outcomes = await cluster.run([plain_pod("a")])
    assert all(o.bound for o in outcomes), [o.failure for o in outcomes]
    assert rm.urgent == {"uid-a": True}


def affine_pod(name: str, *, near: str) -> PodInfo:
    """A pod that must share a node with an ``app=<near>`` pod, or with one of its own group
    (``app=cache``: the first one may go anywhere)."""
    selector = {"matchExpressions": [{"key": "app", "operator": "In", "values": [near, "cache"]}]}
    return PodInfo.from_body(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"app": "cache"}},
            "spec": {
                "schedulerName": "bindery",
                "containers": [{"name": "c"}],
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": HOST, "labelSelector": selector}
                        ]
                    }
                },
            },
        }
    )


@pytest.mark.parametrize(("near", "urgent"), [("plain", True), ("other", False)])
async def test_a_plain_pods_reserve_is_urgent_while_a_group_whose_rules_select_it_is_in_flight(
    near: str, urgent: bool
) -> None:
    """Found in review: the later pods of such a group wait for the plain pod's node. Held at the
    RM, the first one keeps its group in flight while the plain pod reserves (which waits for
    nobody: a pod without rules waits only for pods whose anti-affinity selects it)."""
    rm = UrgencyRM()
    gate = asyncio.Event()
    rm.held["uid-c0"] = gate
    cluster = Cluster(rm)
    first = asyncio.ensure_future(cluster.cycle(affine_pod("c0", near=near)))
    await until(lambda: "uid-c0" in rm.urgent, what="the first pod's reserve held at the RM")
    plain = await cluster.cycle(plain_pod("a"))
    gate.set()
    assert (await first).bound
    assert plain.bound
    assert rm.urgent["uid-a"] is urgent
