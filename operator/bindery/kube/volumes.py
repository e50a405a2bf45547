"""Claims, volumes and storage classes for the VolumeBinding plugin (`scheduling.ports.VolumeAccess`).

Raw JSON reads and small patches: the plugin looks at a handful of fields, and a pod without claims
never calls any of this. The two writes are the ones kube-scheduler makes: a static volume's
`spec.claimRef` (guarded by the volume's resourceVersion, so a volume another scheduler took in the
meantime is not taken twice) and the claim's `volume.kubernetes.io/selected-node` annotation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from bindery.kube.binder import status_message
from bindery.kube.counters import WriteCounter
from bindery.scheduling.ports import VolumeError
from bindery.scheduling.volumes import BOUND_BY_CONTROLLER, SELECTED_NODE

#: One read or write; the generated client's own default is 5 minutes.
TIMEOUT_SECONDS = 10.0


class KubeVolumes:
    def __init__(self, *, api: client.ApiClient, counter: WriteCounter | None = None) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._storage = client.StorageV1Api(api)
        self._counter = counter or WriteCounter()

    async def claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await self._read(
            f"persistentvolumeclaim {namespace}/{name}",
            self._core.read_namespaced_persistent_volume_claim(
                name=name, namespace=namespace, _preload_content=False, _request_timeout=TIMEOUT_SECONDS
            ),
        )

    async def volume(self, name: str) -> Mapping[str, Any] | None:
        return await self._read(
            f"persistentvolume {name}",
            self._core.read_persistent_volume(
                name=name, _preload_content=False, _request_timeout=TIMEOUT_SECONDS
            ),
        )

    async def volumes(self) -> list[Mapping[str, Any]]:
        body = await self._read(
            "the persistentvolumes",
            self._core.list_persistent_volume(_preload_content=False, _request_timeout=TIMEOUT_SECONDS),
        )
        return list((body or {}).get("items") or ())

    async def storage_class(self, name: str) -> Mapping[str, Any] | None:
        return await self._read(
            f"storageclass {name}",
            self._storage.read_storage_class(
                name=name, _preload_content=False, _request_timeout=TIMEOUT_SECONDS
            ),
        )

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
            self._core.patch_persistent_volume(
                name=meta.get("name"), body=patch, _preload_content=False, _request_timeout=TIMEOUT_SECONDS
            ),
        )

    async def select_node(self, *, claim: Mapping[str, Any], node: str | None) -> None:
        meta = claim.get("metadata") or {}
        self._counter.add(kind="claim")
        await self._write(
            f"{'setting' if node else 'removing'} the selected node of claim {meta.get('namespace')}/"
            f"{meta.get('name')}",
            self._core.patch_namespaced_persistent_volume_claim(
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                body={"metadata": {"annotations": {SELECTED_NODE: node}}},
                _preload_content=False,
                _request_timeout=TIMEOUT_SECONDS,
            ),
        )

    async def _read(self, what: str, request: Any) -> dict[str, Any] | None:
        try:
            response = await request
        except Exception as error:  # transport failures, timeouts
            raise VolumeError(f"reading {what} failed: {error or type(error).__name__}") from error
        try:
            if response.status == 404:
                return None
            text = await response.read()
            if response.status >= 300:
                raise VolumeError(f"reading {what} failed: HTTP {response.status}: {status_message(text)}")
            body: dict[str, Any] = json.loads(text)
            return body
        finally:
            response.release()

    async def _write(self, what: str, request: Any) -> None:
        try:
            response = await request
        except Exception as error:
            raise VolumeError(f"{what} failed: {error or type(error).__name__}") from error
        try:
            if response.status >= 300:
                raise VolumeError(
                    f"{what} failed: HTTP {response.status}: {status_message(await response.read())}"
                )
        finally:
            response.release()
