"""The watch of unbound pods, outside Kopf: the operator's hot path.

Why not a Kopf ``on.event`` handler: every pod event went through Kopf's per-object machinery (a
worker per pod, cause detection, a handler invocation with its keyword arguments, a per-object
logger). Profiled in the ceiling benchmark's backlog (benchmarks/PROFILE.md: 5,000 pods on 500
nodes), that was 19% of the operator thread's samples, of which Bindery's own handler was 2%.
Bindery needs none of it here: the handler keeps no state on the pod and writes nothing to it, so
the events go straight from the stream to :meth:`bindery.controller.profile.pending.PendingPods.on_pod_event`.
Kopf still runs startup, login and the ResourceManager handlers.

What is kept from Kopf's watch: listed pods arrive as events of type None, as Kopf's listing
delivers them; events are handled in order, one at a time per list-then-watch.
The loop is :func:`bindery.apiserver.watching.list_watch`: a watch the server ends, or whose stream broke
or went silent, resumes from the last resourceVersion seen (bookmarks keep it fresh); one that
expired (410 Gone) is relisted, and the relist is diffed against the pods known, so a pod that
vanished meanwhile arrives as DELETED (Kopf's watch gave it nothing and left it to the runtime's
periodic sweep) and unchanged pods are not offered again.

Only the scheduler names some ResourceManager claims are followed: one list + watch per name and
scope (each namespace of a namespaced operator, else all namespaces), with the field selector
``spec.nodeName=,spec.schedulerName=<name>`` (:meth:`UnboundPodWatcher.follow`). It used to be one
watch of every unbound pod, whatever its scheduler name: any user who may create pods could then
make the operator read, parse and keep their specs (a pod with 20,000 tolerations is 1.5 MB of
JSON, about 7 MB parsed), and a hundred such pods of ``schedulerName: nobody`` took it past its
memory limit, again on every restart's list. The apiserver now filters them out; a name that
becomes claimed later gets its own list, which picks up the pods already waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from bindery.apiserver import resources
from bindery.apiserver.api import ApiClient
from bindery.apiserver.watching import WATCH_BACKOFF, Cursor, Event, Listed, identity, list_watch
from bindery.backoff import Backoff, BackoffPolicy
from bindery.typedefs import Logger

PodEventHandler = Callable[[str | None, Mapping[str, Any]], Awaitable[None]]
#: Explicit bound on one page of the LIST (500 pods).
LIST_TIMEOUT_SECONDS = 60.0


#: The unbound pods: every pod no node is named for yet, whatever its scheduler name.
UNBOUND_PODS = "spec.nodeName="


def unbound_pods_selector(*, scheduler_name: str) -> str:
    """Pure: the field selector of the unbound pods of one scheduler name."""
    return f"{UNBOUND_PODS},spec.schedulerName={scheduler_name}"


def remembered(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """Pure: what is kept of a pending pod for its DELETED, should it vanish during a relist: its
    identity and scheduler name (the runtime forgets it by UID; its departure wakes no parked pod:
    a pending pod holds no room); a pod body per pending pod would double the backlog's memory."""
    kept = dict(identity(pod))
    scheduler = (pod.get("spec") or {}).get("schedulerName")
    if scheduler:
        kept["spec"] = {"schedulerName": scheduler}
    return kept


class UnboundPodWatcher:
    """Feeds every event of the unbound pods of the followed names to `on_event(type, pod)`.

    :meth:`follow` says which scheduler names to follow (none at first); :meth:`run` runs the
    watches until cancelled.
    """

    def __init__(
        self,
        *,
        api: ApiClient,
        namespaces: Sequence[str],
        on_event: PodEventHandler,
        logger: Logger,
        watch_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        self._api = api
        self._scopes: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._on_event = on_event
        self._logger = logger
        self._watch_seconds = watch_seconds
        self._max_backoff = max_backoff
        self.lists = 0  #: completed lists, all names and scopes (tests wait on it)
        #: per (scope, scheduler name), where its list-then-watch stands (version, pods known)
        self.cursors: dict[tuple[str | None, str], Cursor] = {}
        self._tasks: dict[tuple[str | None, str], asyncio.Task[None]] = {}
        self._names: frozenset[str] = frozenset()
        self._running = False

    @property
    def names(self) -> frozenset[str]:
        """The scheduler names followed."""
        return self._names

    def follow(self, names: Iterable[str]) -> None:
        """Follow exactly these scheduler names from now on: start a list + watch for each new one,
        stop those of names no longer claimed (their pods are the runtime's to forget)."""
        self._names = frozenset(names)
        if self._running:
            self._sync()

    def _sync(self) -> None:
        wanted = {(scope, name) for scope in self._scopes for name in self._names}
        for key in [key for key in self._tasks if key not in wanted]:
            self._tasks.pop(key).cancel()
            self.cursors.pop(key, None)
        for scope, name in sorted(wanted - set(self._tasks), key=lambda key: (key[0] or "", key[1])):
            self._tasks[(scope, name)] = asyncio.create_task(
                self._follow(scope, name), name=f"unbound pods of {name} in {scope or 'all'}"
            )

    async def run(self) -> None:
        """Run the watches of the followed names until cancelled."""
        self._running = True
        self._sync()
        try:
            await asyncio.Event().wait()
        finally:
            self._running = False
            tasks = list(self._tasks.values())
            self._tasks.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self, namespace: str | None, scheduler_name: str) -> None:
        cursor = self.cursors[(namespace, scheduler_name)] = Cursor(remember=remembered)
        selector = unbound_pods_selector(scheduler_name=scheduler_name)
        async for item in list_watch(
            self._api,
            resources.PODS,
            namespace=namespace,
            field_selector=selector,
            watch_seconds=self._watch_seconds,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=cursor,
            backoff=Backoff(BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)),
            logger=self._logger,
            what=f"unbound pods ({selector} in {namespace or 'all namespaces'})",
        ):
            if isinstance(item, Listed):
                self.lists += 1
            elif isinstance(item, Event):
                try:
                    await self._on_event(item.type, item.object)
                except Exception as exc:  # one pod's failure must not end the watch of all
                    name = (item.object.get("metadata") or {}).get("name")
                    self._logger.warning(
                        f"handling the {item.type or 'listed'} event of pod {name} failed: {exc}"
                    )
