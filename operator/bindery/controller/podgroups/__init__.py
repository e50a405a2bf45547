"""Pod groups (Kubernetes' PodGroups, ``scheduling.k8s.io``) placed through the resource manager.

- :mod:`~bindery.controller.podgroups.coordinator`: one task per group, offer/withdraw/retry/pause.
"""

from bindery.controller.podgroups.coordinator import PodGroupCoordinator

__all__ = ["PodGroupCoordinator"]
