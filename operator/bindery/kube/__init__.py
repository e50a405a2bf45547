"""Kubernetes implementations of the scheduling ports, over the raw apiserver layer (bindery.k8s).

Each port does exactly one apiserver call on its success path and reads nothing: the cycle already
holds the pod from the watch, so the success path costs the Binding and the Scheduled event only.
Reads happen only to disambiguate a failure (a 409 on bind). Every write goes through `WriteCounter`
so the demo and tests can report writes per bound pod without scraping apiserver metrics.
"""

from bindery.kube.binder import KubeBinder
from bindery.kube.conditions import KubeConditionWriter
from bindery.kube.counters import WriteCounter
from bindery.kube.events import KubeEventSink, reporting_instance
from bindery.kube.lookups import IndexNodeLookup, UnboundPods, project_node
from bindery.kube.placed import PlacedPodCache
from bindery.kube.volumes import KubeVolumes

__all__ = [
    "IndexNodeLookup",
    "KubeBinder",
    "KubeConditionWriter",
    "KubeEventSink",
    "KubeVolumes",
    "PlacedPodCache",
    "UnboundPods",
    "WriteCounter",
    "project_node",
    "reporting_instance",
]
