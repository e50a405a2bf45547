"""VolumeBinding: the pure decisions (kube-scheduler's messages, where volumes can be) and the plugin in
a whole cycle against in-memory claims, volumes and classes (the real apiserver: tests/volumes)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from bindery.constraints import matches_required_affinity
from bindery.rm.errors import ProblemType, RMConflict
from bindery.rm.models import Reservation, ReservationState
from bindery.scheduling.cycle import CycleOutcome, schedule_one
from bindery.scheduling.decisions import FailureKind, Outcome
from bindery.scheduling.framework import CycleContext, Ports, Profile, and_terms
from bindery.scheduling.ports import NodeProjection, VolumeError
from bindery.scheduling.volumes import (
    SELECTED_NODE,
    ClaimView,
    claim_problem,
    claim_terms,
    compact_terms,
    matching_volumes,
    volume_for_node,
    zone_terms,
)
from tests.scheduling.fakes import (
    Calls,
    FakeBinder,
    FakeConditions,
    FakeEvents,
    FakeNodes,
    FakePods,
    FakeRM,
    pod,
)

WFFC = {
    "metadata": {"name": "wffc"},
    "provisioner": "example.com/disk",
    "volumeBindingMode": "WaitForFirstConsumer",
}
LOCAL = {
    "metadata": {"name": "local"},
    "provisioner": "kubernetes.io/no-provisioner",
    "volumeBindingMode": "WaitForFirstConsumer",
}
IMMEDIATE = {
    "metadata": {"name": "fast"},
    "provisioner": "example.com/disk",
    "volumeBindingMode": "Immediate",
}


def claim(name: str, *, cls: str = "wffc", size: str = "1Gi", volume: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "storageClassName": cls,
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }
    if volume:
        spec["volumeName"] = volume
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": spec,
        "status": {"phase": "Bound" if volume else "Pending"},
    }


def pv(name: str, *, node: str | None, cls: str = "local", size: str = "1Gi") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "storageClassName": cls,
        "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": size},
    }
    if node is not None:
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                        ]
                    }
                ]
            }
        }
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": spec,
        "status": {"phase": "Available"},
    }


def hostname(node: str) -> NodeProjection:
    return NodeProjection(name=node, labels={"kubernetes.io/hostname": node})


# -- pure decisions --------------------------------------------------------------------------------


def test_kube_schedulers_messages_for_claims_that_rule_the_pod_out() -> None:
    assert claim_problem(ClaimView(name="data", claim=None)) == 'persistentvolumeclaim "data" not found'
    deleting = claim("data")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert claim_problem(ClaimView(name="data", claim=deleting, storage_class=WFFC)) == (
        'persistentvolumeclaim "data" is being deleted'
    )
    immediate = ClaimView(name="data", claim=claim("data", cls="fast"), storage_class=IMMEDIATE)
    assert claim_problem(immediate) == "pod has unbound immediate PersistentVolumeClaims"
    assert claim_problem(ClaimView(name="data", claim=claim("data", cls="nope"))) == (
        "pod has unbound immediate PersistentVolumeClaims"  # no such class: nothing waits for a consumer
    )
    assert claim_problem(ClaimView(name="data", claim=claim("data"), storage_class=WFFC)) is None
    bound = ClaimView(name="data", claim=claim("data", volume="pv-1"), volume=pv("pv-1", node="n1"))
    assert claim_problem(bound) is None


def test_a_bound_volume_limits_the_pod_to_its_nodes() -> None:
    view = ClaimView(name="data", claim=claim("data", volume="pv-1"), volume=pv("pv-1", node="n2"))
    terms = claim_terms(view, [])
    assert terms == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}
    ]
    anywhere = ClaimView(name="data", claim=claim("data", volume="pv-2"), volume=pv("pv-2", node=None))
    assert claim_terms(anywhere, []) is None


def test_static_candidates_and_provisioning_topology_bound_an_unbound_claim() -> None:
    local = ClaimView(name="data", claim=claim("data", cls="local"), storage_class=LOCAL)
    volumes = [pv("a", node="n1"), pv("b", node="n3"), pv("small", node="n2", size="100Mi")]
    candidates = matching_volumes(claim=local.claim or {}, volumes=volumes)
    assert [v["metadata"]["name"] for v in candidates] == ["a", "b"]  # too small for 1Gi: left out
    terms = claim_terms(local, candidates)
    assert terms is not None
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["n1", "n3"]]  # one term, two nodes
    assert claim_terms(local, []) == []  # nothing can take it and nothing provisions: no node at all
    dynamic = ClaimView(name="data", claim=claim("data"), storage_class=WFFC)
    assert claim_terms(dynamic, []) is None  # provisions anywhere
    zoned = ClaimView(
        name="data",
        claim=claim("data"),
        storage_class={
            **WFFC,
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]}],
        },
    )
    assert claim_terms(zoned, []) == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    ]


def test_a_volume_taken_by_another_claim_or_of_another_class_is_no_candidate() -> None:
    taken = pv("a", node="n1")
    taken["spec"]["claimRef"] = {"namespace": "ns", "name": "other"}
    mine = pv("b", node="n1")
    mine["spec"]["claimRef"] = {"namespace": "ns", "name": "data"}
    other_class = pv("c", node="n1", cls="wffc")
    released = pv("d", node="n1")
    released["status"]["phase"] = "Released"
    found = matching_volumes(claim=claim("data", cls="local"), volumes=[taken, mine, other_class, released])
    assert [v["metadata"]["name"] for v in found] == ["b"]


def test_the_smallest_volume_on_the_node_is_chosen_once() -> None:
    candidates = [pv("s", node="n1", size="1Gi"), pv("l", node="n1", size="5Gi"), pv("o", node="n2")]
    first = volume_for_node(candidates=candidates, node=hostname("n1"), taken=set())
    assert first is not None
    assert first["metadata"]["name"] == "s"
    second = volume_for_node(candidates=candidates, node=hostname("n1"), taken={"s"})
    assert second is not None
    assert second["metadata"]["name"] == "l"
    assert volume_for_node(candidates=candidates, node=hostname("n3"), taken=set()) is None


def test_constraints_and_the_pods_own_affinity_are_anded() -> None:
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
    gpu = {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
    n1 = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}
    n2 = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}
    assert and_terms([], [n1]) == [n1]
    assert and_terms([zone, gpu], [n1, n2]) == [
        {"matchExpressions": zone["matchExpressions"] + n1["matchExpressions"]},
        {"matchExpressions": zone["matchExpressions"] + n2["matchExpressions"]},
        {"matchExpressions": gpu["matchExpressions"] + n1["matchExpressions"]},
        {"matchExpressions": gpu["matchExpressions"] + n2["matchExpressions"]},
    ]
    ctx = CycleContext(
        pod=pod("p", affinity_terms=(zone,)),
        profile=Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=FakeRM(Calls())),
        ports=Ports(
            nodes=FakeNodes(Calls()),
            pods=FakePods(Calls()),
            binder=FakeBinder(Calls()),
            events=FakeEvents(Calls()),
            conditions=FakeConditions(Calls()),
        ),
    )
    assert ctx.required_node_terms() == [zone]
    ctx.require_nodes([n1])
    assert ctx.required_node_terms() == [
        {"matchExpressions": zone["matchExpressions"] + n1["matchExpressions"]}
    ]


# -- the plugin in a cycle --------------------------------------------------------------------------


class FakeVolumes:
    """Claims, volumes and classes in memory; `provision_after` polls later a provisioner binds."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.claims: dict[str, dict[str, Any]] = {}
        self.pvs: dict[str, dict[str, Any]] = {}
        self.classes: dict[str, Mapping[str, Any]] = {"wffc": WFFC, "local": LOCAL, "fast": IMMEDIATE}
        self.provision_after: int | None = 1  # None: no provisioner runs
        self.csi: list[dict[str, Any]] = []  # CSINodes
        #: called before each claim read with the number of reads so far (to change the world, or raise)
        self.before_read: Callable[[int], None] | None = None
        self._polls: dict[str, int] = {}

    async def claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        if self.before_read is not None:
            self.before_read(self.calls.count("volumes.claim"))
        self.calls.record("volumes.claim", name=name)
        found = self.claims.get(name)
        if found is not None and SELECTED_NODE in (found["metadata"].get("annotations") or {}):
            self._provision(found)
        return copy.deepcopy(found)

    async def volume(self, name: str) -> Mapping[str, Any] | None:
        return copy.deepcopy(self.pvs.get(name))

    async def volumes(self) -> list[Mapping[str, Any]]:
        return [copy.deepcopy(v) for v in self.pvs.values()]

    async def storage_class(self, name: str) -> Mapping[str, Any] | None:
        return self.classes.get(name)

    async def csi_nodes(self) -> list[Mapping[str, Any]]:
        return [copy.deepcopy(n) for n in self.csi]

    async def all_claims(self) -> list[Mapping[str, Any]]:
        return [copy.deepcopy(c) for c in self.claims.values()]

    async def bind_volume(self, *, volume: Mapping[str, Any], claim: Mapping[str, Any]) -> None:
        name, claim_name = volume["metadata"]["name"], claim["metadata"]["name"]
        self.calls.record("volumes.bind_volume", volume=name, claim=claim_name)
        self.pvs[name]["spec"]["claimRef"] = {"namespace": "ns", "name": claim_name}
        self.claims[claim_name]["spec"]["volumeName"] = name  # the PV controller completes it at once
        self.claims[claim_name]["status"]["phase"] = "Bound"

    async def select_node(self, *, claim: Mapping[str, Any], node: str | None) -> None:
        name = claim["metadata"]["name"]
        self.calls.record("volumes.select_node", claim=name, node=node)
        annotations = self.claims[name]["metadata"].setdefault("annotations", {})
        if node is None:
            annotations.pop(SELECTED_NODE, None)
        else:
            annotations[SELECTED_NODE] = node

    def _provision(self, found: dict[str, Any]) -> None:
        name = found["metadata"]["name"]
        self._polls[name] = self._polls.get(name, 0) + 1
        if (
            self.provision_after is None
            or self._polls[name] <= self.provision_after
            or found["spec"].get("volumeName")
        ):
            return
        node = found["metadata"]["annotations"][SELECTED_NODE]
        self.pvs[f"pvc-{name}"] = pv(f"pvc-{name}", node=node, cls="wffc")
        found["spec"]["volumeName"] = f"pvc-{name}"
        found["status"]["phase"] = "Bound"


