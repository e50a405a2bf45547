"""The one watch of PodGroups: what every profile's pod groups read, and what wakes them.

A waiting group used to GET its PodGroup and LIST its namespace's bound pods on each pass, and
passed again after each backoff because nothing told it of a change: the apiserver paid for every
waiting group, every few seconds. Now one list/watch per scope (all namespaces, or each of the
operator's) keeps what scheduling reads of every PodGroup (:class:`PodGroupInfo`), and an event
that changes what a group's decision reads (it appears, goes, or its spec changes) wakes that
group in every profile; a status write (ours, kube-scheduler's) wakes nothing. The members already
placed are counted from the placed-pod cache, whose changes wake the group too.

The watch starts with the first pod group a profile sees: a cluster that uses none (or whose
apiserver does not serve ``scheduling.k8s.io/v1alpha2``) is never asked. Until it has listed, a
group waits for it (bounded); a failed list (a 403: the ClusterRole lacks list/watch) is what the
group's members are told.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from bindery.apiserver import resources
from bindery.apiserver.api import ApiClient
from bindery.apiserver.errors import ApiError
from bindery.apiserver.watching import Cursor, Event, Listed, list_watch
from bindery.scheduling.podgroups import PodGroupInfo
from bindery.typedefs import Logger

__all__ = ["PodGroupWatch"]

LIST_TIMEOUT_SECONDS = 60.0
GroupKey = tuple[str, str]


class PodGroupWatch:
    """PodGroups by (namespace, name), kept by one list/watch per scope (see the module docstring)."""

    def __init__(
        self,
        *,
        api: ApiClient,
        logger: Logger,
        namespaces: Sequence[str] = (),
        watch_seconds: int = 300,
        on_change: Callable[[str, str], None] = lambda namespace, name: None,
    ) -> None:
        self._api = api
        self._logger = logger
        self._scopes: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._watch_seconds = watch_seconds
        self._groups: dict[GroupKey, PodGroupInfo] = {}
        self._listed: set[str | None] = set()
        self._synced = asyncio.Event()
        self.on_change = on_change
        #: the last failure of a list or watch, until the next progress (what members are told)
        self.error: ApiError | None = None
        self.task: asyncio.Task[None] | None = None
        self.cursors = {scope: Cursor() for scope in self._scopes}

    @property
    def scopes(self) -> int:
        return len(self._scopes)

    def want(self) -> None:
        """Start the watch if it is not running (the first pod group seen)."""
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name="bindery podgroup watch")

    async def close(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait_synced(self, seconds: float) -> bool:
        """Wait (up to `seconds`) until every scope listed; False if it has not (see `error`)."""
        self.want()
        if not self._synced.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._synced.wait()
        return self._synced.is_set()

    def get(self, namespace: str, name: str) -> PodGroupInfo | None:
        return self._groups.get((namespace, name))

    def __len__(self) -> int:
        return len(self._groups)

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for scope in self._scopes:
                group.create_task(
                    self._follow(scope), name=f"bindery podgroups in {scope or 'all namespaces'}"
                )

    def _failed(self, error: ApiError) -> str:
        self.error = error
        return "; the operator needs list and watch on podgroups.scheduling.k8s.io (the chart grants them)"

    async def _follow(self, namespace: str | None) -> None:
        async for item in list_watch(
            self._api,
            resources.PODGROUPS,
            namespace=namespace,
            watch_seconds=self._watch_seconds,
            list_timeout=LIST_TIMEOUT_SECONDS,
            cursor=self.cursors[namespace],
            logger=self._logger,
            what=f"podgroups, for pod groups ({namespace or 'all namespaces'})",
            hint=self._failed,
        ):
            self.error = None
            if isinstance(item, Listed):
                self._listed.add(namespace)
                if len(self._listed) == len(self._scopes):
                    self._synced.set()
                continue
            assert isinstance(item, Event)
            try:
                self._take(item)
            except Exception as exc:  # one PodGroup's body must not end the watch of all
                self._logger.warning(f"handling a PodGroup {item.type or 'listed'} event failed: {exc}")

    def _take(self, event: Event) -> None:
        metadata = event.object.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        before = self._groups.get(key)
        if event.type == "DELETED":
            after = None
            self._groups.pop(key, None)
        else:
            after = PodGroupInfo.from_body(event.object)
            self._groups[key] = after
        if _decides(before) != _decides(after):
            self.on_change(*key)


def _decides(info: PodGroupInfo | None) -> tuple[object, ...] | None:
    """What a group's decision reads of its PodGroup (its conditions are only written)."""
    if info is None:
        return None
    return (info.uid, info.generation, info.min_count, info.topology_keys)
