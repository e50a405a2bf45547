"""The inter-pod rules (bindery.podrules) as kube-scheduler v1.36 applies them, field by field.

Each test places pods one at a time the way a binpacking RM would (the first allowed node by
name), or checks the node requirements the RM is sent, against the placed-pod cache.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from bindery.adapters.placed import PlacedPodCache
from bindery.constraints import matches_required_affinity
from bindery.controller.watches.placed import remembered
from bindery.explain.facts import explain, render
from bindery.podrules.model import HostPort, PlacedPod
from bindery.podrules.parse import placed_pod, pod_rules
from bindery.scheduling.placementrules import InFlight, rules_verdict
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
_uids = itertools.count()


def node(
    name: str, zone: str | None = None, *, taints: Sequence[Mapping[str, Any]] = (), **labels: str
) -> NodeProjection:
    all_labels = {HOST: name, **labels}
    if zone is not None:
        all_labels[ZONE] = zone
    return NodeProjection(name=name, labels=all_labels, taints=tuple(taints))


def body(
    name: str = "",
    *,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    spread: Sequence[Mapping[str, Any]] = (),
    affinity: Sequence[Mapping[str, Any]] = (),
    anti: Sequence[Mapping[str, Any]] = (),
    ports: Sequence[Mapping[str, Any]] = (),
    node_name: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    deleting: bool = False,
    phase: str = "Pending",
) -> dict[str, Any]:
    uid = f"uid-{next(_uids)}"
    spec: dict[str, Any] = {"schedulerName": "bindery", "containers": [{"name": "c", "ports": list(ports)}]}
    pod_affinity: dict[str, Any] = {}
    if affinity:
        pod_affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": list(affinity)}
    if anti:
        pod_affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": list(anti)}
    if pod_affinity:
        spec["affinity"] = pod_affinity
    if spread:
        spec["topologySpreadConstraints"] = list(spread)
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = list(tolerations)
    metadata: dict[str, Any] = {
        "name": name or uid,
        "namespace": namespace,
        "uid": uid,
        "labels": dict(labels or {}),
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def zone_spread(max_skew: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "maxSkew": max_skew,
        "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
        **extra,
    }


def term(key: str = HOST, **selector: str) -> dict[str, Any]:
    return {"topologyKey": key, "labelSelector": {"matchLabels": selector}}


class World:
    def __init__(
        self, nodes: Sequence[NodeProjection], namespaces: Mapping[str, Mapping[str, str]] | None = None
    ) -> None:
        self.node_list = list(nodes)
        self.cache = PlacedPodCache(nodes=lambda: self.node_list, namespace_labels=(namespaces or {}).get)

    def put(self, pod_body: dict[str, Any], node_name: str) -> None:
        pod_body["spec"]["nodeName"] = node_name
        self.cache.on_event("ADDED", pod_body)

    def allowed(self, pod_body: Mapping[str, Any]) -> list[str]:
        """The nodes the RM may pick for this pod: its own constraints and the rules' term."""
        info = PodInfo.from_body(pod_body)
        verdict = rules_verdict(info, self.cache)
        terms = [verdict.term()] if verdict is not None and verdict.term() else []
        return [
            n.name
            for n in self.node_list
            if matches_required_affinity(terms=[t for t in terms if t], labels=n.labels, node_name=n.name)
            and all(n.labels.get(k) == v for k, v in info.node_selector.items())
        ]

    def refusal(self, pod_body: Mapping[str, Any]) -> str | None:
        verdict = rules_verdict(PodInfo.from_body(pod_body), self.cache)
        return None if verdict is None else verdict.refusal()

    def binpack(self, pod_body: dict[str, Any]) -> str | None:
        """Place the pod on the first allowed node, as a binpacking RM fills the first node."""
        allowed = self.allowed(pod_body)
        if not allowed:
            return None
        self.put(pod_body, allowed[0])
        return allowed[0]


def three_zones() -> list[NodeProjection]:
    return [node("a1", "a"), node("b1", "b"), node("c1", "c"), node("a2", "a")]


# -- PodTopologySpread ------------------------------------------------------------------------------


