"""The watch of unbound pods, outside Kopf: the operator's hot path.

Why not a Kopf ``on.event`` handler: every pod event went through Kopf's per-object machinery (a
worker per pod, cause detection, a handler invocation with its keyword arguments, a per-object
logger). Profiled in the ceiling benchmark's backlog (benchmarks/PROFILE.md: 5,000 pods on 500
nodes), that was 19% of the operator thread's samples, of which Bindery's own handler was 2%.
Bindery needs none of it here: the handler keeps no state on the pod and writes nothing to it, so
the events go straight from the stream to :meth:`bindery.controller.pending.PendingPods.on_pod_event`.
Kopf still runs everything else (startup, login, the Node index, the ResourceManager handlers).

What is kept from Kopf's watch: one list + watch per scope (each namespace of a namespaced
operator, else all namespaces) with the field selector ``spec.nodeName=``; listed pods arrive as
events of type None, as Kopf's listing delivers them; events are handled in order, one at a time.
The loop is :func:`bindery.k8s.watching.list_watch`: a watch the server ends, or whose stream broke
or went silent, resumes from the last resourceVersion seen (bookmarks keep it fresh); one that
expired (410 Gone) is relisted, and the relist is diffed against the pods known, so a pod that
vanished meanwhile arrives as DELETED (Kopf's watch gave it nothing and left it to the runtime's
periodic sweep) and unchanged pods are not offered again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from bindery.backoff import Backoff, BackoffPolicy
from bindery.k8s import resources
from bindery.k8s.api import ApiClient
from bindery.k8s.watching import WATCH_BACKOFF, Cursor, Event, Listed, identity, list_watch
from bindery.typedefs import Logger

PodEventHandler = Callable[[str | None, Mapping[str, Any]], Awaitable[None]]
#: Explicit bound on one page of the LIST (500 pods).
LIST_TIMEOUT_SECONDS = 60.0


#: The unbound pods: every pod no node is named for yet, whatever its scheduler name.
UNBOUND_PODS = "spec.nodeName="


def remembered(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """Pure: what is kept of a pending pod for its DELETED, should it vanish during a relist: its
    identity and scheduler name (the runtime forgets it by UID and retries parked pods for its
    scheduler's departures); a pod body per pending pod would double the backlog's memory."""
    kept = dict(identity(pod))
    scheduler = (pod.get("spec") or {}).get("schedulerName")
    if scheduler:
        kept["spec"] = {"schedulerName": scheduler}
    return kept


class UnboundPodWatcher:
    """Feeds every event of the unbound pods in scope to `on_event(type, pod)` until cancelled."""

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
        self.lists = 0  #: completed lists, all scopes (tests wait on it)
        #: per scope, where its list-then-watch stands (version, pods known)
        self.cursors: dict[str | None, Cursor] = {}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for namespace in self._scopes:
                group.create_task(self._follow(namespace), name=f"unbound pods of {namespace or 'all'}")

    async def _follow(self, namespace: str | None) -> None:
        cursor = self.cursors[namespace] = Cursor(remember=remembered)
        async for item in list_watch(
            self._api,
            resources.PODS,
            namespace=namespace,
            field_selector=UNBOUND_PODS,
            watch_seconds=self._watch_seconds,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=cursor,
            backoff=Backoff(BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)),
            logger=self._logger,
            what=f"unbound pods ({UNBOUND_PODS} in {namespace or 'all namespaces'})",
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
