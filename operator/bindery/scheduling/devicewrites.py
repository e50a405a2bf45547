"""The claim writes of PreBind and their undo, through :class:`~bindery.scheduling.ports.DeviceAccess`.

Upstream ``bindClaim``: finalizer first (an update of the claim), then allocation and
``reservedFor`` (an update of its status), each on the claim as just read and redone from a fresh
read on a conflict, so a change made meanwhile by the resourceclaim controller or another
scheduler is never lost. Upstream ``Unreserve`` undoes it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bindery.scheduling.devices.allocation import reserved, unreserved, with_finalizer, without_finalizer
from bindery.scheduling.ports import DeviceAccess, DeviceConflict, DeviceError

__all__ = ["CONFLICT_RETRIES", "bind_claim", "unbind_claim"]

#: Fresh reads after a conflict before the write fails (client-go's ``retry.DefaultRetry`` is 5).
CONFLICT_RETRIES = 5


async def bind_claim(
    *,
    access: DeviceAccess,
    namespace: str,
    name: str,
    pod_name: str,
    pod_uid: str,
    allocation: Mapping[str, Any] | None,
) -> Mapping[str, Any]:
    """Reserve claim ``namespace/name`` for the pod, writing ``allocation`` first if given.

    Raises :class:`DeviceError` when the claim is gone, is allocated differently now (another
    scheduler won), or is reserved for the most consumers: the pod is scheduled again.
    """
    for attempt in range(CONFLICT_RETRIES + 1):
        claim = await _read(access, namespace, name)
        try:
            if allocation is not None and (metadata := with_finalizer(claim.get("metadata") or {})):
                claim = await access.update_claim({**claim, "metadata": metadata})
            try:
                status = reserved(
                    status=claim.get("status") or {},
                    pod_name=pod_name,
                    pod_uid=pod_uid,
                    allocation=allocation,
                )
            except ValueError as error:
                raise DeviceError(f"resourceclaim {namespace}/{name}: {error}") from None
            if status is None:
                return claim
            return await access.update_claim_status({**claim, "status": status})
        except DeviceConflict:
            if attempt == CONFLICT_RETRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


async def unbind_claim(
    *, access: DeviceAccess, namespace: str, name: str, pod_uid: str, allocated_here: bool
) -> None:
    """Take the pod out of the claim's ``reservedFor``; clear what Bindery allocated if nobody uses it.

    A claim that is gone needs no undo.
    """
    for attempt in range(CONFLICT_RETRIES + 1):
        claim = await access.claim(namespace=namespace, name=name)
        if claim is None:
            return
        try:
            status, clear = unreserved(
                status=claim.get("status") or {}, pod_uid=pod_uid, allocated_here=allocated_here
            )
            if status is not None:
                claim = await access.update_claim_status({**claim, "status": status})
            if (clear or (allocated_here and not (claim.get("status") or {}).get("allocation"))) and (
                metadata := without_finalizer(claim.get("metadata") or {})
            ):
                await access.update_claim({**claim, "metadata": metadata})
            return
        except DeviceConflict:
            if attempt == CONFLICT_RETRIES:
                raise


async def _read(access: DeviceAccess, namespace: str, name: str) -> Mapping[str, Any]:
    claim = await access.claim(namespace=namespace, name=name)
    if claim is None:
        raise DeviceError(
            f'resourceclaim "{name}" not found in namespace {namespace}; it was deleted meanwhile'
        )
    return claim