def test_zone_spread_max_skew_1_places_six_pods_two_per_zone() -> None:
    world = World(three_zones())
    placed = [world.binpack(body(labels={"app": "web"}, spread=[zone_spread()])) for _ in range(6)]
    zones = sorted(n[0] for n in placed if n)
    assert zones == ["a", "a", "b", "b", "c", "c"]


def test_spread_counts_only_matching_pods_of_the_same_namespace_not_terminating() -> None:
    world = World(three_zones())
    world.put(body(labels={"app": "web"}, namespace="other"), "b1")  # another namespace
    world.put(body(labels={"app": "db"}), "c1")  # does not match
    world.put(body(labels={"app": "web"}, deleting=True), "a1")  # terminating (upstream #87621)
    world.put(body(labels={"app": "web"}), "b1")
    assert world.allowed(body(labels={"app": "web"}, spread=[zone_spread()])) == ["a1", "c1", "a2"]


def test_spread_max_skew_2_allows_one_more() -> None:
    world = World(three_zones())
    world.put(body(labels={"app": "web"}), "a1")
    assert world.allowed(body(labels={"app": "web"}, spread=[zone_spread(2)])) == ["a1", "b1", "c1", "a2"]
    world.put(body(labels={"app": "web"}), "a1")
    assert world.allowed(body(labels={"app": "web"}, spread=[zone_spread(2)])) == ["b1", "c1"]


def test_spread_without_self_match_does_not_add_the_pod_itself() -> None:
    world = World(three_zones())
    world.put(body(labels={"app": "web"}), "a1")
    # The incoming pod is not a "web" pod: a+0-0 = 1 <= 1, every zone is allowed.
    assert world.allowed(body(labels={"app": "other"}, spread=[zone_spread()])) == ["a1", "b1", "c1", "a2"]


def test_min_domains_counts_the_minimum_as_zero_while_domains_are_missing() -> None:
    world = World([node("a1", "a"), node("b1", "b")])
    world.put(body(labels={"app": "web"}), "a1")
    world.put(body(labels={"app": "web"}), "b1")
    web = {"labels": {"app": "web"}}
    assert world.allowed(body(**web, spread=[zone_spread()])) == ["a1", "b1"]  # type: ignore[arg-type]
    # minDomains 3 with 2 zones: the global minimum is 0, so 1 + 1 - 0 > 1 everywhere.
    refusal = world.refusal(body(**web, spread=[zone_spread(minDomains=3)]))  # type: ignore[arg-type]
    assert refusal == "topology spread excludes all 2 nodes the pod may run on (a1, b1)"


def test_node_affinity_policy_honor_counts_only_domains_the_pod_may_use() -> None:
    world = World([node("a1", "a", pool="x"), node("b1", "b", pool="x"), node("c1", "c", pool="y")])
    world.put(body(labels={"app": "web"}), "a1")
    world.put(body(labels={"app": "web"}), "b1")
    # Honor (default): zone c is not a domain (pool y), the minimum is 1: a and b both allowed.
    honored = body(labels={"app": "web"}, spread=[zone_spread()], node_selector={"pool": "x"})
    assert world.allowed(honored) == ["a1", "b1"]
    # Ignore: zone c (0 pods) counts, so a and b (1 + 1 - 0 > 1) are refused; c is the pod's
    # nodeSelector's to refuse: no node is left.
    ignored = body(
        labels={"app": "web"}, spread=[zone_spread(nodeAffinityPolicy="Ignore")], node_selector={"pool": "x"}
    )
    assert world.allowed(ignored) == []
    assert world.refusal(ignored) == "topology spread excludes all 2 nodes the pod may run on (a1, b1)"


def test_node_taints_policy_honor_skips_domains_on_untolerated_nodes() -> None:
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    world = World([node("a1", "a"), node("b1", "b"), node("c1", "c", taints=[taint])])
    world.put(body(labels={"app": "web"}), "a1")
    world.put(body(labels={"app": "web"}), "b1")
    # Ignore (default): zone c counts with 0, so a and b are refused.
    assert world.allowed(body(labels={"app": "web"}, spread=[zone_spread()])) == ["c1"]
    # Honor: c's taint is not tolerated, c is no domain, minimum 1: a and b are allowed again.
    honor = body(labels={"app": "web"}, spread=[zone_spread(nodeTaintsPolicy="Honor")])
    assert world.allowed(honor) == ["a1", "b1", "c1"]
    tolerated = body(
        labels={"app": "web"},
        spread=[zone_spread(nodeTaintsPolicy="Honor")],
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
    )
    assert world.allowed(tolerated) == ["c1"]


