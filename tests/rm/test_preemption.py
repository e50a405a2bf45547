"""Contract v1.2 feature `preemption`, end to end over HTTP with the reference RM (issue 21).

Why: a pod of priority 100000 stayed Pending next to pods of priority 10, because the contract gave
`pod.priority` no meaning and nothing proposed victims. These tests run the client against the
reference RM with a mirrored set of bound pods (as `--mirror-nodes` feeds it), and against RMs
without the feature, which must never receive `preemptionPolicy`.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any, Literal

import pytest

from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.accounting import BoundPod, ClusterPods, bound_pod
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.preemption import Budget, budget_from, choose_rule_victims, choose_victims
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMConflict, RMUnschedulable
from bindery.rm.models import Placement, PlanState, PodIdentity, ReservationRequest

from .conftest import TOKEN

_NO_CONSTRAINTS: dict[str, Any] = {"node_selector": {}, "affinity_terms": [], "tolerations": []}


def _inventory() -> list[InventoryNode]:
    """The issue's two 4-CPU nodes."""
    return [
        InventoryNode(name=name, allocatable={"cpu": Decimal(4), "pods": Decimal(110)}) for name in ("a", "b")
    ]


def _request(
    uid: str,
    *,
    priority: int,
    policy: Literal["PreemptLowerPriority", "Never"] | None = "PreemptLowerPriority",
    cpu: str = "2",
) -> ReservationRequest:
    return ReservationRequest(
        pod=PodIdentity(
            uid=uid, namespace="ns", name=f"pod-{uid}", scheduler_name="bindery", priority=priority
        ),
        resources={"cpu": cpu},
        idempotency_key=uid,
        ttl_seconds=60,
        preemption_policy=policy,
    )


def _pod(uid: str, node: str, *, priority: int, cpu: str = "2", reservation: str | None = None) -> BoundPod:
    """A bound pod as the pod mirror turns a Kubernetes Pod into one."""
    annotations = {"bindery.dev/reservation-id": reservation} if reservation else {}
    pod = bound_pod(
        {
            "metadata": {"uid": uid, "namespace": "ns", "name": f"pod-{uid}", "annotations": annotations},
            "spec": {
                "nodeName": node,
                "priority": priority,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
            },
            "status": {"phase": "Running"},
        }
    )
    assert pod is not None
    return pod


def _client(url: str) -> ResourceManagerClient:
    return ResourceManagerClient(base_url=url, token=TOKEN, allow_insecure_http=True, batching=False)


@pytest.fixture
async def rm(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=_inventory(), token=TOKEN, policy=Policy.BINPACK
    ) as server:
        yield server


async def _fill(server: RunningServer, client: ResourceManagerClient) -> list[BoundPod]:
    """Four 2-CPU pods of priority 10 that the RM placed (reserved, committed, then bound)."""
    pods = []
    for uid in ("low-1", "low-2", "low-3", "low-4"):
        reservation = await client.reserve(_request(uid, priority=10, policy=None))
        await client.commit(reservation.id, pod_uid=uid)
        pods.append(_pod(uid, reservation.node, priority=10, reservation=reservation.id))
    server.rm.set_bound_pods(ClusterPods.of(pods))
    return pods


