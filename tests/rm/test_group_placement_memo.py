"""Group placement remembers each kind of member's static scores by content, with a kept inventory.

Why: a gang's retry is a new request carrying the same preferred terms (up to 64 x 64 requirements
per member); parsing and matching them again on every attempt was most of a placement's CPU. The
memo must answer exactly what a fresh evaluation answers: the same members on the same nodes,
whichever requests came before, and whatever the caller does to its objects afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bindery.reference_rm.groups import GroupDecision, MemberAsk, place_group
from bindery.reference_rm.placement import InventoryNode, Policy, choose_node

ZONE = "topology.kubernetes.io/zone"
TAINT = {"key": "draining", "value": "true", "effect": "PreferNoSchedule"}

requirements = st.fixed_dictionaries(
    {
        "key": st.sampled_from([ZONE, "disk", "gpu"]),
        "operator": st.sampled_from(["In", "NotIn", "Exists"]),
    }
).flatmap(
    lambda r: (
        st.just(r)
        if r["operator"] == "Exists"
        else st.lists(st.sampled_from(["a", "b", "c", "ssd"]), min_size=1, max_size=2).map(
            lambda values: {**r, "values": values}
        )
    )
)
terms = st.lists(requirements, min_size=1, max_size=3).map(lambda found: {"matchExpressions": found})
# Few weights, so that requests of different terms share them (the memo must compare the terms).
preferences = st.lists(st.tuples(st.sampled_from([0, 1, 100]), terms), max_size=4)
nodes = st.lists(
    st.builds(
        lambda zone, disk, cpu, tainted: (zone, disk, cpu, tainted),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["ssd", "a", None]),
        st.sampled_from([2, 4, 8]),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


def _inventory(shapes: Sequence[tuple[str, str | None, int, bool]]) -> tuple[InventoryNode, ...]:
    return tuple(
        InventoryNode(
            name=f"n{index:02d}",
            labels={ZONE: zone, **({"disk": disk} if disk is not None else {})},
            allocatable={"cpu": Decimal(cpu), "pods": Decimal(110)},
            taints=(TAINT,) if tainted else (),
        )
        for index, (zone, disk, cpu, tainted) in enumerate(shapes)
    )


def _members(kinds: Sequence[tuple[int, Sequence[tuple[int, Mapping[str, Any]]]]]) -> list[MemberAsk]:
    """Fresh objects each call, as each request builds its own."""
    return [
        MemberAsk(
            label=f"ns/m{index}", requests={"cpu": Decimal(cpu)}, preferences=copy.deepcopy(list(prefs))
        )
        for index, (cpu, prefs) in enumerate(kinds)
    ]


def _place(members: Sequence[MemberAsk], nodes: Sequence[InventoryNode], topology: bool) -> GroupDecision:
    return place_group(
        group="ns/g",
        members=members,
        topology_keys=[ZONE] if topology else [],
        nodes=nodes,
        usage_by_node={"n00": {"cpu": Decimal(1)}},
        policy=Policy.BINPACK,
    )


@settings(max_examples=150, deadline=None)
@given(
    shapes=nodes,
    requests=st.lists(
        st.lists(st.tuples(st.sampled_from([1, 2]), preferences), min_size=1, max_size=4),
        min_size=2,
        max_size=3,
    ),
    sequence=st.lists(st.integers(0, 2), min_size=2, max_size=6),
    topology=st.booleans(),
)
def test_a_remembered_placement_chooses_what_a_fresh_one_chooses(
    shapes: list[tuple[str, str | None, int, bool]],
    requests: list[list[tuple[int, list[tuple[int, dict[str, Any]]]]]],
    sequence: list[int],
    topology: bool,
) -> None:
    """Requests retried in any order against one kept inventory (a tuple: remembered) answer as
    the same requests against a list of the same nodes (never remembered)."""
    inventory = _inventory(shapes)
    for pick in sequence:
        kinds = requests[pick % len(requests)]
        remembered = _place(_members(kinds), inventory, topology)
        fresh = _place(_members(kinds), list(inventory), topology)
        assert remembered == fresh, (kinds, shapes)


@settings(max_examples=100, deadline=None)
@given(shapes=nodes, kinds=st.lists(st.tuples(st.just(1), preferences), min_size=1, max_size=4))
def test_a_remembered_placement_chooses_what_single_reserves_one_by_one_would(
    shapes: list[tuple[str, str | None, int, bool]], kinds: list[tuple[int, list[tuple[int, dict[str, Any]]]]]
) -> None:
    """Members of one size, no topology: the group goes where single reserves, one after the other,
    would go (choose_node: the plain path), on the second attempt (remembered) as on the first."""
    inventory = _inventory(shapes)
    for _ in range(2):
        members = _members(kinds)
        decision = _place(members, inventory, topology=False)
        if decision.nodes is None:
            return
        used: dict[str, dict[str, Decimal]] = {"n00": {"cpu": Decimal(1)}}
        for member, chosen in zip(members, decision.nodes, strict=True):
            single = choose_node(
                nodes=list(inventory),
                requests=member.requests,
                usage_by_node=used,
                node_selector={},
                affinity_terms=(),
                tolerations=(),
                policy=Policy.BINPACK,
                preferences=member.preferences,
            )
            assert single.node == chosen, (kinds, shapes)
            bucket = used.setdefault(chosen, {})
            bucket["cpu"] = bucket.get("cpu", Decimal(0)) + 1
            bucket["pods"] = bucket.get("pods", Decimal(0)) + 1


def test_changing_a_request_after_its_placement_does_not_change_what_is_remembered() -> None:
    """The memo keeps its own copy: a caller that reuses and edits its term objects is answered
    for what they say now."""
    inventory = _inventory([("a", None, 4, False), ("b", None, 4, False)])
    term: dict[str, Any] = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]}
    members = [MemberAsk(label="ns/m0", requests={"cpu": Decimal(1)}, preferences=[(100, term)])]
    assert _place(members, inventory, topology=False).nodes == ("n00",)
    term["matchExpressions"][0]["values"] = ["b"]
    assert _place(members, inventory, topology=False).nodes == ("n01",)


def test_requests_of_the_same_weights_and_other_terms_are_told_apart() -> None:
    inventory = _inventory([("a", None, 4, False), ("b", None, 4, False)])

    def prefer(zone: str) -> list[MemberAsk]:
        term = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}
        return [MemberAsk(label="ns/m0", requests={"cpu": Decimal(1)}, preferences=[(100, term)])]

    assert _place(prefer("a"), inventory, topology=False).nodes == ("n00",)
    assert _place(prefer("b"), inventory, topology=False).nodes == ("n01",)
    assert _place(prefer("a"), inventory, topology=False).nodes == ("n00",)
