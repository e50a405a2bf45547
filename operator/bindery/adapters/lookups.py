"""In-memory lookups fed by the watches: Nodes through a Kopf index, unbound pods through a map.

Pre-bind checks must not read from the apiserver (the success path costs two writes and no reads),
so they ask these. The node index stores a `NodeProjection` (name, labels, taints, cordon, deletion)
rather than whole Node objects, whose status (images, conditions) dominates their size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection


class _Index(Protocol):
    """The part of `kopf.Index` we use: key -> a store (iterable) of indexed values."""

    def get(self, key: str) -> Iterable[Any] | None: ...

    def values(self) -> Iterable[Iterable[Any]]: ...


def project_node(*, body: Mapping[str, Any]) -> dict[str, NodeProjection]:
    """The Kopf index function's value: {node name: projection}."""
    projection = NodeProjection.from_body(body)
    return {projection.name: projection}


class IndexNodeLookup:
    def __init__(self, *, index: _Index) -> None:
        self._index = index
        #: every node, kept from one node change to the next (None: to be listed again)
        self._all: tuple[NodeProjection, ...] | None = None

    def changed(self) -> None:
        """A node event was indexed: the next :meth:`all` lists the index again.

        The node event handler calls this; Kopf updates the index just before it calls the
        handler, so a cycle in between reads the nodes as they were an event earlier, as it would
        had the watch delivered that event a moment later.
        """
        self._all = None

    def get(self, name: str) -> NodeProjection | None:
        store = self._index.get(name)
        if not store:
            return None
        for value in store:
            if isinstance(value, NodeProjection):
                return value
        return None

    def all(self) -> tuple[NodeProjection, ...]:
        """Every node the index holds (the inter-pod rules evaluate them all at once, twice per
        pod): listed once per node change, since walking the index per call was 8% of the
        operator's CPU on a backlog of pods with rules."""
        if self._all is None:
            self._all = tuple(
                value
                for store in self._index.values()
                for value in store
                if isinstance(value, NodeProjection)
            )
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