async def test_the_issue_scenario_gets_a_one_victim_plan_and_the_room_is_held_for_the_preemptor(
    rm: RunningServer,
) -> None:
    async with _client(rm.url) as client:
        assert "preemption" in (await client.contract_info()).features
        pods = await _fill(rm, client)
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve(_request("high", priority=100_000))
        plan = refused.value.plan
        assert plan is not None, refused.value.reason
        assert plan.pod_uid == "high"
        assert plan.state is PlanState.PROPOSED
        assert len(plan.victims) == 1
        victim = next(pod for pod in pods if pod.uid == plan.victims[0].pod.uid)
        assert victim.node == plan.node
        assert plan.victims[0].reservation_id == victim.reservation_id
        assert plan.victims[0].frees == {"cpu": "2", "pods": "1"}

        # Asked again while the victim terminates: the same plan, not a second victim.
        with pytest.raises(RMUnschedulable) as again:
            await client.reserve(_request("high", priority=100_000))
        assert again.value.plan is not None
        assert again.value.plan.plan_id == plan.plan_id

        confirmed = await client.confirm_preemption(plan.plan_id)
        assert confirmed.state is PlanState.CONFIRMED
        assert confirmed.expires_at is not None
        assert (await client.confirm_preemption(plan.plan_id)).plan_id == plan.plan_id  # idempotent

        # The victim is evicted: its pod leaves the mirror and its reservation is released.
        assert victim.reservation_id is not None
        await client.release(victim.reservation_id, pod_uid=victim.uid)
        rm.rm.set_bound_pods(ClusterPods.of(pod for pod in pods if pod is not victim))

        # The room is the preemptor's: another pod, even of higher priority, does not get it ...
        with pytest.raises(RMUnschedulable) as intruder:
            await client.reserve(_request("intruder", priority=0, policy=None))
        assert intruder.value.plan is None
        # ... and a second preemptor is not offered the same victim or the held room.
        with pytest.raises(RMUnschedulable) as rival:
            await client.reserve(_request("rival", priority=100_000))
        assert rival.value.plan is None or rival.value.plan.victims[0].pod.uid != victim.uid

        placed = await client.reserve(_request("high", priority=100_000))
        assert placed.node == plan.node
        with pytest.raises(RMConflict):  # used: confirming again is refused
            await client.confirm_preemption(plan.plan_id)
        await client.cancel_preemption(plan.plan_id)  # idempotent, even when used
        await client.cancel_preemption("pln-unknown")  # unknown: nothing to do


async def test_a_cancelled_plan_gives_the_room_back(rm: RunningServer) -> None:
    async with _client(rm.url) as client:
        pods = await _fill(rm, client)
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve(_request("high", priority=100_000))
        plan = refused.value.plan
        assert plan is not None
        await client.confirm_preemption(plan.plan_id)
        victim = next(pod for pod in pods if pod.uid == plan.victims[0].pod.uid)
        assert victim.reservation_id is not None
        await client.release(victim.reservation_id, pod_uid=victim.uid)
        rm.rm.set_bound_pods(ClusterPods.of(pod for pod in pods if pod is not victim))
        await client.cancel_preemption(plan.plan_id)
        with pytest.raises(RMConflict):
            await client.confirm_preemption(plan.plan_id)
        placed = await client.reserve(_request("other", priority=0, policy=None))
        assert placed.node == plan.node


async def test_never_and_absent_policies_and_equal_priorities_get_no_plan(rm: RunningServer) -> None:
    async with _client(rm.url) as client:
        await _fill(rm, client)
        for request in (
            _request("never", priority=100_000, policy="Never"),
            _request("absent", priority=100_000, policy=None),
            _request("equal", priority=10),
        ):
            with pytest.raises(RMUnschedulable) as refused:
                await client.reserve(request)
            assert refused.value.plan is None, request.pod.uid


@pytest.mark.parametrize("rm_kind", ["v1.1", "without-feature"])
async def test_an_rm_without_the_feature_never_sees_preemption_policy(
    tmp_path: pathlib.Path, rm_kind: str
) -> None:
    """Such an RM answers 400 to `preemptionPolicy`; the client leaves it out, so the pod is merely
    unschedulable, as before v1.2."""
    async with (
        serve_reference_rm(
            db_path=tmp_path / "rm.sqlite",
            inventory=_inventory(),
            token=TOKEN,
            cluster_ids=rm_kind != "v1.1",
            preemption=False,
        ) as server,
        _client(server.url) as client,
    ):
        assert "preemption" not in (await client.contract_info()).features
        await _fill(server, client)
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve(_request("high", priority=100_000))
        assert refused.value.plan is None


