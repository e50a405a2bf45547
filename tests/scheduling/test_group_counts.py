"""The placed-pod cache counts each group's pods per node (GroupPods) as pods come and go, and the
filters' fast paths over those counts answer as the pod-by-pod path: random event sequences, the
counts recomputed after every event, verdicts and NodeCheck's re-check compared for every node."""

from __future__ import annotations

import copy
import dataclasses
import random
from collections import Counter
from typing import Any

import pytest

from bindery.adapters.placed import PlacedPodCache
from bindery.podrules.filters import evaluate, refusing
from bindery.podrules.model import GroupPods
from bindery.podrules.nodes import NodeSnapshot
from bindery.podrules.parse import placed_pod
from bindery.scheduling.placementrules import _incoming, _Without
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.test_placed_groups import Ungrouped
from tests.scheduling.test_podrules import HOST, ZONE, body, term, zone_spread


def check_group(group: GroupPods) -> None:
    pods = list(group.by_uid.values())
    every = Counter(p.node for p in pods)
    live = Counter(p.node for p in pods if not p.terminating)
    assert group.every == dict(every)
    assert group.live == dict(live)
    assert group.crowded == {n: c for n, c in live.items() if c > 1}
    assert all(uid == p.uid for uid, p in group.by_uid.items())
    for value_of, counts in group._valued.values():  # the per-key value counts, kept as pods move
        assert counts == dict(Counter(value_of[n] for n in every if n in value_of))
    for value_of, counts in group._live_valued.values():  # and the live pods per value
        assert counts == dict(
            Counter(value_of[p.node] for p in pods if not p.terminating and p.node in value_of)
        )


def check_cache(cache: PlacedPodCache) -> None:
    held = {}
    for namespace, groups in cache._by_namespace.items():
        for key, (_labels, group) in groups.items():
            assert group, "empty group kept"
            check_group(group)
            for p in group:
                assert p.namespace == namespace
                assert frozenset(p.labels.items()) == key
                assert cache.get(p.uid) is p
                held[p.uid] = p
    assert held.keys() == {p.uid for p in cache._pods.values()}
    for toward in cache._anti_toward.values():
        for (owner, terms), members in toward.items():
            assert members
            check_group(members)
            for p in members:
                assert cache.get(p.uid) is p
                assert p.anti_affinity == terms
                assert p.namespace == owner


NODES = [
    NodeProjection(name="n0", labels={HOST: "n0", ZONE: "a"}),
    NodeProjection(name="n1", labels={HOST: "n1", ZONE: "b"}),
    NodeProjection(name="n2", labels={HOST: "n2", ZONE: "c"}),
    NodeProjection(name="n3", labels={HOST: "n3", ZONE: "a"}),
    NodeProjection(name="n4", labels={HOST: "n4"}),  # no zone
    NodeProjection(name="n5", labels={HOST: "shared", ZONE: "b"}),  # hostname not unique
    NodeProjection(name="n6", labels={HOST: "shared", ZONE: "c"}),
    NodeProjection(name="n7", labels={ZONE: "c"}),  # no hostname
]
UNIQUE = [NodeProjection(name=f"u{i}", labels={HOST: f"u{i}", ZONE: "abc"[i % 3]}) for i in range(6)] + [
    NodeProjection(name="u6", labels={HOST: "u6"})
]
NAMES = [n.name for n in NODES] + ["gone-node"]  # a pod on a node the snapshot does not know


def random_body(rng: random.Random, index: int, names: list[str] = NAMES) -> dict[str, Any]:
    app = rng.choice(["web", "api"])
    rules: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.35:
        rules["anti"] = [term(rng.choice([HOST, ZONE]), app=app)]
    elif roll < 0.45:
        rules["affinity"] = [term(ZONE, app=rng.choice(["web", "api"]))]
    if rng.random() < 0.5:
        key = rng.choice([ZONE, HOST])
        rules["spread"] = [{**zone_spread(max_skew=rng.choice([1, 2])), "topologyKey": key}]
    if rng.random() < 0.15:
        rules["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    return body(
        f"p{index}",
        labels={"app": app},
        node_name=rng.choice(names),
        deleting=rng.random() < 0.25,
        **rules,
    )


