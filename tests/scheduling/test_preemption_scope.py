"""A plan is carried out only when it was asked for and makes sense (issue 35, finding 3).

Why: the RM proposes, Bindery evicts. A buggy or hostile RM could otherwise evict any pod below the
priority of a pending Bindery pod, cluster-wide: victims in kube-system or outside its
namespaceSelector, bound by another scheduler, on another node than the plan's, freeing nothing,
on a node the preemptor may not run on, or a plan to a reserve that asked for none.

A lying RM is a hypothesis strategy over plan shapes; the vetting is pure, so thousands of shapes
run in a second. Every plan :func:`vet` accepts must be one the independent checker
(tests/placement/checker.py, which shares no code with Bindery) finds nothing wrong with, and
honest of every lie listed above; every honest plan is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bindery.rm.models import PreemptionPlan
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from bindery.scheduling.preemption import REFUSAL_REASONS, PlanScope, VictimScope, vet
from tests.placement.checker import eviction_violations

SCHEDULER = "bindery"
SERVED_NAMESPACE = "ns"
#: namespace -> whether the RM's namespaceSelector selects it (None: its labels are not known yet)
SELECTED: dict[str, bool | None] = {SERVED_NAMESPACE: True, "kube-system": False, "fresh": None}
NODES: dict[str, dict[str, Any]] = {
    "a": {"metadata": {"name": "a", "labels": {"pool": "a"}}, "spec": {}},
    "b": {"metadata": {"name": "b", "labels": {"pool": "b"}}, "spec": {}},
    "tainted": {
        "metadata": {"name": "tainted", "labels": {"pool": "a"}},
        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
    },
}
PREEMPTOR_BODY: dict[str, Any] = {
    "metadata": {"name": "high", "namespace": SERVED_NAMESPACE, "uid": "u-high"},
    "spec": {
        "schedulerName": SCHEDULER,
        "priority": 100,
        "nodeSelector": {"pool": "a"},
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
    },
}
SCOPE = PlanScope(
    rm_name="rm",
    victims=VictimScope.SERVED,
    scheduler_names=frozenset({SCHEDULER}),
    selects=lambda namespace: SELECTED.get(namespace, False),
)


def _node(name: str) -> NodeProjection | None:
    body = NODES.get(name)
    return NodeProjection.from_body(body) if body is not None else None


@dataclasses.dataclass(frozen=True)
class Victim:
    name: str
    namespace: str
    scheduler: str
    on: str  # where it is bound
    named_on: str | None  # the node the plan names for it (None: the plan's)
    priority: int
    cpu: int  # what it requests
    frees: dict[str, str]

    def body(self) -> dict[str, Any]:
        return {
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": f"u-{self.name}"},
            "spec": {
                "schedulerName": self.scheduler,
                "nodeName": self.on,
                "priority": self.priority,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": str(self.cpu)}}}],
            },
            "status": {"phase": "Running"},
        }


@dataclasses.dataclass(frozen=True)
class Shape:
    """One plan a lying RM may send, and the reserve it answers."""

    node: str
    victims: tuple[Victim, ...]
    asked: str | None
    never: bool  # the preemptor's own spec.preemptionPolicy is Never

    def plan(self) -> PreemptionPlan:
        return PreemptionPlan.model_validate(
            {
                "planId": "pln-lie",
                "node": self.node,
                "podUid": "u-high",
                "leaseSeconds": 60,
                "victims": [
                    {
                        "pod": {"namespace": v.namespace, "name": v.name, "uid": f"u-{v.name}"},
                        "frees": v.frees,
                        **({"node": v.named_on} if v.named_on is not None else {}),
                    }
                    for v in self.victims
                ],
            }
        )

    def preemptor_body(self) -> dict[str, Any]:
        policy = {"preemptionPolicy": "Never"} if self.never else {}
        return {**PREEMPTOR_BODY, "spec": {**PREEMPTOR_BODY["spec"], **policy}}

    def preemptor(self) -> PodInfo:
        return PodInfo.from_body(self.preemptor_body())

    def honest(self) -> bool:
        """Every rule of the issue, stated here apart from Bindery's code."""
        return (
            self.asked == "PreemptLowerPriority"
            and not self.never
            and self.node == "a"  # b fails the nodeSelector, tainted a taint, ghost does not exist
            and all(
                v.scheduler == SCHEDULER
                and v.namespace == SERVED_NAMESPACE
                and v.on == self.node
                and v.named_on in (None, self.node)
                and v.priority < 100
                and bool(v.frees)
                and all(_fits(resource, amount, v) for resource, amount in v.frees.items())
                for v in self.victims
            )
        )


