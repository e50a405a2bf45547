"""What the RM is asked for a pod's claims, and where claims already allocated keep the pod.

Upstream ``PreFilter`` sorts a pod's claims into those already allocated (their
``status.allocation.nodeSelector`` then limits the pod's nodes in ``Filter``) and those to
allocate (its allocator runs per node). Bindery keeps the first half and hands the second to the
RM as the request's ``devices``, with each DeviceClass's selectors resolved, as upstream's
allocator resolves them, so the RM evaluates expressions and never reads classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from bindery.rm.models import (
    MAX_DEVICE_CLAIMS,
    ClaimDevices,
    ClaimRef,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
)
from bindery.scheduling.devices.allocation import RESERVED_FOR_MAX
from bindery.scheduling.devices.claims import ClaimWait, PodClaim

__all__ = ["DevicePlan", "plan_devices"]


@dataclasses.dataclass(frozen=True, slots=True)
class DevicePlan:
    """A pod's claims sorted: to allocate through the RM, and already allocated (reused)."""

    #: sent as the reservation request's ``devices``, in the pod's order
    to_allocate: tuple[ClaimDevices, ...] = ()
    #: claims already allocated, to be reserved for the pod at PreBind
    reused: tuple[str, ...] = ()
    #: one list of nodeSelectorTerms (ORed) per reused claim with a nodeSelector; all must hold
    node_terms: tuple[tuple[Mapping[str, Any], ...], ...] = ()


def plan_devices(
    *,
    pod_uid: str,
    claims: Sequence[tuple[PodClaim, Mapping[str, Any]]],
    classes: Mapping[str, Mapping[str, Any] | None],
    in_flight: Collection[str] = frozenset(),
) -> DevicePlan | ClaimWait:
    """Sort ``claims`` (each with its current body) or say why the pod waits.

    ``classes``: DeviceClass bodies by name (``None``: not found); ``in_flight``: UIDs of claims
    another cycle is allocating now. Mirrors upstream ``PreFilter``: a claim reserved for the
    maximum of pods is in use; a missing DeviceClass makes the pod wait for it; and (upstream's
    in-flight allocations of the shared claim tracker) a claim being allocated for another pod is
    not allocated a second time, the pod waits and then reuses it.
    """
    to_allocate: list[ClaimDevices] = []
    reused: list[str] = []
    node_terms: list[tuple[Mapping[str, Any], ...]] = []
    for claim, body in claims:
        metadata: Mapping[str, Any] = body.get("metadata") or {}
        status: Mapping[str, Any] = body.get("status") or {}
        uid = str(metadata.get("uid") or "")
        allocation = status.get("allocation")
        if allocation:
            reserved_for = status.get("reservedFor") or ()
            absent = all(entry.get("uid") != pod_uid for entry in reserved_for)
            if absent and len(reserved_for) >= RESERVED_FOR_MAX:
                return ClaimWait(f'resourceclaim "{claim.name}" is in use', claim=claim.name, reason="in_use")
            reused.append(claim.name)
            if terms := (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms"):
                node_terms.append(tuple(terms))
            continue
        if uid in in_flight:
            return ClaimWait(
                f'resourceclaim "{claim.name}" is being allocated for another pod; this pod uses it '
                "once that allocation is written",
                claim=claim.name,
                reason="in_flight",
            )
        entry = _claim_devices(claim=claim, body=body, classes=classes)
        if isinstance(entry, ClaimWait):
            return entry
        to_allocate.append(entry)
    if len(to_allocate) > MAX_DEVICE_CLAIMS:
        return ClaimWait(
            f"the pod has {len(to_allocate)} ResourceClaims to allocate, more than the "
            f"{MAX_DEVICE_CLAIMS} a reservation request of contract v1.3 carries; use fewer claims "
            "(a claim may hold several requests)",
            reason="too_many_claims",
        )
    return DevicePlan(to_allocate=tuple(to_allocate), reused=tuple(reused), node_terms=tuple(node_terms))


def _claim_devices(
    *, claim: PodClaim, body: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any] | None]
) -> ClaimDevices | ClaimWait:
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    devices: Mapping[str, Any] = (body.get("spec") or {}).get("devices") or {}
    requests: list[DeviceRequest] = []
    for request in devices.get("requests") or ():
        name = str(request.get("name") or "")
        if exactly := request.get("exactly"):
            sub = _sub_request(None, exactly, classes, claim)
            if isinstance(sub, ClaimWait):
                return sub
            requests.append(DeviceRequest(name=name, exactly=sub))
            continue
        alternatives: list[DeviceSubRequest] = []
        for alternative in request.get("firstAvailable") or ():
            sub = _sub_request(str(alternative.get("name") or ""), alternative, classes, claim)
            if isinstance(sub, ClaimWait):
                return sub
            alternatives.append(sub)
        requests.append(DeviceRequest(name=name, first_available=alternatives))
    constraints = [
        DeviceConstraint(
            requests=list(constraint["requests"]) if constraint.get("requests") else None,
            match_attribute=constraint.get("matchAttribute"),
            distinct_attribute=constraint.get("distinctAttribute"),
        )
        for constraint in devices.get("constraints") or ()
    ]
    return ClaimDevices(
        claim=ClaimRef(
            namespace=str(metadata.get("namespace") or ""),
            name=claim.name,
            uid=str(metadata.get("uid") or ""),
        ),
        requests=requests,
        constraints=constraints,
    )


def _sub_request(
    name: str | None,
    body: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any] | None],
    claim: PodClaim,
) -> DeviceSubRequest | ClaimWait:
    class_name = str(body.get("deviceClassName") or "")
    device_class = classes.get(class_name)
    if device_class is None:
        # Upstream: "request %s: device class %s does not exist", unschedulable until a class event.
        return ClaimWait(
            f'resourceclaim "{claim.name}": device class "{class_name}" does not exist; the pod waits '
            "until it is created",
            reason="class_missing",
        )
    mode = str(body.get("allocationMode") or "ExactCount")
    capacity = (body.get("capacity") or {}).get("requests")
    fields: dict[str, Any] = {
        "device_class_name": class_name,
        "class_selectors": _expressions((device_class.get("spec") or {}).get("selectors")),
        "selectors": _expressions(body.get("selectors")),
        "allocation_mode": mode,
        "count": int(body.get("count") or 1) if mode == "ExactCount" else None,
        "admin_access": bool(body.get("adminAccess")),
        "tolerations": [dict(toleration) for toleration in body.get("tolerations") or ()],
    }
    if name is not None:
        fields["name"] = name
    if capacity:
        fields["capacity"] = {"requests": {str(k): str(v) for k, v in capacity.items()}}
    return DeviceSubRequest.model_validate(fields)


def _expressions(selectors: Sequence[Mapping[str, Any]] | None) -> list[str]:
    return [str((selector.get("cel") or {}).get("expression")) for selector in selectors or ()]
