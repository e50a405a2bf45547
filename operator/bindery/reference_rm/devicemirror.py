"""Mirror the cluster's ResourceSlices and allocated ResourceClaims for device allocation.

Slices go to the allocator helper as they change (an upsert per added or modified slice, a
delete per removed one); it decides which pools are complete, as upstream does. Claims are
followed for their ``status.allocation``: a device another scheduler (or Bindery, after writing
the allocation) gave to a claim is in use, keyed by (driver, pool, device), so a claim Bindery
allocated from a reservation is not counted twice. Both are the same list-then-watch loops as
the node and pod mirrors (:mod:`bindery.reference_rm.mirror`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bindery.apiserver.api import ApiClient
from bindery.apiserver.resources import Resource
from bindery.reference_rm.devices import DeviceAllocator, DeviceInUse
from bindery.reference_rm.mirror import DEFAULT_STALE_AFTER, _ListWatch

__all__ = ["RESOURCE_CLAIMS", "RESOURCE_SLICES", "ClaimMirror", "SliceMirror", "claim_devices"]

RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", False, "ResourceSlice")
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", True, "ResourceClaim")


class SliceMirror(_ListWatch):
    """Keeps the allocator helper's copy of the ResourceSlices current."""

    what = "resourceslice"
    resource = RESOURCE_SLICES

    #: the first list was applied (the RM is unready until it is)
    listed = False

    def __init__(
        self,
        *,
        api: ApiClient,
        allocator: DeviceAllocator,
        watch_timeout_seconds: int = 300,
        max_backoff: float = 10.0,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> None:
        super().__init__(
            api=api,
            watch_timeout_seconds=watch_timeout_seconds,
            max_backoff=max_backoff,
            stale_after=stale_after,
        )
        self._allocator = allocator
        self._names: set[str] = set()

    def _selectors(self) -> dict[str, str]:
        return {}

    def _listed(self, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        return raw

    def _replace(self, listed: Mapping[str, Any]) -> None:
        self.listed = True  # readiness waits for it: no device decision on a half-listed mirror
        slices = list(listed.values())
        names = {str(item["metadata"]["name"]) for item in slices}
        self._allocator.update_slices(upserted=slices, deleted=sorted(self._names - names))
        self._names = names

    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        name = str(raw["metadata"]["name"])
        if kind == "DELETED":
            self._allocator.update_slices(deleted=[name])
            self._names.discard(name)
        else:
            self._allocator.update_slices(upserted=[raw])
            self._names.add(name)


def claim_devices(raw: Mapping[str, Any]) -> tuple[DeviceInUse, ...]:
    """Pure: the devices a ResourceClaim's ``status.allocation`` holds (none when unallocated)."""
    allocation = (raw.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return tuple(
        DeviceInUse(
            driver=str(result["driver"]),
            pool=str(result["pool"]),
            device=str(result["device"]),
            share_id=result.get("shareID"),
            consumed_capacity=result.get("consumedCapacity"),
        )
        for result in results
        if not result.get("adminAccess")  # admin access never makes a device unavailable
    )


class ClaimMirror(_ListWatch):
    """Keeps ``on_change`` fed with the devices allocated in the cluster's ResourceClaims."""

    what = "resourceclaim"
    resource = RESOURCE_CLAIMS

    #: the first list was applied (the RM is unready until it is)
    listed = False

    def __init__(
        self,
        *,
        api: ApiClient,
        on_change: Callable[[tuple[DeviceInUse, ...]], None],
        watch_timeout_seconds: int = 300,
        max_backoff: float = 10.0,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> None:
        super().__init__(
            api=api,
            watch_timeout_seconds=watch_timeout_seconds,
            max_backoff=max_backoff,
            stale_after=stale_after,
        )
        self._on_change = on_change
        self._claims: dict[str, tuple[DeviceInUse, ...]] = {}

    def _selectors(self) -> dict[str, str]:
        return {}

    @staticmethod
    def _key(raw: Mapping[str, Any]) -> str:
        metadata = raw["metadata"]
        return f"{metadata.get('namespace') or ''}/{metadata['name']}"

    def _publish(self) -> None:
        self._on_change(tuple(device for devices in self._claims.values() for device in devices))

    def _listed(self, raw: Mapping[str, Any]) -> tuple[str, tuple[DeviceInUse, ...]]:
        return self._key(raw), claim_devices(raw)

    def _replace(self, listed: Mapping[str, Any]) -> None:
        self.listed = True  # readiness waits for it: no device decision on a half-listed mirror
        entries: list[tuple[str, tuple[DeviceInUse, ...]]] = list(listed.values())
        self._claims = {key: devices for key, devices in entries if devices}
        self._publish()

    def _apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        key = self._key(raw)
        devices = () if kind == "DELETED" else claim_devices(raw)
        if self._claims.get(key, ()) == devices:
            return
        if devices:
            self._claims[key] = devices
        else:
            self._claims.pop(key, None)
        self._publish()