class VolumeWorld:
    def __init__(self, *claims: str) -> None:
        self.calls = Calls()
        self.rm = FakeRM(self.calls, node="n2")
        self.volumes = FakeVolumes(self.calls)
        self.pod = pod("web", claims=claims)
        self.pods = FakePods(self.calls)
        self.pods.pods[self.pod.uid] = self.pod
        self.nodes = FakeNodes(self.calls, {n: hostname(n) for n in ("n1", "n2", "n3")})
        self.events = FakeEvents(self.calls)
        self.conditions = FakeConditions(self.calls)

    async def run(self, **profile: Any) -> CycleOutcome:
        ports = Ports(
            nodes=self.nodes,
            pods=self.pods,
            binder=FakeBinder(self.calls),
            events=self.events,
            conditions=self.conditions,
            volumes=self.volumes,
        )
        return await schedule_one(
            pod=self.pod,
            profile=Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=self.rm, **profile),
            ports=ports,
        )


async def test_a_missing_claim_is_unschedulable_before_anything_is_reserved() -> None:
    world = VolumeWorld("data")
    outcome = await world.run()
    assert outcome.outcome is Outcome.UNSCHEDULABLE
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.PLUGIN_UNSCHEDULABLE
    assert 'persistentvolumeclaim "data" not found' in outcome.failure.message
    assert "rm.reserve" not in world.calls.names()
    [(_, condition)] = [entry for entry in world.calls.log if entry[0] == "conditions.pod_scheduled_false"]
    assert condition["reason"] == "Unschedulable"


