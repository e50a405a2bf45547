"""The placed-pod cache's groups: a namespace's pods by label set, pods with anti-affinity by terms.

The filters match a selector once per group instead of once per pod (a backlog of N pods with
anti-affinity over their Deployment cost O(N²) selector matches, twice per pod). These tests hold
the groups to the pods the cache holds through additions, label and term changes, assumptions and
removals, and hold the verdicts to what the same rules give when every pod is its own group.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping
from typing import Any

from bindery.adapters.placed import PlacedPodCache
from bindery.podrules.filters import evaluate
from bindery.podrules.model import AffinityTerm, PlacedPod
from bindery.podrules.parse import placed_pod
from bindery.scheduling.placementrules import _incoming, _Without
from bindery.scheduling.podspec import PodInfo
from tests.scheduling.test_podrules import HOST, ZONE, body, node, term, zone_spread


def groups(cache: PlacedPodCache, namespace: str = "default") -> dict[tuple[tuple[str, str], ...], set[str]]:
    return {
        tuple(sorted(labels.items())): {p.uid for p in pods} for labels, pods in cache.label_groups(namespace)
    }


def anti_groups(cache: PlacedPodCache, namespace: str = "default") -> dict[tuple[str, str], set[str]]:
    """(owner namespace, first term's topology key) → UIDs, per group."""
    return {
        (owner, terms[0].topology_key): {p.uid for p in pods}
        for owner, terms, pods in cache.anti_affinity_groups_toward(namespace)
    }


def uid(pod_body: Mapping[str, Any]) -> str:
    return str(pod_body["metadata"]["uid"])


def test_label_groups_follow_additions_label_changes_and_removals() -> None:
    cache = PlacedPodCache()
    a = body("a", node_name="n1", labels={"app": "x"})
    b = body("b", node_name="n2", labels={"app": "x"})
    c = body("c", node_name="n1", labels={"app": "y"})
    for pod in (a, b, c):
        cache.on_event("ADDED", pod)
    assert groups(cache) == {(("app", "x"),): {uid(a), uid(b)}, (("app", "y"),): {uid(c)}}

    b["metadata"]["labels"] = {"app": "y"}
    cache.on_event("MODIFIED", b)
    assert groups(cache) == {(("app", "x"),): {uid(a)}, (("app", "y"),): {uid(b), uid(c)}}
    assert sorted(p.uid for p in cache.in_namespace("default")) == sorted([uid(a), uid(b), uid(c)])

    cache.on_event("DELETED", a)
    assert groups(cache) == {(("app", "y"),): {uid(b), uid(c)}}
    cache.on_event("DELETED", b)
    cache.on_event("DELETED", c)
    assert groups(cache) == {}
    assert list(cache.namespaces()) == []
    assert list(cache.in_namespace("default")) == []


def test_a_pod_moved_to_another_namespace_leaves_its_old_group() -> None:
    cache = PlacedPodCache()
    a = body("a", node_name="n1", labels={"app": "x"})
    cache.on_event("ADDED", a)
    a["metadata"]["namespace"] = "other"
    cache.on_event("MODIFIED", a)
    assert groups(cache) == {}
    assert groups(cache, "other") == {(("app", "x"),): {uid(a)}}


def test_an_assumed_pod_and_its_watched_copy_are_one_member_of_one_group() -> None:
    cache = PlacedPodCache()
    watched = body("a", node_name="n1", labels={"app": "x"}, anti=[term(app="x")])
    projection = placed_pod(watched)
    assert projection is not None
    cache.assume(dataclasses.replace(projection, assumed=True))
    assert groups(cache) == {(("app", "x"),): {uid(watched)}}
    cache.on_event("ADDED", watched)
    assert groups(cache) == {(("app", "x"),): {uid(watched)}}
    assert anti_groups(cache) == {("default", HOST): {uid(watched)}}
    cache.forget(uid(watched))  # the watched copy is the truth: forgetting the assumption keeps it
    assert groups(cache) == {(("app", "x"),): {uid(watched)}}


def test_anti_affinity_groups_follow_term_changes_and_removals() -> None:
    cache = PlacedPodCache()
    a = body("a", node_name="n1", labels={"app": "x"}, anti=[term(app="x")])
    b = body("b", node_name="n2", labels={"app": "x"}, anti=[term(app="x")])
    cache.on_event("ADDED", a)
    cache.on_event("ADDED", b)
    assert anti_groups(cache) == {("default", HOST): {uid(a), uid(b)}}

    # The apiserver keeps a pod's affinity as created, so a watch's MODIFIED never changes it (the
    # cache takes those as status writes when nothing it compares changed); a copy delivered as
    # added (a relist's) is projected anew, whatever changed.
    b["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = [
        term(ZONE, app="x")
    ]
    cache.on_event("ADDED", b)
    assert anti_groups(cache) == {("default", HOST): {uid(a)}, ("default", ZONE): {uid(b)}}

    del b["spec"]["affinity"]
    cache.on_event(None, b)
    assert anti_groups(cache) == {("default", HOST): {uid(a)}}
    cache.on_event("DELETED", a)
    assert anti_groups(cache) == {}
    assert list(cache.anti_affinity_toward("default")) == []


def test_a_modified_copy_is_a_status_write_unless_what_can_change_on_a_bound_pod_changed() -> None:
    # The apiserver refuses changes to a pod's affinity, ports, volumes and priority, and to its
    # nodeName once set: a MODIFIED differing from the cached projection in those alone is not
    # projected again (placed_unchanged). Labels, deletion and the phase are compared.
    cache = PlacedPodCache()
    a = body("a", node_name="n1", labels={"app": "x"}, anti=[term(app="x")])
    cache.on_event("ADDED", a)
    held = cache.get(uid(a))
    a["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = [
        term(ZONE, app="x")
    ]
    a["status"] = {"phase": "Running"}
    cache.on_event("MODIFIED", a)
    assert cache.get(uid(a)) is held
    a["metadata"]["labels"] = {"app": "y"}
    cache.on_event("MODIFIED", a)
    changed = cache.get(uid(a))
    assert changed is not None
    assert changed is not held
    assert changed.labels == {"app": "y"}
    a["status"] = {"phase": "Succeeded"}
    cache.on_event("MODIFIED", a)
    assert cache.get(uid(a)) is None


def test_anti_affinity_reaching_every_namespace_is_grouped_for_each() -> None:
    cache = PlacedPodCache()
    wide = {**term(app="x"), "namespaceSelector": {}}
    a = body("a", namespace="team-a", node_name="n1", labels={"app": "x"}, anti=[wide])
    cache.on_event("ADDED", a)
    assert anti_groups(cache, "team-b") == {("team-a", HOST): {uid(a)}}
    assert anti_groups(cache, "team-a") == {("team-a", HOST): {uid(a)}}
    cache.on_event("DELETED", a)
    assert anti_groups(cache, "team-b") == {}


class Ungrouped:
    """The same pods as `placed`, each its own group: what the filters saw before the groups."""

    def __init__(self, placed: Any) -> None:
        self._placed = placed

    def in_namespace(self, namespace: str) -> Iterable[PlacedPod]:
        return list(self._placed.in_namespace(namespace))

    def label_groups(self, namespace: str) -> Iterable[tuple[Mapping[str, str], Iterable[PlacedPod]]]:
        return [(p.labels, [p]) for p in self._placed.in_namespace(namespace)]

    def namespaces(self) -> Iterable[str]:
        return list(self._placed.namespaces())

    def with_anti_affinity(self) -> Iterable[PlacedPod]:
        return list(self._placed.with_anti_affinity())

    def anti_affinity_toward(self, namespace: str) -> Iterable[PlacedPod]:
        return list(self._placed.anti_affinity_toward(namespace))

    def anti_affinity_groups_toward(
        self, namespace: str
    ) -> Iterable[tuple[str, tuple[AffinityTerm, ...], Iterable[PlacedPod]]]:
        return [(p.namespace, p.anti_affinity, [p]) for p in self._placed.anti_affinity_toward(namespace)]

    def with_host_ports(self) -> Iterable[PlacedPod]:
        return list(self._placed.with_host_ports())


def _random_pod(rng: random.Random, index: int, *, node_name: str | None) -> dict[str, Any]:
    app = rng.choice(["web", "api", "db"])
    labels = {"app": app, "tier": rng.choice(["a", "b"])}
    namespace = rng.choice(["default", "default", "team-b"])
    rules: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.4:
        rules["anti"] = [term(HOST, app=app)]
    elif roll < 0.5:
        rules["anti"] = [{**term(ZONE, app=rng.choice(["web", "api"])), "namespaceSelector": {}}]
    elif roll < 0.6:
        rules["affinity"] = [term(ZONE, app=rng.choice(["web", "db"]))]
    if rng.random() < 0.5:
        rules["spread"] = [zone_spread(max_skew=rng.choice([1, 2]))]
    return body(f"p{index}", namespace=namespace, labels=labels, node_name=node_name, **rules)


def test_grouped_verdicts_equal_the_pod_by_pod_verdicts() -> None:
    """Several hundred random worlds: the verdict over the cache's groups is the verdict over the same
    pods one by one, and so is the verdict with some pods gone (a preemption plan's victims)."""
    rng = random.Random(19)
    nodes = [node(f"n{i}", "abc"[i % 3]) for i in range(9)]
    namespaces = {"default": {"team": "a"}, "team-b": {"team": "b"}}
    compared = 0
    for _ in range(40):
        cache = PlacedPodCache(nodes=lambda: nodes, namespace_labels=namespaces.get)
        placed = [_random_pod(rng, i, node_name=rng.choice(nodes).name) for i in range(rng.randint(0, 40))]
        for pod in placed:
            cache.on_event("ADDED", pod)
        for pod in rng.sample(placed, k=len(placed) // 4):  # some change labels after they were placed
            pod["metadata"]["labels"] = {"app": rng.choice(["web", "api"]), "tier": "a"}
            cache.on_event("MODIFIED", pod)
        gone = frozenset(uid(p) for p in rng.sample(placed, k=len(placed) // 5))
        for index in range(10):
            incoming = _incoming(PodInfo.from_body(_random_pod(rng, 1000 + index, node_name=None)))
            for view in (cache, _Without(cache, gone)):
                grouped = evaluate(pod=incoming, placed=view, nodes=nodes, namespace_labels=namespaces.get)
                one_by_one = evaluate(
                    pod=incoming, placed=Ungrouped(view), nodes=nodes, namespace_labels=namespaces.get
                )
                assert grouped == one_by_one
                compared += 1
    assert compared == 800
