"""Which pod groups a released reservation, a node or a placed pod wakes (PodGroupCoordinator.retry
and .wake), without I/O."""

from __future__ import annotations

import asyncio
import logging
import time
import types
from typing import Any, cast

from bindery.adapters.placed import PlacedPodCache
from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.coordinator import GroupState, PodGroupCoordinator
from bindery.controller.podgroups.placement import RULES_RECHECK_SECONDS, Placement
from bindery.controller.preemption import Preemptions
from bindery.rm.errors import RMUnschedulable
from bindery.scheduling.placementrules import TAG_ANTI_AFFINITY
from bindery.scheduling.podgroups import PodGroupInfo
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from bindery.scheduling.preemption import PlanScope, Preemptor
from bindery.scheduling.queue import Touch, WakeOn


def _unused() -> Any:
    raise AssertionError("retry() must not do I/O")


def test_a_release_wakes_only_groups_the_rm_found_no_room_for() -> None:
    """Before the fix every group woke with its backoff reset: a group whose PreBind failed woke on
    its own release and tried again at once, for ever."""
    coordinator = PodGroupCoordinator(
        profile=_unused,
        ports=_unused,
        rm=_unused,
        api=None,
        logger=logging.getLogger("test"),
        metrics=Metrics(),
        on_released=lambda: None,
    )
    no_room, prebind_failed, short_of_members = GroupState(), GroupState(), GroupState()
    no_room.waits_for_capacity, no_room.failures = True, 4
    prebind_failed.failures = short_of_members.failures = 3
    groups = {("ns", "a"): no_room, ("ns", "b"): prebind_failed, ("ns", "c"): short_of_members}
    coordinator._groups.update(groups)
    coordinator.retry()
    assert no_room.wake.is_set()
    assert no_room.failures == 0
    assert not no_room.waits_for_capacity  # woken once per "no room" answer
    assert not prebind_failed.wake.is_set()
    assert prebind_failed.failures == 3
    assert not short_of_members.wake.is_set()


async def test_a_group_whose_members_all_left_forgets_its_preemption_back_off() -> None:
    """A group's preemption back-off and plan were forgotten only when members bound. Deleted and
    recreated under the same name, the group inherited the back-off: its reserves carried
    `preemptionPolicy: Never` (no preemption) until the old back-off ended, up to 5 minutes."""
    preemptions = Preemptions(
        api=cast(Any, None),
        rm=cast(Any, None),
        logger=logging.getLogger("test"),
        scope=lambda: PlanScope(rm_name="rm"),
        nodes=lambda name: None,
    )
    key = Preemptor.of_group(namespace="ns", name="g", members=()).uid
    preemptions._back_off(key, "a budget protects every victim")
    assert preemptions.backed_off(key) is not None

    members_gone = types.SimpleNamespace(pods=types.SimpleNamespace(get=lambda uid: None))
    coordinator = PodGroupCoordinator(
        profile=_unused,
        ports=lambda: cast(Any, members_gone),
        rm=_unused,
        api=None,
        logger=logging.getLogger("test"),
        metrics=Metrics(),
        on_released=lambda: None,
        preemptions=preemptions,
    )
    coordinator._active = True
    group = GroupState()
    group.pending["u1"] = PodInfo(uid="u1", namespace="ns", name="g-0", scheduler_name="s")
    coordinator._groups[("ns", "g")] = group
    await coordinator._run(("ns", "g"), group)

    assert ("ns", "g") not in coordinator._groups
    assert preemptions.backed_off(key) is None


def _coordinator() -> PodGroupCoordinator:
    return PodGroupCoordinator(
        profile=_unused,
        ports=_unused,
        rm=_unused,
        api=None,
        logger=logging.getLogger("test"),
        metrics=Metrics(),
        on_released=lambda: None,
    )


def _refused(rules: WakeOn, *, backoff_left: float = -1.0) -> GroupState:
    group = GroupState()
    group.rules, group.retry_at = rules, time.monotonic() + backoff_left
    return group