def test_victims_are_the_fewest_lower_priority_pods_lowest_first() -> None:
    """kube-scheduler's reprieve: node `a` needs two victims (priorities 1 and 2 are evicted, 3 is
    reprieved), node `b` one (50; 60 reprieved): `b` wins with fewer victims. Pods of the same
    priority as the preemptor, or higher, are never victims."""
    nodes = [InventoryNode(name=name, allocatable={"cpu": Decimal(4)}) for name in ("a", "b", "c")]
    pods = [
        _pod("a1", "a", priority=1, cpu="1"),
        _pod("a2", "a", priority=2, cpu="1"),
        _pod("a3", "a", priority=3, cpu="2"),
        _pod("b50", "b", priority=50),
        _pod("b60", "b", priority=60),
        _pod("c100", "c", priority=100, cpu="4"),
    ]
    used = {
        node: {"cpu": sum((p.usage["cpu"] for p in pods if p.node == node), Decimal(0))} for node in "abc"
    }
    found = choose_victims(
        nodes=nodes,
        requests={"cpu": Decimal(2)},
        priority=100,
        placement=_NO_CONSTRAINTS,
        used_by_node=used,
        pods=ClusterPods.of(pods),
    )
    assert found is not None
    assert (found.node, [v.uid for v in found.victims]) == ("b", ["b50"])

    only_a = choose_victims(
        nodes=nodes,
        requests={"cpu": Decimal(2)},
        priority=100,
        placement=_NO_CONSTRAINTS,
        used_by_node=used,
        pods=ClusterPods.of(pods),
        spoken_for=frozenset({"b50", "b60"}),
    )
    assert only_a is not None
    assert (only_a.node, [v.uid for v in only_a.victims]) == ("a", ["a1", "a2"])


