"""One pod read, for the rare paths that must learn a pod's fate from the apiserver itself.

The scheduling cycle never reads (it trusts the watch caches); only the settling of reservations
does, after a crash (`bindery.controller.reservations.reconcile`) or a Binding that got no answer
(`bindery.controller.reservations.unconfirmed`). The body is read raw: only a few fields are looked at, and a
`V1Pod` model would parse every timestamp for nothing.
"""

from __future__ import annotations

from typing import Any

from bindery.apiserver import ApiClient, NotFound, get, list_pages, resources


async def read_pod(
    *,
    api: ApiClient,
    namespace: str,
    name: str,
    timeout_seconds: float | None = None,
) -> dict[str, Any] | None:
    """The pod's current body, or None if it does not exist; raises :class:`bindery.apiserver.ApiError` on
    other answers and transport failures.

    ``timeout_seconds`` bounds the request (None: the layer's default bound).
    """
    try:
        if timeout_seconds is None:
            return await get(api, resources.PODS, namespace=namespace, name=name)
        return await get(api, resources.PODS, namespace=namespace, name=name, request_timeout=timeout_seconds)
    except NotFound:
        return None


async def read_budgets(*, api: ApiClient, namespace: str, timeout_seconds: float) -> list[dict[str, Any]]:
    """The PodDisruptionBudgets (policy/v1) of ``namespace``, read now: preemption counts a plan's
    victims against them before evicting any (``list`` on poddisruptionbudgets)."""
    budgets: list[dict[str, Any]] = []
    async for page in list_pages(
        api, resources.POD_DISRUPTION_BUDGETS, namespace=namespace, request_timeout=timeout_seconds
    ):
        budgets.extend(page.get("items") or ())
    return budgets