async def test_a_placed_pod_change_wakes_the_groups_its_members_rules_refused_that_it_concerns() -> None:
    """Before: a group its members' rules refused was not woken by the pod in its way leaving; it
    was only polled again after its backoff. Now it is woken as a refused pod is, and only by a
    change of a namespace its rules read or of a pod with a tag they care about."""
    coordinator = _coordinator()
    same_namespace = _refused(WakeOn(namespaces=frozenset({"ns"})))
    elsewhere = _refused(WakeOn(namespaces=frozenset({"other"})))
    by_tag = _refused(WakeOn(namespaces=frozenset({"other"}), tags=frozenset({TAG_ANTI_AFFINITY})))
    any_namespace = _refused(WakeOn(namespaces=None))
    not_refused = GroupState()
    groups = [same_namespace, elsewhere, by_tag, any_namespace, not_refused]
    coordinator._groups.update({("ns", str(i)): group for i, group in enumerate(groups)})

    coordinator.wake(Touch(namespace="ns"))
    assert [group.wake.is_set() for group in groups] == [True, False, False, True, False]
    assert same_namespace.rules is None  # once per refusal: the next try sets it again

    coordinator.wake(Touch(namespace="ns", tags=frozenset({TAG_ANTI_AFFINITY})))
    assert by_tag.wake.is_set()
    assert not elsewhere.wake.is_set()


async def test_a_group_woken_during_its_backoff_is_woken_when_the_backoff_ends() -> None:
    coordinator = _coordinator()
    group = _refused(WakeOn(namespaces=frozenset({"ns"})), backoff_left=0.2)
    coordinator._groups[("ns", "g")] = group
    coordinator.wake(Touch(namespace="ns"))
    assert not group.wake.is_set()  # checked at once, no wait: the timer cannot have fired yet
    await asyncio.wait_for(group.wake.wait(), timeout=10)


async def test_a_node_change_wakes_a_group_its_members_rules_refused() -> None:
    """Node labels are what a rule's topology reads: retry() (node events, releases) wakes them too."""
    coordinator = _coordinator()
    group = _refused(WakeOn(namespaces=frozenset({"ns"})))
    coordinator._groups[("ns", "g")] = group
    coordinator.retry()
    assert group.wake.is_set()


async def test_a_group_refused_by_its_members_rules_waits_for_a_wake_not_a_poll() -> None:
    """The refusal records what may lift it; the next look is the safety net, not the backoff."""
    cache = PlacedPodCache(nodes=lambda: [NodeProjection(name="n0", labels={"kubernetes.io/hostname": "n0"})])
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "pair"}}}
            ]
        }
    }
    members = [
        PodInfo.from_body(
            {
                "metadata": {
                    "name": f"pair-{i}",
                    "namespace": "ns",
                    "uid": f"u{i}",
                    "labels": {"app": "pair"},
                },
                "spec": {"schedulerName": "s", "containers": [{"name": "c"}], "affinity": anti},
            }
        )
        for i in range(2)
    ]

    class _Reporter:
        async def fail(self, *args: Any, **kwargs: Any) -> None:
            return None

    placement = Placement(
        profile=lambda: cast(Any, types.SimpleNamespace(reservation_ttl_seconds=60)),
        ports=lambda: cast(Any, types.SimpleNamespace(placed=cache)),
        rm=_unused,
        logger=logging.getLogger("test"),
        metrics=Metrics(),
        reporter=cast(Any, _Reporter()),
        backoff=lambda group: 2.0,
        on_released=lambda: None,
        on_outcome=lambda pod, outcome: None,
    )
    group = GroupState()
    delay = await placement.place(PodGroupInfo(namespace="ns", name="pair"), group, members)
    assert delay == RULES_RECHECK_SECONDS
    assert group.rules is not None
    assert group.rules.namespaces == frozenset({"ns"})
    assert group.retry_at > time.monotonic()  # the backoff (2 s) still runs