async def test_the_conformance_check_passes_the_reference_rm_and_fails_one_that_gives_the_room_away(
    rm: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the mirror, the reference RM proposes among the pods it placed (what the kit can make);
    with holds broken (no room taken out of other reserves), the kit's intruder gets the room."""
    from bindery.conformance import CHECKS, ConformanceConfig
    from bindery.conformance.kit import http_client, run_check
    from bindery.reference_rm import store as store_module

    check = next(c for c in CHECKS if c.name == "preemption")
    config = ConformanceConfig(url=rm.url, token=TOKEN, resource="cpu", capacity=8)
    async with http_client(config) as http:
        passed = await run_check(check, config, http)
        assert passed.passed, passed.error
        # The stores take the held rooms out of the nodes they place on (reference_rm/store.py).
        monkeypatch.setattr(store_module, "without_held", lambda nodes, held: nodes)
        failed = await run_check(check, config, http)
    assert not failed.passed
    assert "holds the freed room" in (failed.error or ""), failed.error


async def test_a_batched_reserve_gets_the_plan_its_single_call_would(rm: RunningServer) -> None:
    import httpx

    async with _client(rm.url) as client:
        await _fill(rm, client)
    body = _request("high", priority=100_000).model_dump(by_alias=True, exclude_none=True, mode="json")
    async with httpx.AsyncClient(base_url=rm.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        answer = await http.post("/v1/batch", json={"operations": [{"reserve": body}]})
    (result,) = answer.json()["results"]
    assert result["status"] == 409
    assert result["problem"]["preemption"]["podUid"] == "high"
    assert len(result["problem"]["preemption"]["victims"]) == 1


def _labelled(uid: str, node: str, *, priority: int, labels: dict[str, str]) -> BoundPod:
    import dataclasses

    return dataclasses.replace(_pod(uid, node, priority=priority), labels=tuple(sorted(labels.items())))


def _budget(name: str, *, app: str, allowed: int = 0) -> Budget:
    return budget_from(
        {
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed},
        }
    )


def _choose(pods: list[BoundPod], budgets: list[Budget]) -> Any:
    nodes = [InventoryNode(name=name, allocatable={"cpu": Decimal(4)}) for name in ("a", "b")]
    used = {node: {"cpu": sum((p.usage["cpu"] for p in pods if p.node == node), Decimal(0))} for node in "ab"}
    return choose_victims(
        nodes=nodes,
        requests={"cpu": Decimal(2)},
        priority=100,
        placement=_NO_CONSTRAINTS,
        used_by_node=used,
        pods=ClusterPods.of(pods),
        budgets=budgets,
    )


def test_the_node_whose_victims_no_budget_protects_wins() -> None:
    """Issue 21: "victims no PDB protects preferred". Nodes `a` and `b` tie on every other rule
    (one 2-CPU victim of priority 10 each); `a`'s pods are protected (0 disruptions allowed), so the
    victim is on `b`, as kube-scheduler's first criterion (fewest PDB violations) picks."""
    pods = [
        _labelled("a1", "a", priority=10, labels={"app": "kept"}),
        _labelled("a2", "a", priority=10, labels={"app": "kept"}),
        _labelled("b1", "b", priority=10, labels={"app": "free"}),
        _labelled("b2", "b", priority=10, labels={"app": "free"}),
    ]
    assert _choose(pods, []).node == "a"  # without budgets, the name breaks the tie
    found = _choose(pods, [_budget("keep", app="kept")])
    assert (found.node, len(found.victims), dict(found.violations)) == ("b", 1, {})


def test_on_one_node_the_unprotected_pod_is_the_victim_even_at_a_higher_priority() -> None:
    """Within a node, protected candidates are reprieved first (upstream's SelectVictimsOnNode):
    the priority-5 pod is protected, so the priority-7 one is evicted instead."""
    pods = [
        _labelled("p5", "a", priority=5, labels={"app": "kept"}),
        _labelled("p7", "a", priority=7, labels={"app": "free"}),
        _labelled("b1", "b", priority=200, labels={}),
        _labelled("b2", "b", priority=200, labels={}),
    ]
    assert [v.uid for v in _choose(pods, []).victims] == ["p5"]
    found = _choose(pods, [_budget("keep", app="kept")])
    assert ([v.uid for v in found.victims], dict(found.violations)) == (["p7"], {})


def test_when_every_candidate_is_protected_the_victim_names_its_budget() -> None:
    """No node can do without a protected victim: the plan still names one (the caller decides; the
    Eviction API would refuse it) and says which budget it would exceed. A budget allowing one
    disruption covers one victim, not two; an empty selector protects nothing (as upstream)."""
    pods = [
        _labelled(uid, node, priority=10, labels={"app": "kept"})
        for uid, node in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b"))
    ]
    found = _choose(pods, [_budget("keep", app="kept")])
    assert dict(found.violations) == {found.victims[0].uid: ("keep",)}
    assert dict(_choose(pods, [_budget("keep", app="kept", allowed=1)]).violations) == {}
    everything = budget_from({"metadata": {"namespace": "ns", "name": "all"}, "spec": {"selector": {}}})
    assert dict(_choose(pods, [everything]).violations) == {}


async def test_a_plan_whose_victim_a_budget_protects_says_so_over_http(rm: RunningServer) -> None:
    async with _client(rm.url) as client:
        pods = await _fill(rm, client)
        rm.rm.set_budgets(
            [
                budget_from(
                    {
                        "metadata": {"namespace": "ns", "name": "keep-low"},
                        "spec": {"selector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}},
                    }
                )
            ]
        )
        import dataclasses

        rm.rm.set_bound_pods(ClusterPods.of(dataclasses.replace(p, labels=(("tier", "low"),)) for p in pods))
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve(_request("high", priority=100_000))
        plan = refused.value.plan
        assert plan is not None
        assert [v.violated_budgets for v in plan.victims] == [["keep-low"]]


def _member(uid: str, node: str, *, group: str | None, priority: int = 10) -> BoundPod:
    import dataclasses

    return dataclasses.replace(_pod(uid, node, priority=priority), group=group)


def test_a_pod_groups_members_are_victims_together_or_not_at_all() -> None:
    """Issue 21: "a pod group's members all or none" (volcano#4607). Node `a` holds a two-member
    gang, node `b` a single pod and one of the preemptor's priority: breaking the gang would free
    room with one victim on `a` (the name breaks the tie), so `b`'s single pod is the victim. With
    the peer gone from `b` too, the whole gang goes when `a` is the only node left. A gang with a
    member on another node is no candidate at all."""
    gang = [_member("g0", "a", group="ns/gang"), _member("g1", "a", group="ns/gang")]
    single = [_member("s0", "b", group=None), _member("peer", "b", group=None, priority=100)]
    assert [v.uid for v in _choose(gang + single, []).victims] == ["s0"]
    only_a = choose_victims(
        nodes=[InventoryNode(name="a", allocatable={"cpu": Decimal(4)})],
        requests={"cpu": Decimal(2)},
        priority=100,
        placement=_NO_CONSTRAINTS,
        used_by_node={"a": {"cpu": Decimal(4)}},
        pods=ClusterPods.of(gang),
    )
    assert only_a is not None
    assert sorted(v.uid for v in only_a.victims) == ["g0", "g1"]
    spread = [_member("g0", "a", group="ns/gang"), _member("x", "a", group=None, priority=100)]
    spread.append(_member("g1", "b", group="ns/gang"))
    spread.append(_member("y", "b", group=None, priority=100))
    assert _choose(spread, []) is None


async def test_the_conformance_check_fails_an_rm_whose_victims_name_budgets_badly(
    rm: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bindery.conformance import CHECKS, ConformanceConfig
    from bindery.conformance.kit import http_client, run_check
    from bindery.reference_rm import preemption as preemption_module

    original = preemption_module.Plan.to_json

    def malformed(plan: Any) -> dict[str, Any]:
        body = original(plan)
        for victim in body["victims"]:
            victim["violatedBudgets"] = "keep-low"  # a string, not a list of names
        return body

    monkeypatch.setattr(preemption_module.Plan, "to_json", malformed)
    check = next(c for c in CHECKS if c.name == "preemption")
    config = ConformanceConfig(url=rm.url, token=TOKEN, resource="cpu", capacity=8)
    async with http_client(config) as http:
        failed = await run_check(check, config, http)
    assert not failed.passed
    assert "violatedBudgets must be a list" in (failed.error or ""), failed.error


async def test_two_replicas_on_one_database_answer_each_others_plans_and_hold_their_rooms(
    postgres_db: str,
) -> None:
    """Issue 22: any replica answers any call. The issue's scenario with the plan proposed by
    replica A and everything after it sent to replica B: B confirms it, keeps the freed room from an
    intruder, places the preemptor there, and A then sees the plan used. (When plans lived in A's
    memory, B answered the confirm 404 and gave the room to the intruder.)"""
    async with contextlib.AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                serve_reference_rm(
                    db_path=postgres_db, inventory=_inventory(), token=TOKEN, policy=Policy.BINPACK
                )
            )
            for _ in range(2)
        ]
        async with _client(a.url) as on_a, _client(b.url) as on_b:
            pods = await _fill(a, on_a)
            b.rm.set_bound_pods(ClusterPods.of(pods))  # both mirror the same pods
            with pytest.raises(RMUnschedulable) as refused:
                await on_a.reserve(_request("high", priority=100_000))
            plan = refused.value.plan
            assert plan is not None, refused.value.reason
            with pytest.raises(RMUnschedulable) as again:  # asked again on B: the same plan
                await on_b.reserve(_request("high", priority=100_000))
            assert again.value.plan is not None
            assert again.value.plan.plan_id == plan.plan_id
            confirmed = await on_b.confirm_preemption(plan.plan_id)
            assert confirmed.state is PlanState.CONFIRMED
            victim = next(pod for pod in pods if pod.uid == plan.victims[0].pod.uid)
            assert victim.reservation_id is not None
            await on_b.release(victim.reservation_id, pod_uid=victim.uid)
            left = ClusterPods.of(pod for pod in pods if pod is not victim)
            a.rm.set_bound_pods(left)
            b.rm.set_bound_pods(left)
            for client in (on_a, on_b):
                with pytest.raises(RMUnschedulable) as intruder:
                    await client.reserve(_request(f"intruder-{id(client)}", priority=0, policy=None))
                assert intruder.value.plan is None
            placed = await on_b.reserve(_request("high", priority=100_000))
            assert placed.node == plan.node
            with pytest.raises(RMConflict):  # used, as A reads it too
                await on_a.confirm_preemption(plan.plan_id)


def test_a_rule_plan_names_the_listed_pods_and_adds_pods_for_room_on_top() -> None:
    """Contract v1.2.4 ``rulePreemption``: on node `b` the caller's rule needs `b-named` gone; room
    needs 2 CPU more, which the lowest remaining pod (`b1`, not `b5`) frees. A node whose listed pod
    is of the preemptor's priority gets no plan."""
    nodes = [InventoryNode(name=name, allocatable={"cpu": Decimal(4)}) for name in ("a", "b")]
    pods = [
        _pod("b-named", "b", priority=20, cpu="1"),
        _pod("b1", "b", priority=1, cpu="2"),
        _pod("b5", "b", priority=5, cpu="1"),
        _pod("a-same", "a", priority=100, cpu="1"),
    ]
    used = {node: {"cpu": sum((p.usage["cpu"] for p in pods if p.node == node), Decimal(0))} for node in "ab"}
    found = choose_rule_victims(
        nodes=nodes,
        requests={"cpu": Decimal(3)},
        priority=100,
        tolerations=[],
        required={"b": frozenset({"b-named"}), "a": frozenset({"a-same"})},
        used_by_node=used,
        pods=ClusterPods.of(pods),
    )
    assert found is not None
    assert (found.node, sorted(v.uid for v in found.victims)) == ("b", ["b-named", "b1"])
    spoken = choose_rule_victims(
        nodes=nodes,
        requests={"cpu": Decimal(1)},
        priority=100,
        tolerations=[],
        required={"b": frozenset({"b-named"})},
        used_by_node=used,
        pods=ClusterPods.of(pods),
        spoken_for=frozenset({"b-named"}),
    )
    assert spoken is None


async def test_a_rule_preemption_node_is_never_placed_on_and_its_plan_names_the_listed_pod(
    rm: RunningServer,
) -> None:
    """Over HTTP: the caller lists node `n1` with its low pod; `n1` has room, yet the preemptor is
    not placed there (its rule accepts it only without that pod): the plan names the pod."""
    from bindery.rm.models import RulePreemption, RuleVictim

    client = _client(rm.url)
    try:
        low = await client.reserve(_request("low-r", priority=10, policy=None, cpu="1"))
        await client.commit(low.id, pod_uid="low-r")
        rm.rm.set_bound_pods(
            ClusterPods.of([_pod("low-r", low.node, priority=10, cpu="1", reservation=low.id)])
        )
        only = {
            "requiredNodeAffinity": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [low.node]}]}
            ]
        }
        request = _request("high-r", priority=100, cpu="1").model_copy(
            update={
                "placement": Placement.model_validate(only),
                "rule_preemption": [
                    RulePreemption(
                        node=low.node, victims=[RuleVictim(namespace="ns", name="pod-low-r", uid="low-r")]
                    )
                ],
            }
        )
        with pytest.raises(RMUnschedulable) as raised:
            await client.reserve(request)
        plan = raised.value.plan
        assert plan is not None
        assert (plan.node, [v.pod.uid for v in plan.victims]) == (low.node, ["low-r"])
        # Without the field the same request is placed on the room n1 has.
        placed = await client.reserve(
            request.model_copy(update={"rule_preemption": None, "idempotency_key": "other"})
        )
        assert placed.node == low.node
    finally:
        await client.aclose()


