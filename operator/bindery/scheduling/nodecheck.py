"""Check the node a resource manager chose before binding a pod to it.

The apiserver does not check anything when a Binding is created: it binds a pod to a node that
does not exist, is cordoned, or carries a taint the pod does not tolerate, and the kubelet (if any)
rejects the pod afterwards, too late to pick another node.  The resource manager's view of nodes
may be stale or wrong, so before binding we repeat the checks kube-scheduler's filters would have
made (NodeUnschedulable, TaintToleration, NodeAffinity) against the Node as the watch sees it.

How much to check is a per-ResourceManager choice (``spec.nodeCheck``), see :class:`NodeCheckMode`.
The result is ``None`` (go ahead) or a message that names the RM and the node and says exactly
which rule failed, because it ends up in the pod's ``FailedScheduling`` event.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from bindery.constraints import (
    matches_node_selector,
    matches_required_affinity,
    tolerates,
    untolerated_taints,
)
from bindery.podrules.filters import Verdict
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection

__all__ = ["UNSCHEDULABLE_TAINT", "NodeCheckMode", "check_node", "check_rules", "format_taint"]

#: The taint kube-scheduler's NodeUnschedulable plugin treats as "cordoned": a pod that tolerates
#: it (a DaemonSet pod, typically) may go to a cordoned node.
UNSCHEDULABLE_TAINT: Mapping[str, str] = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


class NodeCheckMode(enum.StrEnum):
    """How strictly the RM's node choice is checked (the CRD's ``spec.nodeCheck``)."""

    #: Everything kube-scheduler's filters would reject: missing or deleting node, cordoned node,
    #: untolerated NoSchedule/NoExecute taints, nodeSelector, required node affinity.
    FULL = "Full"
    #: Only that the node exists and is not being deleted; for RMs that deliberately place pods on
    #: cordoned or tainted nodes (for example to drain them into a maintenance pool).
    BASIC = "Basic"
    #: Trust the RM entirely; a pod may be bound to a node that does not exist.
    OFF = "Off"


def format_taint(taint: Mapping[str, Any]) -> str:
    """``{key=value:Effect}``, the way ``kubectl describe node`` prints a taint."""
    key = taint.get("key") or ""
    value = taint.get("value")
    return "{" + (f"{key}={value}" if value else key) + f":{taint.get('effect') or ''}" + "}"


def check_node(
    *, pod: PodInfo, node_name: str, node: NodeProjection | None, rm_name: str, mode: NodeCheckMode
) -> str | None:
    """``None`` if ``pod`` may be bound to ``node_name`` under ``mode``, else why not.

    ``node`` is the watch's projection of the node named ``node_name``, or ``None`` if the watch
    has no such node.
    """
    if mode is NodeCheckMode.OFF:
        return None
    chose = f'resource manager "{rm_name}" chose node "{node_name}", which'
    if node is None:
        return f"{chose} does not exist"
    if node.deleting:
        return f"{chose} is being deleted"
    if mode is NodeCheckMode.BASIC:
        return None
    return _full_checks(pod=pod, node=node, chose=chose)


def _full_checks(*, pod: PodInfo, node: NodeProjection, chose: str) -> str | None:
    if node.unschedulable and not _tolerates_cordon(pod.tolerations):
        return f"{chose} is cordoned (spec.unschedulable)"
    untolerated = untolerated_taints(taints=node.taints, tolerations=pod.tolerations)
    if untolerated:
        listed = ", ".join(format_taint(taint) for taint in untolerated)
        noun = "taint" if len(untolerated) == 1 else "taints"
        return f"{chose.removesuffix(', which')}, whose {noun} {listed} the pod does not tolerate"
    if not matches_node_selector(node_selector=pod.node_selector, labels=node.labels):
        return f"{chose} does not match the pod's nodeSelector"
    if not matches_required_affinity(terms=pod.affinity_terms, labels=node.labels, node_name=node.name):
        return f"{chose} does not match the pod's required node affinity"
    return None


def check_rules(verdict: Verdict, *, node_name: str, rm_name: str) -> str | None:
    """``None`` if the inter-pod rules allow ``node_name``, else which rule refuses it."""
    refusing = [effect.rule for effect in verdict.effects if node_name in effect.excluded]
    return rules_problem(refusing, node_name=node_name, rm_name=rm_name)


def rules_problem(refusing: Sequence[str], *, node_name: str, rm_name: str) -> str | None:
    """:func:`check_rules`'s answer from the rules that exclude ``node_name``."""
    if not refusing:
        return None
    return (
        f'resource manager "{rm_name}" chose node "{node_name}", which the pod\'s {" and ".join(refusing)} '
        "rules out (the RM did not honour the node constraints it was sent, or a pod placed meanwhile "
        "changed them)"
    )


def _tolerates_cordon(tolerations: Sequence[Mapping[str, Any]]) -> bool:
    return any(tolerates(toleration=t, taint=UNSCHEDULABLE_TAINT) for t in tolerations)
