"""The compiled node matcher answers exactly what bindery.constraints answers.

The reference RM asks :mod:`bindery.reference_rm.nodematch` instead of
:func:`~bindery.constraints.matches_term` on every node; a difference would place pods on nodes
their affinity refuses (or refuse nodes it allows). Random terms of every operator, valid and not,
against random label sets and node names.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest

from bindery.constraints import matches_node_selector, matches_required_affinity, matches_term
from bindery.reference_rm.nodematch import LabelMasks, compile_required, compile_term, label_sets
from bindery.reference_rm.placement import (
    InventoryNode,
    Policy,
    choose_node,
    preference_scores,
    static_failure,
    static_scores,
)

KEYS = ["zone", "kubernetes.io/hostname", "rank", "gpu", ""]
VALUES = ["a", "b", "c", "n1", "n2", "3", "-2", "07", " 4", "1_0", "99999999999999999999", ""]
OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Equal", None]


def random_values(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.08:
        return "a"  # not a list
    if roll < 0.1:
        return ["a", 3]  # not all strings
    return rng.sample(VALUES, rng.randrange(0, 5))


def well_formed(rng: random.Random, key: Any) -> dict[str, Any]:
    operator = rng.choice(OPERATORS[:6])
    if operator in ("Exists", "DoesNotExist"):
        return {"key": key, "operator": operator}
    if operator in ("Gt", "Lt"):
        return {"key": key, "operator": operator, "values": [rng.choice(["3", "-2", "0", "50"])]}
    return {"key": key, "operator": operator, "values": rng.sample(VALUES, rng.randrange(1, 4))}


def random_requirement(rng: random.Random, *, field: bool) -> dict[str, Any]:
    if rng.random() < 0.6:  # mostly what a valid request carries, so that terms match some nodes
        if field:
            return {
                "key": "metadata.name",
                "operator": rng.choice(["In", "NotIn"]),
                "values": [rng.choice(VALUES)],
            }
        return well_formed(rng, rng.choice(KEYS[:4]))
    requirement: dict[str, Any] = {
        "key": ("metadata.name" if rng.random() < 0.8 else "metadata.uid")
        if field
        else rng.choice([*KEYS, None]),
        "operator": rng.choice(OPERATORS),
    }
    values = random_values(rng)
    if values is not None:
        requirement["values"] = values
    if requirement["operator"] is None:
        del requirement["operator"]
    return requirement


def random_term(rng: random.Random) -> dict[str, Any]:
    term: dict[str, Any] = {}
    if rng.random() < 0.9:
        term["matchExpressions"] = [random_requirement(rng, field=False) for _ in range(rng.randrange(0, 3))]
    if rng.random() < 0.2:
        term["matchFields"] = [random_requirement(rng, field=True) for _ in range(rng.randrange(0, 3))]
    return term


def random_labels(rng: random.Random) -> dict[str, str]:
    return {key: rng.choice(VALUES) for key in KEYS if rng.random() < 0.7}


@pytest.mark.parametrize("seed", range(4))
def test_a_compiled_term_answers_as_matches_term(seed: int) -> None:
    rng = random.Random(seed)
    matched = 0
    for _ in range(3000):
        term = random_term(rng)
        compiled = compile_term(term)
        for _ in range(8):
            labels = random_labels(rng)
            name = rng.choice(VALUES)
            expected = matches_term(term=term, labels=labels, node_name=name)
            assert compiled(labels, name) is expected, (term, labels, name)
            matched += expected
    assert matched > 1500  # the terms are not all refusals: both answers are compared


@pytest.mark.parametrize("seed", range(4))
def test_a_compiled_selector_and_affinity_answer_as_constraints(seed: int) -> None:
    rng = random.Random(seed)
    in_form = 0
    for _ in range(2000):
        terms = [random_term(rng) for _ in range(rng.choice([0, 0, 1, 1, 2, 3]))]
        selector = {key: rng.choice(VALUES) for key in KEYS[:3] if rng.random() < 0.2}
        compiled = compile_required(node_selector=selector, terms=terms)
        # The form placement looks up in its label index, when the constraint has it.
        requirements = label_sets(node_selector=selector, terms=terms)
        for _ in range(8):
            labels = random_labels(rng)
            name = rng.choice(VALUES)
            expected = matches_node_selector(
                node_selector=selector, labels=labels
            ) and matches_required_affinity(terms=terms, labels=labels, node_name=name)
            assert compiled(labels, name) is expected, (selector, terms, labels, name)
            if requirements is not None:
                met = all((labels.get(key) in values) is wanted for key, values, wanted in requirements)
                assert met is expected, (selector, terms, labels)
                in_form += 1
    assert in_form > 1000


def test_bindery_rule_requirements_compile_to_set_lookups() -> None:
    """What Bindery sends for a hard spread and an anti-affinity: a NotIn split at 256 names."""
    names = [f"node-{i:04d}" for i in range(600)]
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": names[:256]},
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": names[256:400]},
            {"key": "zone", "operator": "In", "values": ["zone-1", "zone-2"]},
        ]
    }
    compiled = compile_term(term)
    for index, name in enumerate(names):
        for zone in ("zone-0", "zone-1", "zone-2"):
            labels = {"kubernetes.io/hostname": name, "zone": zone}
            assert compiled(labels, name) is matches_term(term=term, labels=labels, node_name=name)
            assert compiled(labels, name) is (index >= 400 and zone != "zone-0")


def test_a_term_of_unusual_shape_is_asked_of_matches_term() -> None:
    """A tuple of expressions (no contract request has one) is not compiled, yet answered alike."""
    term = {"matchExpressions": ({"key": "zone", "operator": "In", "values": ["a"]},)}
    assert compile_term(term)({"zone": "a"}, "n") is True
    assert compile_term(term)({"zone": "b"}, "n") is False


def rules_inventory(count: int, *, zone_of: int = 3) -> tuple[InventoryNode, ...]:
    return tuple(
        InventoryNode(
            name=f"node-{i:03d}",
            allocatable={"cpu": Decimal(4), "pods": Decimal(110)},
            labels={"kubernetes.io/hostname": f"node-{i:03d}", "zone": f"zone-{i % zone_of}"},
        )
        for i in range(count)
    )


def test_a_relabelled_inventory_is_matched_afresh() -> None:
    """The static outcome and the fits are remembered per inventory tuple: the mirror's new tuple
    (a node moved to another zone) must give the answer of its own labels, not the old ones'."""
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["zone-1"]}]}
    ask: dict[str, Any] = {
        "requests": {"cpu": Decimal(1)},
        "usage_by_node": {},
        "node_selector": {},
        "affinity_terms": [term],
        "tolerations": [],
        "policy": Policy.BINPACK,
    }
    before = rules_inventory(3)
    assert choose_node(nodes=before, **ask).node == "node-001"
    after = (*before[:1], InventoryNode(name="node-001", allocatable=before[1].allocatable), before[2])
    assert choose_node(nodes=after, **ask).node is None
    assert choose_node(nodes=before, **ask).node == "node-001"