def test_match_label_keys_narrows_the_spread_to_the_same_revision() -> None:
    world = World(three_zones())
    for _ in range(2):
        world.put(body(labels={"app": "web", "rev": "1"}), "a1")
    new = body(labels={"app": "web", "rev": "2"}, spread=[zone_spread(matchLabelKeys=["rev"])])
    assert world.allowed(new) == ["a1", "b1", "c1", "a2"]  # the rev 1 pods do not count
    old = body(labels={"app": "web", "rev": "1"}, spread=[zone_spread(matchLabelKeys=["rev"])])
    assert world.allowed(old) == ["b1", "c1"]


def test_a_node_without_the_topology_key_is_refused_by_spread() -> None:
    world = World([node("a1", "a"), NodeProjection(name="bare", labels={HOST: "bare"})])
    assert world.allowed(body(labels={"app": "web"}, spread=[zone_spread()])) == ["a1"]


def test_schedule_anyway_is_no_rule() -> None:
    assert not pod_rules(
        body(labels={"app": "web"}, spread=[zone_spread(whenUnsatisfiable="ScheduleAnyway")])
    )


def test_hostname_spread_over_many_nodes_sends_the_shorter_list() -> None:
    nodes = [node(f"n{i:03}", "a") for i in range(300)]
    world = World(nodes)
    world.put(body(labels={"app": "web"}), "n000")
    spread = {**zone_spread(), "topologyKey": HOST}
    verdict = rules_verdict(PodInfo.from_body(body(labels={"app": "web"}, spread=[spread])), world.cache)
    assert verdict is not None
    assert verdict.term() == {
        "matchExpressions": [
            {"key": HOST, "operator": "Exists"},
            {"key": HOST, "operator": "NotIn", "values": ["n000"]},
        ]
    }


# -- InterPodAffinity ---------------------------------------------------------------------------------


def test_hostname_anti_affinity_places_four_of_five_and_names_the_rule() -> None:
    nodes = [node(f"n{i}", "a") for i in range(4)]
    world = World(nodes)
    pods = [body(labels={"app": "web"}, anti=[term(app="web")]) for _ in range(5)]
    placed = [world.binpack(p) for p in pods]
    assert placed == ["n0", "n1", "n2", "n3", None]
    assert (
        world.refusal(pods[4]) == "pod anti-affinity excludes all 4 nodes the pod may run on (n0, n1, n2, n3)"
    )


def test_existing_pods_anti_affinity_refuses_a_pod_without_rules() -> None:
    world = World([node("n0", "a"), node("n1", "a"), node("n2", "b")])
    world.put(body(labels={"app": "db"}, anti=[term(ZONE, app="web")]), "n0")
    assert world.allowed(body(labels={"app": "web"})) == ["n2"]  # zone a is refused (symmetry)
    assert world.allowed(body(labels={"app": "cache"})) == ["n0", "n1", "n2"]


def test_existing_pods_anti_affinity_is_scoped_by_its_own_namespace() -> None:
    world = World([node("n0", "a"), node("n1", "b")])
    world.put(body(labels={"app": "db"}, namespace="data", anti=[term(app="web")]), "n0")
    assert world.allowed(body(labels={"app": "web"}, namespace="default")) == ["n0", "n1"]
    assert world.allowed(body(labels={"app": "web"}, namespace="data")) == ["n1"]


def test_anti_affinity_namespaces_and_namespace_selector() -> None:
    world = World(
        [node("n0", "a"), node("n1", "b"), node("n2", "c")], namespaces={"team-a": {"team": "a"}, "x": {}}
    )
    world.put(body(labels={"app": "web"}, namespace="team-a"), "n0")
    world.put(body(labels={"app": "web"}, namespace="x"), "n1")
    own = body(labels={"app": "web"}, anti=[term(app="web")])
    assert world.allowed(own) == ["n0", "n1", "n2"]  # only its own namespace, empty
    listed = body(anti=[{**term(app="web"), "namespaces": ["x"]}])
    assert world.allowed(listed) == ["n0", "n2"]
    selected = body(anti=[{**term(app="web"), "namespaceSelector": {"matchLabels": {"team": "a"}}}])
    assert world.allowed(selected) == ["n1", "n2"]
    everywhere = body(anti=[{**term(app="web"), "namespaceSelector": {}}])
    assert world.allowed(everywhere) == ["n2"]


