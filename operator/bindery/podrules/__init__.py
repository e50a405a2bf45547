"""Kubernetes' inter-pod placement rules, evaluated by Bindery (pure: no I/O, no Kubernetes client).

``model`` holds the slim projections, ``parse`` turns pod bodies into them, ``filters`` evaluates
InterPodAffinity, PodTopologySpread (DoNotSchedule) and NodePorts as kube-scheduler v1.36 does and
expresses the result as required node affinity the RM contract carries.
"""

from bindery.podrules.filters import Incoming, PlacedView, RuleEffect, Verdict, evaluate
from bindery.podrules.model import (
    AffinityTerm,
    HostPort,
    LabelSelector,
    PlacedPod,
    PodRules,
    SpreadConstraint,
)
from bindery.podrules.parse import placed_pod, pod_rules

__all__ = [
    "AffinityTerm",
    "HostPort",
    "Incoming",
    "LabelSelector",
    "PlacedPod",
    "PlacedView",
    "PodRules",
    "RuleEffect",
    "SpreadConstraint",
    "Verdict",
    "evaluate",
    "placed_pod",
    "pod_rules",
]
