"""The reference RM scores a pod group's members' preferences (contract v1.2 ``node-preferences``,
carried per member; issue 19 item 3).

Why: its group placement read only the members' hard constraints, so a gang's
``preferredNodeAffinity`` (its own, and the soft inter-pod rules Bindery writes into it) was
ignored: binpack stacked the members on the first node whatever they preferred.
"""

from __future__ import annotations

import pathlib
import random
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from bindery.reference_rm import serve_reference_rm
from bindery.reference_rm.groups import MemberAsk, place_group
from bindery.reference_rm.placement import InventoryNode, Policy, add_usage, choose_node, effective_usage
from bindery.reference_rm.store import GroupPlaced
from bindery.rm.client import ResourceManagerClient
from bindery.rm.models import ReservationGroupRequest
from tests.rm.conftest import TOKEN, StoreFactory

ZONE = "topology.kubernetes.io/zone"

INVENTORY = [
    InventoryNode(name=name, labels={ZONE: name[0]}, allocatable={"cpu": Decimal(4), "pods": Decimal(110)})
    for name in ("a1", "b1", "c1")
]
PREFER_C = (100, {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["c"]}]})


def _asks(count: int, preferences: Sequence[tuple[int, Mapping[str, Any]]] = ()) -> list[MemberAsk]:
    return [
        MemberAsk(label=f"ns/m{i}", requests={"cpu": Decimal(1)}, preferences=tuple(preferences))
        for i in range(count)
    ]


