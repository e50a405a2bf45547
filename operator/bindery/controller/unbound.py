"""The watch of unbound pods, outside Kopf: the operator's hot path.

Why not a Kopf ``on.event`` handler: every pod event went through Kopf's per-object machinery (a
worker per pod, cause detection, a handler invocation with its keyword arguments, a per-object
logger). Profiled in the ceiling benchmark's backlog (benchmarks/PROFILE.md: 5,000 pods on 500
nodes), that was 19% of the operator thread's samples, of which Bindery's own handler was 2%.
Bindery needs none of it here: the handler keeps no state on the pod and writes nothing to it, so
the events go straight from the stream to :meth:`bindery.controller.runtime.Runtime.on_pod_event`.
Kopf still runs everything else (startup, login, the Node index, the ResourceManager handlers).

What is kept from Kopf's watch: one list + watch per scope (each namespace of a namespaced
operator, else all namespaces) with the field selector ``spec.nodeName=``; listed pods arrive as
events of type None, as Kopf's listing delivers them; events are handled in order, one at a time;
a watch that the server ends is resumed from the last resourceVersion seen (bookmarks keep it
fresh), and so is one whose stream broke (after a backoff); one that expired (410 Gone) is
relisted, and so is a failed list. A pod that vanished between two lists gets no DELETED event,
as with Kopf: the runtime's periodic sweep forgets it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from bindery.controller.bound import watch_event
from bindery.controller.settings import UNBOUND_PODS

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]
PodEventHandler = Callable[[str | None, Mapping[str, Any]], Awaitable[None]]
#: Explicit bound on one page of the LIST (500 pods).
LIST_TIMEOUT_SECONDS = 60.0


class UnboundPodWatcher:
    """Feeds every event of the unbound pods in scope to `on_event(type, pod)` until cancelled."""

    def __init__(
        self,
        *,
        api: client.ApiClient,
        namespaces: Sequence[str],
        on_event: PodEventHandler,
        logger: Logger,
        watch_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._scopes: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._on_event = on_event
        self._logger = logger
        self._watch_seconds = watch_seconds
        self._max_backoff = max_backoff
        self.lists = 0  #: completed lists, all scopes (tests wait on it)
        #: per scope, the resourceVersion to resume the watch from; None = list first
        self._resume: dict[str | None, str | None] = {}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for namespace in self._scopes:
                group.create_task(self._follow(namespace), name=f"unbound pods of {namespace or 'all'}")

    async def _follow(self, namespace: str | None) -> None:
        backoff = 0.5
        self._resume[namespace] = None
        while True:
            try:
                if self._resume[namespace] is None:
                    self._resume[namespace] = await self._list(namespace)
                    backoff = 0.5
                # Ended in order (resume from the last version seen) or expired (None: relist).
                self._resume[namespace] = await self._watch(namespace, str(self._resume[namespace]))
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A broken stream resumes from the last version seen, as Kopf's watch did: a relist
                # would offer every pending pod again. A failed list is retried as a list.
                self._logger.warning(
                    f"unbound-pod watch ({UNBOUND_PODS} in {namespace or 'all namespaces'}) failed: {exc}; "
                    f"{'relisting' if self._resume[namespace] is None else 'resuming'} in {backoff:.1f}s"
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def _lister(self, namespace: str | None) -> tuple[Callable[..., Any], tuple[str, ...]]:
        if namespace is None:
            return self._core.list_pod_for_all_namespaces, ()
        return self._core.list_namespaced_pod, (namespace,)

    async def _list(self, namespace: str | None) -> str:
        """Deliver every unbound pod in scope (type None), page by page; the list's resourceVersion."""
        lister, args = self._lister(namespace)
        token = ""
        while True:
            options: dict[str, Any] = {
                "field_selector": UNBOUND_PODS,
                "limit": 500,
                "_preload_content": False,
                "_request_timeout": LIST_TIMEOUT_SECONDS,
            }
            if token:
                options["_continue"] = token
            response = await lister(*args, **options)
            try:
                document = json.loads(await response.read())
            finally:
                response.release()
            if response.status != 200:
                raise RuntimeError(
                    f"listing unbound pods answered HTTP {response.status}: {document.get('message')}"
                )
            for item in document.get("items") or ():
                await self._on_event(None, item)
            metadata = document.get("metadata") or {}
            token = str(metadata.get("continue") or "")
            if not token:
                self.lists += 1
                return str(metadata.get("resourceVersion") or "")

    async def _watch(self, namespace: str | None, version: str) -> str | None:
        """Follow one watch request from `version`. The last version seen when the server ended it
        in order (resume from there); None when it must be relisted (an ERROR event: 410 Gone)."""
        lister, args = self._lister(namespace)
        response = await lister(
            *args,
            field_selector=UNBOUND_PODS,
            resource_version=version,
            timeout_seconds=self._watch_seconds,
            allow_watch_bookmarks=True,
            watch=True,
            _preload_content=False,
            # A connection silent for longer than the server's own timeout is half-open: give it up.
            _request_timeout=aiohttp.ClientTimeout(
                sock_connect=10, sock_read=self._watch_seconds + max(5, self._watch_seconds / 10)
            ),
        )
        try:
            if response.status == 410:  # "Gone": the version was compacted away
                return None
            if response.status != 200:
                body = await response.read()
                raise RuntimeError(f"watching unbound pods answered HTTP {response.status}: {body[:500]!r}")
            while line := await response.content.readline():
                event = watch_event(line)
                if event is None:
                    continue  # a blank keep-alive line
                kind, pod = event
                if kind == "ERROR":
                    return None
                version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                self._resume[namespace] = version  # kept if the stream breaks before it ends
                if kind != "BOOKMARK":
                    await self._on_event(kind, pod)
        finally:
            response.release()
        return version
