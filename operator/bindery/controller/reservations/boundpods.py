"""The bound pods as a reservation's after-life reads them: a slim projection, a LIST, stand-ins.

A reconcile pass lists every bound pod of its scheduler names, the bound-pod releases queue every
event of a pod carrying a reservation annotation, and the shared watch of placed pods remembers
every pod on a node between two lists. Each keeps only what a commit or a release needs
(:func:`listed_bound_pod`, :func:`remembered`): a pod's spec may be 1.5 MB, and there may be 50,000
of them. A body :func:`remembered` kept stands in for a pod that vanished between two lists, or is
replayed to a profile subscribing late; :func:`is_stand_in` tells it from one the apiserver sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bindery.apiserver import resources
from bindery.apiserver.api import ApiClient, list_pages
from bindery.controller.reservations.fate import TERMINAL_PHASES
from bindery.scheduling.framework import RESERVATION_ANNOTATION

#: Explicit bound on one LIST of bound pods (thousands of pods take a while on a busy apiserver).
LIST_TIMEOUT_SECONDS = 60.0


def bound_pods_selector(*, scheduler_name: str) -> str:
    return f"spec.schedulerName={scheduler_name},spec.nodeName!="


def listed_bound_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: what a reconcile pass reads of a listed bound pod (identity, the reservation
    annotation, node, scheduler name, phase, the PodScheduled condition), in the pod's own shape.

    A pass lists every bound pod of its names; holding their whole bodies (a spec of 1.5 MB is
    allowed) for the pass made its memory grow with the largest pods anyone can create.
    """
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    kept_metadata = {
        key: metadata[key]
        for key in ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp")
        if key in metadata
    }
    reservation_id = (metadata.get("annotations") or {}).get(RESERVATION_ANNOTATION)
    if reservation_id:
        kept_metadata["annotations"] = {RESERVATION_ANNOTATION: str(reservation_id)}
    conditions = [c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"]
    return {
        "metadata": kept_metadata,
        "spec": {key: spec[key] for key in ("nodeName", "schedulerName") if key in spec},
        "status": {"phase": status.get("phase"), "conditions": conditions},
    }


async def list_bound_pods(
    *,
    api: ApiClient,
    scheduler_name: str,
    namespace: str | None,
    within: float = LIST_TIMEOUT_SECONDS,
) -> tuple[list[dict[str, Any]], str]:
    """One paged LIST of the bound pods of `scheduler_name` (in `namespace`, None = all): each
    pod as :func:`listed_bound_pod` keeps it, and the list's version. Each page is reduced before
    the next is read. `within` bounds each page. Raises :class:`bindery.apiserver.ApiError`.
    """
    items: list[dict[str, Any]] = []
    version = ""
    async for page in list_pages(
        api,
        resources.PODS,
        namespace=namespace,
        field_selector=bound_pods_selector(scheduler_name=scheduler_name),
        request_timeout=within,
    ):
        version = version or str((page.get("metadata") or {}).get("resourceVersion") or "")
        items.extend(listed_bound_pod(pod) for pod in page.get("items") or ())
    return items, version


def remembered(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """Pure: what the shared pod watch's cursor keeps per pod on a node: the body of its DELETED
    should it vanish between two lists, and what a profile that subscribes later is replayed.

    A pod without a reservation annotation (another scheduler's, or a DaemonSet's): its UID only,
    all the placed-pod cache needs to forget it; with 50,000 pods, name, namespace and
    resourceVersion too doubled the memory per pod. A pod Bindery placed: its identity, reservation
    id and node (all a release needs), its scheduler name (which profile it goes to) and, once it
    finished, its terminal phase (so that a profile subscribing later still releases it). Never its
    resourceVersion (the cursor keeps it beside): its absence marks a stand-in (:func:`is_stand_in`).
    """
    metadata = pod.get("metadata") or {}
    reservation_id = (metadata.get("annotations") or {}).get(RESERVATION_ANNOTATION)
    if not reservation_id:
        return {"metadata": {"uid": metadata.get("uid")}}
    spec = pod.get("spec") or {}
    kept: dict[str, Any] = {
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "annotations": {RESERVATION_ANNOTATION: str(reservation_id)},
        },
        "spec": {"nodeName": spec.get("nodeName"), "schedulerName": spec.get("schedulerName")},
    }
    phase = (pod.get("status") or {}).get("phase")
    if phase in TERMINAL_PHASES:
        kept["status"] = {"phase": phase}
    return kept


def is_stand_in(pod: Mapping[str, Any]) -> bool:
    """Pure: whether `pod` is a body :func:`remembered` kept (a relist's DELETED of a pod that
    vanished while the watch was down, or a replay), not one the apiserver sent."""
    return "resourceVersion" not in (pod.get("metadata") or {})