@pytest.mark.parametrize("seed", range(4))
def test_a_term_as_masks_answers_as_matches_term(seed: int) -> None:
    """Group placement matches each preferred term against every node at once (LabelMasks)."""
    rng = random.Random(seed)
    matched = 0
    for _ in range(400):
        nodes = [(random_labels(rng), rng.choice(VALUES)) for _ in range(rng.randrange(0, 9))]
        masks = LabelMasks(nodes)
        for _ in range(8):
            term = random_term(rng)
            mask = masks.term(term)
            if mask is None:
                continue  # an unusual shape: placement asks compile_term node by node
            for position, (labels, name) in enumerate(nodes):
                expected = matches_term(term=term, labels=labels, node_name=name)
                assert bool(mask >> position & 1) is expected, (term, labels, name)
                matched += expected
    assert matched > 500


@pytest.mark.parametrize("seed", range(4))
def test_static_scores_answer_as_the_filters_and_preference_scores_per_node(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        nodes = tuple(
            InventoryNode(
                name=f"n{index}",
                allocatable={"cpu": Decimal(4)},
                labels=random_labels(rng),
                taints=tuple(
                    {
                        "key": rng.choice(["gpu", "spot"]),
                        "value": "",
                        "effect": rng.choice(["NoSchedule", "PreferNoSchedule"]),
                    }
                    for _ in range(rng.randrange(0, 3))
                ),
                unschedulable=rng.random() < 0.1,
            )
            for index in range(rng.randrange(0, 9))
        )
        terms = [random_term(rng) for _ in range(rng.choice([0, 1]))]
        preferences = [(rng.choice([0, 1, 5, 100]), random_term(rng)) for _ in range(rng.randrange(0, 5))]
        tolerations = [{"key": "spot", "operator": "Exists"}] if rng.random() < 0.3 else []
        scores = static_scores(
            nodes=nodes,
            node_selector={},
            affinity_terms=terms,
            tolerations=tolerations,
            preferences=preferences,
        )
        expected = {
            node.name: preference_scores(node=node, preferences=preferences, tolerations=tolerations)
            for node in nodes
            if static_failure(node=node, node_selector={}, affinity_terms=terms, tolerations=tolerations)
            is None
        }
        assert scores == expected, (nodes, terms, preferences, tolerations)
