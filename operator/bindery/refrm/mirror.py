"""Mirror the cluster's Node objects, and the pods bound to them, into the reference RM.

In this mode the RM owns the pool of nodes selected by a label selector and sees each one's
``status.allocatable``, labels, taints and ``spec.unschedulable`` as they change.  Only Ready nodes
that are not being deleted count (see :func:`bindery.refrm.inventory.node_from_object`).

The nodes are shared: kube-scheduler, DaemonSets, static pods and other schedulers put pods there
too, and those pods use capacity the RM must not hand out again.  So the RM also follows every pod
bound to a node (field selector ``spec.nodeName!=``) and hands an immutable snapshot of them to the
store (see :mod:`bindery.refrm.accounting`).  It is not ready (``/readyz`` 503, reserve 503) until it
knows both the nodes and the pods: a reservation placed before the pods are known could land on a
node that is already full.

Both list-then-watch loops relist on a ``410 Gone`` and after any error, with capped backoff, so a
restarted apiserver is survived without a restart of the RM.  A relist replaces the whole set, so
objects deleted while the watch was down disappear.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch

from bindery.podresources import PodResourcesError
from bindery.refrm.accounting import BoundPod, ClusterPods, bound_pod
from bindery.refrm.inventory import node_from_object
from bindery.refrm.placement import InventoryNode

__all__ = ["MirrorGate", "NodeMirror", "PodMirror"]

log = logging.getLogger(__name__)

#: Bound of one page of a (re)list.
LIST_TIMEOUT_SECONDS = 60


class _RawWatch(watch.Watch):  # type: ignore[misc]  # the client is untyped
    """A watch that hands out events as JSON only.

    The client's watch turns every event's object into its model class (``V1Pod``...) by dumping
    the JSON it just parsed and deserializing it again; the mirrors read only ``raw_object``, and
    in a backlog that round trip per pod event was 5% of the RM's CPU.  No return type: the object
    stays the parsed JSON (the resourceVersion is then read from it).
    """

    def get_return_type(self, func: object) -> str:
        return ""


class _ListWatch(abc.ABC):
    """List, then watch from the list's resourceVersion; relist on 410 or any error, with backoff."""

    what = "object"

    def __init__(self, *, api: client.ApiClient, watch_timeout_seconds: int, max_backoff: float) -> None:
        self._core = client.CoreV1Api(api)
        self._watch_timeout = watch_timeout_seconds
        self._max_backoff = max_backoff

    @abc.abstractmethod
    def _list_function(self) -> Callable[..., Any]: ...

    @abc.abstractmethod
    def _selectors(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def _replace(self, items: list[Mapping[str, Any]]) -> None:
        """The whole set, from a (re)list."""

    @abc.abstractmethod
    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        """One ADDED, MODIFIED or DELETED watch event."""

    async def _list(self) -> str:
        items: list[Mapping[str, Any]] = []
        continue_token: str | None = None
        resource_version = ""
        while True:
            extra = {"_continue": continue_token} if continue_token else {}
            response = await self._list_function()(
                **self._selectors(),
                limit=500,
                _preload_content=False,
                _request_timeout=LIST_TIMEOUT_SECONDS,
                **extra,
            )
            body = await response.read()
            if not 200 <= response.status <= 299:
                # Unread bodies are not checked by the client: a 403 would read as an empty list.
                raise client.ApiException(status=response.status, reason=body.decode(errors="replace")[:500])
            document = json.loads(body)
            items.extend(document.get("items") or [])
            metadata = document.get("metadata") or {}
            resource_version = resource_version or str(metadata.get("resourceVersion", ""))
            continue_token = metadata.get("continue") or None
            if not continue_token:
                break
        self._replace(items)
        log.info("%s mirror: %d %s(s) match %s", self.what, len(items), self.what, self._selectors())
        return resource_version

    async def _watch(self, resource_version: str) -> str:
        """Apply events until the server ends the watch; returns the last resourceVersion seen."""
        async with _RawWatch() as stream:
            async for event in stream.stream(
                self._list_function(),
                **self._selectors(),
                resource_version=resource_version,
                timeout_seconds=self._watch_timeout,
                allow_watch_bookmarks=True,
                # A connection silent past the server's own timeout is half-open: without this the
                # mirror would keep a stale snapshot for ever and place pods on capacity in use.
                _request_timeout=aiohttp.ClientTimeout(
                    sock_connect=10, sock_read=self._watch_timeout + max(5, self._watch_timeout / 10)
                ),
            ):
                kind = event["type"]
                raw = event["raw_object"]
                if kind == "ERROR":
                    raise _Expired(str(raw.get("message", raw)))
                resource_version = str((raw.get("metadata") or {}).get("resourceVersion") or resource_version)
                if kind == "BOOKMARK":
                    continue
                self._apply(kind, raw)
        return resource_version

    async def run(self) -> None:
        """Run until cancelled."""
        backoff = 0.5
        while True:
            try:
                resource_version = await self._list()
                backoff = 0.5
                while True:  # a watch the server ended on its timeout resumes where it stopped
                    resource_version = await self._watch(resource_version)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                hint = ""
                if isinstance(error, client.ApiException) and error.status == 403:
                    hint = f" (grant the RM's service account get, list and watch on {self.what}s)"
                log.warning(
                    "%s mirror failed (%s: %s)%s; relisting in %.1fs",
                    self.what,
                    type(error).__name__,
                    error,
                    hint,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)


class NodeMirror(_ListWatch):
    """Keeps ``on_change`` fed with the current inventory of selected, Ready nodes.

    Each node is parsed once per event that touches it, and an event that leaves its inventory
    entry as it was (a status heartbeat, an annotation) publishes nothing: parsing every node on
    every event cost O(nodes) per event, and a new inventory makes the next placement evaluate
    every node's taints and labels again (see :func:`bindery.refrm.placement.choose_node`).
    """

    what = "node"

    def __init__(
        self,
        *,
        api: client.ApiClient,
        label_selector: str = "",
        on_change: Callable[[Sequence[InventoryNode]], None],
        watch_timeout_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        super().__init__(api=api, watch_timeout_seconds=watch_timeout_seconds, max_backoff=max_backoff)
        self._selector = label_selector
        self._on_change = on_change
        self._nodes: dict[str, InventoryNode] = {}  # the selected nodes that count, by object name

    def _list_function(self) -> Callable[..., Any]:
        return self._core.list_node  # type: ignore[no-any-return]

    def _selectors(self) -> dict[str, str]:
        return {"label_selector": self._selector}

    def _publish(self) -> None:
        self._on_change(list(self._nodes.values()))

    def _replace(self, items: list[Mapping[str, Any]]) -> None:
        parsed = ((item["metadata"]["name"], node_from_object(item)) for item in items)
        self._nodes = {name: node for name, node in parsed if node is not None}
        self._publish()

    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        name = raw["metadata"]["name"]
        node = None if kind == "DELETED" else node_from_object(raw)
        if self._nodes.get(name) == node:
            return
        if node is None:
            del self._nodes[name]
        else:
            self._nodes[name] = node
        self._publish()


class PodMirror(_ListWatch):
    """Keeps ``on_change`` fed with a :class:`ClusterPods` snapshot of the non-terminal bound pods.

    Only the small :class:`BoundPod` projection of each pod is kept, not the pod body.  A watch
    event rebuilds the entry of the node(s) it touches and publishes a new snapshot (copy-on-write);
    an event that changes nothing the RM counts (a status write, a label) publishes nothing.
    """

    what = "pod"

    def __init__(
        self,
        *,
        api: client.ApiClient,
        on_change: Callable[[ClusterPods], None],
        watch_timeout_seconds: int = 300,
        max_backoff: float = 10.0,
    ) -> None:
        super().__init__(api=api, watch_timeout_seconds=watch_timeout_seconds, max_backoff=max_backoff)
        self._on_change = on_change
        self._pods: dict[str, BoundPod] = {}  # by UID
        self._by_node: dict[str, dict[str, BoundPod]] = {}
        self._snapshot = ClusterPods()

    def _list_function(self) -> Callable[..., Any]:
        return self._core.list_pod_for_all_namespaces  # type: ignore[no-any-return]

    def _selectors(self) -> dict[str, str]:
        return {"field_selector": "spec.nodeName!="}

    @staticmethod
    def _project(raw: Mapping[str, Any]) -> BoundPod | None:
        try:
            return bound_pod(raw)
        except PodResourcesError as error:
            metadata = raw.get("metadata") or {}
            log.warning(
                "pod mirror: not counting pod %s/%s: %s",
                metadata.get("namespace"),
                metadata.get("name"),
                error,
            )
            return None

    def _replace(self, items: list[Mapping[str, Any]]) -> None:
        pods = [pod for pod in map(self._project, items) if pod is not None]
        self._pods = {pod.uid: pod for pod in pods}
        self._by_node = {}
        for pod in pods:
            self._by_node.setdefault(pod.node, {})[pod.uid] = pod
        self._snapshot = ClusterPods.of(pods)
        self._on_change(self._snapshot)

    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        uid = str((raw.get("metadata") or {}).get("uid") or "")
        old = self._pods.get(uid)
        new = None if kind == "DELETED" else self._project(raw)
        if old == new:
            return
        if old is not None:
            del self._pods[uid]
            self._by_node.get(old.node, {}).pop(uid, None)
        if new is not None:
            self._pods[uid] = new
            self._by_node.setdefault(new.node, {})[uid] = new
        for node in {pod.node for pod in (old, new) if pod is not None}:
            members = self._by_node.get(node, {})
            if not members:
                self._by_node.pop(node, None)
            self._snapshot = self._snapshot.with_node(node, members.values())
        self._on_change(self._snapshot)


class MirrorGate:
    """Hands the RM its node inventory only once the pods bound to nodes are known as well.

    The server is ready as soon as it has an inventory; holding the inventory back until the first
    pod list arrived keeps it at 503 instead of placing reservations on nodes that may be full.
    """

    def __init__(
        self,
        *,
        set_inventory: Callable[[Sequence[InventoryNode]], None],
        set_bound_pods: Callable[[ClusterPods], None],
    ) -> None:
        self._set_inventory = set_inventory
        self._set_bound_pods = set_bound_pods
        self._held: Sequence[InventoryNode] | None = None
        self._pods_known = False

    def nodes(self, nodes: Sequence[InventoryNode]) -> None:
        if self._pods_known:
            self._set_inventory(nodes)
        else:
            self._held = nodes

    def pods(self, pods: ClusterPods) -> None:
        self._set_bound_pods(pods)
        if not self._pods_known:
            self._pods_known = True
            if self._held is not None:
                self._set_inventory(self._held)
                self._held = None


class _Expired(Exception):
    """The watch's resource version is too old (410) or the stream reported an error: relist."""
