"""The bound pods of each running profile, handed over by the shared watch of placed pods.

A committed reservation is an allocation: it lasts until Bindery releases it (contract v1, "when
the pod is gone, Bindery releases"). The unbound-pod watch sees only unbound pods (`spec.nodeName=`).
Bound pods are not watched here: the placed-pod watch (:mod:`.placed`, ``spec.nodeName!=``, one
list/watch per scope for the inter-pod rules) already receives every event of every bound pod, so
it hands each one, after the placed-pod cache took it, to the :class:`BoundPodSubscriber` of each
running profile whose scheduler names include the pod's ``spec.schedulerName``. A second watch per
scheduler name (``spec.schedulerName=<name>,spec.nodeName!=``) made the apiserver send, and the
operator decode, every bound pod's events twice (issue 19's plain-pod budget).

One profile's subscriber is :class:`bindery.controller.reservations.releases.BoundPodReleases`,
which releases the reservations of departed pods; what the watch's cursor keeps per pod is
:func:`bindery.controller.reservations.boundpods.remembered`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol


class BoundPodSubscriber(Protocol):
    """What the shared pod watch hands bound pods to: one per running profile.

    `deliver` is called inside the watch's stream, after the placed-pod cache took the event, for
    every event of a pod whose ``spec.schedulerName`` is in `scheduler_names` and whose namespace is
    in `namespaces` (empty: any); it must not block (nor await: the cache of every other pod waits).
    `relisted` is called after a real relist's events (not after the first list, nor a resumed
    watch).
    """

    @property
    def scheduler_names(self) -> Collection[str]: ...

    @property
    def namespaces(self) -> Collection[str]: ...

    def deliver(self, event_type: str, pod: Mapping[str, Any]) -> None: ...

    def relisted(self) -> None: ...


class BoundPodFeed(Protocol):
    """Where a profile subscribes (:class:`bindery.controller.watches.placed.PlacedPodWatcher`).

    `subscribe` replays what the watch already knows of the subscriber's pods, as a watch of its own
    would list them; `replay` does that for scheduler names a subscriber gained.
    """

    def subscribe(self, subscriber: BoundPodSubscriber) -> None: ...

    def unsubscribe(self, subscriber: BoundPodSubscriber) -> None: ...

    def replay(self, subscriber: BoundPodSubscriber, *, scheduler_names: Collection[str]) -> None: ...
