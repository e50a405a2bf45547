"""InFlight groups cycles by signature (namespace, labels, rules, soft rules, claims) and decides
relatedness once per pair of groups; these tests hold it to the pod-by-pod answer.

The pod-by-pod answer is what InFlight computed before the groups: every earlier in-flight cycle,
not stale, for which ``_related`` or ``_share_claims`` holds. The random mixes cover claims, host
ports, the anti-affinity symmetry, soft terms, and namespaceSelector terms whose answer changes
when a namespace's labels change between two cycles (a memo must not outlive that).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from bindery.scheduling import inflight
from bindery.scheduling.inflight import STALE_SECONDS, InFlight, _Cycle, _related, _share_claims
from bindery.scheduling.podspec import PodInfo
from tests.scheduling.test_podrules import HOST, ZONE, body, term, zone_spread


def pod_by_pod(flight: InFlight, cycle: _Cycle, namespace_labels: Any, now: float) -> list[str]:
    """The straightforward computation: every in-flight cycle, one by one."""
    return [
        other.uid
        for other in flight._cycles.values()
        if other.seq < cycle.seq
        and now - other.started < STALE_SECONDS
        and (_related(cycle, other, namespace_labels) or _share_claims(cycle, other))
    ]


def _random_body(rng: random.Random, index: int) -> dict[str, Any]:
    """A pod of a few 'Deployments' (shared labels and rules), with a stray variation now and then."""
    app = rng.choice(["web", "api", "db"])
    namespace = rng.choice(["default", "default", "team-b"])
    rules: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.3:
        rules["anti"] = [term(HOST, app=app)]
    elif roll < 0.4:
        selector = rng.choice([{}, {"matchLabels": {"team": "a"}}, {"matchLabels": {"team": "b"}}])
        rules["anti"] = [{**term(ZONE, app=rng.choice(["web", "api"])), "namespaceSelector": selector}]
    elif roll < 0.5:
        rules["affinity"] = [
            {**term(ZONE, app=rng.choice(["web", "db"])), "namespaceSelector": {"matchLabels": {"team": "a"}}}
        ]
    elif roll < 0.55:
        rules["affinity"] = [{**term(ZONE, app="db"), "namespaces": ["team-b"]}]
    if rng.random() < 0.3:
        rules["spread"] = [zone_spread(max_skew=rng.choice([1, 2]))]
    if rng.random() < 0.15:
        rules["ports"] = [{"containerPort": 80, "hostPort": rng.choice([80, 81])}]
    pod = body(f"p{index}", namespace=namespace, labels={"app": app, "tier": rng.choice("ab")}, **rules)
    spec = pod["spec"]
    if rng.random() < 0.15:
        claim = rng.choice(["data-0", "data-1"])
        spec["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]
    if rng.random() < 0.2:
        preferred: dict[str, Any] = {
            "weight": 10,
            "podAffinityTerm": term(HOST, app=rng.choice(["web", "api"])),
        }
        if rng.random() < 0.5:
            preferred["podAffinityTerm"]["namespaceSelector"] = {"matchLabels": {"team": "b"}}
        spec.setdefault("affinity", {})["podAntiAffinity"] = {
            **spec.get("affinity", {}).get("podAntiAffinity", {}),
            "preferredDuringSchedulingIgnoredDuringExecution": [preferred],
        }
    if rng.random() < 0.3:
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"{app}-rs",
                "uid": "r",
                "controller": True,
            }
        ]
    return pod


def test_grouped_waits_equal_the_pod_by_pod_waits() -> None:
    """Thousands of random cycles begun and settled in random order, a namespace's labels flipping
    now and then, some cycles going stale: each new cycle waits for exactly the pods the pod-by-pod
    computation names."""
    rng = random.Random(19)
    compared = waited = 0
    clock = [0.0]
    for _ in range(30):
        clock[0] = 0.0
        flight = InFlight(clock=lambda: clock[0])
        namespaces: dict[str, dict[str, str]] = {"default": {"team": "a"}, "team-b": {"team": "b"}}
        bodies = [_random_body(rng, i) for i in range(12)]  # a few templates, reused: groups form
        for step in range(150):
            roll = rng.random()
            if roll < 0.1:  # a namespace's labels change between cycles
                namespaces["team-b"] = {"team": rng.choice("ab")}
                namespaces["default"] = {"team": rng.choice("ab")}
            elif roll < 0.35 and len(flight):
                flight.settle(rng.choice(list(flight._cycles)))
            clock[0] += rng.choice([0.0, 1.0, 30.0])
            template = rng.choice(bodies)
            pod_body = {**template, "metadata": {**template["metadata"], "uid": f"uid-{step}"}}
            if rng.random() < 0.05 and len(flight):  # a pod's new cycle while its old one never settled
                pod_body["metadata"]["uid"] = rng.choice(list(flight._cycles))
            cycle = flight.begin(PodInfo.from_body(pod_body), soft=rng.random() < 0.8)
            got = [other.uid for other in flight.earlier_related(cycle, namespace_labels=namespaces.get)]
            assert got == pod_by_pod(flight, cycle, namespaces.get, clock[0])
            compared += 1
            waited += bool(got)
    assert compared == 4500
    assert 500 < waited < 4000  # the mix has both answers


def test_a_deployments_burst_decides_relatedness_once(monkeypatch: Any) -> None:
    """40 pods of one Deployment in flight: the 40th matched its rules against one group, not 39
    pods (that was 11 % of the operator's CPU on issue 19's rules backlog)."""
    calls = [0]
    real = inflight._related

    def counted(*args: Any) -> bool:
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(inflight, "_related", counted)
    flight = InFlight()
    template = body("web", labels={"app": "web"}, anti=[term(HOST, app="web")], spread=[zone_spread()])
    cycles = [
        flight.begin(PodInfo.from_body({**template, "metadata": {**template["metadata"], "uid": f"u{i}"}}))
        for i in range(40)
    ]
    for cycle in cycles:
        flight.earlier_related(cycle, namespace_labels=lambda ns: None)
    assert len(flight.earlier_related(cycles[-1], namespace_labels=lambda ns: None)) == 39
    assert calls[0] == 1


def test_a_namespace_selector_answer_follows_the_namespaces_labels() -> None:
    """A pod whose anti-affinity selects namespaces labelled team=b: the in-flight pod of team-b is
    related while team-b has that label, and stops being related once the label changes."""
    namespaces = {"team-b": {"team": "b"}}
    flight = InFlight()
    earlier = flight.begin(PodInfo.from_body(body("e", namespace="team-b", labels={"app": "web"})))
    anti = {**term(ZONE, app="web"), "namespaceSelector": {"matchLabels": {"team": "b"}}}
    template = body("w", labels={"app": "api"}, anti=[anti])
    first = flight.begin(PodInfo.from_body(template))
    assert flight.earlier_related(first, namespace_labels=namespaces.get) == [earlier]
    namespaces["team-b"] = {"team": "c"}
    second = flight.begin(PodInfo.from_body({**template, "metadata": {**template["metadata"], "uid": "w2"}}))
    assert flight.earlier_related(second, namespace_labels=namespaces.get) == []  # not even `first`
    namespaces["team-b"] = {"team": "b"}
    assert flight.earlier_related(second, namespace_labels=namespaces.get) == [earlier]


def test_a_pod_waits_until_every_earlier_related_pod_settled_in_any_order_or_its_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three earlier pods of its Deployment settle in reverse order: the fourth goes on only after
    the last of them. A fifth, whose earlier pods never settle, goes on at its deadline saying how
    many were still unplaced."""

    caplog.set_level(logging.INFO, logger=inflight.__name__)

    async def scenario() -> None:
        flight = InFlight()
        template = body("web", labels={"app": "web"}, anti=[term(HOST, app="web")])

        def pod(uid: str) -> PodInfo:
            return PodInfo.from_body({**template, "metadata": {**template["metadata"], "uid": uid}})

        earlier = [flight.begin(pod(f"u{i}")) for i in range(3)]
        fourth = flight.begin(pod("u3"))
        waiting = asyncio.ensure_future(flight.wait(fourth, namespace_labels=lambda ns: None, seconds=30))
        for cycle in reversed(earlier):
            await asyncio.sleep(0)
            assert not waiting.done()
            flight.settle(cycle.uid)
        assert await asyncio.wait_for(waiting, 5) == 3
        fifth = flight.begin(pod("u4"))
        flight.settle(fourth.uid)
        sixth = flight.begin(pod("u5"))
        assert await flight.wait(sixth, namespace_labels=lambda ns: None, seconds=0.05) == 1  # fifth
        assert fifth.uid in flight._cycles
        assert "waited 0.05 s for 1 related pods to be placed; going on" in caplog.text

    asyncio.run(scenario())