async def test_an_unbound_immediate_claim_is_unschedulable_with_kube_schedulers_message() -> None:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data", cls="fast")
    outcome = await world.run()
    assert outcome.outcome is Outcome.UNSCHEDULABLE
    assert outcome.failure is not None
    assert "pod has unbound immediate PersistentVolumeClaims" in outcome.failure.message
    assert "rm.reserve" not in world.calls.names()


async def test_a_bound_volume_is_sent_to_the_rm_as_required_node_affinity() -> None:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data", volume="pv-1")
    world.volumes.pvs["pv-1"] = pv("pv-1", node="n2")
    outcome = await world.run()
    assert outcome.outcome is Outcome.BOUND
    [request] = world.rm.requests
    assert request.placement.affinity_terms() == [
        {
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}],
            "matchFields": [],
        }
    ]


async def test_a_bound_volume_on_another_node_than_the_rms_choice_is_released_and_reported() -> None:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data", volume="pv-1")
    world.volumes.pvs["pv-1"] = pv("pv-1", node="n1")  # the RM (n2) ignored the affinity it was sent
    outcome = await world.run()
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.NODE_CHECK
    assert "volume node affinity conflict" in outcome.failure.message
    assert outcome.released
    assert "binder.bind" not in world.calls.names()


async def test_a_wait_for_first_consumer_claim_is_provisioned_on_the_chosen_node_before_the_binding() -> None:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data")
    outcome = await world.run()
    assert outcome.outcome is Outcome.BOUND
    names = world.calls.names()
    assert names.index("volumes.select_node") < names.index("binder.bind")
    assert world.volumes.claims["data"]["metadata"]["annotations"] == {SELECTED_NODE: "n2"}
    assert world.volumes.claims["data"]["spec"]["volumeName"] == "pvc-data"
    assert "rm.commit" in names


