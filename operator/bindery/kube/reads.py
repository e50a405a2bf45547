"""One pod read, for the rare paths that must learn a pod's fate from the apiserver itself.

The scheduling cycle never reads (it trusts the watch caches); only the settling of reservations
does, after a crash (`bindery.controller.reconcile`) or a Binding that got no answer
(`bindery.controller.unconfirmed`). The body is read raw: only a few fields are looked at, and a
`V1Pod` model would parse every timestamp for nothing.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio import client


async def read_pod(
    *, core: client.CoreV1Api, namespace: str, name: str, timeout_seconds: float | None = None
) -> dict[str, Any] | None:
    """The pod's current body, or None if it does not exist; raises ApiException on other answers.

    ``timeout_seconds`` bounds the request; the generated client's own default is 5 minutes.
    """
    response = await core.read_namespaced_pod(
        name=name, namespace=namespace, _preload_content=False, _request_timeout=timeout_seconds
    )
    try:
        if response.status == 404:
            return None
        if response.status >= 300:
            raise client.ApiException(status=response.status, reason=f"reading pod {namespace}/{name}")
        body: dict[str, Any] = json.loads(await response.read())
    finally:
        response.release()
    return body