def test_anti_affinity_allows_nodes_without_the_topology_key() -> None:
    world = World([node("n0", "a"), NodeProjection(name="bare", labels={})])
    world.put(body(labels={"app": "web"}), "n0")
    assert world.allowed(body(anti=[term(ZONE, app="web")])) == ["bare"]


def test_mismatch_label_keys_keeps_tenants_apart() -> None:
    world = World([node("n0", "a"), node("n1", "b")])
    world.put(body(labels={"tenant": "red", "app": "x"}), "n0")
    anti = {
        "topologyKey": HOST,
        "labelSelector": {"matchExpressions": [{"key": "tenant", "operator": "Exists"}]},
    }
    # Anti-affinity to every pod of *another* tenant: the red pod does not repel a red pod.
    red = body(labels={"tenant": "red"}, anti=[{**anti, "mismatchLabelKeys": ["tenant"]}])
    assert world.allowed(red) == ["n0", "n1"]
    blue = body(labels={"tenant": "blue"}, anti=[{**anti, "mismatchLabelKeys": ["tenant"]}])
    assert world.allowed(blue) == ["n1"]


def test_affinity_follows_the_matching_pods_zone() -> None:
    world = World([node("n0", "a"), node("n1", "b"), node("n2", "b")])
    world.put(body(labels={"app": "db"}), "n1")
    assert world.allowed(body(affinity=[term(ZONE, app="db")])) == ["n1", "n2"]


def test_affinity_with_match_label_keys_and_every_term_must_match_one_pod() -> None:
    world = World([node("n0", "a"), node("n1", "b")])
    world.put(body(labels={"app": "db", "shard": "1"}), "n0")
    world.put(body(labels={"app": "cache", "shard": "2"}), "n1")
    follows_shard = body(
        labels={"shard": "2"}, affinity=[{**term(ZONE, app="cache"), "matchLabelKeys": ["shard"]}]
    )
    assert world.allowed(follows_shard) == ["n1"]
    # Two terms: only a pod matching both counts (updateWithAffinityTerms); none does.
    both = body(affinity=[term(ZONE, app="db"), term(HOST, shard="2")])
    assert world.refusal(both) == "pod affinity excludes all 2 nodes the pod may run on (n0, n1)"


def test_first_pod_of_a_self_affinity_group_may_go_anywhere_with_the_key() -> None:
    world = World([node("n0", "a"), NodeProjection(name="bare", labels={})])
    first = body(labels={"app": "web"}, affinity=[term(ZONE, app="web")])
    assert world.allowed(first) == ["n0"]  # every node carrying the key
    stranger = body(labels={"app": "other"}, affinity=[term(ZONE, app="web")])
    assert world.refusal(stranger) == "pod affinity excludes all 2 nodes the pod may run on (bare, n0)"


def test_affinity_and_anti_affinity_count_terminating_pods() -> None:
    world = World([node("n0", "a"), node("n1", "b")])
    world.put(body(labels={"app": "web"}, deleting=True), "n0")
    assert world.allowed(body(anti=[term(app="web")])) == ["n1"]


# -- NodePorts ------------------------------------------------------------------------------------


def port(number: int, protocol: str = "TCP", ip: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"containerPort": 80, "hostPort": number, "protocol": protocol}
    if ip:
        entry["hostIP"] = ip
    return entry


@pytest.mark.parametrize(
    ("held", "wanted", "conflict"),
    [
        (port(8080), port(8080), True),
        (port(8080), port(8081), False),
        (port(8080, "UDP"), port(8080), False),
        (port(8080, ip="10.0.0.1"), port(8080, ip="10.0.0.2"), False),
        (port(8080, ip="10.0.0.1"), port(8080), True),  # 0.0.0.0 covers every address
        (port(8080), port(8080, ip="10.0.0.1"), True),
        (port(8080, ip="10.0.0.1"), port(8080, ip="10.0.0.1"), True),
    ],
)
def test_host_port_conflicts(held: dict[str, Any], wanted: dict[str, Any], conflict: bool) -> None:
    world = World([node("n0", "a"), node("n1", "a")])
    world.put(body(ports=[held]), "n0")
    assert world.allowed(body(ports=[wanted])) == (["n1"] if conflict else ["n0", "n1"])