async def test_a_static_local_volume_on_the_chosen_node_is_pre_bound() -> None:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data", cls="local")
    world.volumes.pvs.update({"on-n1": pv("on-n1", node="n1"), "on-n2": pv("on-n2", node="n2")})
    outcome = await world.run()
    assert outcome.outcome is Outcome.BOUND
    [request] = world.rm.requests
    assert [t["matchExpressions"][0]["values"] for t in request.placement.affinity_terms()] == [["n1", "n2"]]
    [(_, bound)] = [entry for entry in world.calls.log if entry[0] == "volumes.bind_volume"]
    assert bound == {"volume": "on-n2", "claim": "data"}
    assert "volumes.select_node" not in world.calls.names()


async def test_provisioning_that_never_happens_times_out_undoes_the_annotation_and_releases() -> None:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data")
    world.volumes.provision_after = None
    outcome = await world.run(volume_bind_timeout_seconds=1.0)
    assert outcome.failure is not None
    assert "timed out after 1 s" in outcome.failure.message
    assert outcome.released
    assert "binder.bind" not in world.calls.names()
    selects = [entry[1]["node"] for entry in world.calls.log if entry[0] == "volumes.select_node"]
    assert selects == ["n2", None]  # set, then removed before the release
    names = world.calls.names()
    assert max(i for i, n in enumerate(names) if n == "volumes.select_node") < names.index("rm.release")
    assert SELECTED_NODE not in world.volumes.claims["data"]["metadata"]["annotations"]


async def test_a_volume_api_failure_is_a_scheduler_error_not_unschedulable() -> None:
    world = VolumeWorld("data")

    def broken(reads: int) -> None:
        raise VolumeError("reading persistentvolumeclaim ns/data failed: HTTP 500: etcd is away")

    world.volumes.before_read = broken
    outcome = await world.run()
    assert outcome.outcome is Outcome.ERROR
    assert outcome.failure is not None
    assert "etcd is away" in outcome.failure.message
    assert "rm.reserve" not in world.calls.names()


@pytest.mark.parametrize("claims", [()])
async def test_a_pod_without_claims_touches_no_volume_api(claims: tuple[str, ...]) -> None:
    world = VolumeWorld(*claims)
    outcome = await world.run()
    assert outcome.outcome is Outcome.BOUND
    assert not [name for name in world.calls.names() if name.startswith("volumes.")]


async def test_the_lease_is_renewed_while_the_provisioner_works() -> None:
    """Provisioning outlasts the reservation's lease (3 s here): PreBind renews it instead of letting it
    run out under a pod whose volume is being made for that node."""
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data")
    world.volumes.provision_after = 8  # polls, every 0.5 s: about 4 s
    outcome = await world.run(reservation_ttl_seconds=3)
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    names = world.calls.names()
    last_look = max(i for i, name in enumerate(names) if name == "volumes.claim")
    assert "rm.renew" in names[names.index("volumes.select_node") : last_look], names  # while waiting


def test_many_local_volumes_make_one_term_per_key_not_one_per_volume() -> None:
    """70 local volumes on 10 nodes: 70 terms would exceed the contract's 64 and fail every reserve."""
    local = ClaimView(name="data", claim=claim("data", cls="local"), storage_class=LOCAL)
    volumes = [pv(f"v{i}", node=f"n{i % 10}") for i in range(70)]
    terms = claim_terms(local, matching_volumes(claim=local.claim or {}, volumes=volumes))
    assert terms is not None
    assert len(terms) == 1
    assert sorted(terms[0]["matchExpressions"][0]["values"]) == sorted(f"n{i}" for i in range(10))
    assert compact_terms([terms[0], terms[0]]) == terms


