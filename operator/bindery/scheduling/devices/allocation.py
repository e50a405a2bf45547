"""The claim writes Bindery makes at PreBind, and what Unreserve takes back.

Mirrors upstream ``bindClaim`` (PreBind): the finalizer ``resource.kubernetes.io/delete-protection``
first, so a claim is never deleted while its allocation is being written; then ``status.allocation``
(for a claim not allocated yet) and the pod appended to ``status.reservedFor``. And upstream
``Unreserve``: the pod is removed from ``reservedFor`` again; an allocation Bindery wrote that nobody
else has reserved is cleared with the finalizer, so the devices are free for the next claim.
Functions of claim bodies to new bodies: the adapter writes them with ``resourceVersion`` and redoes
them on a conflict.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from bindery.rm.models import ClaimAllocation

__all__ = [
    "DELETE_PROTECTION",
    "RESERVED_FOR_MAX",
    "allocated_status",
    "reserved",
    "unreserved",
    "with_finalizer",
    "without_finalizer",
]

#: ``resourceapi.Finalizer``: set by whoever allocates a claim, removed when the allocation is.
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
#: ``resourceapi.ResourceClaimReservedForMaxSize``: at most this many consumers of one claim.
RESERVED_FOR_MAX = 256


def allocated_status(
    *,
    claim: Mapping[str, Any],
    answer: ClaimAllocation,
    classes: Mapping[str, Mapping[str, Any] | None],
    node: str,
) -> dict[str, Any]:
    """``status.allocation`` for ``claim`` from the RM's answer, as upstream's allocator builds it.

    ``devices.config``: each allocated request's DeviceClass config (source ``FromClass``), then the
    claim's own ``spec.devices.config`` and the RM's (source ``FromClaim``). ``nodeSelector``: the
    answer's, or the chosen node alone (``matchFields metadata.name``).
    """
    results = [result.model_dump(by_alias=True, exclude_none=True, mode="json") for result in answer.results]
    config: list[dict[str, Any]] = []
    class_of = _request_classes(claim)
    for request in dict.fromkeys(result.request for result in answer.results):
        device_class = classes.get(class_of.get(request, "")) or {}
        for entry in (device_class.get("spec") or {}).get("config") or ():
            if opaque := entry.get("opaque"):
                config.append({"source": "FromClass", "requests": [request], "opaque": copy.deepcopy(opaque)})
    for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or ():
        if opaque := entry.get("opaque"):
            item: dict[str, Any] = {"source": "FromClaim", "opaque": copy.deepcopy(opaque)}
            if entry.get("requests"):
                item["requests"] = list(entry["requests"])
            config.append(item)
    for added in answer.config:
        item = {"source": "FromClaim", "opaque": dict(added.opaque)}
        if added.requests:
            item["requests"] = list(added.requests)
        config.append(item)
    node_selector = answer.node_selector or {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }
    devices: dict[str, Any] = {"results": results}
    if config:
        devices["config"] = config
    return {"devices": devices, "nodeSelector": dict(node_selector)}


def _request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """``"<request>"`` and ``"<request>/<subrequest>"`` → the DeviceClass they name."""
    classes: dict[str, str] = {}
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        name = str(request.get("name") or "")
        if exactly := request.get("exactly"):
            classes[name] = str(exactly.get("deviceClassName") or "")
        for sub in request.get("firstAvailable") or ():
            classes[f"{name}/{sub.get('name')}"] = str(sub.get("deviceClassName") or "")
    return classes


def with_finalizer(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """``metadata`` with :data:`DELETE_PROTECTION` added; ``None`` when it is there already."""
    finalizers: Sequence[str] = metadata.get("finalizers") or ()
    if DELETE_PROTECTION in finalizers:
        return None
    return {**metadata, "finalizers": [*finalizers, DELETE_PROTECTION]}


def without_finalizer(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """``metadata`` without :data:`DELETE_PROTECTION`; ``None`` when it is not there."""
    finalizers: Sequence[str] = metadata.get("finalizers") or ()
    if DELETE_PROTECTION not in finalizers:
        return None
    return {**metadata, "finalizers": [name for name in finalizers if name != DELETE_PROTECTION]}


def reserved(
    *, status: Mapping[str, Any], pod_name: str, pod_uid: str, allocation: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """``status`` with the pod in ``reservedFor`` (and ``allocation`` written if given and none is).

    ``None``: nothing to write (the pod is reserved already, and no allocation is to be added).
    Raises ``ValueError`` when the claim is allocated differently (another scheduler won the race)
    or is reserved for the maximum of consumers: the pod must be scheduled again.
    """
    current = status.get("allocation")
    if allocation is not None and current and current != allocation:
        raise ValueError("the claim was allocated by someone else meanwhile")
    reserved_for: list[Mapping[str, Any]] = list(status.get("reservedFor") or ())
    present = any(entry.get("uid") == pod_uid for entry in reserved_for)
    if present and (allocation is None or current):
        return None
    if not present:
        if len(reserved_for) >= RESERVED_FOR_MAX:
            raise ValueError(
                f"the claim is reserved for {RESERVED_FOR_MAX} consumers already, the most allowed"
            )
        reserved_for.append({"resource": "pods", "name": pod_name, "uid": pod_uid})
    new: dict[str, Any] = {**status, "reservedFor": reserved_for}
    if allocation is not None and not current:
        new["allocation"] = dict(allocation)
    return new


def unreserved(
    *, status: Mapping[str, Any], pod_uid: str, allocated_here: bool
) -> tuple[dict[str, Any] | None, bool]:
    """``status`` without the pod in ``reservedFor``, and whether the finalizer is to go as well.

    ``allocated_here``: this cycle wrote the allocation; then, with no consumer left, it is cleared
    (and the finalizer removed). An allocation someone else made, or one still reserved for others,
    stays. ``(None, False)``: nothing to undo.
    """
    reserved_for = [entry for entry in status.get("reservedFor") or () if entry.get("uid") != pod_uid]
    changed = len(reserved_for) != len(status.get("reservedFor") or ())
    clear = allocated_here and not reserved_for and bool(status.get("allocation"))
    if not changed and not clear:
        return None, False
    new: dict[str, Any] = {key: value for key, value in status.items() if key != "reservedFor"}
    if reserved_for:
        new["reservedFor"] = reserved_for
    if clear:
        new.pop("allocation", None)
    return new, clear
