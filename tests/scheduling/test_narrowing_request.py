"""A request narrowed to some hosts of a zone carries those hosts, not the rules' requirements too.

On issue 19's rules backlog 98% of the reserves were narrowed to a part of a zone (``hostname In``
a dozen hosts, each one the rules allow), and each still carried the rules' requirements ANDed in:
``hostname NotIn`` every node the group's pods had taken, and every node where earlier pods were
being placed, about 290 values per request. The RM parsed, validated and fingerprinted them all to
choose among the same dozen hosts. Refused, the request is sent again without the narrowing: then
the rules' requirements are what keeps the pod off the taken nodes, so they must be back.
"""

from __future__ import annotations

from typing import Any

from bindery.rm.models import ReservationRequest
from tests.scheduling.fakes import Calls
from tests.scheduling.test_inflight_domains import (
    HOST,
    ZONE,
    Cluster,
    PickingRM,
    spread_pod,
    violations,
    zoned_nodes,
)


def requirements(request: ReservationRequest) -> list[tuple[str, str, list[str]]]:
    """The request's node requirements (one term here) as (key, operator, values)."""
    terms: list[dict[str, Any]] = request.placement.model_dump(by_alias=True, exclude_none=True)[
        "requiredNodeAffinity"
    ]
    assert len(terms) <= 1, terms
    return [
        (e["key"], e["operator"], list(e.get("values") or ()))
        for t in terms
        for e in t.get("matchExpressions", ())
    ]


def narrowed_to_hosts(request: ReservationRequest) -> bool:
    return any(key == HOST and op == "In" for key, op, _ in requirements(request))


async def test_a_request_narrowed_to_some_hosts_names_only_its_zone_and_those_hosts() -> None:
    rm = PickingRM(Calls(), zoned_nodes(15), seed=1)
    cluster = Cluster(rm)
    infos = [spread_pod(f"p{i}") for i in range(12)]
    outcomes = await cluster.run(infos)
    assert all(o.bound for o in outcomes), [o.failure for o in outcomes]
    narrowed = [r for r in rm.requests if narrowed_to_hosts(r)]
    assert len(narrowed) >= 6, [requirements(r) for r in rm.requests]
    for request in narrowed:
        kept = requirements(request)
        assert [(key, op) for key, op, _ in kept] == [(ZONE, "In"), (HOST, "In")], kept
    placements = {o.node: o.node for o in outcomes if o.node}
    assert violations(placements, {f"n{i}": f"z{i % 3}" for i in range(15)}) == []


async def test_a_refused_narrowed_request_is_sent_again_with_the_rules_requirements() -> None:
    rm = PickingRM(Calls(), zoned_nodes(15), seed=1)
    rm.refuse = {"uid-p7"}
    cluster = Cluster(rm)
    infos = [spread_pod(f"p{i}") for i in range(12)]
    outcomes = await cluster.run(infos)
    assert all(o.bound for o in outcomes), [o.failure for o in outcomes]
    first, again = [r for r in rm.requests if r.pod.uid == "uid-p7"]
    assert narrowed_to_hosts(first)
    assert not narrowed_to_hosts(again)
    kept = requirements(again)
    # The anti-affinity keeps it off the nodes its group's pods took (and the ones being placed).
    taken = {v for key, op, values in kept if key == HOST and op == "NotIn" for v in values}
    assert taken, kept
    assert outcomes[7].node not in taken
    placements = {o.node: o.node for o in outcomes if o.node}
    assert violations(placements, {f"n{i}": f"z{i % 3}" for i in range(15)}) == []
