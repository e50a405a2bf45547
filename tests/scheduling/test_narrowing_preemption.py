"""Found in review: a narrowed request (zone In [one], maybe hostname In [a few]) still asks the RM for a
preemption plan: with no room in that part the RM proposes evicting lower-priority pods there,
while the zones the spread allows have room (kube-scheduler preempts only when no node fits)."""

from __future__ import annotations

from tests.scheduling.fakes import Calls
from tests.scheduling.test_inflight_domains import ZONE, Cluster, PickingRM, spread_pod, zoned_nodes


async def test_a_narrowed_request_asks_for_no_preemption_plan() -> None:
    rm = PickingRM(Calls(), zoned_nodes(6), seed=0)
    await Cluster(rm).run([spread_pod(f"p{i}") for i in range(4)])

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