def test_host_ports_are_excluded_by_hostname_when_every_node_has_its_own() -> None:
    world = World([node("n0", "a"), node("n1", "a"), node("n2", "a")])
    world.put(body(ports=[port(80)]), "n0")
    world.put(body(ports=[port(80)]), "n1")
    verdict = rules_verdict(PodInfo.from_body(body(ports=[port(80)])), world.cache)
    assert verdict is not None
    assert verdict.term() == {
        "matchExpressions": [{"key": HOST, "operator": "NotIn", "values": ["n0", "n1"]}]
    }
    assert world.allowed(body(ports=[port(80)])) == ["n2"]


def test_host_ports_fall_back_to_node_name_one_value_per_requirement_without_unique_hostnames() -> None:
    shared = {HOST: "same"}
    world = World([NodeProjection(name=f"n{i}", labels=shared) for i in range(3)])
    world.put(body(ports=[port(80)]), "n0")
    world.put(body(ports=[port(80)]), "n1")
    verdict = rules_verdict(PodInfo.from_body(body(ports=[port(80)])), world.cache)
    assert verdict is not None
    assert verdict.term() == {
        "matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["n0"]},
            {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]},
        ]
    }
    assert pod_rules(body(ports=[{"containerPort": 80}])).host_ports == ()


# -- the cache --------------------------------------------------------------------------------------


def test_cache_drops_finished_and_deleted_pods_and_prefers_the_watch_over_an_assumption() -> None:
    cache = PlacedPodCache()
    running = body(labels={"app": "web"}, node_name="n0", phase="Running")
    cache.on_event("ADDED", running)
    uid = running["metadata"]["uid"]
    watched = cache.get(uid)
    assert watched is not None
    assert not watched.assumed
    cache.assume(PlacedPod(uid=uid, namespace="default", node="n9", assumed=True))
    assert cache.get(uid) == watched
    cache.on_event("MODIFIED", {**running, "status": {"phase": "Succeeded"}})
    assert cache.get(uid) is None
    cache.on_event("ADDED", running)
    cache.on_event("DELETED", remembered(running))  # a relist's stand-in: the UID only
    assert len(cache) == 0
    assert not list(cache.namespaces())
    cache.assume(PlacedPod(uid="x", namespace="default", node="n1", host_ports=(HostPort(80),), assumed=True))
    assert [p.uid for p in cache.with_host_ports()] == ["x"]
    cache.forget("x")
    assert len(cache) == 0
    assert not list(cache.with_host_ports())


def test_placed_projection_keeps_only_what_the_rules_read() -> None:
    pod_body = body(labels={"app": "web"}, anti=[term(app="web")], ports=[port(80)], node_name="n0")
    pod_body["spec"]["containers"][0]["env"] = [{"name": "BIG", "value": "x" * 10_000}]
    projected = placed_pod(pod_body)
    assert projected is not None
    assert (projected.node, dict(projected.labels), projected.host_ports) == (
        "n0",
        {"app": "web"},
        (HostPort(80),),
    )
    assert len(projected.anti_affinity) == 1
    assert placed_pod(body(labels={"app": "web"})) is None  # on no node


# -- in-flight cycles ---------------------------------------------------------------------------------


def test_a_related_pod_waits_for_the_earlier_one_and_an_unrelated_one_does_not() -> None:
    async def scenario() -> None:
        flight = InFlight()
        first = PodInfo.from_body(body(labels={"app": "web"}, anti=[term(app="web")]))
        second = PodInfo.from_body(body(labels={"app": "web"}, anti=[term(app="web")]))
        plain = PodInfo.from_body(body(labels={"app": "other"}))
        one = flight.begin(first)
        two = flight.begin(second)
        three = flight.begin(plain)
        assert await flight.wait(three, namespace_labels=lambda ns: None, seconds=5) == 0
        assert await flight.wait(one, namespace_labels=lambda ns: None, seconds=5) == 0  # nothing earlier
        waiting = asyncio.ensure_future(flight.wait(two, namespace_labels=lambda ns: None, seconds=5))
        await asyncio.sleep(0)
        assert not waiting.done()
        flight.settle(first.uid)
        assert await asyncio.wait_for(waiting, 5) == 1

    asyncio.run(scenario())


