"""PlacedPodCache: the pods on nodes, as the inter-pod rules read them (the PlacedPods port).

Fed by the placed-pod watch (bindery.controller.watches.placed: every pod with ``spec.nodeName``
set, whoever bound it) and by the cycles' assume/forget. It keeps one frozen
:class:`~bindery.podrules.model.PlacedPod` per pod (namespace, labels, node, host ports, required
anti-affinity terms, and the rarer affinity and preferred terms), indexed by namespace, plus the few
pods with anti-affinity, affinity or preferred terms, or host ports, so that a pod without rules costs
one emptiness check. A namespace's pods are grouped by their label set, and pods with anti-affinity by
their namespace and terms (a Deployment's pods share both), so that the filters match a selector once
per group rather than once per pod: a backlog of N pods with anti-affinity over their group cost
O(N²) selector matches per pass, twice per pod. Each group also counts its pods per node
(:class:`~bindery.podrules.model.GroupPods`), so the filters read a group's nodes and a spread's
domains without walking its pods. A pod that finished (Succeeded/Failed) or was
deleted leaves the cache; a pod assumed by a cycle is replaced by its watched copy once seen bound.
Each pod that arrives, leaves or changes in a way the rules read is passed to :attr:`on_change`,
which wakes the pods the rules refused (a status write or the watched copy replacing the assumed one
is no change).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from bindery.podrules.model import AffinityTerm, GroupPods, PlacedPod
from bindery.podrules.nodes import NodeSnapshot
from bindery.podrules.parse import placed_pod, placed_unchanged
from bindery.scheduling.inflight import InFlight
from bindery.scheduling.ports import NodeProjection

__all__ = ["PlacedPodCache"]


class PlacedPodCache:
    def __init__(
        self,
        *,
        nodes: Callable[[], Sequence[NodeProjection]] = list,
        namespace_labels: Callable[[str], Mapping[str, str] | None] = lambda namespace: None,
        service_selectors: Callable[[str], Iterable[Mapping[str, str]]] = lambda namespace: (),
        synced: bool = True,
        namespaces_synced: bool = True,
    ) -> None:
        """`synced` False: the cache waits for its watch's first list (`mark_synced`);
        `namespaces_synced` False: and for the namespace watch's (`mark_namespaces_synced`), since a
        term with a namespaceSelector finds no namespace in scope while their labels are unknown."""
        self._pods: dict[str, PlacedPod] = {}
        #: namespace → label set → (those labels, the pods carrying them)
        self._by_namespace: dict[str, dict[_LabelSet, tuple[Mapping[str, str], GroupPods]]] = {}
        self._anti: dict[str, PlacedPod] = {}
        #: pods with anti-affinity by the namespaces it reaches: their own (every term without
        #: namespaces or namespaceSelector), or any (``None``); the symmetry check reads only these.
        #: Within: grouped by (their namespace, their terms), which decide whether they select a pod.
        self._anti_toward: dict[str | None, dict[_AntiKey, GroupPods]] = {}
        #: the same for pods with affinity or preferred terms (InterPodAffinity's Score symmetry)
        self._scoring_toward: dict[str | None, dict[str, PlacedPod]] = {}
        self._ports: dict[str, PlacedPod] = {}
        #: node → the pods on it by UID (a rule's victims are looked for on a few nodes only)
        self._by_node: dict[str, dict[str, PlacedPod]] = {}
        #: priority → how many pods have it (most clusters have one or two: a preemptor with no
        #: lower-priority pod anywhere skips the search for a rule's victims in O(1))
        self._priorities: dict[int, int] = {}
        self._nodes = nodes
        self._snapshot: NodeSnapshot | None = None
        self._seen: tuple[NodeProjection, ...] = ()  #: the objects `_nodes` gave for `_snapshot`
        self._namespace_labels = namespace_labels
        self._service_selectors = service_selectors
        self._in_flight = InFlight()
        self.lists = 0  #: completed lists of the watch (tests wait on it)
        #: called with each placed pod added, changed (its old and its new copy) or removed
        self.on_change: Callable[[PlacedPod], None] | None = None
        self._synced = asyncio.Event()
        if synced:
            self._synced.set()
        self._namespaces_synced = asyncio.Event()
        if namespaces_synced:
            self._namespaces_synced.set()

    # -- the port ---------------------------------------------------------------------------------

    async def wait_synced(self, seconds: float) -> bool:
        if not self._is_synced():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._synced.wait()
                    await self._namespaces_synced.wait()
        return self._is_synced()

    def _is_synced(self) -> bool:
        return self._synced.is_set() and self._namespaces_synced.is_set()

    def mark_namespaces_synced(self) -> None:
        """The namespace watch listed: namespaceSelector terms see every namespace's labels."""
        self._namespaces_synced.set()

    def mark_synced(self) -> None:
        """Every scope of the watch listed: the cache holds every pod on a node."""
        self.lists += 1
        self._synced.set()

    @property
    def in_flight(self) -> InFlight:
        return self._in_flight

    def in_namespace(self, namespace: str) -> Iterable[PlacedPod]:
        groups = self._by_namespace.get(namespace)
        if not groups:
            return ()
        return itertools.chain.from_iterable(pods for _, pods in groups.values())

    def label_groups(self, namespace: str) -> Iterable[tuple[Mapping[str, str], Iterable[PlacedPod]]]:
        """The pods of `namespace` grouped by label set: (the labels, the pods carrying exactly them)."""
        groups = self._by_namespace.get(namespace)
        if not groups:
            return ()
        return list(groups.values())

    def namespaces(self) -> Iterable[str]:
        return self._by_namespace.keys()

    def on_node(self, node: str) -> Iterable[PlacedPod]:
        pods = self._by_node.get(node)
        return pods.values() if pods else ()

    def lowest_priority(self) -> int | None:
        return min(self._priorities) if self._priorities else None

    def with_anti_affinity(self) -> Iterable[PlacedPod]:
        return self._anti.values()

    def anti_affinity_toward(self, namespace: str) -> Iterable[PlacedPod]:
        """The pods whose anti-affinity may select a pod of `namespace` (superset)."""
        return itertools.chain.from_iterable(
            pods for _, _, pods in self.anti_affinity_groups_toward(namespace)
        )

    def anti_affinity_groups_toward(
        self, namespace: str
    ) -> Iterable[tuple[str, tuple[AffinityTerm, ...], Iterable[PlacedPod]]]:
        """:meth:`anti_affinity_toward` grouped: (their namespace, their terms, the pods)."""
        return [
            (owner, terms, pods)
            for key in (namespace, None)
            for (owner, terms), pods in (self._anti_toward.get(key) or {}).items()
        ]

    def preferring_toward(self, namespace: str) -> Iterable[PlacedPod]:
        """The pods whose affinity or preferred terms may select a pod of `namespace` (superset)."""
        local = self._scoring_toward.get(namespace)
        wide = self._scoring_toward.get(None)
        if not wide:
            return local.values() if local else ()
        return [*(local or {}).values(), *wide.values()]

    def with_host_ports(self) -> Iterable[PlacedPod]:
        return self._ports.values()

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return self._namespace_labels(namespace)

    def service_selectors(self, namespace: str) -> Iterable[Mapping[str, str]]:
        return self._service_selectors(namespace)

    def nodes(self) -> Sequence[NodeProjection]:
        """The known nodes as one :class:`NodeSnapshot`, the same object until a node changes, so
        that the filters' per-snapshot indexes and memos serve every pod until then (a node is
        compared by identity first: the node index keeps its projection until an event replaces
        it; an equal replacement, such as a status-only update, keeps the snapshot)."""
        current = self._nodes()
        snapshot = self._snapshot
        if snapshot is None or not (
            current is self._seen  # the node lookup's own tuple, kept until a node event
            or (len(current) == len(self._seen) and all(map(operator.is_, current, self._seen)))
        ):
            if snapshot is None or not snapshot.same_nodes(current):
                snapshot = self._snapshot = NodeSnapshot(current)
                self._forget_counts()
            self._seen = tuple(current)
        return cast(Sequence[NodeProjection], snapshot)

    def _forget_counts(self) -> None:
        """A new snapshot: the groups' counts per topology value were kept for the old one's
        mappings, which no read asks for again (each group counts afresh when next read)."""
        for groups in self._by_namespace.values():
            for _, group in groups.values():
                group.forget_counts()
        for toward in self._anti_toward.values():
            for group in toward.values():
                group.forget_counts()

    def assume(self, pod: PlacedPod) -> None:
        current = self._pods.get(pod.uid)
        if current is not None and not current.assumed:
            return  # the watch already saw it bound: that copy is the truth
        self._put(pod)

    def forget(self, uid: str) -> None:
        current = self._pods.get(uid)
        if current is not None and current.assumed:
            self._remove(uid)

    # -- the watch --------------------------------------------------------------------------------

    def on_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watched pod with ``spec.nodeName`` set (any scheduler's), or its deletion."""
        uid = str((body.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        old = self._pods.get(uid)
        if event_type == "MODIFIED" and old is not None and not old.assumed and placed_unchanged(old, body):
            return  # a status write: most events of a bound pod
        projection = None if event_type == "DELETED" else placed_pod(body)
        if projection is None:
            self._remove(uid)
        else:
            self._put(projection)

    def get(self, uid: str) -> PlacedPod | None:
        return self._pods.get(uid)

    def __len__(self) -> int:
        return len(self._pods)

    def _put(self, pod: PlacedPod) -> None:
        old = self._pods.get(pod.uid)
        if old is not None and old == pod:
            # The same copy again (a status write, a relist): every index already holds an equal
            # object. Most watch events of a bound pod are these; they cost one comparison.
            return
        if old is not None and old.namespace != pod.namespace:
            self._remove(pod.uid)
            old = None
        changed = old is None or not _same_but_assumed(old, pod)
        self._pods[pod.uid] = pod
        if old is not None:
            self._ungroup(old)
            self._unplace(old)
        self._by_node.setdefault(pod.node, {})[pod.uid] = pod
        self._priorities[pod.priority] = self._priorities.get(pod.priority, 0) + 1
        groups = self._by_namespace.setdefault(pod.namespace, {})
        label_set = _label_set(pod.labels)
        group = groups.get(label_set)
        if group is None:
            group = groups[label_set] = (pod.labels, GroupPods())
        group[1].add(pod)
        for index, has in ((self._anti, pod.anti_affinity), (self._ports, pod.host_ports)):
            if has:
                index[pod.uid] = pod
            else:
                index.pop(pod.uid, None)
        self._drop_toward(pod.uid, old)
        if pod.anti_affinity:
            local = all(not t.namespaces and t.namespace_selector is None for t in pod.anti_affinity)
            toward = self._anti_toward.setdefault(pod.namespace if local else None, {})
            members = toward.get((pod.namespace, pod.anti_affinity))
            if members is None:
                members = toward[(pod.namespace, pod.anti_affinity)] = GroupPods()
            members.add(pod)
        if pod.affinity or pod.preferred_affinity or pod.preferred_anti_affinity:  # scores_others, inlined
            terms = (
                *pod.affinity,
                *(w.term for w in pod.preferred_affinity),
                *(w.term for w in pod.preferred_anti_affinity),
            )
            local = all(not t.namespaces and t.namespace_selector is None for t in terms)
            self._scoring_toward.setdefault(pod.namespace if local else None, {})[pod.uid] = pod
        # Last, once the cache is whole: a listener that fails must not leave it half changed.
        if self.on_change is not None and changed:
            if old is not None:
                self.on_change(old)
            self.on_change(pod)

    def _drop_toward(self, uid: str, old: PlacedPod | None) -> None:
        if old is None:
            return
        if old.anti_affinity:
            for key in (old.namespace, None):
                groups = self._anti_toward.get(key)
                if groups is None:
                    continue
                members = groups.get((old.namespace, old.anti_affinity))
                if members is not None and members.discard(uid) is not None and not members:
                    del groups[(old.namespace, old.anti_affinity)]
                    if not groups:
                        del self._anti_toward[key]
        if old.affinity or old.preferred_affinity or old.preferred_anti_affinity:  # plain pods skip both
            _drop_from(self._scoring_toward, uid, old.namespace)

    def _remove(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        if pod is None:
            return
        self._ungroup(pod)
        self._unplace(pod)
        self._anti.pop(uid, None)
        self._ports.pop(uid, None)
        self._drop_toward(uid, pod)
        if self.on_change is not None:  # last, as in _put
            self.on_change(pod)

    def _unplace(self, pod: PlacedPod) -> None:
        """Take `pod` (the copy the cache holds) out of the by-node and by-priority indexes."""
        pods = self._by_node.get(pod.node)
        if pods is not None and pods.pop(pod.uid, None) is not None and not pods:
            del self._by_node[pod.node]
        left = self._priorities.get(pod.priority, 0) - 1
        if left > 0:
            self._priorities[pod.priority] = left
        else:
            self._priorities.pop(pod.priority, None)

    def _ungroup(self, pod: PlacedPod) -> None:
        """Take `pod` (the copy the cache holds) out of its namespace's label group."""
        groups = self._by_namespace.get(pod.namespace)
        if groups is None:
            return
        key = _label_set(pod.labels)
        group = groups.get(key)
        if group is not None and group[1].discard(pod.uid) is not None and not group[1]:
            del groups[key]
            if not groups:
                del self._by_namespace[pod.namespace]


_LabelSet = frozenset[tuple[str, str]]
_AntiKey = tuple[str, tuple[AffinityTerm, ...]]


#: The fields of a PlacedPod the rules read: all but ``assumed`` (whether this process or the watch
#: reported it). Compared one by one, not through ``dataclasses.replace`` (a copy per watch event).
_RULE_FIELDS = tuple(field.name for field in dataclasses.fields(PlacedPod) if field.name != "assumed")


def _same_but_assumed(old: PlacedPod, new: PlacedPod) -> bool:
    """Whether `old` and `new` differ at most in ``assumed`` (the watched copy of an assumed pod)."""
    return all(getattr(old, name) == getattr(new, name) for name in _RULE_FIELDS)


def _label_set(labels: Mapping[str, str]) -> _LabelSet:
    return frozenset(labels.items())


def _drop_from(index: dict[str | None, dict[str, PlacedPod]], uid: str, namespace: str) -> None:
    for key in (namespace, None):
        bucket = index.get(key)
        if bucket is not None and bucket.pop(uid, None) is not None and not bucket:
            del index[key]
