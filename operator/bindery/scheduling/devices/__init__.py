"""DRA devices through the RM: what kube-scheduler's DynamicResources plugin decides, kept pure.

Upstream (``pkg/scheduler/framework/plugins/dynamicresources``) allocates a pod's ResourceClaims
itself; Bindery asks the RM instead (contract v1.3, feature ``devices``) and does the rest around
that answer, as upstream does around its allocator:

* :mod:`.claims` — which claims a pod needs and whether they may be used yet (upstream
  ``PreEnqueue`` / ``PreFilter``): a template's claim not created yet, a claim being deleted, or
  one made for another pod makes the pod wait.
* :mod:`.plan` — claims already allocated are reused, the pod narrowed to their ``nodeSelector``
  (upstream ``PreFilter`` + ``Filter``); the rest become the request's ``devices``.
* :mod:`.allocation` — the claim status Bindery writes at PreBind (upstream ``bindClaim``) and
  what Unreserve takes back (upstream ``Unreserve``).

No I/O here: the plugin (:mod:`bindery.scheduling.dynamicresources`) reads and writes claims and
classes through a port (:mod:`bindery.scheduling.devicewrites` for the writes).
"""

from __future__ import annotations

from bindery.scheduling.devices.allocation import (
    DELETE_PROTECTION,
    RESERVED_FOR_MAX,
    allocated_status,
    reserved,
    unreserved,
)
from bindery.scheduling.devices.claims import ClaimWait, PodClaim, claim_wait, pod_claims
from bindery.scheduling.devices.plan import DevicePlan, plan_devices

__all__ = [
    "DELETE_PROTECTION",
    "RESERVED_FOR_MAX",
    "ClaimWait",
    "DevicePlan",
    "PodClaim",
    "allocated_status",
    "claim_wait",
    "plan_devices",
    "pod_claims",
    "reserved",
    "unreserved",
]
