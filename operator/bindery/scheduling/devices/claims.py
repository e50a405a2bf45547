"""Which ResourceClaims a pod uses, and whether each may be used yet.

Mirrors ``k8s.io/dynamic-resource-allocation/resourceclaim.Name`` and ``IsForPod``, as upstream's
``PreEnqueue`` and ``PreFilter`` use them: a claim named by ``resourceClaimName`` is used as it is;
one made from ``resourceClaimTemplateName`` is the claim that ``pod.status.resourceClaimStatuses``
names (kube-controller-manager's resourceclaim controller creates it and writes that entry), and
it must be owned by the pod, so a pod never takes a claim generated for another one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ClaimWait", "PodClaim", "claim_wait", "pod_claims"]


@dataclasses.dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of ``spec.resourceClaims`` resolved to the ResourceClaim it uses."""

    #: the entry's name in the pod (``spec.resourceClaims[].name``)
    pod_claim: str
    #: the ResourceClaim's name, in the pod's namespace
    name: str
    #: made from a template for this pod (then it must be owned by the pod)
    generated: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimWait:
    """Why the pod cannot be scheduled yet; a claim event may change that (never polled)."""

    message: str
    #: the claim whose creation or change wakes the pod (``None``: a pod update does)
    claim: str | None = None
    #: a short key for the metric of refused claims (``bindery_device_claims{outcome="waiting"}``)
    reason: str = "waiting"


def pod_claims(pod: Mapping[str, Any]) -> tuple[PodClaim, ...] | ClaimWait:
    """The claims the pod uses, or why it waits: a template's claim not created yet.

    An entry of ``resourceClaimStatuses`` with no ``resourceClaimName`` means the controller
    decided no claim is needed (upstream skips it as well).
    """
    spec: Mapping[str, Any] = pod.get("spec") or {}
    status: Mapping[str, Any] = pod.get("status") or {}
    statuses = {
        str(entry.get("name")): entry.get("resourceClaimName")
        for entry in status.get("resourceClaimStatuses") or ()
    }
    claims: list[PodClaim] = []
    for entry in spec.get("resourceClaims") or ():
        pod_claim = str(entry.get("name") or "")
        if named := entry.get("resourceClaimName"):
            claims.append(PodClaim(pod_claim=pod_claim, name=str(named), generated=False))
        elif entry.get("resourceClaimTemplateName"):
            if pod_claim not in statuses:
                return ClaimWait(
                    f'waiting for the ResourceClaim of pod claim "{pod_claim}" (template '
                    f'"{entry.get("resourceClaimTemplateName")}") to be created by the '
                    "resourceclaim controller of kube-controller-manager",
                    reason="claim_not_created",
                )
            if (generated := statuses[pod_claim]) is not None:
                claims.append(PodClaim(pod_claim=pod_claim, name=str(generated), generated=True))
    return tuple(claims)


def claim_wait(
    *, pod_uid: str, pod_key: str, claim: PodClaim, body: Mapping[str, Any] | None
) -> ClaimWait | None:
    """Why ``claim`` (its current ``body``, ``None`` if absent) cannot be used by the pod yet, or None.

    Upstream ``PreFilter``: a missing claim and a claim being deleted make the pod unschedulable
    until a claim event; a generated claim not owned by the pod is refused the same way.
    """
    if body is None:
        return ClaimWait(f'resourceclaim "{claim.name}" not found', claim=claim.name, reason="claim_missing")
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return ClaimWait(
            f'resourceclaim "{claim.name}" is being deleted', claim=claim.name, reason="claim_deleting"
        )
    if claim.generated and not _owned_by(metadata.get("ownerReferences") or (), pod_uid):
        return ClaimWait(
            f"ResourceClaim {claim.name} was not created for pod {pod_key} (pod is not owner)",
            claim=claim.name,
            reason="not_owner",
        )
    return None


def _owned_by(owners: Sequence[Mapping[str, Any]], pod_uid: str) -> bool:
    return any(owner.get("uid") == pod_uid and owner.get("controller") for owner in owners)
