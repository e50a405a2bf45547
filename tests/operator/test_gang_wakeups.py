"""Which pod groups a released reservation wakes (PodGroupCoordinator.retry), without I/O."""

from __future__ import annotations

import logging
import types
from typing import Any, cast

from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.coordinator import GroupState, PodGroupCoordinator
from bindery.controller.preemption import Preemptions
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.preemption import Preemptor


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
    preemptions = Preemptions(api=cast(Any, None), rm=cast(Any, None), logger=logging.getLogger("test"))
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
