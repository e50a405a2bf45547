"""The placed-pod cache stays whole when its listener (the rules-refused pods' wake-up) fails.

`on_change` was called before the cache changed: a listener raising on a deletion left the pod
dropped from the table but still in the namespace and anti-affinity indexes (a phantom that kept
refusing pods), and on an addition left the pod out altogether (a placed pod the rules ignored).
"""

from __future__ import annotations

import pytest

from bindery.adapters.placed import PlacedPodCache
from bindery.podrules.model import PlacedPod
from tests.scheduling.test_podrules import body, term


def _failing(pod: PlacedPod) -> None:
    raise RuntimeError("listener failed")


def test_a_deletion_whose_listener_fails_still_leaves_no_trace() -> None:
    cache = PlacedPodCache()
    placed = body("a", node_name="n1", labels={"app": "x"}, anti=[term(app="x")])
    cache.on_event("ADDED", placed)
    cache.on_change = _failing
    with pytest.raises(RuntimeError):
        cache.on_event("DELETED", placed)
    assert cache.get(placed["metadata"]["uid"]) is None
    assert list(cache.in_namespace("default")) == []
    assert list(cache.with_anti_affinity()) == []
    assert list(cache.anti_affinity_toward("default")) == []


def test_an_addition_whose_listener_fails_is_still_in_the_cache() -> None:
    cache = PlacedPodCache()
    cache.on_change = _failing
    placed = body("a", node_name="n1", labels={"app": "x"}, anti=[term(app="x")])
    with pytest.raises(RuntimeError):
        cache.on_event("ADDED", placed)
    uid = placed["metadata"]["uid"]
    assert cache.get(uid) is not None
    assert [p.uid for p in cache.in_namespace("default")] == [uid]
    assert [p.uid for p in cache.with_anti_affinity()] == [uid]
