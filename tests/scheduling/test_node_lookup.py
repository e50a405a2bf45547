"""The node cache: fed by the node watch's events, one list of every node per change, synced once listed.

The inter-pod rules read every node twice per pod (PreFilter, then NodeCheck's re-check of the
chosen node); building that list for each was 8% of the operator's CPU on a rules backlog.
"""

from __future__ import annotations

from typing import Any

from bindery.adapters import NodeCache


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {}}


def test_every_node_is_listed_once_per_change_and_afresh_after_each() -> None:
    cache = NodeCache()
    cache.on_event(None, _node("a", zone="x"))
    first = cache.all()
    assert [n.name for n in first] == ["a"]
    assert cache.all() is first  # no change: the same tuple

    cache.on_event("ADDED", _node("b", zone="y"))
    assert [n.name for n in cache.all()] == ["a", "b"]

    cache.on_event("MODIFIED", _node("a", zone="z"))
    assert {n.name: n.labels["zone"] for n in cache.all()} == {"a": "z", "b": "y"}
    a = cache.get("a")
    assert a is not None
    assert a.labels["zone"] == "z"

    cache.on_event("DELETED", {"metadata": {"name": "b"}})  # a relist's stand-in: the name alone
    assert [n.name for n in cache.all()] == ["a"]
    assert cache.get("b") is None


async def test_the_cache_is_synced_only_once_marked_so() -> None:
    cache = NodeCache()
    cache.on_event(None, _node("a"))
    assert not cache.synced
    assert not await cache.wait_synced(0)
    cache.mark_synced()
    assert cache.synced
    assert await cache.wait_synced(0)
