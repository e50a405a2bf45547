"""Which ResourceManager serves which scheduler name, and which names are contested.

Decision (documented in the CRD status and the README): when two or more ResourceManagers claim the
same scheduler name, NONE of them serves it. Picking a winner (oldest, alphabetical) would make the
outcome depend on an ordering the user never chose, and a typo in a new object would silently steal
pods from a working one. Instead every claimant reports the conflict in its status (Ready=False,
reason SchedulerNameConflict, naming the other objects), and pods of that name stay Pending with a
FailedScheduling event that says which objects conflict. Removing the name from all but one object
resolves it without a restart. Names that are not contested keep working on every claimant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from bindery.config.resourcemanager import ResourceManagerConfig


@dataclasses.dataclass(frozen=True)
class Routing:
    served: Mapping[str, str]  # scheduler name -> ResourceManager name (uncontested only)
    contested: Mapping[str, tuple[str, ...]]  # scheduler name -> all claimants, sorted

    def conflicts_of(self, *, rm_name: str) -> dict[str, tuple[str, ...]]:
        """For one ResourceManager: its contested names -> the OTHER claimants."""
        return {
            name: tuple(other for other in claimants if other != rm_name)
            for name, claimants in self.contested.items()
            if rm_name in claimants
        }

    def conflict_message(self, *, scheduler_name: str) -> str | None:
        claimants = self.contested.get(scheduler_name)
        if not claimants:
            return None
        return (
            f'scheduler name "{scheduler_name}" is claimed by ResourceManagers '
            f"{', '.join(repr(c) for c in claimants)}; none of them schedules it until the name is "
            "removed from all but one of them"
        )


def route_scheduler_names(*, configs: Iterable[ResourceManagerConfig]) -> Routing:
    claimants: dict[str, list[str]] = {}
    for config in configs:
        for name in config.scheduler_names:
            claimants.setdefault(name, []).append(config.name)
    served = {name: rms[0] for name, rms in claimants.items() if len(rms) == 1}
    contested = {name: tuple(sorted(rms)) for name, rms in claimants.items() if len(rms) > 1}
    return Routing(served=served, contested=contested)