async def test_the_rule_preemption_check_passes_the_reference_rm_and_fails_one_that_places_there(
    rm: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bindery.conformance import CHECKS, ConformanceConfig
    from bindery.conformance.kit import http_client, run_check
    from bindery.reference_rm import store as store_module

    check = next(c for c in CHECKS if c.name == "rule-preemption")
    config = ConformanceConfig(url=rm.url, token=TOKEN, resource="cpu", capacity=8)
    async with http_client(config) as http:
        passed = await run_check(check, config, http)
        assert passed.passed, passed.error
        monkeypatch.setattr(store_module, "placeable", lambda nodes, request: nodes)
        failed = await run_check(check, config, http)
    assert not failed.passed
    assert "must never be placed there" in (failed.error or ""), failed.error


async def test_a_rule_preemption_node_gets_no_plan_without_the_listed_pods(rm: RunningServer) -> None:
    """Node `b` is full: `named` (priority 20, 1 CPU), which the caller's rule needs gone, and
    `roomy` (priority 1, 3 CPU). Room for the 2-CPU preemptor needs only `roomy` gone, but a plan
    on a listed node must name every listed pod (contract v1.2.4): evicting `roomy` alone frees
    room the pod may never use, since its rule still excludes `b`. Before, the room-only plan (one
    victim) outranked the rule's (two) and was proposed."""
    from bindery.rm.models import RulePreemption, RuleVictim

    rm.rm.set_bound_pods(
        ClusterPods.of(
            [
                _pod("named", "b", priority=20, cpu="1"),
                _pod("roomy", "b", priority=1, cpu="3"),
                _pod("full-a", "a", priority=1000, cpu="4"),
            ]
        )
    )
    only_b = {
        "requiredNodeAffinity": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
        ]
    }
    request = _request("high-r", priority=100, cpu="2").model_copy(
        update={
            "placement": Placement.model_validate(only_b),
            "rule_preemption": [
                RulePreemption(node="b", victims=[RuleVictim(namespace="ns", name="pod-named", uid="named")])
            ],
        }
    )
    client = _client(rm.url)
    try:
        with pytest.raises(RMUnschedulable) as raised:
            await client.reserve(request)
    finally:
        await client.aclose()
    plan = raised.value.plan
    assert plan is not None
    assert (plan.node, sorted(v.pod.uid for v in plan.victims)) == ("b", ["named", "roomy"])


