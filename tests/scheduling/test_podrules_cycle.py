"""PodPlacementRules inside schedule_one: what the RM is sent, refusals before any reservation,
NodeCheck against an RM that ignores the constraints, assume on success, forget on failure."""

from __future__ import annotations

from typing import Any

import pytest

from bindery.kube.placed import PlacedPodCache
from bindery.scheduling import placementrules
from bindery.scheduling.cycle import schedule_one
from bindery.scheduling.decisions import FailureKind, Outcome
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.fakes import Calls, FakeBinder, FakeConditions, FakeEvents, FakeNodes, FakePods, FakeRM

HOST = "kubernetes.io/hostname"


def anti_pod(name: str, **extra: Any) -> PodInfo:
    term = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "solo"}}}
    return PodInfo.from_body(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"app": "solo"}},
            "spec": {
                "schedulerName": "bindery",
                "containers": [{"name": "c"}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
                **extra,
            },
        }
    )


class Rig:
    def __init__(self, *, nodes: int = 2, rm_node: str = "n0", with_cache: bool = True) -> None:
        self.calls = Calls()
        self.node_list = [NodeProjection(name=f"n{i}", labels={HOST: f"n{i}"}) for i in range(nodes)]
        self.cache = PlacedPodCache(nodes=lambda: self.node_list) if with_cache else None
        self.rm = FakeRM(self.calls, node=rm_node)
        self.pods = FakePods(self.calls)
        self.events = FakeEvents(self.calls)

    async def run(self, pod: PodInfo) -> Any:
        self.pods.pods[pod.uid] = pod
        ports = Ports(
            nodes=FakeNodes(self.calls, {n.name: n for n in self.node_list}),
            pods=self.pods,
            binder=FakeBinder(self.calls),
            events=self.events,
            conditions=FakeConditions(self.calls),
            placed=self.cache,
        )
        profile = Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=self.rm)
        return await schedule_one(pod=pod, profile=profile, ports=ports)


async def test_the_rm_is_sent_the_anti_affinity_as_node_affinity_and_the_pod_is_assumed() -> None:
    rig = Rig(rm_node="n0")
    assert (await rig.run(anti_pod("a"))).outcome is Outcome.BOUND
    assert rig.cache is not None
    assumed = rig.cache.get("uid-a")
    assert assumed is not None
    assert (assumed.node, assumed.assumed) == ("n0", True)
    rig.rm.node = "n1"
    assert (await rig.run(anti_pod("b"))).outcome is Outcome.BOUND
    sent = rig.rm.requests[-1].model_dump(mode="json", by_alias=True, exclude_none=True)
    assert sent["placement"]["requiredNodeAffinity"] == [
        {"matchExpressions": [{"key": HOST, "operator": "NotIn", "values": ["n0"]}], "matchFields": []}
    ]


async def test_no_node_left_is_unschedulable_naming_the_rule_and_nothing_is_reserved() -> None:
    rig = Rig(nodes=1)
    await rig.run(anti_pod("a"))
    outcome = await rig.run(anti_pod("b"))
    assert outcome.outcome is Outcome.UNSCHEDULABLE
    assert outcome.failure is not None
    assert "pod anti-affinity excludes all 1 node the pod may run on (n0)" in outcome.failure.message
    assert len(rig.rm.requests) == 1  # only the first pod's


async def test_node_check_refuses_the_node_an_rm_picked_against_the_rules_and_forgets_the_pod() -> None:
    rig = Rig(rm_node="n0")  # the fake RM ignores node affinity
    await rig.run(anti_pod("a"))
    outcome = await rig.run(anti_pod("b"))
    assert outcome.outcome is Outcome.ERROR
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.NODE_CHECK
    assert 'chose node "n0", which the pod\'s pod anti-affinity rules out' in outcome.failure.message
    assert outcome.released
    assert rig.cache is not None
    assert rig.cache.get("uid-b") is None  # forgotten on unreserve
    assert not rig.cache.in_flight


async def test_host_ports_on_65_nodes_go_to_the_rm_as_hostname_chunks_and_the_pod_is_placed() -> None:
    rig = Rig(nodes=70, rm_node="n69")
    ports = [{"containerPort": 80, "hostPort": 80}]
    for i in range(65):  # a pod holding host port 80 on each of 65 nodes; 5 nodes are free
        assert rig.cache is not None
        rig.cache.on_event(
            "ADDED",
            {
                "metadata": {"uid": f"held-{i}", "namespace": "ns"},
                "spec": {"nodeName": f"n{i}", "containers": [{"name": "c", "ports": ports}]},
            },
        )
    wants = PodInfo.from_body(
        {
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
            "spec": {"schedulerName": "bindery", "containers": [{"name": "c", "ports": ports}]},
        }
    )
    outcome = await rig.run(wants)
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    [request] = rig.rm.requests
    [term] = request.placement.required_node_affinity
    assert not term.match_fields
    assert [(r.key, r.operator, len(r.values)) for r in term.match_expressions] == [(HOST, "NotIn", 65)]