def test_a_plain_pod_waits_for_an_earlier_pod_whose_anti_affinity_matches_it() -> None:
    async def scenario() -> None:
        flight = InFlight()
        repels = flight.begin(PodInfo.from_body(body(labels={"app": "db"}, anti=[term(app="web")])))
        web = flight.begin(PodInfo.from_body(body(labels={"app": "web"})))
        waiting = asyncio.ensure_future(flight.wait(web, namespace_labels=lambda ns: None, seconds=5))
        await asyncio.sleep(0)
        assert not waiting.done()
        flight.settle(repels.uid)
        assert await asyncio.wait_for(waiting, 5) == 1

    asyncio.run(scenario())


# -- what `bindery explain` prints --------------------------------------------------------------------


def test_explain_lines_name_each_rule_and_what_it_allows() -> None:
    world = World(three_zones())
    world.put(body(labels={"app": "web"}), "a1")
    world.put(body(labels={"app": "solo"}), "b1")
    incoming = body(labels={"app": "web"}, spread=[zone_spread()], anti=[term(app="solo")])
    verdict = rules_verdict(PodInfo.from_body(incoming), world.cache)
    assert verdict is not None
    lines = [effect.summary for effect in verdict.effects]
    assert lines == ["pod anti-affinity excludes 1 node: b1", "zone spread (maxSkew 1) allows zones b, c"]
    rendered = render(
        explain(pod=incoming, resource_manager="rm", events=[], reservations=[], placement_rules=lines)
    )
    assert "Placement rules:\n  pod anti-affinity excludes 1 node: b1\n  zone spread" in rendered


def test_existing_anti_affinity_reaching_other_namespaces_refuses_their_pods() -> None:
    world = World([node("n0", "a"), node("n1", "b")])
    repels = body(labels={"app": "db"}, namespace="data", anti=[{**term(app="web"), "namespaceSelector": {}}])
    world.put(repels, "n0")
    assert world.allowed(body(labels={"app": "web"}, namespace="default")) == ["n1"]
    world.cache.on_event("DELETED", repels)
    assert world.allowed(body(labels={"app": "web"}, namespace="default")) == ["n0", "n1"]
    assert not list(world.cache.anti_affinity_toward("default"))


def test_a_long_anti_affinity_list_is_split_under_the_contract_cap() -> None:
    nodes = [node(f"n{i:03}", "a") for i in range(300)]
    world = World(nodes)
    for n in nodes[:280]:
        world.put(body(labels={"app": "web"}), n.name)
    verdict = rules_verdict(PodInfo.from_body(body(anti=[term(app="web")])), world.cache)
    assert verdict is not None
    expressions = (verdict.term() or {})["matchExpressions"]
    assert [len(e["values"]) for e in expressions] == [256, 24]
    assert world.allowed(body(anti=[term(app="web")])) == [n.name for n in nodes[280:]]


def test_the_compiled_node_predicate_agrees_with_matches_term() -> None:
    import random

    from bindery.constraints import matches_term
    from bindery.podrules.filters import _compiled

    rng = random.Random(19)
    nodes = [
        NodeProjection(name=f"n{i}", labels={k: rng.choice("abc") for k in ("x", "y") if rng.random() < 0.7})
        for i in range(30)
    ]
    for _ in range(300):
        expressions = []
        for _ in range(rng.randint(0, 3)):
            op = rng.choice(["In", "NotIn", "Exists", "DoesNotExist"])
            e: dict[str, Any] = {"key": rng.choice("xy"), "operator": op}
            if op in ("In", "NotIn"):
                e["values"] = rng.sample("abc", rng.randint(1, 3))
            expressions.append(e)
        fields = [
            {
                "key": "metadata.name",
                "operator": rng.choice(["In", "NotIn"]),
                "values": [f"n{rng.randint(0, 29)}"],
            }
            for _ in range(rng.randint(0, 2))
        ]
        if not expressions and not fields:
            continue
        allows = _compiled(expressions, fields)
        term = {"matchExpressions": expressions, "matchFields": fields}
        for n in nodes:
            assert allows(n) == matches_term(term=term, labels=n.labels, node_name=n.name), (term, n)


