"""A pod group as preemptor (contract v1.2, feature ``group-preemption``; issue 21 item 4).

Why: a group's reserve answered "unschedulable" with no plan, so a high-priority gang stayed
Pending beside pods of priority 10 for ever. Here: the reference RM's choice of victims for a whole
group (the fewest, lower than every member, on as many nodes as the members need, PodDisruptionBudgets
spared first); the plan's hold in both stores (the members' rooms held from everyone else, the
group's own reserve placed on them and ending the plan); and the exchange over HTTP.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import AsyncIterator, Mapping
from decimal import Decimal
from typing import Literal

import pytest

from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.accounting import BoundPod, ClusterPods, bound_pod
from bindery.reference_rm.groups import MemberAsk
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.preemption import (
    REPRIEVE_PLACEMENTS,
    Budget,
    GroupCandidate,
    PlanMember,
    Proposal,
    budget_from,
    choose_group_victims,
    group_plan_key,
)
from bindery.reference_rm.store import GroupPlaced, Placed, Unschedulable
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMConflict, RMUnschedulable
from bindery.rm.models import PlanState, PodIdentity, ReservationGroupRequest, ReservationRequest
from tests.rm.conftest import TOKEN, StoreFactory

NODES = [
    InventoryNode(name=name, allocatable={"cpu": Decimal(4), "pods": Decimal(110)}) for name in ("a", "b")
]


def _pod(uid: str, node: str, *, priority: int, labels: Mapping[str, str] | None = None) -> BoundPod:
    pod = bound_pod(
        {
            "metadata": {"uid": uid, "namespace": "ns", "name": uid, "labels": dict(labels or {})},
            "spec": {
                "nodeName": node,
                "priority": priority,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}],
            },
            "status": {"phase": "Running"},
        }
    )
    assert pod is not None
    return pod


def _asks(count: int) -> list[MemberAsk]:
    return [MemberAsk(label=f"ns/m{i}", requests={"cpu": Decimal(2)}) for i in range(count)]


def _used(pods: list[BoundPod]) -> dict[str, dict[str, Decimal]]:
    used: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        for name, amount in pod.usage.items():
            used.setdefault(pod.node, {})[name] = used.get(pod.node, {}).get(name, Decimal(0)) + amount
    return used


def _choose(
    pods: list[BoundPod], *, members: int, priority: int = 100, budgets: list[Budget] | None = None
) -> GroupCandidate | None:
    return choose_group_victims(
        members=_asks(members),
        topology_keys=[],
        nodes=NODES,
        priority=priority,
        used_by_node=_used(pods),
        pods=ClusterPods.of(pods),
        policy=Policy.BINPACK,
        budgets=budgets or [],
    )


def test_a_group_needing_room_on_both_nodes_gets_the_fewest_victims_lowest_priorities_first() -> None:
    """Both 4-CPU nodes full of 2-CPU pods of priorities 10..40; three 2-CPU members need 6 CPU:
    three victims on both nodes, the priority-40 pod spared, the members placed around it."""
    pods = [_pod("p10", "a", priority=10), _pod("p20", "b", priority=20)]
    pods += [_pod("p30", "a", priority=30), _pod("p40", "b", priority=40)]
    found = _choose(pods, members=3)
    assert found is not None
    assert [v.uid for v in found.victims] == ["p10", "p20", "p30"]
    assert sorted(found.nodes) == ["a", "a", "b"]


def test_victims_are_below_every_member_and_a_group_that_cannot_fit_gets_no_plan() -> None:
    """The lowest member priority bounds the victims (a victim above a member would be preempting
    a pod by one of lower priority). Room for two members only, whatever is evicted: no plan."""
    pods = [_pod("p10", "a", priority=10), _pod("p10b", "a", priority=10)]
    pods += [_pod("p60", "b", priority=60), _pod("p60b", "b", priority=60)]
    assert _choose(pods, members=3, priority=50) is None
    two = _choose(pods, members=2, priority=50)
    assert two is not None
    assert (sorted(v.uid for v in two.victims), two.nodes) == (["p10", "p10b"], ("a", "a"))
    assert _choose(pods, members=5, priority=1000) is None  # 10 CPU asked of 8


def test_the_victims_no_budget_protects_are_chosen_first() -> None:
    """Two victims are needed of four equal candidates; two are under a budget that allows no
    disruption: the other two go, and no victim names a budget."""
    pods = [_pod(f"free{i}", node, priority=10) for i, node in enumerate("ab")]
    pods += [_pod(f"kept{i}", node, priority=10, labels={"app": "db"}) for i, node in enumerate("ab")]
    budget = budget_from(
        {
            "metadata": {"namespace": "ns", "name": "db"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}},
            "status": {"disruptionsAllowed": 0},
        }
    )
    found = _choose(pods, members=2, budgets=[budget])
    assert found is not None
    assert [v.uid for v in found.victims] == ["free0", "free1"]
    assert not found.violations


def test_a_gang_among_the_candidates_is_one_victim_or_none() -> None:
    """A two-member priority-10 gang on node a, a priority-20 single pod on node b. One 2-CPU member:
    the gang is one candidate of two pods, so the single pod is the one victim (fewest victims first,
    as for a pod's plan), never one gang member. Two members (4 CPU): node a whole, the gang goes."""
    gang = [dataclasses.replace(_pod(f"g{i}", "a", priority=10), group="ns/gang") for i in range(2)]
    pods = [*gang, _pod("s", "b", priority=20), _pod("peer", "b", priority=1000)]
    found = _choose(pods, members=1)
    assert found is not None
    assert [v.uid for v in found.victims] == ["s"]
    both = _choose(pods, members=2)  # 4 CPU: the whole gang (a) or nothing
    assert both is not None
    assert sorted(v.uid for v in both.victims) == ["g0", "g1"]


# -- the plan in both stores -------------------------------------------------------------------


def _single(uid: str) -> ReservationRequest:
    return ReservationRequest.model_validate(
        {
            "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "s"},
            "resources": {"cpu": "2"},
            "idempotencyKey": uid,
            "ttlSeconds": 600,
        }
    )


def _group(name: str, members: int, *, priority: int = 100) -> ReservationGroupRequest:
    return ReservationGroupRequest.model_validate(
        {
            "group": {"namespace": "ns", "name": name, "schedulerName": "s"},
            "members": [
                {
                    "pod": {
                        "uid": f"{name}-{i}",
                        "namespace": "ns",
                        "name": f"{name}-{i}",
                        "schedulerName": "s",
                        "priority": priority,
                    },
                    "resources": {"cpu": "2"},
                }
                for i in range(members)
            ],
            "idempotencyKey": name,
            "ttlSeconds": 600,
            "preemptionPolicy": "PreemptLowerPriority",
        }
    )


def test_a_group_plans_rooms_are_held_from_others_and_become_the_groups_reservations(
    make_store: StoreFactory,
) -> None:
    """Both nodes full; the group's plan names three victims and holds a member's room on each
    node it chose. Once the victims' reservations are released, a single reserve and another group
    are refused the held room; the group's own reserve lands on it and ends the plan (``used``)."""
    store = make_store(clock=lambda: 1000.0)
    low: list[BoundPod] = []
    for i in range(4):
        placed = store.reserve(_single(f"low-{i}"), nodes=NODES, policy=Policy.BINPACK)
        assert isinstance(placed, Placed)
        store.commit(placed.reservation.id)
        low.append(
            dataclasses.replace(
                _pod(f"low-{i}", placed.reservation.node, priority=10), reservation_id=placed.reservation.id
            )
        )
    assert isinstance(
        store.reserve_group(_group("train", 3), nodes=NODES, policy=Policy.BINPACK), Unschedulable
    )
    victims = tuple(low[:3])
    members = tuple(
        PlanMember(pod_uid=f"train-{i}", node=victim.node, hold={"cpu": Decimal(2)})
        for i, victim in enumerate(victims)
    )
    key = group_plan_key("ns", "train")
    plan = store.propose_plan(
        key,
        lambda used, spoken: Proposal(node=members[0].node, victims=victims, hold={}, members=members),
        lease_seconds=60,
    )
    assert plan is not None
    assert [m.node for m in plan.members] == [v.node for v in victims]
    answer = plan.to_json()
    assert answer["podUid"] == key
    assert [v["node"] for v in answer["victims"]] == [v.node for v in victims]
    assert store.confirm_plan(plan.plan_id) is not None
    for victim in victims:
        assert store.release(victim.reservation_id or "") is not None
    assert isinstance(store.reserve(_single("intruder"), nodes=NODES, policy=Policy.BINPACK), Unschedulable)
    assert isinstance(
        store.reserve_group(_group("rival", 1), nodes=NODES, policy=Policy.BINPACK), Unschedulable
    )
    placed_group = store.reserve_group(_group("train", 3), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed_group, GroupPlaced), placed_group
    assert sorted(m.node for m in placed_group.group.members) == sorted(v.node for v in victims)
    used = store.get_plan(plan.plan_id)
    assert used is not None
    assert used.state is PlanState.USED
    # The plan ended with the group's reserve: nothing is held any more.
    assert isinstance(store.reserve(_single("after"), nodes=NODES, policy=Policy.BINPACK), Unschedulable)


# -- over HTTP ------------------------------------------------------------------------------------


@pytest.fixture
async def rm(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=NODES, token=TOKEN, policy=Policy.BINPACK
    ) as server:
        yield server


def _client(url: str) -> ResourceManagerClient:
    return ResourceManagerClient(base_url=url, token=TOKEN, allow_insecure_http=True, batching=False)


def _http_group(
    name: str,
    members: int,
    *,
    priority: int = 100_000,
    policy: Literal["PreemptLowerPriority", "Never"] | None = "PreemptLowerPriority",
) -> ReservationGroupRequest:
    return _group(name, members, priority=priority).model_copy(update={"preemption_policy": policy})


async def test_a_group_gets_one_plan_for_all_its_members_and_its_reserve_uses_the_held_room(
    rm: RunningServer,
) -> None:
    async with _client(rm.url) as client:
        assert "group-preemption" in (await client.contract_info()).features
        low = []
        for i in range(4):
            reservation = await client.reserve(
                ReservationRequest(
                    pod=PodIdentity(
                        uid=f"low-{i}", namespace="ns", name=f"low-{i}", scheduler_name="s", priority=10
                    ),
                    resources={"cpu": "2"},
                    idempotency_key=f"low-{i}",
                    ttl_seconds=600,
                )
            )
            await client.commit(reservation.id, pod_uid=f"low-{i}")
            low.append(
                dataclasses.replace(
                    _pod(f"low-{i}", reservation.node, priority=10), reservation_id=reservation.id
                )
            )
        rm.rm.set_bound_pods(ClusterPods.of(low))
        with pytest.raises(RMUnschedulable) as never:
            await client.reserve_group(_http_group("train", 3, policy="Never"))
        assert never.value.plan is None
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve_group(_http_group("train", 3))
        plan = refused.value.plan
        assert plan is not None, refused.value.reason
        assert plan.pod_uid == "group/ns/train"
        assert len(plan.victims) == 3
        assert sorted(m.pod_uid for m in plan.members) == ["train-0", "train-1", "train-2"]
        assert {plan.node_of(v) for v in plan.victims} == {"a", "b"}
        by_uid = {pod.uid: pod for pod in low}
        assert all(by_uid[v.pod.uid].node == plan.node_of(v) for v in plan.victims)
        with pytest.raises(RMUnschedulable) as again:  # asked again: the same plan
            await client.reserve_group(_http_group("train", 3))
        assert again.value.plan is not None
        assert again.value.plan.plan_id == plan.plan_id
        await client.confirm_preemption(plan.plan_id)
        gone = {v.pod.uid for v in plan.victims}
        for pod in low:
            if pod.uid in gone:
                await client.release(pod.reservation_id or "", pod_uid=pod.uid)
        rm.rm.set_bound_pods(ClusterPods.of(pod for pod in low if pod.uid not in gone))
        with pytest.raises(RMUnschedulable):
            await client.reserve_group(_http_group("rival", 1, priority=0, policy=None))
        group = await client.reserve_group(_http_group("train", 3))
        assert sorted(m.node for m in group.members) == sorted(m.node for m in plan.members)
        with pytest.raises(RMConflict):  # used
            await client.confirm_preemption(plan.plan_id)


async def test_an_rm_without_group_preemption_never_sees_the_groups_preemption_policy(
    tmp_path: pathlib.Path,
) -> None:
    """An RM with groups but without preemption (``--no-preemption``) answers preemptionPolicy on
    a group with 400; the client leaves the field out, so the group is refused as before, no plan."""
    async with (
        serve_reference_rm(
            db_path=tmp_path / "rm.sqlite",
            inventory=NODES[:1],
            token=TOKEN,
            policy=Policy.BINPACK,
            preemption=False,
        ) as server,
        _client(server.url) as client,
    ):
        assert "group-preemption" not in (await client.contract_info()).features
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve_group(_http_group("big", 3))
        assert refused.value.plan is None


async def test_the_conformance_check_passes_the_reference_rm_and_fails_one_that_gives_the_room_away(
    rm: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kit's ``group-preemption`` check: the reference RM passes; with holds broken (no room
    taken out of other reserves), the kit's intruder gets the room the group's plan holds."""
    from bindery.conformance import CHECKS, ConformanceConfig
    from bindery.conformance.kit import http_client, run_check
    from bindery.reference_rm import store as store_module

    check = next(c for c in CHECKS if c.name == "group-preemption")
    config = ConformanceConfig(url=rm.url, token=TOKEN, resource="cpu", capacity=8)
    async with http_client(config) as http:
        passed = await run_check(check, config, http)
        assert passed.passed, passed.error
        monkeypatch.setattr(store_module, "without_held", lambda nodes, held: nodes)
        failed = await run_check(check, config, http)
    assert not failed.passed
    assert "holds the freed room" in (failed.error or ""), failed.error


def test_with_many_candidates_each_node_is_reprieved_alone_and_no_node_is_overcommitted() -> None:
    """Past REPRIEVE_PLACEMENTS candidates the group is placed once (placing it per candidate took
    42 s for 100 members on 500 nodes). Twenty full nodes of four 2-CPU candidates, priorities
    mixed; five 2-CPU members: five victims, each member's node holding it once they are gone."""
    nodes = [
        InventoryNode(name=f"n{i:02}", allocatable={"cpu": Decimal(8), "pods": Decimal(110)})
        for i in range(20)
    ]
    pods = [_pod(f"p{i:02}-{j}", f"n{i:02}", priority=(i * 7 + j) % 50) for i in range(20) for j in range(4)]
    assert len(pods) > REPRIEVE_PLACEMENTS
    found = choose_group_victims(
        members=_asks(5),
        topology_keys=[],
        nodes=nodes,
        priority=100,
        used_by_node=_used(pods),
        pods=ClusterPods.of(pods),
        policy=Policy.BINPACK,
    )
    assert found is not None
    assert len(found.victims) == 5
    gone = {victim.uid for victim in found.victims}
    left = _used([pod for pod in pods if pod.uid not in gone])
    for name in found.nodes:
        left.setdefault(name, {})["cpu"] = left.get(name, {}).get("cpu", Decimal(0)) + Decimal(2)
    assert all(bucket["cpu"] <= 8 for bucket in left.values()), left


def test_a_gang_spread_over_nodes_is_one_candidate_of_a_groups_plan() -> None:
    """Issue 21: gangs "are preempted as a whole". A priority-10 gang has one member on each node,
    beside a priority-20 single pod on each. Two 2-CPU members need one slot per node: evicting the
    gang (both members, across both nodes) or both singles frees it; the gang's lower priority wins,
    and never one member of it alone. A pod's plan (one node) still never takes a spread gang."""
    gang = [dataclasses.replace(_pod(f"g-{node}", node, priority=10), group="ns/gang") for node in "ab"]
    pods = [*gang, _pod("s-a", "a", priority=20), _pod("s-b", "b", priority=20)]
    found = _choose(pods, members=2)
    assert found is not None
    assert sorted(v.uid for v in found.victims) == ["g-a", "g-b"]
    assert sorted(found.nodes) == ["a", "b"]
    one = _choose(pods, members=1)  # one slot: one single pod, never half the gang
    assert one is not None
    assert [v.uid for v in one.victims] in (["s-a"], ["s-b"])
