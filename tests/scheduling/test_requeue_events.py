"""Plugins declare the cluster events that can make a pod they refused schedulable (kube-scheduler's
``EnqueueExtensions.EventsToRegister``); the queue wakes the pod from that declaration alone, and
nothing in ``controller/`` names a plugin to decide it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil

import bindery.scheduling
from bindery.rm.errors import RMUnschedulable
from bindery.scheduling.cycle import schedule_one
from bindery.scheduling.decisions import Failure, FailureKind, Outcome
from bindery.scheduling.events import ClusterEvent, Requeue
from bindery.scheduling.framework import CycleContext, EnqueueExtensions, PluginSet, Ports, Profile, Status
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.queue import SchedulingQueue, Touch, WakeOn
from tests.scheduling.fakes import (
    Calls,
    FakeBinder,
    FakeClock,
    FakeConditions,
    FakeEvents,
    FakeNodes,
    FakePods,
    FakeRM,
    pod,
)

CONTROLLER = pathlib.Path(bindery.scheduling.__file__).parent.parent / "controller"


class QuotaGate:
    """A toy PreFilter plugin: refuses every pod until a placed pod of namespace "quota" changes."""

    name = "QuotaGate"

    async def pre_filter(self, *, ctx: CycleContext) -> Status:
        return Status.unschedulable("the namespace's quota is used up")

    def events_to_register(self, *, pod: PodInfo, failure: Failure) -> Requeue | None:
        return Requeue(
            events=frozenset({ClusterEvent.PLACED_POD}),
            placed=WakeOn(namespaces=frozenset({"quota"})),
        )


async def refused_by(plugin: object) -> tuple[SchedulingQueue, PodInfo]:
    """One cycle of a pod the toy plugin refuses, its outcome handed to the queue as the runner does."""
    calls = Calls()
    the_pod = pod("web")
    ports = Ports(
        nodes=FakeNodes(calls, {}),
        pods=FakePods(calls),
        binder=FakeBinder(calls),
        events=FakeEvents(calls),
        conditions=FakeConditions(calls),
    )
    profile = Profile(
        name="pool",
        scheduler_names=frozenset({"bindery"}),
        client=FakeRM(calls, node="n1"),
        plugins=PluginSet(pre_filter=(plugin,)),  # type: ignore[arg-type]
    )
    queue = SchedulingQueue(clock=FakeClock())
    queue.add(the_pod)
    popped = queue.pop_nowait()
    assert popped is not None
    result = await schedule_one(pod=popped, profile=profile, ports=ports)
    assert result.outcome is Outcome.UNSCHEDULABLE
    queue.settle(
        popped.uid,
        outcome=result.outcome,
        retry_after=result.retry_after,
        requeue=result.failure.requeue if result.failure is not None else None,
    )
    return queue, popped


async def test_a_new_plugins_declared_event_wakes_the_pods_it_refused() -> None:
    gate = QuotaGate()
    assert isinstance(gate, EnqueueExtensions)
    queue, refused = await refused_by(gate)
    assert queue.position(refused.uid).queue == "unschedulable"  # type: ignore[union-attr]
    assert queue.wake(Touch(namespace="elsewhere")) == 0, "a change outside the declared scope woke it"
    assert queue.wake(Touch(namespace="quota")) == 1, "the event the plugin declared did not wake its pod"
    assert queue.position(refused.uid).queue != "unschedulable"  # type: ignore[union-attr]


class FreedQuota(QuotaGate):
    """The toy gate with a queueing hint: only a placed pod that frees quota lifts its refusal."""

    def events_to_register(self, *, pod: PodInfo, failure: Failure) -> Requeue | None:
        return Requeue(
            events=frozenset({ClusterEvent.PLACED_POD}),
            placed=WakeOn(namespaces=frozenset({"quota"}), hint=lambda touch: "quota-freed" in touch.tags),
        )


async def test_a_plugins_queueing_hint_filters_the_changes_in_its_scope() -> None:
    queue, refused = await refused_by(FreedQuota())
    assert queue.wake(Touch(namespace="quota")) == 0, "a change the hint turned down woke the pod"
    assert queue.position(refused.uid).queue == "unschedulable"  # type: ignore[union-attr]
    assert queue.wake(Touch(namespace="quota", tags=frozenset({"quota-freed"}))) == 1


async def test_a_plugin_declaring_nothing_gets_its_pods_back_on_their_backoff() -> None:
    class Silent(QuotaGate):
        def events_to_register(self, *, pod: PodInfo, failure: Failure) -> Requeue | None:
            return None

    queue, refused = await refused_by(Silent())
    assert queue.wake(Touch(namespace="quota")) == 0
    position = queue.position(refused.uid)
    assert position is not None
    assert position.queue == "unschedulable"
    assert position.ready_in is not None
    assert position.ready_in <= 1.0, "parked past its 1 s backoff"


class QuotaBroker:
    """A toy Reserve plugin asking another RM, which has no room: it declares nothing."""

    name = "QuotaBroker"

    async def reserve(self, *, ctx: CycleContext) -> Status:
        raise RMUnschedulable("409", reason="no quota left")

    async def unreserve(self, *, ctx: CycleContext) -> None:
        return None


async def test_an_rm_no_room_waits_for_capacity_whichever_plugin_relayed_it() -> None:
    """As before plugins declared events: the RM's "no room" waits for a release or a Node."""
    calls = Calls()
    ports = Ports(
        nodes=FakeNodes(calls, {}),
        pods=FakePods(calls),
        binder=FakeBinder(calls),
        events=FakeEvents(calls),
        conditions=FakeConditions(calls),
    )
    profile = Profile(
        name="pool",
        scheduler_names=frozenset({"bindery"}),
        client=FakeRM(calls, node="n1"),
        plugins=PluginSet(reserve=(QuotaBroker(),)),
    )
    result = await schedule_one(pod=pod("web"), profile=profile, ports=ports)
    assert result.failure is not None
    assert result.failure.kind is FailureKind.RM_UNSCHEDULABLE
    assert result.failure.requeue is not None
    assert result.failure.requeue.until_event, "a pod the RM had no room for came back on its backoff"


def _plugin_classes() -> set[str]:
    """Every class in bindery.scheduling that is a plugin of some extension point."""
    points = ("pre_filter", "reserve", "pre_bind", "bind", "post_bind")
    found: set[str] = set()
    for info in pkgutil.walk_packages(bindery.scheduling.__path__, "bindery.scheduling."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and value.__module__ == module.__name__
                and not getattr(value, "_is_protocol", False)
                and isinstance(getattr(value, "name", None), str)
                and any(callable(getattr(value, point, None)) for point in points)
            ):
                found.add(name)
    return found


def _named(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.name if isinstance(node, ast.alias) else ""


def test_no_controller_module_names_a_plugin_class() -> None:
    plugins = _plugin_classes()
    assert {"PodPlacementRules", "VolumeBinding", "NodeCheck", "ResourceManagerReservation"} <= plugins
    named = [
        f"{path.relative_to(CONTROLLER.parent)}:{node.lineno}: {_named(node)}"
        for path in sorted(CONTROLLER.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if (isinstance(node, ast.Name) and node.id in plugins)
        or (isinstance(node, ast.alias) and node.name in plugins)
    ]
    assert not named, f"controller/ names plugin classes (ask the plugin chain instead): {named}"
