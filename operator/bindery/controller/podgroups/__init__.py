"""Pod groups (Kubernetes' PodGroups, ``scheduling.k8s.io``) placed through the resource manager.

A PodGroup's members are placed all together or not at all: one reservation group at the resource
manager (contract v1.1, ``POST /v1/reservation-groups``) for every pending member, then every
member's PreBind, then the Bindings. The pure decisions are :mod:`bindery.scheduling.podgroups`'s;
this package is their I/O, one file per part:

- ``coordinator.py``: one task per group: offer/withdraw/retry/pause, backoff, the pass that decides.
- ``placement.py``: reserve the group, PreBind every member, then bind them all.
- ``recovery.py``: after a restart, bind or release what an earlier process left reserved.
- ``reporting.py``: ``FailedScheduling``/``PodScheduled`` on members, ``PodGroupScheduled`` on the group.
"""

from bindery.controller.podgroups.coordinator import PodGroupCoordinator

__all__ = ["PodGroupCoordinator"]