async def test_a_claim_already_selected_for_a_node_keeps_the_pod_there() -> None:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data")
    world.volumes.claims["data"]["metadata"]["annotations"] = {SELECTED_NODE: "n2"}
    await world.run()
    [request] = world.rm.requests
    assert request.placement.affinity_terms() == [
        {
            "matchExpressions": [],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}],
        }
    ]


def waiting_world() -> VolumeWorld:
    """A WaitForFirstConsumer claim whose provisioner never provisions (tests change the world)."""
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data")
    world.volumes.provision_after = None
    return world


async def test_a_provisioner_that_removes_the_selected_node_ends_the_wait_at_once() -> None:
    world = waiting_world()

    def gives_up(reads: int) -> None:
        if reads >= 3:  # "no capacity there"
            world.volumes.claims["data"]["metadata"].get("annotations", {}).pop(SELECTED_NODE, None)

    world.volumes.before_read = gives_up
    outcome = await world.run(volume_bind_timeout_seconds=60)
    assert outcome.failure is not None
    assert "gave up on node" in outcome.failure.message
    assert outcome.released
    assert world.calls.count("volumes.claim") < 10  # not 60 s of polling


async def test_a_pod_deleted_while_its_volumes_are_bound_ends_the_wait_and_releases() -> None:
    world = waiting_world()

    def then_deleted(reads: int) -> None:
        if reads >= 3:
            world.pods.pods.clear()

    world.volumes.before_read = then_deleted
    outcome = await world.run(volume_bind_timeout_seconds=60)
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.POD_GONE
    assert outcome.released


async def test_a_read_that_fails_once_while_waiting_is_retried_not_fatal() -> None:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data")
    world.volumes.provision_after = 3
    failed: list[bool] = []

    def flaky(reads: int) -> None:
        if reads == 3 and not failed:
            failed.append(True)
            raise VolumeError("reading persistentvolumeclaim ns/data failed: HTTP 500: busy")

    world.volumes.before_read = flaky
    outcome = await world.run(volume_bind_timeout_seconds=60)
    assert failed == [True]
    assert outcome.outcome is Outcome.BOUND, outcome.failure


async def test_unreserve_leaves_a_selection_another_scheduler_made_since() -> None:
    world = waiting_world()

    def reselected(reads: int) -> None:
        if reads == 4:  # after the fourth read: another scheduler selected n3
            world.volumes.claims["data"]["metadata"]["annotations"][SELECTED_NODE] = "n3"

    world.volumes.before_read = reselected
    outcome = await world.run(volume_bind_timeout_seconds=60)
    assert outcome.failure is not None  # the provisioner's "gave up on n2", as it now says n3
    assert world.volumes.claims["data"]["metadata"]["annotations"] == {SELECTED_NODE: "n3"}
    selects = [entry[1]["node"] for entry in world.calls.log if entry[0] == "volumes.select_node"]
    assert selects == ["n2"]  # set once, never removed: it is not ours any more


def _key_reused() -> RMConflict:
    return RMConflict(
        "the RM rejected reserve with HTTP 409: idempotency key reused for a different request",
        status=409,
        problem={"type": ProblemType.IDEMPOTENCY_KEY_REUSED},
    )


def world_with_earlier_reservation(*, on: str) -> VolumeWorld:
    """The claim is bound to a volume on n2; the RM still holds a reservation for the pod on `on`,
    made under another request, so the next reserve answers 409 idempotency-key-reused."""
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data", volume="pv-1")
    world.volumes.pvs["pv-1"] = pv("pv-1", node="n2")
    world.rm.reserve_errors = [_key_reused()]
    world.rm.listed = [
        Reservation(
            id="earlier",
            node=on,
            state=ReservationState.RESERVED,
            pod_uid=world.pod.uid,
            scheduler_name="bindery",
        )
    ]
    return world


async def test_a_reservation_kept_from_before_the_claim_was_bound_is_kept_if_its_node_still_fits() -> None:
    """An earlier cycle reserved on n2 without a volume constraint, bound the claim there and lost its
    Binding's answer; the next cycle's request now carries the volume's node affinity (n2), and the RM
    answers 409 idempotency-key-reused. The earlier reservation fits the new request: it is used."""
    world = world_with_earlier_reservation(on="n2")
    outcome = await world.run()
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    assert outcome.reservation_id == "earlier"
    assert world.calls.count("rm.reserve") == 1
    assert "rm.release" not in world.calls.names()


