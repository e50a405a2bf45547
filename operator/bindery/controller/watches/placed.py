"""The watch of every pod on a node, for the inter-pod rules (bindery.kube.placed.PlacedPodCache).

Pod affinity, topology spread and host ports read the pods already on nodes, whoever placed them
(kube-scheduler, another scheduler, a DaemonSet's own nodeName), so this follows all pods with the
server-side field selector ``spec.nodeName!=``, in the operator's namespaces (all, unless it runs
namespaced). The cache keeps a slim projection per pod (bindery.podrules.model.PlacedPod); the
cursor remembers only identities (for the DELETED a relist's diff synthesizes). Finished pods
(Succeeded/Failed) leave the cache: they hold neither room nor ports.

Started by the runtime with the operator. As kube-scheduler waits for its informers to sync, a
cycle waits (up to 10 s) until every scope has listed (:meth:`PlacedPodCache.mark_synced`); past
that a pod with rules is a SchedulerError and retried, never evaluated on a partial cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from bindery.backoff import Backoff, BackoffPolicy
from bindery.k8s import resources
from bindery.k8s.api import ApiClient
from bindery.k8s.watching import WATCH_BACKOFF, Cursor, Event, Listed, list_watch
from bindery.kube.placed import PlacedPodCache
from bindery.typedefs import Logger

#: Every pod a node is named for.
PLACED_PODS = "spec.nodeName!="


def remembered(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """Pure: what the cursor keeps per pod for the DELETED a relist synthesizes: its UID, all the
    cache needs to forget it (name, namespace and resourceVersion too doubled the memory per pod)."""
    return {"metadata": {"uid": (pod.get("metadata") or {}).get("uid")}}


LIST_TIMEOUT_SECONDS = 60.0


class PlacedPodWatcher:
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

    @property
    def synced(self) -> bool:
        return len(self._listed) == len(self._scopes)

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
            cursor=Cursor(remember=remembered),
            backoff=Backoff(BackoffPolicy(initial=WATCH_BACKOFF.initial, maximum=self._max_backoff)),
            logger=self._logger,
            what=f"pods on nodes, for inter-pod rules ({namespace or 'all namespaces'})",
        ):
            if isinstance(item, Listed):
                if namespace not in self._listed:
                    self._listed.add(namespace)
                    if self.synced:
                        self._cache.mark_synced()
                continue
            assert isinstance(item, Event)
            try:
                self._cache.on_event(item.type, item.object)
            except Exception as exc:  # one pod's projection must not end the watch of all
                self._logger.warning(f"handling a placed-pod {item.type or 'listed'} event failed: {exc}")
