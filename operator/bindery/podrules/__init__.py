"""Kubernetes' inter-pod placement rules, evaluated by Bindery (pure: no I/O, no Kubernetes client).

``model`` holds the slim projections, ``parse`` turns pod bodies into them, ``filters`` evaluates
InterPodAffinity, PodTopologySpread (DoNotSchedule) and NodePorts as kube-scheduler v1.36 does and
expresses the result as required node affinity the RM contract carries; ``soft`` scores the soft
rules (preferred pod affinity, ScheduleAnyway and default spreading) as weighted node preferences.
"""

from bindery.podrules.filters import Incoming, PlacedView, RuleEffect, Verdict, evaluate
from bindery.podrules.model import (
    AffinityTerm,
    HostPort,
    LabelSelector,
    PlacedPod,
    PodRules,
    SoftRules,
    SpreadConstraint,
    WeightedTerm,
)
from bindery.podrules.parse import placed_pod, pod_rules, soft_rules
from bindery.podrules.soft import Preferences, preferences

__all__ = [
    "AffinityTerm",
    "HostPort",
    "Incoming",
    "LabelSelector",
    "PlacedPod",
    "PlacedView",
    "PodRules",
    "Preferences",
    "RuleEffect",
    "SoftRules",
    "SpreadConstraint",
    "Verdict",
    "WeightedTerm",
    "evaluate",
    "placed_pod",
    "pod_rules",
    "preferences",
    "soft_rules",
]