def _fits(resource: str, amount: str, victim: Victim) -> bool:
    """What a victim's ``frees`` may claim: at most its requests and its one pod slot."""
    held = {"cpu": victim.cpu, "pods": 1}
    return resource in held and 0 < int(amount) <= held[resource]


FREES = st.sampled_from([{}, {"cpu": "1"}, {"cpu": "2"}, {"cpu": "64"}, {"pods": "1"}, {"memory": "1"}])


@st.composite
def victims(draw: st.DrawFn) -> tuple[Victim, ...]:
    count = draw(st.integers(min_value=1, max_value=3))
    return tuple(
        Victim(
            name=f"low-{i}",
            namespace=draw(
                st.sampled_from([SERVED_NAMESPACE, SERVED_NAMESPACE, "kube-system", "fresh", "other"])
            ),
            scheduler=draw(st.sampled_from([SCHEDULER, SCHEDULER, "default-scheduler"])),
            on=draw(st.sampled_from(["a", "a", "b", "tainted"])),
            named_on=draw(st.sampled_from([None, None, "a", "b"])),
            priority=draw(st.sampled_from([1, 10, 100, 1000])),
            cpu=draw(st.sampled_from([0, 1, 2])),
            frees=draw(FREES),
        )
        for i in range(count)
    )


RANDOM = st.builds(
    Shape,
    node=st.sampled_from(["a", "a", "b", "tainted", "ghost"]),
    victims=victims(),
    asked=st.sampled_from(["PreemptLowerPriority", "PreemptLowerPriority", "Never", None]),
    never=st.booleans(),
)


@st.composite
def honest_victims(draw: st.DrawFn) -> tuple[Victim, ...]:
    count = draw(st.integers(min_value=1, max_value=3))
    out = []
    for i in range(count):
        cpu = draw(st.sampled_from([0, 1, 2]))
        frees = draw(
            st.sampled_from([{"pods": "1"}, *([{"cpu": str(cpu)}, {"cpu": "1", "pods": "1"}] if cpu else [])])
        )
        named = draw(st.sampled_from([None, "a"]))
        out.append(
            Victim(
                f"low-{i}",
                SERVED_NAMESPACE,
                SCHEDULER,
                "a",
                named,
                draw(st.sampled_from([1, 99])),
                cpu,
                frees,
            )
        )
    return tuple(out)


HONEST = st.builds(
    Shape,
    node=st.just("a"),
    victims=honest_victims(),
    asked=st.just("PreemptLowerPriority"),
    never=st.just(False),
)

#: One lie each, told by an otherwise honest plan.
LIES: dict[str, Callable[[Shape, int], Shape]] = {
    "unasked": lambda shape, v: dataclasses.replace(shape, asked=None),
    "never-asked": lambda shape, v: dataclasses.replace(shape, asked="Never"),
    "never-pod": lambda shape, v: dataclasses.replace(shape, never=True),
    "wrong-node": lambda shape, v: dataclasses.replace(shape, node="b"),
    "tainted-node": lambda shape, v: dataclasses.replace(shape, node="tainted"),
    "ghost-node": lambda shape, v: dataclasses.replace(shape, node="ghost"),
    "victim-elsewhere": lambda shape, v: _victim(shape, v, on="b", named_on="b"),
    "victim-moved": lambda shape, v: _victim(shape, v, on="b"),
    "kube-system": lambda shape, v: _victim(shape, v, namespace="kube-system"),
    "unselected": lambda shape, v: _victim(shape, v, namespace="other"),
    "labels-unknown": lambda shape, v: _victim(shape, v, namespace="fresh"),
    "other-scheduler": lambda shape, v: _victim(shape, v, scheduler="default-scheduler"),
    "not-lower": lambda shape, v: _victim(shape, v, priority=100),
    "frees-nothing": lambda shape, v: _victim(shape, v, frees={}),
    "frees-more": lambda shape, v: _victim(shape, v, frees={"cpu": "64"}),
    "frees-other": lambda shape, v: _victim(shape, v, frees={"memory": "1"}),
}