async def test_a_rule_preemption_node_is_not_placed_on_by_an_rm_that_cannot_receive_the_field(
    tmp_path: pathlib.Path,
) -> None:
    """PodPlacementRules lists node `b` (its rule excludes it while `low` stays) and limits the
    reserve to it, for an RM that may take ``rulePreemption``, as far as the client knew without a
    call (its first reserve has not read ``GET /v1/info`` yet). This RM lacks the preemption
    features, so the client drops the field: it must keep `b` out of the placement too. Before, the
    reserve went without the field and the RM placed the pod on `b`, against its inter-pod rule."""
    from bindery.rm.models import RulePreemption, RuleVictim

    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=_inventory(), token=TOKEN, preemption=False
    ) as server:
        server.rm.set_bound_pods(ClusterPods.of([_pod("low", "b", priority=10, cpu="1")]))
        client = _client(server.url)
        try:
            assert client.takes_rule_preemption()  # unknown yet: PodPlacementRules names the victims
            only_b = {
                "requiredNodeAffinity": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
                ]
            }
            request = _request("high-r", priority=100, cpu="1").model_copy(
                update={
                    "placement": Placement.model_validate(only_b),
                    "rule_preemption": [
                        RulePreemption(
                            node="b", victims=[RuleVictim(namespace="ns", name="pod-low", uid="low")]
                        )
                    ],
                }
            )
            with pytest.raises(RMUnschedulable) as raised:  # before: placed on b
                await client.reserve(request)
            assert raised.value.plan is None
            assert not client.takes_rule_preemption()
        finally:
            await client.aclose()


def test_dropping_rule_preemption_excludes_each_listed_node_once_per_term() -> None:
    from bindery.rm.answers import without_nodes as _without_nodes

    placement = Placement.model_validate(
        {
            "requiredNodeAffinity": [
                {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["b"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
            ]
        }
    )
    terms = _without_nodes(placement, ["b", "c"]).model_dump(by_alias=True, exclude_defaults=True)
    not_in = [[f["values"][0] for f in term.get("matchFields", [])] for term in terms["requiredNodeAffinity"]]
    assert not_in == [["b", "c"], ["b", "c"]]
    assert _without_nodes(placement, []) is placement