def test_the_reference_rm_places_members_where_their_preferences_point() -> None:
    """Binpack alone stacks them on a1 (the first name); preferring zone c, both go there."""
    plain = place_group(
        group="ns/g",
        members=_asks(2),
        topology_keys=[],
        nodes=INVENTORY,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert plain.nodes == ("a1", "a1")
    preferred = place_group(
        group="ns/g",
        members=_asks(2, [PREFER_C]),
        topology_keys=[],
        nodes=INVENTORY,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert preferred.nodes == ("c1", "c1")


def test_preferences_are_soft_a_member_goes_elsewhere_when_the_preferred_node_is_full() -> None:
    decision = place_group(
        group="ns/g",
        members=_asks(6, [PREFER_C]),
        topology_keys=[],
        nodes=INVENTORY,
        usage_by_node={"c1": {"cpu": Decimal(2), "pods": Decimal(2)}},
        policy=Policy.BINPACK,
    )
    assert decision.nodes is not None, decision.reason
    assert decision.nodes.count("c1") == 2  # all the room c1 has left
    assert len(decision.nodes) == 6


def test_members_with_and_without_preferences_share_the_usage() -> None:
    """A plain member placed after a preferring one sees the room that one took (one view of usage)."""
    members = [*_asks(1, [PREFER_C]), MemberAsk(label="ns/big", requests={"cpu": Decimal(4)})]
    decision = place_group(
        group="ns/g",
        members=members,
        topology_keys=[],
        nodes=INVENTORY,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert decision.nodes is not None, decision.reason
    assert decision.nodes[0] == "c1"
    assert decision.nodes[1] in ("a1", "b1")


def _request(preferences: Sequence[tuple[int, Mapping[str, Any]]]) -> ReservationGroupRequest:
    placement: dict[str, Any] = {}
    if preferences:
        placement["preferredNodeAffinity"] = [{"weight": w, "preference": t} for w, t in preferences]
    return ReservationGroupRequest.model_validate(
        {
            "group": {"namespace": "ns", "name": "g", "schedulerName": "s"},
            "members": [
                {
                    "pod": {"uid": f"g-{i}", "namespace": "ns", "name": f"g-{i}", "schedulerName": "s"},
                    "resources": {"cpu": "1"},
                    "placement": placement,
                }
                for i in range(2)
            ],
            "idempotencyKey": "g",
            "ttlSeconds": 600,
        }
    )


@pytest.mark.parametrize("preferred", [False, True])
def test_the_stores_pass_the_members_preferences_to_the_group_placement(
    make_store: StoreFactory, preferred: bool
) -> None:
    store = make_store(clock=lambda: 1000.0)
    placed = store.reserve_group(
        _request([PREFER_C] if preferred else []), nodes=INVENTORY, policy=Policy.BINPACK
    )
    assert isinstance(placed, GroupPlaced)
    nodes = [member.node for member in placed.group.members]
    assert nodes == (["c1", "c1"] if preferred else ["a1", "a1"])


def test_members_are_kept_off_prefer_no_schedule_nodes_as_single_pods_are() -> None:
    """TaintToleration scores a PreferNoSchedule taint the member does not tolerate; binpack alone
    would take a1, the first name."""
    draining = {"key": "draining", "value": "true", "effect": "PreferNoSchedule"}
    nodes = [
        InventoryNode(
            name=node.name,
            labels=node.labels,
            allocatable=node.allocatable,
            taints=(draining,) if node.name == "a1" else (),
        )
        for node in INVENTORY
    ]
    decision = place_group(
        group="ns/g", members=_asks(2), topology_keys=[], nodes=nodes, usage_by_node={}, policy=Policy.BINPACK
    )
    assert decision.nodes == ("b1", "b1")
    tolerating = [
        MemberAsk(label=f"ns/t{i}", requests={"cpu": Decimal(1)}, tolerations=({"operator": "Exists"},))
        for i in range(2)
    ]
    decision = place_group(
        group="ns/g",
        members=tolerating,
        topology_keys=[],
        nodes=nodes,
        usage_by_node={},
        policy=Policy.BINPACK,
    )
    assert decision.nodes == ("a1", "a1")


async def test_a_v1_1_rm_is_sent_no_member_preferences_and_places_the_group(tmp_path: pathlib.Path) -> None:
    """The reference RM as a v1.1 RM answers 400 to preferredNodeAffinity: the client must leave
    it out of every member, and the group is placed by the policy alone."""
    async with (
        serve_reference_rm(
            db_path=tmp_path / "rm.sqlite", inventory=INVENTORY, token=TOKEN, cluster_ids=False
        ) as server,
        ResourceManagerClient(base_url=server.url, token=TOKEN, allow_insecure_http=True) as client,
    ):
        group = await client.reserve_group(_request([PREFER_C]))
    assert len(group.members) == 2  # a member sent its preferences would have got 400


def _one_by_one(
    members: Sequence[MemberAsk],
    nodes: Sequence[InventoryNode],
    used: Mapping[str, Mapping[str, Decimal]],
    policy: Policy,
) -> tuple[str | None, ...]:
    """Each member as a single reserve would be placed, with the ones before it counted."""
    usage = {name: dict(bucket) for name, bucket in used.items()}
    chosen: list[str | None] = []
    for member in members:
        decision = choose_node(
            nodes=nodes,
            requests=member.requests,
            usage_by_node=usage,
            node_selector=member.node_selector,
            affinity_terms=member.affinity_terms,
            tolerations=member.tolerations,
            policy=policy,
            preferences=member.preferences,
        )
        chosen.append(decision.node)
        if decision.node is not None:
            node = next(n for n in nodes if n.name == decision.node)
            add_usage(usage, node.name, effective_usage(member.requests, node))
    return tuple(chosen)


@pytest.mark.parametrize("policy", list(Policy))
def test_the_group_placement_chooses_what_single_reserves_one_by_one_would(policy: Policy) -> None:
    """The heaps per score (for speed: a scan per member of a 1000-member gang took seconds) pick
    the node choose_node picks, over random inventories, usage, preferences and taints."""
    rng = random.Random(19)
    zones = ("a", "b", "c")
    taint = {"key": "draining", "value": "true", "effect": "PreferNoSchedule"}
    for _ in range(150):
        nodes = [
            InventoryNode(
                name=f"n{i:02d}",
                labels={ZONE: rng.choice(zones)},
                allocatable={"cpu": Decimal(rng.choice((2, 4, 8))), "pods": Decimal(110)},
                taints=(taint,) if rng.random() < 0.2 else (),
            )
            for i in range(rng.randint(1, 8))
        ]
        used = {node.name: {"cpu": Decimal(rng.randint(0, 2))} for node in nodes if rng.random() < 0.5}
        members = []
        for i in range(rng.randint(1, 6)):
            preferences = tuple(
                (
                    rng.randint(1, 100),
                    {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]},
                )
                for zone in rng.sample(zones, rng.randint(0, 2))
            )
            tolerations = ({"operator": "Exists"},) if rng.random() < 0.3 else ()
            members.append(
                MemberAsk(
                    label=f"ns/m{i}",
                    requests={"cpu": Decimal(rng.choice((1, 2)))},
                    preferences=preferences,
                    tolerations=tolerations,
                )
            )
        decision = place_group(
            group="ns/g", members=members, topology_keys=[], nodes=nodes, usage_by_node=used, policy=policy
        )
        if decision.nodes is None:
            continue  # refused whole; the greedy order (largest first) may differ from one by one
        order = sorted(range(len(members)), key=lambda index: -members[index].requests["cpu"])
        expected = _one_by_one([members[i] for i in order], nodes, used, policy)
        assert tuple(decision.nodes[i] for i in order) == expected, (nodes, used, members)