def _victim(shape: Shape, index: int, **changes: Any) -> Shape:
    victims = list(shape.victims)
    victims[index % len(victims)] = dataclasses.replace(victims[index % len(victims)], **changes)
    return dataclasses.replace(shape, victims=tuple(victims))


@st.composite
def one_lie(draw: st.DrawFn) -> Shape:
    honest = draw(HONEST)
    lie = LIES[draw(st.sampled_from(sorted(LIES)))]
    return lie(honest, draw(st.integers(min_value=0, max_value=2)))


SHAPES = st.one_of(HONEST, one_lie(), RANDOM)


@settings(max_examples=400, deadline=None)
@given(shape=SHAPES)
def test_a_lying_rms_plan_is_refused_and_an_honest_one_carried_out(shape: Shape) -> None:
    bodies = {f"{v.namespace}/{v.name}": v.body() for v in shape.victims}
    refusal = vet(
        shape.plan(), preemptor=shape.preemptor(), victims=bodies, asked=shape.asked, scope=SCOPE, nodes=_node
    )
    if refusal is None:
        assert shape.honest(), f"carried out a lie: {shape}"
        # kube-scheduler would make these evictions too (capacity is the RM's to judge).
        violations = eviction_violations(
            preemptor=shape.preemptor_body(),
            node=NODES[shape.node],
            victims=[v.body() for v in shape.victims],
        )
        assert violations == [], [str(v) for v in violations]
    else:
        assert not shape.honest(), f"refused an honest plan: {refusal}"
        assert refusal.reason in REFUSAL_REASONS
        assert "pln-lie" in refusal.message or refusal.reason != "unasked"


def test_any_lets_a_plan_name_pods_the_rm_does_not_serve() -> None:
    """``spec.preemption.victims: Any`` (an RM that counts kube-scheduler's pods): every other rule
    still holds."""
    victim = Victim("low-0", "kube-system", "default-scheduler", "a", None, 1, 1, {"cpu": "1"})
    shape = Shape(node="a", victims=(victim,), asked="PreemptLowerPriority", never=False)
    bodies = {"kube-system/low-0": victim.body()}
    served = vet(
        shape.plan(), preemptor=shape.preemptor(), victims=bodies, asked=shape.asked, scope=SCOPE, nodes=_node
    )
    assert served is not None
    assert served.reason == "victim_scope"
    assert "default-scheduler" in served.message
    anyone = dataclasses.replace(SCOPE, victims=VictimScope.ANY)
    assert (
        vet(
            shape.plan(),
            preemptor=shape.preemptor(),
            victims=bodies,
            asked=shape.asked,
            scope=anyone,
            nodes=_node,
        )
        is None
    )
    lying = dataclasses.replace(victim, frees={})
    refusal = vet(
        dataclasses.replace(shape, victims=(lying,)).plan(),
        preemptor=shape.preemptor(),
        victims=bodies,
        asked=shape.asked,
        scope=anyone,
        nodes=_node,
    )
    assert refusal is not None
    assert refusal.reason == "frees"


def test_a_namespace_whose_labels_are_unknown_is_not_evicted_from_on_a_guess() -> None:
    victim = Victim("low-0", "fresh", SCHEDULER, "a", None, 1, 1, {"cpu": "1"})
    shape = Shape(node="a", victims=(victim,), asked="PreemptLowerPriority", never=False)
    refusal = vet(
        shape.plan(),
        preemptor=shape.preemptor(),
        victims={"fresh/low-0": victim.body()},
        asked=shape.asked,
        scope=SCOPE,
        nodes=_node,
    )
    assert refusal is not None
    assert "cannot tell yet" in refusal.message
