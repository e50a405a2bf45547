"""Device allocation for the reference RM (contract v1.3, feature ``devices``), through upstream's allocator.

The RM does not evaluate CEL or pick devices itself: ``devalloc`` (built from
``devcluster/gomod/devalloc``) runs Kubernetes' own ``k8s.io/dynamic-resource-allocation/structured``
allocator, the code kube-scheduler's DynamicResources plugin calls, so selectors (with ``quantity``,
``semver`` and the other extension functions), ``firstAvailable``, constraints, consumable capacity
and the rule that a pool counts only when all slices of its current generation are there behave
exactly as under kube-scheduler. The helper is one long-lived process spoken to in JSON lines: it
keeps the ResourceSlices it is sent (incremental upserts and deletes) and answers each ``allocate``
with the first of the RM's candidate nodes where every claim allocates.

This module is pure translation (contract request → ResourceClaim objects, AllocationResult →
contract answer) plus :class:`DeviceAllocator`, the pipe to the helper. A selector that does not
compile or evaluate comes back as :class:`AllocationError`: the reserve answers ``unschedulable``
with upstream's message, never a guess.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from bindery.rm.models import ClaimDevices, DeviceSubRequest

__all__ = [
    "Allocated",
    "AllocationError",
    "DeviceAllocator",
    "DeviceInUse",
    "NotAllocated",
    "claim_answer",
    "claim_object",
    "request_classes",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceInUse:
    """A device held by a reservation or allocated in a mirrored claim (``share_id``: a shared one)."""

    driver: str
    pool: str
    device: str
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "pool": self.pool, "device": self.device}
        if self.share_id is not None:
            out["shareID"] = self.share_id
            out["consumedCapacity"] = dict(self.consumed_capacity or {})
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Allocated:
    """Every claim allocates on ``node``; ``allocations`` are AllocationResults, one per claim in order."""

    node: str
    allocations: tuple[dict[str, Any], ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class NotAllocated:
    """No candidate node could allocate the claims; ``reasons`` by node, in upstream's words."""

    reasons: Mapping[str, str]


class AllocationError(Exception):
    """The claims cannot be evaluated at all (a selector that does not compile, a helper failure)."""


def _selectors(expressions: Sequence[str]) -> list[dict[str, Any]]:
    return [{"cel": {"expression": expression}} for expression in expressions]


def _exact(sub: DeviceSubRequest) -> dict[str, Any]:
    """A request body as the apiserver stores it after defaulting (the allocator expects defaults)."""
    body: dict[str, Any] = {
        "deviceClassName": sub.device_class_name,
        "selectors": _selectors(sub.selectors),
        "allocationMode": sub.allocation_mode,
    }
    if sub.allocation_mode == "ExactCount":
        body["count"] = sub.count if sub.count is not None else 1
    if sub.admin_access:
        body["adminAccess"] = True
    if sub.tolerations:
        body["tolerations"] = list(sub.tolerations)
    if sub.capacity is not None and sub.capacity.requests:
        body["capacity"] = {"requests": dict(sub.capacity.requests)}
    return body


def claim_object(claim: ClaimDevices) -> dict[str, Any]:
    """The ResourceClaim (resource.k8s.io/v1) that ``claim`` describes, unallocated."""
    requests: list[dict[str, Any]] = []
    for request in claim.requests:
        if request.exactly is not None:
            requests.append({"name": request.name, "exactly": _exact(request.exactly)})
        else:
            subs = [{"name": sub.name, **_exact(sub)} for sub in request.first_available or ()]
            requests.append({"name": request.name, "firstAvailable": subs})
    constraints: list[dict[str, Any]] = []
    for constraint in claim.constraints:
        item: dict[str, Any] = {}
        if constraint.requests is not None:
            item["requests"] = list(constraint.requests)
        if constraint.match_attribute is not None:
            item["matchAttribute"] = constraint.match_attribute
        if constraint.distinct_attribute is not None:
            item["distinctAttribute"] = constraint.distinct_attribute
        constraints.append(item)
    ref = claim.claim
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
        "spec": {"devices": {"requests": requests, "constraints": constraints}},
    }


