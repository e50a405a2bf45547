"""Which pod groups a released reservation wakes (PodGroupCoordinator.retry), without I/O."""

from __future__ import annotations

import logging
from typing import Any

from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.coordinator import GroupState, PodGroupCoordinator


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
