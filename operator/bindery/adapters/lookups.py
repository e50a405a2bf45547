"""In-memory lookups fed by the watches: Nodes and unbound pods, each a map.

Pre-bind checks must not read from the apiserver (the success path costs two writes and no reads),
so they ask these. The node cache stores a `NodeProjection` (name, labels, taints, cordon, deletion)
rather than whole Node objects, whose status (images, conditions) dominates their size.

The Nodes used to be a Kopf index. Kopf runs no handler until every index has taken its initial
list, and its per-object machinery made that list cost the operator minutes of CPU at thousands of
Nodes, so every profile waited for it. The cache is now fed by the operator's own list-then-watch
(bindery.controller.watches.nodes) and says when it holds every Node (`synced`): a profile waits for
that before it schedules, and nothing else waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection


class NodeCache:
    """name → projection of every Node, kept by the node watch; `synced` once its first list ended."""

    def __init__(self, *, synced: bool = False) -> None:
        self._nodes: dict[str, NodeProjection] = {}
        #: every node, kept from one node change to the next (None: to be listed again)
        self._all: tuple[NodeProjection, ...] | None = None
        self._synced = asyncio.Event()
        if synced:
            self._synced.set()

    def on_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Take one event of the node watch (type None: a listed Node)."""
        projection = NodeProjection.from_body(body)
        if not projection.name:
            return
        if event_type == "DELETED":
            self._nodes.pop(projection.name, None)
        else:
            self._nodes[projection.name] = projection
        self._all = None

    @property
    def synced(self) -> bool:
        """Whether the watch's first list completed: the cache then holds every Node."""
        return self._synced.is_set()

    def mark_synced(self) -> None:
        self._synced.set()

    async def wait_synced(self, seconds: float) -> bool:
        """Wait (bounded) until the first list completed; whether it has."""
        if not self._synced.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._synced.wait()
        return self._synced.is_set()

    def get(self, name: str) -> NodeProjection | None:
        return self._nodes.get(name)

    def __len__(self) -> int:
        return len(self._nodes)

    def all(self) -> tuple[NodeProjection, ...]:
        """Every node (the inter-pod rules evaluate them all at once, twice per pod): one tuple per
        node change, since building it per call was 8% of the operator's CPU on a backlog of pods
        with rules."""
        if self._all is None:
            self._all = tuple(self._nodes.values())
        return self._all


class UnboundPods:
    """Unbound pods of served scheduler names by UID; the pod event handler keeps it current."""

    def __init__(self) -> None:
        self._pods: dict[str, PodInfo] = {}
        #: namespace/name → UID, so a lookup by name (the operator's /debug/queue) is no scan
        self._by_key: dict[str, str] = {}

    def get(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def find(self, *, namespace: str, name: str) -> PodInfo | None:
        """The remembered pod of that name (the newest, if one replaced another under it)."""
        uid = self._by_key.get(f"{namespace}/{name}")
        return self._pods.get(uid) if uid is not None else None

    def put(self, pod: PodInfo) -> None:
        self._pods[pod.uid] = pod
        self._by_key[pod.key] = pod.uid

    def pop(self, uid: str) -> PodInfo | None:
        pod = self._pods.pop(uid, None)
        if pod is not None and self._by_key.get(pod.key) == uid:
            del self._by_key[pod.key]
        return pod

    def __len__(self) -> int:
        return len(self._pods)

    def uids(self) -> set[str]:
        return set(self._pods)
