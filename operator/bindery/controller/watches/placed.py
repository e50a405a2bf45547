"""The one watch of every pod on a node: for the inter-pod rules, and for releases.

Pod affinity, topology spread and host ports read the pods already on nodes, whoever placed them
(kube-scheduler, another scheduler, a DaemonSet's own nodeName), so this follows all pods with the
server-side field selector ``spec.nodeName!=``, in the operator's namespaces (all, unless it runs
namespaced): one list/watch per scope. The cache (bindery.adapters.placed.PlacedPodCache) keeps a slim
projection per pod (bindery.podrules.model.PlacedPod). Finished pods (Succeeded/Failed) leave the
cache: they hold neither room nor ports.

The same stream feeds the releases of departed pods (:mod:`.bound`): every running profile
subscribes a :class:`~.bound.BoundPodSubscriber`, and each event goes, after the cache took it, to
every subscriber whose scheduler names include the pod's ``spec.schedulerName``. The profiles used
to run a second list/watch per scheduler name (``spec.schedulerName=<name>,spec.nodeName!=``), a
subset of this one: the apiserver sent, and the operator decoded, every bound pod's events twice.
The cache comes first, so that a pod woken by a release sees the node without the departed pod.
One subscriber failing leaves the cache and the others alone.

The cursor of each scope remembers, per pod,
:func:`~bindery.controller.reservations.boundpods.remembered`: a UID for most pods (the
cache needs no more to forget one), and for a pod carrying a reservation annotation what its release
needs. So a relist's diff (after a 410) synthesizes a DELETED that both the cache and the release
can act on, and a profile that subscribes later (leadership gained, a ResourceManager added, a
scheduler name added) is replayed the pods of its names as a watch of its own would list them.

Started by the runtime with the operator, leader or standby (a standby's cache is warm when it
leads; its profiles subscribe only while they lead). As kube-scheduler waits for its informers to
sync, a cycle waits (up to 10 s) until every scope has listed (:meth:`PlacedPodCache.mark_synced`);
past that a pod with rules is a SchedulerError and retried, never evaluated on a partial cache.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from bindery.adapters.placed import PlacedPodCache
from bindery.apiserver import resources
from bindery.apiserver.api import ApiClient
from bindery.apiserver.watching import WATCH_BACKOFF, Cursor, Event, Listed, list_watch
from bindery.backoff import Backoff, BackoffPolicy
from bindery.controller.reservations.boundpods import remembered
from bindery.controller.watches.bound import BoundPodSubscriber
from bindery.typedefs import Logger

__all__ = ["PLACED_PODS", "PlacedPodWatcher", "remembered"]

#: Every pod a node is named for.
PLACED_PODS = "spec.nodeName!="

LIST_TIMEOUT_SECONDS = 60.0


class PlacedPodWatcher:
    """One list/watch of the pods on nodes per scope, into the cache and the subscribed profiles
    (a :class:`~.bound.BoundPodFeed`)."""

    def __init__(
        self,
        *,
        api: ApiClient,
        cache: PlacedPodCache,
        logger: Logger,
        namespaces: Sequence[str] = (),
        watch_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        self._api = api
        self._cache = cache
        self._logger = logger
        self._scopes: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._watch_seconds = watch_seconds
        self._max_backoff = max_backoff
        self._listed: set[str | None] = set()
        #: per scope, where its list-then-watch stands (and the pods known, for replays)
        self.cursors: dict[str | None, Cursor] = {
            scope: Cursor(remember=remembered) for scope in self._scopes
        }
        #: replaced, never changed in place: a stream iterating it is not disturbed by a (un)subscribe
        self._subscribers: tuple[BoundPodSubscriber, ...] = ()

    @property
    def synced(self) -> bool:
        return len(self._listed) == len(self._scopes)

    # -- the feed of bound pods --------------------------------------------------------------------

    def subscribe(self, subscriber: BoundPodSubscriber) -> None:
        """From now on `subscriber` gets the events of its pods; what is known of them already is
        replayed first (as ADDED), as a list of its own would give them."""
        if subscriber in self._subscribers:
            return
        self._subscribers = (*self._subscribers, subscriber)
        self.replay(subscriber, scheduler_names=subscriber.scheduler_names)

    def unsubscribe(self, subscriber: BoundPodSubscriber) -> None:
        self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

    def replay(self, subscriber: BoundPodSubscriber, *, scheduler_names: Collection[str]) -> None:
        """Deliver to `subscriber`, as ADDED, every known pod of `scheduler_names` in its namespaces.

        Known: the pods of the last list and of the watch since, and those of a list under way
        (pages already delivered). A pod that vanished during a relist under way may be replayed
        and then come as DELETED: a release is idempotent, and released ids are remembered.
        """
        names = frozenset(scheduler_names)
        if not names:
            return
        namespaces = subscriber.namespaces
        for cursor in self.cursors.values():
            for _, body in itertools.chain(list(cursor.known.values()), list(cursor.fresh.values())):
                spec = body.get("spec")  # only pods carrying a reservation annotation keep one
                if spec is None or spec.get("schedulerName") not in names:
                    continue
                if namespaces and (body.get("metadata") or {}).get("namespace") not in namespaces:
                    continue
                self._deliver(subscriber, "ADDED", body)

    # -- the stream --------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for scope in self._scopes:
                group.create_task(
                    self._follow(scope), name=f"bindery placed pods in {scope or 'all namespaces'}"
                )

    async def _follow(self, namespace: str | None) -> None:
        async for item in list_watch(
            self._api,
            resources.PODS,
            namespace=namespace,
            field_selector=PLACED_PODS,
            watch_seconds=self._watch_seconds,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=self.cursors[namespace],
            backoff=Backoff(BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)),
            logger=self._logger,
            what=f"pods on nodes, for inter-pod rules and releases ({namespace or 'all namespaces'})",
        ):
            if isinstance(item, Listed):
                if namespace not in self._listed:
                    self._listed.add(namespace)
                    if self.synced:
                        self._cache.mark_synced()
                if item.relist:
                    for subscriber in self._subscribers:
                        try:
                            subscriber.relisted()
                        except Exception as exc:
                            self._logger.warning(f"telling a profile of a pod relist failed: {exc}")
                continue
            assert isinstance(item, Event)
            pod = item.object
            try:
                self._cache.on_event(item.type, pod)
            except Exception as exc:  # one pod's projection must not end the watch of all
                self._logger.warning(f"handling a placed-pod {item.type or 'listed'} event failed: {exc}")
            if self._subscribers:
                self._dispatch(item.type or "ADDED", pod)

    def _dispatch(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """Hand one event to every subscriber of the pod's scheduler name (and namespace)."""
        name = (pod.get("spec") or {}).get("schedulerName")
        for subscriber in self._subscribers:
            if name not in subscriber.scheduler_names:
                continue
            namespaces = subscriber.namespaces
            if namespaces and (pod.get("metadata") or {}).get("namespace") not in namespaces:
                continue
            self._deliver(subscriber, event_type, pod)

    def _deliver(self, subscriber: BoundPodSubscriber, event_type: str, pod: Mapping[str, Any]) -> None:
        try:
            subscriber.deliver(event_type, pod)
        except Exception as exc:  # one profile's failure must not end the watch of the others
            self._logger.warning(f"handing a bound-pod {event_type} event to a profile failed: {exc}")
