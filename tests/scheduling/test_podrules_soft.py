"""The soft inter-pod rules (bindery.podrules.soft) as weighted node preferences, per rule.

Why: ScheduleAnyway spread, preferred pod (anti-)affinity and kube-scheduler's default spreading were
dropped (issue 19), so a Deployment under a binpacking RM landed on one node. Each test checks the
``(weight, nodeSelectorTerm)`` list the RM is sent against the score kube-scheduler v1.36 computes
(podtopologyspread/scoring.go, interpodaffinity/scoring.go), worked out by hand in the docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bindery.adapters.placed import PlacedPodCache
from bindery.podrules.model import NO_SOFT
from bindery.rm.models import Placement
from bindery.scheduling.placementrules import InFlight, rules_preferences, rules_verdict
from bindery.scheduling.podspec import PodInfo, max_items, reservation_request
from bindery.scheduling.ports import NodeProjection

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "rs", "controller": True}


def node(name: str, zone: str | None = None) -> NodeProjection:
    labels = {HOST: name}
    if zone is not None:
        labels[ZONE] = zone
    return NodeProjection(name=name, labels=labels)


def body(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
    owned: bool = False,
    node_name: str | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "labels": dict(labels or {}),
    }
    if owned:
        metadata["ownerReferences"] = [_OWNER]
    full_spec: dict[str, Any] = {"schedulerName": "bindery", "containers": [{"name": "c"}], **(spec or {})}
    if node_name:
        full_spec["nodeName"] = node_name
    return {
        "metadata": metadata,
        "spec": full_spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def any_spread(key: str = ZONE, max_skew: int = 1) -> dict[str, Any]:
    return {
        "maxSkew": max_skew,
        "topologyKey": key,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app": "web"}},
    }


def preferred(kind: str, weight: int, key: str, **selector: str) -> dict[str, Any]:
    term = {"topologyKey": key, "labelSelector": {"matchLabels": selector}}
    return {kind: {_PREFERRED: [{"weight": weight, "podAffinityTerm": term}]}}


class World:
    def __init__(self, nodes: Sequence[NodeProjection]) -> None:
        self.nodes = list(nodes)
        self.cache = PlacedPodCache(nodes=lambda: self.nodes)

    def put(self, pod: dict[str, Any], node_name: str) -> None:
        pod["spec"]["nodeName"] = node_name
        pod["status"]["phase"] = "Running"
        self.cache.on_event("ADDED", pod)

    def prefer(self, pod: Mapping[str, Any]) -> list[tuple[int, dict[str, Any]]] | None:
        found = rules_preferences(PodInfo.from_body(pod), self.cache)
        return None if found is None else [(w, dict(t)) for w, t in found.terms]


def zone_in(*zones: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": ZONE, "operator": "In", "values": list(zones)}]}


def host_in(*hosts: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": HOST, "operator": "In", "values": list(hosts)}]}


def web(name: str, **extra: Any) -> dict[str, Any]:
    return body(name, labels={"app": "web"}, **extra)


# -- PodTopologySpread, ScheduleAnyway -------------------------------------------------------------


def test_schedule_anyway_zone_spread_prefers_the_zones_with_fewer_matching_pods() -> None:
    """Zones a (2 pods), b (1), c (0), log(3 + 2) = 1.61 per pod: raw 3, 2, 0; normalised
    100·(3 + 0 − s)/3 = 0, 33, 100. Zone a, the lowest, gets no term."""
    world = World([node("a1", "a"), node("a2", "a"), node("b1", "b"), node("c1", "c")])
    for name, where in (("w1", "a1"), ("w2", "a2"), ("w3", "b1")):
        world.put(web(name), where)
    world.put(body("other", labels={"app": "db"}), "c1")  # not selected: does not count
    assert world.prefer(web("new", spec={"topologySpreadConstraints": [any_spread()]})) == [
        (100, zone_in("c")),
        (33, zone_in("b")),
    ]


def test_schedule_anyway_spread_with_equal_counts_prefers_nothing() -> None:
    world = World([node("a1", "a"), node("b1", "b")])
    world.put(web("w1"), "a1")
    world.put(web("w2"), "b1")
    assert world.prefer(web("new", spec={"topologySpreadConstraints": [any_spread()]})) == []


def test_a_do_not_schedule_spread_is_no_preference() -> None:
    pod = web(
        "new", spec={"topologySpreadConstraints": [{**any_spread(), "whenUnsatisfiable": "DoNotSchedule"}]}
    )
    assert PodInfo.from_body(pod).soft is NO_SOFT


# -- InterPodAffinity, preferred terms -------------------------------------------------------------


def test_preferred_anti_affinity_is_a_preference_for_the_other_hosts() -> None:
    """n1 runs a web pod: −50 there, 0 elsewhere; normalised 0 and 100. Weights are positive only,
    so "avoid n1" is "prefer n2 and n3", in one term."""
    world = World([node("n1"), node("n2"), node("n3")])
    world.put(web("w1"), "n1")
    pod = web("new", spec={"affinity": preferred("podAntiAffinity", 50, HOST, app="web")})
    assert world.prefer(pod) == [(100, host_in("n2", "n3"))]


def test_preferred_affinity_weighs_matching_pods_per_domain() -> None:
    """Weight 10 per db pod in the zone: a 2 pods (20), b 1 (10), c 0; normalised 100, 50, 0."""
    world = World([node("a1", "a"), node("b1", "b"), node("c1", "c")])
    world.put(body("d1", labels={"app": "db"}), "a1")
    world.put(body("d2", labels={"app": "db"}), "a1")
    world.put(body("d3", labels={"app": "db"}), "b1")
    pod = web("new", spec={"affinity": preferred("podAffinity", 10, ZONE, app="db")})
    assert world.prefer(pod) == [(100, zone_in("a")), (50, zone_in("b"))]


def test_an_existing_pods_preferred_anti_affinity_steers_a_plain_pod_away() -> None:
    """Symmetry (processExistingPod): a running pod's preferred anti-affinity toward app=web weighs
    against its host for a web pod that states no rule at all."""
    world = World([node("n1"), node("n2")])
    world.put(
        body(
            "loner",
            labels={"app": "loner"},
            spec={"affinity": preferred("podAntiAffinity", 80, HOST, app="web")},
        ),
        "n1",
    )
    assert world.prefer(web("new")) == [(100, host_in("n2"))]
    assert (
        world.prefer(body("unrelated", labels={"app": "db"})) is None
    )  # its terms select app=web only: nothing to score


def test_an_existing_pods_required_affinity_draws_the_pod_it_selects() -> None:
    """hardPodAffinityWeight 1: a running pod whose required affinity selects the incoming pod makes
    its zone preferred."""
    required = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "web"}}}
            ]
        }
    }
    world = World([node("a1", "a"), node("b1", "b")])
    world.put(body("fan", labels={"app": "fan"}, spec={"affinity": required}), "b1")
    assert world.prefer(web("new")) == [(100, zone_in("b"))]


# -- default spreading -----------------------------------------------------------------------------


def test_a_replicaset_pod_is_spread_by_default_over_hosts_and_zones() -> None:
    """Defaults hostname maxSkew 3 and zone maxSkew 5, log(5) = 1.61: n1 (2 pods, zone a) raw
    2·1.61 + 2 + 2·1.61 + 4 = 12, n2 and n3 6; normalised 100·(12 + 6 − s)/12 = 50, 100, 100.
    n2 and n3 are zones b and c exactly, so the term is by zone."""
    labels = {"app": "web", "pod-template-hash": "5d8f"}
    world = World([node("n1", "a"), node("n2", "b"), node("n3", "c")])
    world.put(body("w1", labels=labels, owned=True), "n1")
    world.put(body("w2", labels=labels, owned=True), "n1")
    assert world.prefer(body("new", labels=labels, owned=True)) == [(100, zone_in("b", "c"))]


def test_default_spreading_is_off_without_an_owner_or_with_a_spread_of_the_pods_own() -> None:
    labels = {"app": "web", "pod-template-hash": "5d8f"}
    world = World([node("n1", "a"), node("n2", "b")])
    world.put(body("w1", labels=labels, owned=True), "n1")
    assert world.prefer(body("bare", labels=labels)) is None
    hard = {"topologySpreadConstraints": [{**any_spread(HOST), "whenUnsatisfiable": "DoNotSchedule"}]}
    assert PodInfo.from_body(body("own", labels=labels, owned=True, spec=hard)).soft is NO_SOFT


def test_default_spreading_ignores_a_statefulsets_per_pod_labels() -> None:
    """Each StatefulSet pod has its own pod-name label; the selector leaves it out, or no pod but
    itself would match."""
    world = World([node("n1", "a"), node("n2", "b")])

    def member(i: int) -> dict[str, Any]:
        labels = {
            "app": "db",
            "statefulset.kubernetes.io/pod-name": f"db-{i}",
            "apps.kubernetes.io/pod-index": str(i),
        }
        return body(f"db-{i}", labels=labels, owned=True)

    world.put(member(0), "n1")
    assert world.prefer(member(1)) == [(100, zone_in("b"))]


# -- caps, and the plain pod -----------------------------------------------------------------------


def test_terms_stay_within_the_contract_cap_beside_the_pods_own_preferences() -> None:
    """120 nodes in 120 zones with 0..6 matching pods each: six weighted terms of about 17 zones.
    With 62 preferred terms of its own, the pod has 2 left: the weights are coarsened (to 100 and 50)
    until 2 terms say it."""
    nodes = [node(f"n{i:03}", f"z{i:03}") for i in range(120)]
    world = World(nodes)
    for i in range(120):
        for j in range(i % 7):
            world.put(web(f"w{i}-{j}"), f"n{i:03}")
    own = [
        {
            "weight": 1,
            "preference": {"matchExpressions": [{"key": "k", "operator": "In", "values": [str(i)]}]},
        }
        for i in range(62)
    ]
    spec = {"topologySpreadConstraints": [any_spread()], "affinity": {"nodeAffinity": {_PREFERRED: own}}}
    pod = web("new", spec=spec)
    terms = world.prefer(pod)
    assert terms is not None
    assert 1 <= len(terms) <= 2
    assert terms[0][0] == 100
    first = terms[0][1]["matchExpressions"]
    if first[0]["operator"] == "In":  # no matching pod: z000 is most preferred
        assert "z000" in first[0]["values"]
    else:  # the complement is shorter: said as NotIn
        assert all(e["operator"] == "NotIn" and "z000" not in e["values"] for e in first)
    assert all(len(e["values"]) <= 256 for e in first)
    info = PodInfo.from_body(pod)
    request = reservation_request(
        pod=info, ttl_seconds=60, preferred_node_affinity=[*info.preferred_terms, *terms]
    )
    assert len(request.placement.preferred_node_affinity or ()) <= max_items(
        Placement, "preferred_node_affinity"
    )


def test_a_plain_pod_gets_nothing_and_costs_one_lookup() -> None:
    world = World([node("n1", "a"), node("n2", "b")])
    world.put(web("w1"), "n1")
    plain = PodInfo.from_body(web("new"))
    assert plain.soft is NO_SOFT
    assert world.prefer(web("new")) is None


def test_explain_names_the_preferred_domains_and_a_deleted_pod_stops_steering() -> None:
    world = World([node("n1"), node("n2")])
    loner = body(
        "loner", labels={"app": "loner"}, spec={"affinity": preferred("podAntiAffinity", 80, HOST, app="web")}
    )
    world.put(loner, "n1")
    found = rules_preferences(PodInfo.from_body(web("new")), world.cache)
    assert found is not None
    assert found.summary == "soft rules prefer hostname n2 (weight 100)"
    world.cache.on_event("DELETED", loner)
    assert not world.cache.preferring_toward("default")
    assert world.prefer(web("new")) is None


def test_a_deployments_pods_in_one_burst_wait_for_each_others_node_and_plain_pods_do_not() -> None:
    """Without the wait, every pod of a burst scores the same empty domains and all go together."""
    labels = {"app": "web", "pod-template-hash": "5d8f"}
    flight = InFlight()
    first = flight.begin(PodInfo.from_body(body("r1", labels=labels, owned=True)))
    second = flight.begin(PodInfo.from_body(body("r2", labels=labels, owned=True)))
    plain = flight.begin(PodInfo.from_body(body("p", labels=labels)))
    related = flight.earlier_related(second, namespace_labels=lambda ns: None)
    assert related == [first]
    assert flight.earlier_related(plain, namespace_labels=lambda ns: None) == []
    other = flight.begin(PodInfo.from_body(body("o", labels={"app": "other"}, owned=True)))
    assert flight.earlier_related(other, namespace_labels=lambda ns: None) == []


def test_nodes_the_hard_rules_exclude_are_not_scored() -> None:
    """kube-scheduler scores only the nodes its filters passed: with n1 excluded by the pod's own
    required anti-affinity, n2 and n3 score the same and nothing is preferred (scored with n1, they
    would have got a term that says nothing the hard rule does not)."""
    labels = {"app": "web", "pod-template-hash": "5d8f"}
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "web"}}}
            ]
        }
    }
    world = World([node("n1", "a"), node("n2", "b"), node("n3", "c")])
    world.put(body("w1", labels=labels, owned=True, spec={"affinity": anti}), "n1")
    pod = PodInfo.from_body(body("new", labels=labels, owned=True, spec={"affinity": anti}))
    verdict = rules_verdict(pod, world.cache)
    assert verdict is not None
    found = rules_preferences(pod, world.cache, verdict)
    assert found is not None
    assert found.terms == ()


# -- review findings: cost and payload on large clusters ---------------------------------------------


def test_avoiding_a_few_hosts_of_many_is_said_with_notin_not_a_list_of_every_other_host() -> None:
    """Default spreading with 2 of 40 hosts occupied: "prefer the 38 others" was an `In` list of 38
    hostnames (1,996 of 2,000 nodes on a large cluster: 27 KB per request); `NotIn` the 2 says the
    same for the nodes the pod may use (every one carries the hostname label)."""
    world = World([node(f"n{i}") for i in range(40)])
    world.put(body("w1", labels={"app": "web"}, owned=True), "n0")
    world.put(body("w2", labels={"app": "web"}, owned=True), "n1")
    terms = world.prefer(body("new", labels={"app": "web"}, owned=True))
    assert terms is not None
    values = [len(e["values"]) for _, t in terms for e in t.get("matchExpressions", [])]
    assert max(values) <= 2, terms
    assert [(w, t) for w, t in terms if w == 100] == [
        (100, {"matchExpressions": [{"key": HOST, "operator": "NotIn", "values": ["n0", "n1"]}]})
    ]


def test_a_wide_preferred_term_that_does_not_select_the_pod_costs_it_no_scoring() -> None:
    """A placed pod whose preferred anti-affinity reaches every namespace (namespaceSelector {})
    but selects app=db: a plain app=web pod gets nothing, and no node is scored for it."""
    world = World([node("n1"), node("n2")])
    term = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "db"}}, "namespaceSelector": {}}
    wide = body(
        "watcher",
        labels={"app": "watcher"},
        namespace="monitoring",
        spec={"affinity": {"podAntiAffinity": {_PREFERRED: [{"weight": 50, "podAffinityTerm": term}]}}},
    )
    world.put(wide, "n1")
    scored: list[str] = []
    nodes = world.nodes

    def counting() -> list[NodeProjection]:
        scored.append("nodes")
        return nodes

    world.cache = PlacedPodCache(nodes=counting)
    world.cache.on_event("ADDED", wide)
    assert world.cache.preferring_toward("default")
    assert world.prefer(web("new")) is None
    assert scored == []