@pytest.mark.parametrize("seed", range(4))
def test_the_excluded_nodes_are_those_the_compiled_predicate_refuses(seed: int) -> None:
    # _excluded answers with set operations on the snapshot's indexes (a one-In shortcut, and one
    # node per value for a key like the hostname, "h" here); _compiled tests node by node.
    import random

    from bindery.podrules.filters import _compiled, _excluded
    from bindery.podrules.nodes import NodeSnapshot

    rng = random.Random(seed)
    nodes = [
        NodeProjection(
            name=f"n{i}",
            labels={
                **{k: rng.choice(["a", "b", "c", ""]) for k in ("x", "y") if rng.random() < 0.7},
                **({"h": f"h{i}"} if seed % 2 == 0 or rng.random() < 0.8 else {}),
            },
        )
        for i in range(30)
    ]
    snapshot = NodeSnapshot.of(nodes)
    for _ in range(400):
        expressions = []
        for _ in range(rng.randint(0, 3)):
            op = rng.choice(["In", "NotIn", "Exists", "DoesNotExist"])
            key = rng.choice("xyh")
            e: dict[str, Any] = {"key": key, "operator": op}
            if op in ("In", "NotIn"):
                pool = [f"h{i}" for i in range(34)] if key == "h" else [*"abcd", ""]
                e["values"] = rng.sample(pool, rng.randint(0, 4))
                if not e["values"] and rng.random() < 0.5:
                    del e["values"]  # absent, as an empty list: no value
            expressions.append(e)
        fields = [
            {
                "key": "metadata.name",
                "operator": rng.choice(["In", "NotIn"]),
                "values": [f"n{rng.randint(0, 29)}"],
            }
            for _ in range(rng.randint(0, 1))
        ]
        allows = _compiled(expressions, fields)
        assert _excluded(snapshot, expressions, fields) == {n.name for n in nodes if not allows(n)}, (
            expressions,
            fields,
        )


def test_hostname_spread_past_the_value_cap_is_split_and_places_where_kube_scheduler_does() -> None:
    # 600 nodes, 300 of them holding a matching pod: 300 allowed and 300 refused hostnames, both
    # past the contract's 256 values per requirement. kube-scheduler places; so must the RM's term.
    nodes = [node(f"n{i:03}", "a") for i in range(600)]
    world = World(nodes)
    for n in nodes[:300]:
        world.put(body(labels={"app": "web"}), n.name)
    spread = {**zone_spread(), "topologyKey": HOST}
    incoming = body(labels={"app": "web"}, spread=[spread])
    verdict = rules_verdict(PodInfo.from_body(incoming), world.cache)
    assert verdict is not None
    expressions = (verdict.term() or {})["matchExpressions"]
    assert all(len(e.get("values", ())) <= 256 for e in expressions), [
        (e["operator"], len(e.get("values", ()))) for e in expressions
    ]
    assert world.allowed(incoming) == [n.name for n in nodes[300:]]


def test_two_spread_constraints_that_exclude_every_node_between_them_are_a_refusal() -> None:
    """Each constraint excludes one of the two nodes: no node is left, and Bindery says so itself
    instead of sending the RM a request no node satisfies (the refusal once kept only the last
    constraint's nodes, both being "topology spread")."""
    world = World([node("a1", "a"), node("b1", "b")])
    world.put(body(labels={"app": "web"}), "a1")  # zone a is one ahead for app=web
    world.put(body(labels={"tier": "x"}), "b1")  # host b1 is one ahead for tier=x
    host_spread = {**zone_spread(), "topologyKey": HOST, "labelSelector": {"matchLabels": {"tier": "x"}}}
    pod = body(labels={"app": "web", "tier": "x"}, spread=[zone_spread(), host_spread])
    assert world.allowed(pod) == []
    assert world.refusal(pod) == "topology spread excludes all 2 nodes the pod may run on (a1, b1)"
