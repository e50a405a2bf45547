"""PodPlacementRules inside schedule_one: what the RM is sent, refusals before any reservation,
NodeCheck against an RM that ignores the constraints, assume on success, forget on failure."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from bindery.adapters.placed import PlacedPodCache
from bindery.constraints import matches_required_affinity
from bindery.scheduling import placementrules
from bindery.scheduling.cycle import schedule_one
from bindery.scheduling.decisions import FailureKind, Outcome
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from bindery.scheduling.volumes import csi_volume, over_volume_limits
from tests.scheduling.fakes import Calls, FakeBinder, FakeConditions, FakeEvents, FakeNodes, FakePods, FakeRM
from tests.scheduling.test_volumes import FakeVolumes, claim, pv

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
        self.rm: FakeRM = FakeRM(self.calls, node=rm_node)
        self.pods = FakePods(self.calls)
        self.events = FakeEvents(self.calls)
        self.volumes: FakeVolumes | None = None

    async def run(self, pod: PodInfo) -> Any:
        self.pods.pods[pod.uid] = pod
        ports = Ports(
            nodes=FakeNodes(self.calls, {n.name: n for n in self.node_list}),
            pods=self.pods,
            binder=FakeBinder(self.calls),
            events=self.events,
            conditions=FakeConditions(self.calls),
            placed=self.cache,
            volumes=self.volumes,
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


# -- VolumeRestrictions: a ReadWriteOncePod claim is one pod's ---------------------------------------


class SlowRM(FakeRM):
    """Answers a reserve after the event loop ran the other cycles: two cycles overlap."""

    async def reserve(self, request: Any, /) -> Any:
        await asyncio.sleep(0.01)
        return await super().reserve(request)


def claim_pod(name: str, claim: str = "data") -> PodInfo:
    return PodInfo.from_body(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {
                "schedulerName": "bindery",
                "containers": [{"name": "c"}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }
    )


def claim_rig(mode: str, **rig: Any) -> tuple[Rig, FakeVolumes]:
    """A Rig whose claim "data" is bound (to a volume usable anywhere) with access mode `mode`."""
    base = Rig(**rig)
    volumes = FakeVolumes(base.calls)
    bound = claim("data", volume="pv-1")
    bound["spec"]["accessModes"] = [mode]
    volumes.claims["data"] = bound
    volumes.pvs["pv-1"] = pv("pv-1", node=None)
    base.volumes = volumes
    return base, volumes


def holder(uid: str, *, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": uid},
        "spec": {
            "nodeName": "n1",
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}],
        },
        "status": {"phase": phase},
    }


async def test_a_read_write_once_pod_claim_in_use_is_unschedulable_naming_the_rule() -> None:
    rig, _ = claim_rig("ReadWriteOncePod")
    assert rig.cache is not None
    rig.cache.on_event("ADDED", holder("other"))
    outcome = await rig.run(claim_pod("p"))
    assert outcome.outcome is Outcome.UNSCHEDULABLE
    assert outcome.failure is not None
    assert "VolumeRestrictions" in outcome.failure.message
    assert 'persistentvolumeclaim "data"' in outcome.failure.message
    assert rig.rm.requests == []  # refused before anything was reserved


async def test_a_shared_read_write_once_claim_and_a_finished_holder_do_not_refuse() -> None:
    shared, _ = claim_rig("ReadWriteOnce")
    assert shared.cache is not None
    shared.cache.on_event("ADDED", holder("other"))
    assert (await shared.run(claim_pod("p"))).outcome is Outcome.BOUND
    finished, _ = claim_rig("ReadWriteOncePod")
    assert finished.cache is not None
    finished.cache.on_event("ADDED", holder("done", phase="Succeeded"))
    assert (await finished.run(claim_pod("p"))).outcome is Outcome.BOUND


async def test_two_racing_pods_of_one_read_write_once_pod_claim_bind_only_one() -> None:
    """Both cycles run at once; the second waits for the first to name its node, then sees the
    claim taken (kube-scheduler's assume cache, which one scheduling loop gets for free)."""
    rig, _ = claim_rig("ReadWriteOncePod")
    rig.rm = SlowRM(rig.calls, node="n0")
    outcomes = await asyncio.gather(rig.run(claim_pod("a")), rig.run(claim_pod("b")))
    assert sorted(o.outcome.value for o in outcomes) == sorted(
        [Outcome.BOUND.value, Outcome.UNSCHEDULABLE.value]
    )
    assert len(rig.rm.requests) == 1


# -- NodeVolumeLimits: a CSI driver's attach limit per node ------------------------------------------

DRIVER = "csi.example.com"


def csi_pv(name: str, handle: str, driver: str = DRIVER) -> dict[str, Any]:
    volume = pv(name, node=None)
    volume["spec"]["csi"] = {"driver": driver, "volumeHandle": handle}
    return volume


def csi_node(name: str, count: int | None, driver: str = DRIVER) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": driver, "nodeID": name}
    if count is not None:
        entry["allocatable"] = {"count": count}
    return {"metadata": {"name": name}, "spec": {"drivers": [entry]}}


def limits_rig(*, rm_node: str, limit: int, full: tuple[str, ...]) -> Rig:
    """Three nodes whose CSINodes allow `limit` volumes of DRIVER; a pod on each node of `full` uses one
    volume of it; the incoming pod "p" uses another (claim "data")."""
    rig = Rig(rm_node=rm_node, nodes=3)
    volumes = FakeVolumes(rig.calls)
    volumes.csi = [csi_node(f"n{i}", limit) for i in range(3)]
    volumes.claims["data"] = claim("data", volume="pv-new")
    volumes.pvs["pv-new"] = csi_pv("pv-new", "h-new")
    assert rig.cache is not None
    for node in full:
        volumes.claims[f"old-{node}"] = claim(f"old-{node}", volume=f"pv-{node}")
        volumes.pvs[f"pv-{node}"] = csi_pv(f"pv-{node}", f"h-{node}")
        holder_pod = {
            "metadata": {"uid": f"on-{node}", "namespace": "ns", "name": f"on-{node}"},
            "spec": {
                "nodeName": node,
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": f"old-{node}"}}],
            },
        }
        rig.cache.on_event("ADDED", holder_pod)
    rig.volumes = volumes
    return rig


async def test_a_node_at_its_csi_attach_limit_is_excluded_and_an_rm_choosing_it_is_refused() -> None:
    rig = limits_rig(rm_node="n2", limit=1, full=("n0", "n1"))
    assert (await rig.run(claim_pod("p"))).outcome is Outcome.BOUND
    [request] = rig.rm.requests
    terms = request.placement.affinity_terms()
    on = [
        n.name
        for n in rig.node_list
        if matches_required_affinity(terms=terms, labels=n.labels, node_name=n.name)
    ]
    assert on == ["n2"]  # the contract's metadata.name fields carry one node each
    ignored = limits_rig(rm_node="n0", limit=1, full=("n0",))  # an RM that ignores the terms
    outcome = await ignored.run(claim_pod("p"))
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.NODE_CHECK
    assert "NodeVolumeLimits" in outcome.failure.message
    assert outcome.released


async def test_every_node_at_its_csi_attach_limit_is_unschedulable_naming_the_rule() -> None:
    rig = limits_rig(rm_node="n0", limit=1, full=("n0", "n1", "n2"))
    outcome = await rig.run(claim_pod("p"))
    assert outcome.outcome is Outcome.UNSCHEDULABLE
    assert outcome.failure is not None
    assert "NodeVolumeLimits: node(s) exceed max volume count" in outcome.failure.message
    assert rig.rm.requests == []
    roomy = limits_rig(rm_node="n0", limit=2, full=("n0", "n1", "n2"))
    assert (await roomy.run(claim_pod("p"))).outcome is Outcome.BOUND


async def test_every_node_the_pod_may_run_on_at_its_limit_is_unschedulable_whatever_other_nodes_exist() -> (
    None
):
    """Nodes the pod's nodeSelector rules out do not keep it from being refused here: a cluster
    with other pools sent the pod to the RM with every node of its own excluded, and the RM's answer
    named node affinity, not the attach limit (seen in CI, with other tests' nodes in the cluster)."""
    rig = limits_rig(rm_node="n0", limit=1, full=("n0", "n1", "n2"))
    rig.node_list[:] = [dataclasses.replace(n, labels={**n.labels, "pool": "mine"}) for n in rig.node_list]
    rig.node_list.append(NodeProjection(name="elsewhere", labels={HOST: "elsewhere", "pool": "other"}))
    pod = claim_pod("p")
    outcome = await rig.run(dataclasses.replace(pod, node_selector={"pool": "mine"}))
    assert outcome.outcome is Outcome.UNSCHEDULABLE, outcome
    assert outcome.failure is not None
    assert "NodeVolumeLimits: node(s) exceed max volume count" in outcome.failure.message
    assert rig.rm.requests == []


async def test_nodes_of_another_pool_at_their_limit_do_not_count_against_the_contracts_cap() -> None:
    """70 nodes of another pool at the attach limit (more than the 64 matchFields a term carries):
    a pod pinned to its own pool, which has room, is placed, not refused TooManyTerms."""
    rig = limits_rig(rm_node="n0", limit=1, full=("n1",))
    assert rig.volumes is not None
    assert rig.cache is not None
    rig.node_list[:] = [dataclasses.replace(n, labels={**n.labels, "pool": "mine"}) for n in rig.node_list]
    for i in range(70):
        name = f"other-{i}"
        rig.node_list.append(NodeProjection(name=name, labels={HOST: name, "pool": "other"}))
        rig.volumes.csi.append(csi_node(name, 1))
        rig.volumes.claims[f"old-{name}"] = claim(f"old-{name}", volume=f"pv-{name}")
        rig.volumes.pvs[f"pv-{name}"] = csi_pv(f"pv-{name}", f"h-{name}")
        rig.cache.on_event(
            "ADDED",
            {
                "metadata": {"uid": f"on-{name}", "namespace": "ns", "name": f"on-{name}"},
                "spec": {
                    "nodeName": name,
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": f"old-{name}"}}],
                },
            },
        )
    outcome = await rig.run(dataclasses.replace(claim_pod("p"), node_selector={"pool": "mine"}))
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    sent = rig.rm.requests[-1].model_dump(mode="json", by_alias=True, exclude_none=True)
    excluded = [f["values"][0] for t in sent["placement"]["requiredNodeAffinity"] for f in t["matchFields"]]
    assert excluded == ["n1"]


def test_volume_limits_count_unique_volumes_per_driver_and_unbound_claims_by_their_class() -> None:
    new = {(DRIVER, "h1")}
    nodes = [
        csi_node("shares", 1),
        csi_node("full", 1),
        csi_node("other-driver", 1, driver="x"),
        csi_node("no-count", None),
    ]
    attached = {
        "shares": {(DRIVER, "h1")},
        "full": {(DRIVER, "h2")},
        "other-driver": {("x", "h9")},
        "no-count": {(DRIVER, "h3")},
    }
    # "shares" already has h1 (another pod of the same volume): it is not counted twice.
    assert over_volume_limits(new=new, csi_nodes=nodes, attached=attached) == ["full"]
    unbound = claim("fresh")
    assert csi_volume(namespace="ns", claim=unbound, volume=None, storage_class={"provisioner": DRIVER}) == (
        DRIVER,
        "ns-fresh",
    )
    assert csi_volume(namespace="ns", claim=unbound, volume=None, storage_class=None) is None
    assert csi_volume(namespace="ns", claim=None, volume=pv("local", node="n1"), storage_class=None) is None


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
