"""NodeSnapshot: the known nodes, frozen, with what every evaluation until the next node change reuses.

The filters read every node for every pod: which nodes the pod's own nodeSelector and node
affinity allow, which are a spread constraint's domains, which nodes a requirement excludes. On a
backlog those answers are the same for pod after pod (a Deployment's pods share their node
constraints, and nodes change far less often than pods are scheduled), so a snapshot indexes the
nodes once (by name; per label key, value → node names) and memoizes, in a small LRU, the answers
keyed by what they depend on besides the nodes. A node change brings a new snapshot (see
:meth:`bindery.adapters.placed.PlacedPodCache.nodes`), and with it empty memos: nothing to invalidate.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

from bindery.podrules.model import NodeFacts

__all__ = ["MEMO_SIZE", "NodeSnapshot", "frozen"]

#: Memoized answers kept per snapshot: a few per Deployment in the backlog (its fits, each spread
#: constraint's domains); the least recently used goes first.
MEMO_SIZE = 64

_T = TypeVar("_T")


class NodeSnapshot(Sequence[NodeFacts]):
    """The nodes as a sequence, plus a by-name map, per-key value indexes and an LRU memo."""

    __slots__ = ("_holders", "_memo", "_nodes", "_value_of", "by_name", "names")

    def __init__(self, nodes: Iterable[NodeFacts]) -> None:
        self._nodes = tuple(nodes)
        self.by_name: dict[str, NodeFacts] = {node.name: node for node in self._nodes}
        self.names: frozenset[str] = frozenset(self.by_name)
        self._holders: dict[str, tuple[dict[str, frozenset[str]], frozenset[str]]] = {}
        self._value_of: dict[str, dict[str, str]] = {}
        self._memo: OrderedDict[Hashable, Any] = OrderedDict()

    @classmethod
    def of(cls, nodes: Sequence[NodeFacts]) -> NodeSnapshot:
        """`nodes` itself when it is a snapshot, else a snapshot of them (memos for this call only)."""
        return nodes if isinstance(nodes, NodeSnapshot) else cls(nodes)

    def same_nodes(self, nodes: Sequence[NodeFacts]) -> bool:
        """Whether `nodes` are this snapshot's, in order: the same objects, or equal ones."""
        if len(nodes) != len(self._nodes):
            return False
        return all(map(operator.is_, nodes, self._nodes)) or all(map(operator.eq, nodes, self._nodes))

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, index: int) -> NodeFacts: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[NodeFacts]: ...

    def __getitem__(self, index: int | slice) -> NodeFacts | Sequence[NodeFacts]:
        return self._nodes[index]

    def __iter__(self) -> Iterator[NodeFacts]:
        return iter(self._nodes)

    def holders(self, key: str) -> Mapping[str, frozenset[str]]:
        """Label value of `key` → the names of the nodes carrying it."""
        return self._index(key)[0]

    def with_key(self, key: str) -> frozenset[str]:
        """The names of the nodes carrying label `key`."""
        return self._index(key)[1]

    def value_of(self, key: str) -> Mapping[str, str]:
        """Node name → its value of label `key`, for the nodes carrying it."""
        found = self._value_of.get(key)
        if found is None:
            found = self._value_of[key] = {
                node.name: value for node in self._nodes if (value := node.labels.get(key)) is not None
            }
        return found

    def _index(self, key: str) -> tuple[dict[str, frozenset[str]], frozenset[str]]:
        found = self._holders.get(key)
        if found is None:
            grouped: dict[str, set[str]] = {}
            for node in self._nodes:
                value = node.labels.get(key)
                if value is not None:
                    grouped.setdefault(value, set()).add(node.name)
            holders = {value: frozenset(names) for value, names in grouped.items()}
            found = holders, frozenset().union(*holders.values())
            self._holders[key] = found
        return found

    def memo(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """`compute()`, remembered under `key` for this snapshot's life (the last MEMO_SIZE keys)."""
        memo = self._memo
        if key in memo:
            memo.move_to_end(key)
            found: _T = memo[key]
            return found
        value = compute()
        memo[key] = value
        if len(memo) > MEMO_SIZE:
            memo.popitem(last=False)
        return value


#: id → (the value, its :func:`frozen` key) for the last values asked: the value is held, so its id
#: is not reused while it is in here.
_FROZEN: dict[int, tuple[object, Hashable]] = {}
#: repr of a value → its key, for values equal to one asked before (a Deployment's pods share them)
_FROZEN_BY_TEXT: dict[str, Hashable] = {}
_FROZEN_SIZE = 256


def frozen(value: object) -> Hashable:
    """A hashable stand-in for a JSON-shaped value (mappings, sequences, scalars), equal for equal
    values whatever the mappings' key order; a memo key for a pod's node terms and tolerations.

    A tuple's key is remembered: by identity for the last few asked (one pod's cycle asks for its
    tolerations' key several times: each memo of its candidates, placeable nodes and spread
    domains; those tuples are a :class:`~bindery.scheduling.podspec.PodInfo`'s, never changed once
    parsed), and by its repr for a value seen before (the next pod of a Deployment). Walking the
    tolerations each time cost a rules pod more than its node memos saved. The key of a tuple is a
    string, which computes its hash once: the memos hash their keys at every lookup."""
    if not isinstance(value, tuple) or not value:
        return _frozen(value)
    found = _FROZEN.get(id(value))
    if found is not None and found[0] is value:
        return found[1]
    text = repr(value)
    key = _FROZEN_BY_TEXT.get(text)
    if key is None:
        key = repr(_frozen(value))  # sorted mappings: equal for equal values
        if len(_FROZEN_BY_TEXT) >= _FROZEN_SIZE:
            _FROZEN_BY_TEXT.clear()
        _FROZEN_BY_TEXT[text] = key
    if len(_FROZEN) >= _FROZEN_SIZE:
        _FROZEN.clear()
    _FROZEN[id(value)] = (value, key)
    return key


def _frozen(value: object) -> Hashable:
    if isinstance(value, Mapping):
        return ("{", tuple(sorted((str(k), _frozen(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("[", tuple(_frozen(v) for v in value))
    return (type(value).__name__, value) if isinstance(value, Hashable) else ("?", repr(value))