async def test_a_placed_pod_change_while_the_refusal_is_reported_still_wakes_the_group() -> None:
    """The refusal is reported (an Event and a condition per member: API calls, seconds for a large
    gang) after the rules were evaluated. Before: the group recorded what may lift the refusal only
    once the report was written, so the pod in its way leaving meanwhile woke nothing and the group
    slept RULES_RECHECK_SECONDS (60 s). Now the wake-up is armed before the report."""
    cache = PlacedPodCache(nodes=lambda: [NodeProjection(name="n0", labels={"kubernetes.io/hostname": "n0"})])
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "pair"}}}
            ]
        }
    }
    members = [
        PodInfo.from_body(
            {
                "metadata": {
                    "name": f"pair-{i}",
                    "namespace": "ns",
                    "uid": f"u{i}",
                    "labels": {"app": "pair"},
                },
                "spec": {"schedulerName": "s", "containers": [{"name": "c"}], "affinity": anti},
            }
        )
        for i in range(2)
    ]
    coordinator = _coordinator()
    group = GroupState()
    coordinator._groups[("ns", "pair")] = group

    class _Reporter:
        async def fail(self, *args: Any, **kwargs: Any) -> None:
            await asyncio.sleep(0)  # the report's API calls: the watch delivers meanwhile
            coordinator.wake(Touch(namespace="ns"))  # a pod of ns left its node

    placement = Placement(
        profile=lambda: cast(Any, types.SimpleNamespace(reservation_ttl_seconds=60)),
        ports=lambda: cast(Any, types.SimpleNamespace(placed=cache)),
        rm=_unused,
        logger=logging.getLogger("test"),
        metrics=Metrics(),
        reporter=cast(Any, _Reporter()),
        backoff=lambda group: 0.0,  # no backoff left: a wake-up is a new try at once
        on_released=lambda: None,
        on_outcome=lambda pod, outcome: None,
    )
    await placement.place(PodGroupInfo(namespace="ns", name="pair"), group, members)
    assert group.wake.is_set(), "the change during the report was lost: the group sleeps 60 s"


async def test_a_release_while_no_room_is_reported_still_wakes_the_group() -> None:
    """The same window for "no room": the group said it waits for capacity only once the report was
    written, so a reservation released meanwhile (PodGroupCoordinator.retry) passed it by and the
    group slept its whole backoff. Now it says so before the report."""
    members = [
        PodInfo.from_body(
            {
                "metadata": {"name": f"gang-{i}", "namespace": "ns", "uid": f"g{i}"},
                "spec": {"schedulerName": "s", "containers": [{"name": "c"}]},
            }
        )
        for i in range(2)
    ]
    coordinator = _coordinator()
    group = GroupState()
    coordinator._groups[("ns", "gang")] = group

    class _Reporter:
        async def fail(self, *args: Any, **kwargs: Any) -> None:
            await asyncio.sleep(0)  # the report's API calls: another reservation is released meanwhile
            coordinator.retry()

    class _RM:
        async def reserve_group(self, request: Any) -> Any:
            raise RMUnschedulable("no room", reason="no node has room for every member")

    profile = types.SimpleNamespace(
        name="rm", reservation_ttl_seconds=60, clock=time.monotonic, client=None, backoff_max_seconds=10.0
    )
    placement = Placement(
        profile=lambda: cast(Any, profile),
        ports=lambda: cast(Any, types.SimpleNamespace(placed=None)),
        rm=lambda: cast(Any, _RM()),
        logger=logging.getLogger("test"),
        metrics=Metrics(),
        reporter=cast(Any, _Reporter()),
        backoff=lambda group: 10.0,
        on_released=lambda: None,
        on_outcome=lambda pod, outcome: None,
    )
    await placement.place(PodGroupInfo(namespace="ns", name="gang"), group, members)
    assert group.wake.is_set(), "the release during the report was lost: the group sleeps its backoff"
