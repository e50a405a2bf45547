"""ResourceClaims and DeviceClasses for the DynamicResources plugin (`scheduling.ports.DeviceAccess`).

Full updates (PUT) guarded by the resourceVersion the plugin read, as kube-scheduler's ``bindClaim``
writes them: a claim another scheduler allocated meanwhile answers 409 and is read again, never
overwritten. The finalizer goes through the claim itself, the allocation and ``reservedFor``
through its ``status`` subresource.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bindery.adapters.counters import WriteCounter
from bindery.apiserver import ApiClient, ApiError, NotFound, list_all, resources
from bindery.apiserver import get as get_object
from bindery.apiserver import replace as replace_object
from bindery.apiserver.errors import Conflict
from bindery.scheduling.ports import DeviceConflict, DeviceError

__all__ = ["KubeDevices"]

#: One read or write; the generated client's own default is 5 minutes.
TIMEOUT_SECONDS = 10.0


class KubeDevices:
    def __init__(self, *, api: ApiClient, counter: WriteCounter | None = None) -> None:
        self._api = api
        self._counter = counter or WriteCounter()

    async def claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await self._read(
            f"resourceclaim {namespace}/{name}", resources.RESOURCE_CLAIMS, name, namespace
        )

    async def device_class(self, name: str) -> Mapping[str, Any] | None:
        # A LIST by name, not a GET: the operator may list and watch classes, as kube-scheduler does.
        try:
            listing = await list_all(
                self._api,
                resources.DEVICE_CLASSES,
                field_selector=f"metadata.name={name}",
                request_timeout=TIMEOUT_SECONDS,
            )
        except ApiError as error:
            raise DeviceError(f"reading deviceclass {name} failed: {_why(error)}") from error
        return listing.items[0] if listing.items else None

    async def update_claim(self, claim: Mapping[str, Any]) -> Mapping[str, Any]:
        return await self._write("updating", claim, subresource="")

    async def update_claim_status(self, claim: Mapping[str, Any]) -> Mapping[str, Any]:
        return await self._write("updating the status of", claim, subresource="status")

    async def _read(
        self, what: str, resource: resources.Resource, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return await get_object(
                self._api, resource, name=name, namespace=namespace, request_timeout=TIMEOUT_SECONDS
            )
        except NotFound:
            return None
        except ApiError as error:
            raise DeviceError(f"reading {what} failed: {_why(error)}") from error

    async def _write(self, what: str, claim: Mapping[str, Any], *, subresource: str) -> Mapping[str, Any]:
        meta = claim.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        self._counter.add(kind="resourceclaim")
        try:
            return await replace_object(
                self._api,
                resources.RESOURCE_CLAIMS,
                name=name,
                namespace=namespace,
                body=dict(claim),
                subresource=subresource,
                request_timeout=TIMEOUT_SECONDS,
            )
        except Conflict as error:
            raise DeviceConflict(
                f"{what} resourceclaim {namespace}/{name} met a conflict: {_why(error)}"
            ) from error
        except ApiError as error:
            raise DeviceError(f"{what} resourceclaim {namespace}/{name} failed: {_why(error)}") from error


def _why(error: ApiError) -> str:
    """Pure: the failure as ``HTTP 409: <message>``, or the transport error."""
    return f"HTTP {error.status}: {error.message}" if error.status else error.message
