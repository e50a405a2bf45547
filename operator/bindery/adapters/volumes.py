"""Claims, volumes and storage classes for the VolumeBinding plugin (`scheduling.ports.VolumeAccess`).

Raw JSON reads and small patches: the plugin looks at a handful of fields, and a pod without claims
never calls any of this. The two writes are the ones kube-scheduler makes: a static volume's
`spec.claimRef` (guarded by the volume's resourceVersion, so a volume another scheduler took in the
meantime is not taken twice) and the claim's `volume.kubernetes.io/selected-node` annotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bindery.adapters.counters import WriteCounter
from bindery.apiserver import ApiClient, ApiError, NotFound, list_all, resources
from bindery.apiserver import get as get_object
from bindery.apiserver import patch as patch_object
from bindery.apiserver.api import STRATEGIC_PATCH
from bindery.scheduling.ports import VolumeError
from bindery.scheduling.volumes import BOUND_BY_CONTROLLER, SELECTED_NODE

#: One read or write; the generated client's own default is 5 minutes.
TIMEOUT_SECONDS = 10.0


class KubeVolumes:
    def __init__(self, *, api: ApiClient, counter: WriteCounter | None = None) -> None:
        self._api = api
        self._counter = counter or WriteCounter()

    async def claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await self._read(f"persistentvolumeclaim {namespace}/{name}", resources.PVCS, name, namespace)

    async def volume(self, name: str) -> Mapping[str, Any] | None:
        return await self._read(f"persistentvolume {name}", resources.PVS, name)

    async def volumes(self) -> list[Mapping[str, Any]]:
        try:
            listing = await list_all(self._api, resources.PVS, request_timeout=TIMEOUT_SECONDS)
        except ApiError as error:
            raise VolumeError(f"reading the persistentvolumes failed: {_why(error)}") from error
        return list(listing.items)

    async def csi_nodes(self) -> list[Mapping[str, Any]]:
        return await self._list("csinodes", resources.CSI_NODES)

    async def all_claims(self) -> list[Mapping[str, Any]]:
        return await self._list("persistentvolumeclaims", resources.PVCS)

    async def _list(self, what: str, resource: resources.Resource) -> list[Mapping[str, Any]]:
        try:
            listing = await list_all(self._api, resource, request_timeout=TIMEOUT_SECONDS)
        except ApiError as error:
            raise VolumeError(f"reading the {what} failed: {_why(error)}") from error
        return list(listing.items)

    async def storage_class(self, name: str) -> Mapping[str, Any] | None:
        return await self._read(f"storageclass {name}", resources.STORAGE_CLASSES, name)

    async def bind_volume(self, *, volume: Mapping[str, Any], claim: Mapping[str, Any]) -> None:
        meta, claim_meta = volume.get("metadata") or {}, claim.get("metadata") or {}
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {BOUND_BY_CONTROLLER: "yes"},
            },
            "spec": {
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": claim_meta.get("namespace"),
                    "name": claim_meta.get("name"),
                    "uid": claim_meta.get("uid"),
                    "resourceVersion": claim_meta.get("resourceVersion"),
                }
            },
        }
        self._counter.add(kind="volume")
        await self._write(
            f"pre-binding persistentvolume {meta.get('name')} to claim {claim_meta.get('name')}",
            resources.PVS,
            body=patch,
            name=str(meta.get("name")),
        )

    async def select_node(self, *, claim: Mapping[str, Any], node: str | None) -> None:
        meta = claim.get("metadata") or {}
        self._counter.add(kind="claim")
        await self._write(
            f"{'setting' if node else 'removing'} the selected node of claim {meta.get('namespace')}/"
            f"{meta.get('name')}",
            resources.PVCS,
            body={"metadata": {"annotations": {SELECTED_NODE: node}}},
            name=str(meta.get("name")),
            namespace=str(meta.get("namespace")),
        )

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
            raise VolumeError(f"reading {what} failed: {_why(error)}") from error

    async def _write(
        self,
        what: str,
        resource: resources.Resource,
        *,
        body: Mapping[str, Any],
        name: str,
        namespace: str | None = None,
    ) -> None:
        # A strategic merge patch, as the generated methods sent for a dict body.
        try:
            await patch_object(
                self._api,
                resource,
                name=name,
                namespace=namespace,
                body=dict(body),
                content_type=STRATEGIC_PATCH,
                request_timeout=TIMEOUT_SECONDS,
            )
        except ApiError as error:
            raise VolumeError(f"{what} failed: {_why(error)}") from error


def _why(error: ApiError) -> str:
    """Pure: the failure as the volume errors always said it: `HTTP 409: <message>`, or the
    transport error."""
    return f"HTTP {error.status}: {error.message}" if error.status else error.message
