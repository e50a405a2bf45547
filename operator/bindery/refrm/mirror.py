"""Mirror the cluster's Node objects into the reference RM's inventory.

In this mode the RM owns the pool of nodes selected by a label selector and sees each one's
``status.allocatable``, labels, taints and ``spec.unschedulable`` as they change.  Only Ready nodes
that are not being deleted count (see :func:`bindery.refrm.inventory.node_from_object`).  The
list-then-watch loop relists on a ``410 Gone`` and after any error, with capped backoff, so a
restarted apiserver is survived without a restart of the RM.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client, watch

from bindery.refrm.inventory import node_from_object
from bindery.refrm.placement import InventoryNode

__all__ = ["NodeMirror"]

log = logging.getLogger(__name__)


class NodeMirror:
    """Keeps ``on_change`` fed with the current inventory of selected, Ready nodes."""

    def __init__(
        self,
        *,
        api: client.ApiClient,
        label_selector: str = "",
        on_change: Callable[[Sequence[InventoryNode]], None],
        watch_timeout_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._selector = label_selector
        self._on_change = on_change
        self._watch_timeout = watch_timeout_seconds
        self._max_backoff = max_backoff
        self._objects: dict[str, Mapping[str, Any]] = {}

    def _publish(self) -> None:
        nodes = [node for node in map(node_from_object, self._objects.values()) if node is not None]
        self._on_change(nodes)

    async def _list(self) -> str:
        response = await self._core.list_node(label_selector=self._selector, _preload_content=False)
        document = json.loads(await response.read())
        self._objects = {item["metadata"]["name"]: item for item in document.get("items") or []}
        self._publish()
        log.info("node mirror: %d node(s) match %r", len(self._objects), self._selector)
        return str(document["metadata"].get("resourceVersion", ""))

    async def _watch(self, resource_version: str) -> None:
        async with watch.Watch() as stream:
            async for event in stream.stream(
                self._core.list_node,
                label_selector=self._selector,
                resource_version=resource_version,
                timeout_seconds=self._watch_timeout,
                allow_watch_bookmarks=True,
            ):
                kind = event["type"]
                raw = event["raw_object"]
                if kind == "ERROR":
                    raise _Expired(str(raw.get("message", raw)))
                if kind == "BOOKMARK":
                    continue
                name = raw["metadata"]["name"]
                if kind == "DELETED":
                    self._objects.pop(name, None)
                else:
                    self._objects[name] = raw
                self._publish()

    async def run(self) -> None:
        """Run until cancelled."""
        backoff = 0.5
        while True:
            try:
                resource_version = await self._list()
                backoff = 0.5
                while True:
                    await self._watch(resource_version)
                    resource_version = await self._list()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning(
                    "node mirror failed (%s: %s); relisting in %.1fs", type(error).__name__, error, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)


class _Expired(Exception):
    """The watch's resource version is too old (410) or the stream reported an error: relist."""
