"""Kubernetes implementations of the scheduling ports, over the raw apiserver layer (bindery.apiserver).

Each port does exactly one apiserver call on its success path and reads nothing: the cycle already
holds the pod from the watch, so the success path costs the Binding and the Scheduled event only.
Reads happen only to disambiguate a failure (a 409 on bind). Every write goes through `WriteCounter`
so the demo and tests can report writes per bound pod without scraping apiserver metrics.
"""

from bindery.adapters.binder import KubeBinder
from bindery.adapters.conditions import KubeConditionWriter
from bindery.adapters.counters import WriteCounter
from bindery.adapters.devices import KubeDevices
from bindery.adapters.events import KubeEventSink, reporting_instance
from bindery.adapters.lookups import NodeCache, UnboundPods
from bindery.adapters.placed import PlacedPodCache
from bindery.adapters.volumes import KubeVolumes

__all__ = [
    "KubeBinder",
    "KubeConditionWriter",
    "KubeDevices",
    "KubeEventSink",
    "KubeVolumes",
    "NodeCache",
    "PlacedPodCache",
    "UnboundPods",
    "WriteCounter",
    "reporting_instance",
]
