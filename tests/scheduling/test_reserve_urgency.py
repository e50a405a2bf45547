"""Which reserves go to the RM in a request of their own (bindery.rm.batching: urgent calls).

A reserve another cycle may wait for (a pod with inter-pod rules: its Deployment's later pods wait
for its zone or its node) is urgent; a plain pod's is not, and leaves with the commits queued
meanwhile: on a plain backlog the separate requests bought nothing and cost the RM one request
more per few pods.
"""

from __future__ import annotations

import dataclasses

from bindery.rm.batching import URGENT_RESERVE
from bindery.rm.models import Reservation, ReservationRequest
from bindery.scheduling.podspec import PodInfo
from tests.scheduling.fakes import Calls
from tests.scheduling.test_inflight_domains import Cluster, PickingRM, spread_pod, zoned_nodes


class UrgencyRM(PickingRM):
    """Records whether each reserve was sent as urgent (the caller's URGENT_RESERVE)."""

    def __init__(self) -> None:
        super().__init__(Calls(), zoned_nodes(9), seed=0)
        self.urgent: dict[str, bool] = {}

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        self.urgent[request.pod.uid] = URGENT_RESERVE.get()
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
