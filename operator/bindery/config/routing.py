"""Which ResourceManager serves which scheduler name, and which names are contested.

Decision (documented in the CRD status and the README): when two or more ResourceManagers claim the
same scheduler name, NONE of them serves it. Picking a winner (oldest, alphabetical) would make the
outcome depend on an ordering the user never chose, and a typo in a new object would silently steal
pods from a working one. Instead every claimant reports the conflict in its status (Ready=False,
reason SchedulerNameConflict, naming the other objects), and pods of that name stay Pending with a
FailedScheduling event that says which objects conflict. Removing the name from all but one object
resolves it without a restart. Names that are not contested keep working on every claimant.

A served name is served only to the namespaces its ResourceManager's `spec.namespaceSelector`
selects (bindery.config.selector); a pod of another namespace is refused with
:func:`namespace_refusal`'s message, and nothing is reserved for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from bindery.config.resourcemanager import ResourceManagerConfig
from bindery.config.selector import NamespaceSelector


@dataclasses.dataclass(frozen=True)
class Routing:
    served: Mapping[str, str]  # scheduler name -> ResourceManager name (uncontested only)
    contested: Mapping[str, tuple[str, ...]]  # scheduler name -> all claimants, sorted
    #: ResourceManager name -> its spec.namespaceSelector (only those that have one)
    selectors: Mapping[str, NamespaceSelector] = dataclasses.field(default_factory=dict)

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


def namespace_refusal(*, rm_name: str, selector: NamespaceSelector, namespace: str) -> str:
    """Pure: why a pod of `namespace` is not served: the ResourceManager, its rule, the fix."""
    return (
        f'ResourceManager "{rm_name}" serves only namespaces whose labels match its '
        f'spec.namespaceSelector ({selector.describe()}); namespace "{namespace}" does not match, so '
        "nothing was reserved. A cluster administrator can label the namespace to match, or the pod "
        "can use a scheduler name served for this namespace"
    )


def route_scheduler_names(*, configs: Iterable[ResourceManagerConfig]) -> Routing:
    configs = list(configs)
    claimants: dict[str, list[str]] = {}
    for config in configs:
        for name in config.scheduler_names:
            claimants.setdefault(name, []).append(config.name)
    served = {name: rms[0] for name, rms in claimants.items() if len(rms) == 1}
    contested = {name: tuple(sorted(rms)) for name, rms in claimants.items() if len(rms) > 1}
    selectors = {c.name: c.namespace_selector for c in configs if c.namespace_selector is not None}
    return Routing(served=served, contested=contested, selectors=selectors)
