"""A small dynamic provisioner for the cluster plane, following the external-provisioner protocol.

The plane has no CSI driver, and kube-controller-manager's persistent-volume controller provisions
nothing itself for a class whose provisioner is not in-tree: for a WaitForFirstConsumer claim it
waits until a scheduler names a node (annotation `volume.kubernetes.io/selected-node`), then marks
the claim for an external provisioner (`volume.kubernetes.io/storage-provisioner: <class's
provisioner>`) and waits for a PersistentVolume pre-bound to the claim. That is what this class
plays, just enough for the volume-binding tests to see a scheduler's choice turn into a volume on
that node:

- it watches claims in every namespace (admin client);
- a Pending claim with no `volumeName`, marked for its provisioner name and carrying a selected
  node, gets a `local` PV on that node: `spec.nodeAffinity` pins `kubernetes.io/hostname` to the
  node, `spec.claimRef` names the claim (with its UID), and class, size, access modes and volume
  mode are the claim's;
- the PV's name is `pvc-<claim uid>` (as external-provisioner names them), so seeing a claim twice
  creates one PV: a 409 is success.

The PV controller then binds the claim to the PV. The provisioner deletes the PVs it created when
it stops (nothing else would: the PV controller leaves the deletion of an externally provisioned
volume to its provisioner).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any, Self

import aiohttp
from kubernetes_asyncio import client, watch

log = logging.getLogger(__name__)

SELECTED_NODE = "volume.kubernetes.io/selected-node"
STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
HOSTNAME = "kubernetes.io/hostname"
WATCH_SECONDS = 30


def wants(claim: Mapping[str, Any], provisioner: str) -> str | None:
    """Pure: the node to provision `claim` on, if this provisioner should provision it now."""
    annotations = claim["metadata"].get("annotations") or {}
    marked = provisioner in (annotations.get(STORAGE_PROVISIONER), annotations.get(BETA_STORAGE_PROVISIONER))
    pending = (claim.get("status") or {}).get("phase", "Pending") == "Pending"
    unbound = not (claim.get("spec") or {}).get("volumeName")
    alive = not claim["metadata"].get("deletionTimestamp")
    node = annotations.get(SELECTED_NODE)
    return node if marked and pending and unbound and alive and node else None


def volume_for(
    claim: Mapping[str, Any], *, node: str, provisioner: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """Pure: the PV for `claim` on `node`."""
    metadata, spec = claim["metadata"], claim.get("spec") or {}
    name = f"pvc-{metadata['uid']}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": dict(labels), "annotations": {PROVISIONED_BY: provisioner}},
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "storageClassName": spec.get("storageClassName") or "",
            "persistentVolumeReclaimPolicy": "Delete",
            "local": {"path": f"/mnt/bindery-test/{name}"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]}
                    ]
                }
            },
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": metadata["namespace"],
                "name": metadata["name"],
                "uid": metadata["uid"],
                "resourceVersion": metadata["resourceVersion"],
            },
        },
    }


class Provisioner:
    """`async with Provisioner(api, name=...)`: provisions claims of classes whose provisioner is
    `name` while the block runs; `provisioned` maps each PV it created to its node."""

    def __init__(self, api: client.ApiClient, *, name: str, labels: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.labels = {"bindery.dev/test-provisioner": name.replace("/", "."), **(labels or {})}
        self.provisioned: dict[str, str] = {}
        self._core = client.CoreV1Api(api)
        self._task: asyncio.Task[None] | None = None

    async def _handle(self, claim: Mapping[str, Any]) -> None:
        node = wants(claim, self.name)
        if node is None:
            return
        body = volume_for(claim, node=node, provisioner=self.name, labels=self.labels)
        name = body["metadata"]["name"]
        if name in self.provisioned:
            return
        try:
            await self._core.create_persistent_volume(body=body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        self.provisioned[name] = node
        meta = claim["metadata"]
        log.info("provisioned %s on %s for claim %s/%s", name, node, meta["namespace"], meta["name"])

    async def _list(self) -> str:
        response = await self._core.list_persistent_volume_claim_for_all_namespaces(_preload_content=False)
        document = json.loads(await response.read())
        for claim in document.get("items") or []:
            await self._handle(claim)
        return str(document["metadata"]["resourceVersion"])

    async def _watch(self, resource_version: str) -> str:
        async with watch.Watch() as stream:
            async for event in stream.stream(
                self._core.list_persistent_volume_claim_for_all_namespaces,
                resource_version=resource_version,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=aiohttp.ClientTimeout(sock_connect=10, sock_read=WATCH_SECONDS + 10),
            ):
                raw = event["raw_object"]
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watch ended: {raw.get('message', raw)}")
                resource_version = str(raw["metadata"].get("resourceVersion") or resource_version)
                if event["type"] in ("ADDED", "MODIFIED"):
                    await self._handle(raw)
        return resource_version

    async def run(self) -> None:
        """List, then watch (resuming where each watch ended); relist after any failure."""
        while True:
            try:
                resource_version = await self._list()
                while True:
                    resource_version = await self._watch(resource_version)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("provisioner %s: %s: %s; relisting", self.name, type(error).__name__, error)
                await asyncio.sleep(0.5)

    async def delete_volumes(self) -> None:
        """Delete every PV this provisioner created (as external-provisioner would once released)."""
        for name in list(self.provisioned):
            with contextlib.suppress(client.ApiException):
                await self._core.delete_persistent_volume(name)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.run(), name=f"provisioner {self.name}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.delete_volumes()