async def test_a_kept_reservation_the_new_constraints_rule_out_is_released_and_replaced() -> None:
    world = world_with_earlier_reservation(on="n1")
    outcome = await world.run()
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    names = world.calls.names()
    assert names.count("rm.reserve") == 2
    assert names.index("rm.release") < len(names) - names[::-1].index("rm.reserve") - 1
    assert ("release", "earlier", world.pod.uid) in world.rm.pod_uids
    assert outcome.reservation_id != "earlier"


# -- VolumeZone: a bound volume's zone and region labels ---------------------------------------------


def zoned_pv(name: str, **labels: str) -> dict[str, Any]:
    """A bound volume with topology labels and no node affinity (a cloud disk as older CSI drivers
    and the in-tree ones labelled it)."""
    volume = pv(name, node=None)
    volume["metadata"]["labels"] = dict(labels)
    return volume


ZONE_KEY, BETA_ZONE_KEY = "topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"
REGION_KEY = "topology.kubernetes.io/region"


def zoned_node(name: str, **labels: str) -> NodeProjection:
    return NodeProjection(name=name, labels={"kubernetes.io/hostname": name, **labels})


def allowed(terms: list[dict[str, Any]], nodes: list[NodeProjection]) -> list[str]:
    return [
        n.name for n in nodes if matches_required_affinity(terms=terms, labels=n.labels, node_name=n.name)
    ]


ZONED_NODES = {
    "n1": zoned_node("n1", **{ZONE_KEY: "a", REGION_KEY: "r1"}),
    "n2": zoned_node("n2", **{ZONE_KEY: "b", REGION_KEY: "r1"}),
    "n3": zoned_node("n3", **{ZONE_KEY: "b", REGION_KEY: "r2"}),
    "bare": zoned_node("bare"),
}


def zoned_world(volume: dict[str, Any], *, rm_node: str) -> VolumeWorld:
    world = VolumeWorld("data")
    world.volumes.claims["data"] = claim("data", volume=volume["metadata"]["name"])
    world.volumes.pvs[volume["metadata"]["name"]] = volume
    world.rm = FakeRM(world.calls, node=rm_node)
    world.nodes = FakeNodes(world.calls, dict(ZONED_NODES))
    return world


async def test_a_bound_volume_with_zone_labels_and_no_node_affinity_keeps_the_pod_in_its_zone() -> None:
    """kube-scheduler's VolumeZone: a zone-b, region-r1 disk limits the pod to such nodes, and to
    nodes with no topology label at all, which upstream lets through (single-zone clusters)."""
    world = zoned_world(zoned_pv("disk", **{ZONE_KEY: "b", REGION_KEY: "r1"}), rm_node="n2")
    outcome = await world.run()
    assert outcome.outcome is Outcome.BOUND
    [request] = world.rm.requests
    assert allowed(request.placement.affinity_terms(), list(ZONED_NODES.values())) == ["n2", "bare"]


def test_zone_terms_follow_volume_zones_beta_labels_and_multi_zone_values() -> None:
    nodes = list(ZONED_NODES.values())
    beta = zone_terms(zoned_pv("old", **{BETA_ZONE_KEY: "b"}))
    assert beta is not None
    # A beta label on the volume matches the GA label of a node that lacks the beta one.
    assert allowed(beta, nodes) == ["n2", "n3", "bare"]
    assert allowed(beta, [zoned_node("legacy", **{BETA_ZONE_KEY: "a", ZONE_KEY: "b"})]) == []
    multi = zone_terms(zoned_pv("regional", **{ZONE_KEY: "a__b"}))
    assert multi is not None
    assert allowed(multi, nodes) == ["n1", "n2", "n3", "bare"]
    assert zone_terms(zoned_pv("plain", team="x")) is None
    assert zone_terms(zoned_pv("malformed", **{ZONE_KEY: "a__"})) is None  # ignored, as upstream does


async def test_an_rm_choice_outside_the_volumes_zone_is_released_and_names_the_rule() -> None:
    """NodeCheck: a third-party RM that ignores the zone terms is caught before the Binding."""
    world = zoned_world(zoned_pv("disk", **{ZONE_KEY: "b"}), rm_node="n1")
    outcome = await world.run()
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.NODE_CHECK
    assert "VolumeZone" in outcome.failure.message
    assert outcome.released
    assert "binder.bind" not in world.calls.names()
