"""The watch of Nodes, outside Kopf: the node cache, and the wake-ups Node changes bring.

Why not Kopf's index and `on.event` handler (what fed the cache before): Kopf runs no handler at
all, the ResourceManagers' included, until every index has taken its initial list, and it takes
that list through its per-object machinery: a worker per Node, each registering itself with the
index's readiness toggles and waiting on one condition that every other Node's worker notifies.
Profiled at 5,000 Nodes, that was nearly all of the operator's CPU for minutes before the first
profile started. Bindery needs none of it: a Node event is a projection stored in a map.

So the Nodes follow the project's own list-then-watch (:func:`bindery.apiserver.watching.list_watch`:
paged, one page held at a time, resumed from the last resourceVersion, a 410 relisted and diffed).
Each event goes to the cache (:class:`bindery.adapters.lookups.NodeCache`) first, then to
`on_event` (the pending pods: a Node added or changed where placement looks wakes parked pods),
so a pod woken reads the new Node. The end of the first list marks the cache synced and calls
`on_synced` once: the profiles wait for it before they schedule (a decision on half the Nodes
would refuse a node the RM chose because the cache does not know it yet), and for nothing else.

Started by the runtime with the operator, leader or standby: a standby's cache is warm when it leads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bindery.adapters.lookups import NodeCache
from bindery.apiserver import resources
from bindery.apiserver.api import ApiClient
from bindery.apiserver.errors import ApiError
from bindery.apiserver.watching import WATCH_BACKOFF, Cursor, Event, Listed, identity, list_watch
from bindery.backoff import Backoff, BackoffPolicy
from bindery.typedefs import Logger

#: Explicit bound on one page of the LIST (500 Nodes).
LIST_TIMEOUT_SECONDS = 60.0

NodeEventHandler = Callable[[str | None, Mapping[str, Any]], None]


class NodeWatcher:
    """Keeps `cache` current until cancelled (:meth:`run`); see the module docstring."""

    def __init__(
        self,
        *,
        api: ApiClient,
        cache: NodeCache,
        on_event: NodeEventHandler,
        on_synced: Callable[[], None],
        logger: Logger,
        watch_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        self._api = api
        self._cache = cache
        self._on_event = on_event
        self._on_synced = on_synced
        self._logger = logger
        self._watch_seconds = watch_seconds
        self._max_backoff = max_backoff
        self.cursor = Cursor(remember=identity)
        self.lists = 0  #: completed lists (tests wait on it)

    async def run(self) -> None:
        async for item in list_watch(
            self._api,
            resources.NODES,
            watch_seconds=self._watch_seconds,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=self.cursor,
            backoff=Backoff(BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)),
            logger=self._logger,
            what="nodes",
            hint=_hint,
        ):
            if isinstance(item, Listed):
                self.lists += 1
                if self.lists == 1:
                    self._cache.mark_synced()
                    self._logger.info(f"listed {item.count} nodes: scheduling may start")
                    try:
                        self._on_synced()
                    except Exception as exc:  # the cache is synced either way; a profile checks it too
                        self._logger.warning(f"telling the profiles that the nodes are listed failed: {exc}")
            elif isinstance(item, Event):
                try:
                    self._cache.on_event(item.type, item.object)
                    self._on_event(item.type, item.object)
                except Exception as exc:  # one Node must not end the watch of all
                    name = (item.object.get("metadata") or {}).get("name")
                    kind = item.type or "listed"
                    self._logger.warning(f"handling the {kind} event of node {name} failed: {exc}")


def _hint(error: ApiError) -> str:
    if error.status == 403:
        return (
            "; the operator needs list and watch on nodes (bindery.controller.startup.rbac): no pod is "
            "scheduled until it has listed them"
        )
    return ""
