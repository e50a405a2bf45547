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

from bindery.adapters.placed import PlacedPodCache
from bindery.podrules.filters import evaluate, narrowing
from bindery.rm.models import ReservationRequest
from bindery.scheduling.placementrules import _incoming
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
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
from tests.scheduling.test_podrules import body, term, zone_spread


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
    placements = {info.uid: o.node for info, o in zip(infos, outcomes, strict=True) if o.node}
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
    placements = {info.uid: o.node for info, o in zip(infos, outcomes, strict=True) if o.node}
    assert violations(placements, {f"n{i}": f"z{i % 3}" for i in range(15)}) == []


def test_narrowing_never_picks_a_node_the_verdict_did_not_judge() -> None:
    """Found in review: the narrowed request carries its hosts alone (the rules' requirements left
    out), so every host must be one the verdict judged; a node that joined the snapshot after the
    verdict is excluded by none of its effects, yet no rule was asked of it."""
    nodes = [NodeProjection(name=f"n{i}", labels={HOST: f"n{i}", ZONE: "ab"[i % 2]}) for i in range(4)]
    cache = PlacedPodCache(nodes=lambda: nodes)
    for i, name in enumerate(["n0", "n2"]):  # zone a holds two pods of the group, zone b none
        cache.on_event("ADDED", body(f"w{i}", labels={"app": "web"}, node_name=name, spread=[zone_spread()]))
    pod = _incoming(
        PodInfo.from_body(
            body("p", labels={"app": "web"}, spread=[zone_spread()], anti=[term(HOST, app="web")])
        )
    )
    verdict = evaluate(pod=pod, placed=cache, nodes=nodes, namespace_labels=cache.namespace_labels)
    assert [e.summary for e in verdict.effects][1] == "zone spread (maxSkew 1) allows zones b"
    # Three nodes join zone a after the verdict (a snapshot taken a moment later).
    later = nodes + [NodeProjection(name=f"m{j}", labels={HOST: f"m{j}", ZONE: "a"}) for j in range(3)]
    found = narrowing(pod=pod, verdict=verdict, nodes=later, key=ZONE, later=10)
    assert found is not None
    assert found.domain == "b", found  # zone a is refused by the spread