def request_classes(claims: Sequence[ClaimDevices]) -> list[dict[str, Any]]:
    """The DeviceClasses as the caller resolved them: each named class with its ``classSelectors``.

    The contract carries a class's CEL, not the class, so the RM needs no class mirror to honour
    it, and a class changed in the cluster after the caller read it cannot disagree with the request.
    """
    classes: dict[str, list[str]] = {}
    for claim in claims:
        for request in claim.requests:
            subs = [request.exactly] if request.exactly is not None else list(request.first_available or ())
            for sub in subs:
                if sub is not None:
                    classes.setdefault(sub.device_class_name, list(sub.class_selectors))
    return [
        {"metadata": {"name": name}, "spec": {"selectors": _selectors(selectors)}}
        for name, selectors in sorted(classes.items())
    ]


_RESULT_FIELDS = (
    "request",
    "driver",
    "pool",
    "device",
    "adminAccess",
    "tolerations",
    "consumedCapacity",
    "shareID",
    "bindingConditions",
    "bindingFailureConditions",
)


def claim_answer(claim: ClaimDevices, allocation: Mapping[str, Any]) -> dict[str, Any]:
    """The contract's ``Reservation.devices[]`` entry for one claim from upstream's AllocationResult."""
    devices = allocation.get("devices") or {}
    results = [
        {key: result[key] for key in _RESULT_FIELDS if result.get(key) is not None}
        for result in devices.get("results") or ()
    ]
    config = [
        {"requests": list(item.get("requests") or ()), "opaque": item["opaque"]}
        for item in devices.get("config") or ()
        if item.get("opaque") is not None
    ]
    ref = claim.claim
    return {
        "claim": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
        "results": results,
        "nodeSelector": allocation.get("nodeSelector"),
        "config": config,
    }


class DeviceAllocator:
    """The pipe to one ``devalloc`` process; calls are serialized (the helper answers in order)."""

    def __init__(self, *, binary: pathlib.Path | str) -> None:
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [str(binary)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def _call(self, message: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            stdin, stdout = self._proc.stdin, self._proc.stdout
            if stdin is None or stdout is None or self._proc.poll() is not None:
                raise AllocationError(f"the device allocator exited (status {self._proc.returncode})")
            try:
                stdin.write(json.dumps(message, separators=(",", ":")) + "\n")
                stdin.flush()
            except OSError as error:
                raise AllocationError(f"the device allocator does not read its input: {error}") from error
            line = stdout.readline()
        if not line:
            raise AllocationError(f"the device allocator exited (status {self._proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def update_slices(
        self, *, upserted: Sequence[Mapping[str, Any]] = (), deleted: Sequence[str] = ()
    ) -> None:
        """Tell the helper of ResourceSlices added or changed (whole objects) and deleted (names)."""
        answer = self._call({"op": "slices", "slices": list(upserted), "deleted": list(deleted)})
        if not answer.get("ok"):
            raise AllocationError(f"the device allocator refused the slices: {answer.get('error')}")

    def allocate(
        self,
        *,
        claims: Sequence[ClaimDevices],
        used: Sequence[DeviceInUse],
        nodes: Sequence[Mapping[str, Any]],
    ) -> Allocated | NotAllocated:
        """The first of ``nodes`` (core/v1 Node objects, in the RM's order) where all ``claims`` allocate."""
        answer = self._call(
            {
                "op": "allocate",
                "claims": [claim_object(claim) for claim in claims],
                "classes": request_classes(claims),
                "used": [device.to_json() for device in used],
                "nodes": list(nodes),
            }
        )
        if answer.get("error"):
            raise AllocationError(str(answer["error"]))
        if answer.get("ok"):
            return Allocated(node=str(answer["node"]), allocations=tuple(answer.get("allocations") or ()))
        return NotAllocated(reasons=dict(answer.get("reasons") or {}))

    def close(self) -> None:
        """Stop the helper: closing its input ends it; it is waited for, never left behind."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