@pytest.mark.parametrize("nodes", [NODES, UNIQUE], ids=["odd-nodes", "unique-hostnames"])
def test_groups_stay_counted_and_fast_paths_answer_as_the_pod_by_pod_path(
    nodes: list[NodeProjection],
) -> None:
    names = [n.name for n in nodes] + ["gone-node"]
    rng = random.Random(7)
    compared = 0
    for _world in range(60):
        cache = PlacedPodCache(nodes=lambda: nodes, namespace_labels={"default": {}}.get)
        # Mostly one snapshot: the groups' value counts are kept for its mappings, so they are read
        # once and then updated event by event. Now and then the nodes are read through another,
        # with a node relabelled: the groups recount for its mappings, and their pods' events then
        # update counts kept for either.
        relabelled = [
            NodeProjection(name=n.name, labels={**n.labels, ZONE: "z", HOST: "h"}) if i == 0 else n
            for i, n in enumerate(nodes)
        ]
        snapshots = [NodeSnapshot.of(nodes), NodeSnapshot.of(relabelled)]
        snapshot = snapshots[0]
        bodies: list[dict[str, Any]] = []
        for step in range(rng.randint(5, 60)):
            if rng.random() < 0.1:
                snapshot = rng.choice(snapshots)
            roll = rng.random()
            if roll < 0.45 or not bodies:
                b = random_body(rng, len(bodies) + step * 1000, names)
                bodies.append(b)
                cache.on_event("ADDED", b)
            elif roll < 0.6:  # labels change, or only the status (a status write)
                b = rng.choice(bodies)
                if rng.random() < 0.5:
                    b["metadata"]["labels"] = {"app": rng.choice(["web", "api"])}
                else:
                    b["status"] = {"phase": "Running", "podIP": f"10.0.0.{step}"}
                cache.on_event("MODIFIED", b)
                # The cache holds what the pod projects to, whether the event was taken as a status
                # write (placed_unchanged) or projected again.
                assert cache.get(b["metadata"]["uid"]) == placed_pod(b)
            elif roll < 0.7:  # starts (or stops, as a replaced copy) terminating
                b = rng.choice(bodies)
                if "deletionTimestamp" in b["metadata"]:
                    del b["metadata"]["deletionTimestamp"]
                else:
                    b["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                cache.on_event("MODIFIED", b)
                assert cache.get(b["metadata"]["uid"]) == placed_pod(b)
            elif roll < 0.8:  # an assumed copy on another node, then forgotten or not
                b = copy.deepcopy(rng.choice(bodies))
                b["spec"]["nodeName"] = rng.choice(names)
                projection = placed_pod(b)
                assert projection is not None
                cache.forget(projection.uid)
                cache.assume(dataclasses.replace(projection, assumed=True))
                if rng.random() < 0.3:
                    cache.forget(projection.uid)
            elif roll < 0.9:
                b = rng.choice(bodies)
                cache.on_event("DELETED", b)
            else:  # re-added after deletion
                cache.on_event("ADDED", rng.choice(bodies))
            groups = [group for by_labels in cache._by_namespace.values() for _, group in by_labels.values()]
            groups += [group for toward in cache._anti_toward.values() for group in toward.values()]
            for group in groups:  # count some groups' values from now on
                if rng.random() < 0.3:
                    key = rng.choice([HOST, ZONE])
                    group.values(key, snapshot.value_of(key))
                if rng.random() < 0.3:
                    key = rng.choice([HOST, ZONE])
                    group.live_counts(key, snapshot.value_of(key))
            check_cache(cache)
        gone = frozenset(b["metadata"]["uid"] for b in rng.sample(bodies, k=len(bodies) // 4))
        for _ in range(8):
            if rng.random() < 0.6:  # the incoming pod is one of the placed ones (its own entry)
                incoming_body = copy.deepcopy(rng.choice(bodies))
                extra = random_body(rng, 99999)
                incoming_body["spec"] = {**extra["spec"], "nodeName": None}
                del incoming_body["spec"]["nodeName"]
            else:
                incoming_body = random_body(rng, 5000 + compared, names)
                del incoming_body["spec"]["nodeName"]
            incoming_body["metadata"].pop("deletionTimestamp", None)
            pod = _incoming(PodInfo.from_body(incoming_body))
            for view in (cache, _Without(cache, gone)):
                fast = evaluate(pod=pod, placed=view, nodes=snapshot, namespace_labels={"default": {}}.get)
                slow = evaluate(
                    pod=pod,
                    placed=Ungrouped(view),
                    nodes=list(snapshot),
                    namespace_labels={"default": {}}.get,
                )
                assert fast == slow, (pod, fast, slow)
                for name in [n.name for n in nodes]:
                    expected = tuple(e.rule for e in fast.effects if name in e.excluded)
                    for v in (view, Ungrouped(view)):
                        got = refusing(
                            pod=pod, placed=v, nodes=snapshot, namespace_labels={"default": {}}.get, node=name
                        )
                        assert got == expected, (name, got, expected, fast)
                compared += 1
    assert compared > 500


def test_a_new_node_snapshot_drops_the_counts_kept_for_the_old_one() -> None:
    # The groups keep counts per topology value for one snapshot's mappings; once the nodes change,
    # those mappings are never asked for again, so the cache drops them rather than keep them
    # (and update them at every pod event) for good.
    nodes = list(UNIQUE)
    cache = PlacedPodCache(nodes=lambda: nodes, namespace_labels={"default": {}}.get)
    cache.on_event("ADDED", body("p0", labels={"app": "web"}, node_name="u0", anti=[term(HOST, app="web")]))
    snapshot = cache.nodes()
    assert isinstance(snapshot, NodeSnapshot)
    pod = _incoming(PodInfo.from_body(body("p1", labels={"app": "web"}, anti=[term(HOST, app="web")])))
    evaluate(pod=pod, placed=cache, nodes=snapshot, namespace_labels={"default": {}}.get)
    groups = [g for by_labels in cache._by_namespace.values() for _, g in by_labels.values()]
    groups += [g for toward in cache._anti_toward.values() for g in toward.values()]
    assert any(g._valued for g in groups)
    nodes[1] = NodeProjection(name="u1", labels={HOST: "u1", ZONE: "c"})  # relabelled
    assert cache.nodes() is not snapshot
    assert not any(g._valued or g._live_valued for g in groups)