async def test_past_the_contract_caps_is_unschedulable_too_many_terms() -> None:
    # Nodes without a hostname label: each node with the port taken is its own metadata.name NotIn,
    # and 65 of them are past the 64 requirements a term carries.
    rig = Rig(nodes=70, rm_node="n69")
    rig.node_list = [NodeProjection(name=n.name) for n in rig.node_list]
    ports = [{"containerPort": 80, "hostPort": 80}]
    for i in range(65):  # a pod holding host port 80 on each of 65 nodes
        assert rig.cache is not None
        rig.cache.on_event(
            "ADDED",
            {
                "metadata": {"uid": f"held-{i}", "namespace": "ns"},
                "spec": {"nodeName": f"n{i}", "containers": [{"name": "c", "ports": ports}]},
            },
        )
    wants = PodInfo.from_body(
        {
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
            "spec": {"schedulerName": "bindery", "containers": [{"name": "c", "ports": ports}]},
        }
    )
    outcome = await rig.run(wants)
    assert outcome.outcome is Outcome.UNSCHEDULABLE
    assert outcome.failure is not None
    assert "TooManyTerms" in outcome.failure.message
    assert "matchFields" in outcome.failure.message
    assert rig.rm.requests == []


async def test_a_pod_with_rules_and_no_placed_pod_watch_is_an_error_never_placed_without_them() -> None:
    rig = Rig(with_cache=False)
    outcome = await rig.run(anti_pod("a"))
    assert outcome.outcome is Outcome.ERROR
    assert rig.rm.requests == []


async def test_before_the_placed_pod_watch_listed_a_pod_with_rules_waits_then_errs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(placementrules, "SYNC_SECONDS", 0.05)
    rig = Rig()
    rig.cache = PlacedPodCache(nodes=lambda: rig.node_list, synced=False)
    outcome = await rig.run(anti_pod("a"))
    assert outcome.outcome is Outcome.ERROR
    assert outcome.failure is not None
    assert "has not listed them" in outcome.failure.message
    assert rig.rm.requests == []
    rig.cache.mark_synced()
    assert (await rig.run(anti_pod("a"))).outcome is Outcome.BOUND


async def test_before_the_placed_pod_watch_listed_a_pod_without_rules_errs_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Existing pods' anti-affinity toward a plain pod is only known once the watch listed them."""
    monkeypatch.setattr(placementrules, "SYNC_SECONDS", 0.05)
    rig = Rig()
    rig.cache = PlacedPodCache(nodes=lambda: rig.node_list, synced=False)
    plain = PodInfo.from_body(
        {
            "metadata": {"name": "plain", "namespace": "ns", "uid": "uid-plain"},
            "spec": {"schedulerName": "bindery", "containers": [{"name": "c"}]},
        }
    )
    outcome = await rig.run(plain)
    assert outcome.outcome is Outcome.ERROR, outcome
    assert outcome.failure is not None
    assert "has not listed them" in outcome.failure.message
    assert rig.rm.requests == []
    rig.cache.mark_synced()
    assert (await rig.run(plain)).outcome is Outcome.BOUND


def _member(name: str, **spec: Any) -> PodInfo:
    return PodInfo.from_body(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"app": "solo"}},
            "spec": {"schedulerName": "bindery", "containers": [{"name": "c"}], **spec},
        }
    )


@pytest.mark.parametrize(
    ("kind", "spec", "rule"),
    [
        (
            "anti",
            {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "solo"}}}
                        ]
                    }
                }
            },
            "pod anti-affinity",
        ),
        (
            "affinity",
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "solo"}}}
                        ]
                    }
                }
            },
            "pod affinity",
        ),
        (
            "spread",
            {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": HOST,
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "solo"}},
                    }
                ]
            },
            "topology spread",
        ),
    ],
)
def test_a_group_whose_member_rules_select_another_member_is_refused_naming_the_rule(
    kind: str, spec: dict[str, Any], rule: str
) -> None:
    """Rules between members are never sent to the RM (the members have no nodes yet): refused up
    front, not left to NodeCheck (or to nothing, with NodeCheck Basic or Off)."""
    cache = PlacedPodCache(
        nodes=lambda: [NodeProjection(name=f"n{i}", labels={HOST: f"n{i}"}) for i in range(3)]
    )
    members = [_member("m0", **spec), _member("m1", **spec)]
    _, refusal = placementrules.member_node_terms(members, cache)
    assert refusal is not None, kind
    assert rule in refusal
    assert "ns/m1" in refusal
    assert placementrules.member_node_terms([_member("m0", **spec)], cache)[1] is None
