"""The old name of the pod group coordinator, removed when profiles.py is updated."""

from bindery.controller.podgroups.coordinator import PodGroupCoordinator as GangCoordinator

__all__ = ["GangCoordinator"]
