"""Pure: what becomes of a reservation, given its pod as the apiserver shows it now.

Every path of a reservation's after-life asks the same two questions, and they are answered here
once: the reconciler's passes, the unconfirmed Bindings and the bound-pod releases.

- :func:`pod_fate`: a reservation held for a pod on a node is **committed** while that pod (same
  UID) is bound there and still running, **released** once it is gone, replaced, bound elsewhere or
  finished, and left alone (None) while the pod is unbound;
- :func:`reservation_to_release`: the reservation a watch event of a bound pod frees (deleted, or
  in a terminal phase).

A pod in a terminal phase (:data:`TERMINAL_PHASES`) no longer uses its resources, as kube-scheduler
counts it. Nothing here reads or writes: the callers do.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from bindery.scheduling.framework import RESERVATION_ANNOTATION

__all__ = ["TERMINAL_PHASES", "Settle", "pod_fate", "reservation_to_release"]

TERMINAL_PHASES = ("Succeeded", "Failed")


class Settle(enum.StrEnum):
    COMMIT = "commit"
    RELEASE = "release"


def pod_fate(*, pod_uid: str, node: str, pod: Mapping[str, Any] | None) -> Settle | None:
    """Pure: what a reservation held for `pod_uid` on `node` becomes, given the pod's current body.

    Commit if that pod is bound to that node and still running; release if it is gone (None),
    replaced under its name, bound elsewhere or finished; None while it is still unbound.

    The pod's `bindery.dev/reservation-id` annotation is not consulted: it is written by the
    Binding, but whoever may edit the pod may overwrite it afterwards (`kubectl annotate
    --overwrite`). Releasing the reservation of a pod that runs on its node because the annotation
    named another one let a tenant free their own allocation while keeping the pod (issue 20,
    scenario 7): an RM that counts by reservations sold the capacity again. The UID and the node are
    the apiserver's own record; a pod that runs there uses the reservation made for it there.
    """
    if pod is None:
        return Settle.RELEASE
    if (pod.get("metadata") or {}).get("uid") != pod_uid:
        return Settle.RELEASE  # replaced under the same name: the UID precondition kept it unbound
    bound_to = (pod.get("spec") or {}).get("nodeName")
    if not bound_to:
        return None
    if bound_to != node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return Settle.RELEASE
    return Settle.COMMIT


def reservation_to_release(*, event_type: str, pod: Mapping[str, Any]) -> str | None:
    """Pure: the reservation id to release for this watch event of a bound pod, if any."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    reservation_id = annotations.get(RESERVATION_ANNOTATION)
    if not reservation_id:
        return None  # not bound by Bindery (or bound before reservations were annotated)
    phase = (pod.get("status") or {}).get("phase")
    if event_type == "DELETED" or phase in TERMINAL_PHASES:
        return str(reservation_id)
    return None
