"""The Eviction API's request body, shared by preemption and revocation.

Both evict through `pods/{name}/eviction` rather than deleting, so PodDisruptionBudgets hold, and
both name the pod's UID as a precondition: a pod recreated under the same name (a StatefulSet's)
is never evicted in its predecessor's place.
"""

from __future__ import annotations

from typing import Any


def eviction(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """Pure: the policy/v1 Eviction of pod `namespace/name`, only while it has UID `uid`."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }
