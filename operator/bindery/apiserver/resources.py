"""One constant per API resource Bindery reads or writes, and the paths to reach them.

The raw layer speaks REST paths rather than ``kubernetes_asyncio``'s generated methods (one per
verb, resource and scope: ``list_namespaced_pod``, ``list_pod_for_all_namespaces``...), so a list,
a watch or a get of any resource is one function. Before this module the ResourceManager CRD's
group, version and plural were spelled in five places.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import quote

__all__ = [
    "CLUSTER_ROLES",
    "CLUSTER_ROLE_BINDINGS",
    "CRDS",
    "CSI_NODES",
    "DAEMON_SETS",
    "DEPLOYMENTS",
    "DEVICE_CLASSES",
    "EVENTS",
    "EVENTS_V1",
    "JOBS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODGROUPS",
    "PODS",
    "POD_DISRUPTION_BUDGETS",
    "POD_PAGE_SIZE",
    "PVCS",
    "PVS",
    "RESOURCE_CLAIMS",
    "RESOURCE_MANAGERS",
    "RESOURCE_SLICES",
    "SECRETS",
    "SERVICES",
    "STORAGE_CLASSES",
    "Resource",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Resource:
    """An API resource: ``group`` "" is the core API (``/api/v1``)."""

    group: str
    version: str
    plural: str
    namespaced: bool
    kind: str = ""
    #: Objects per page of a LIST (``limit``) unless the caller says otherwise: what one page holds
    #: at once, parsed, on top of what the caller keeps.
    page_size: int = 500

    @property
    def api_version(self) -> str:
        """What objects of this resource say in ``apiVersion``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        """Pure: the URL path of the collection (in `namespace`; None = all namespaces, or cluster
        scope), of the object `name`, or of its `subresource` (``status``, ``binding``)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace is not None:
            if not self.namespaced:
                raise ValueError(f"{self.plural} are cluster-scoped: no namespace {namespace!r}")
            prefix += f"/namespaces/{quote(namespace, safe='')}"
        elif name is not None and self.namespaced:
            raise ValueError(f"{self.plural} are namespaced: a name needs its namespace")
        path = f"{prefix}/{self.plural}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
            if subresource:
                path += f"/{subresource}"
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return path


#: Pods per page of a pod LIST. Any namespace user may create pods of up to about 1.5 MB (etcd's
#: request limit) with `spec.nodeName` preset, and a page is parsed whole (JSON of 37 KB becomes
#: about 0.4 MB of objects): pages of 500 pods of 75 KB kept the operator's RSS 135 MB up after a
#: reconcile pass (benchmarks/tenant_memory.py --preset-tolerations 1000). 50 holds a tenth of
#: that at once, for ten times the requests of a large list (a pass over 10,000 bound pods of one
#: name: 200 requests instead of 20, each small for ordinary pods). It bounds the count, not the
#: bytes: 50 pods of 1.5 MB are still 75 MB of JSON.
POD_PAGE_SIZE = 50
PODS = Resource("", "v1", "pods", True, "Pod", page_size=POD_PAGE_SIZE)
NODES = Resource("", "v1", "nodes", False, "Node")
NAMESPACES = Resource("", "v1", "namespaces", False, "Namespace")
EVENTS = Resource("", "v1", "events", True, "Event")
SECRETS = Resource("", "v1", "secrets", True, "Secret")
SERVICES = Resource("", "v1", "services", True, "Service")
PVCS = Resource("", "v1", "persistentvolumeclaims", True, "PersistentVolumeClaim")
PVS = Resource("", "v1", "persistentvolumes", False, "PersistentVolume")
EVENTS_V1 = Resource("events.k8s.io", "v1", "events", True, "Event")
LEASES = Resource("coordination.k8s.io", "v1", "leases", True, "Lease")
STORAGE_CLASSES = Resource("storage.k8s.io", "v1", "storageclasses", False, "StorageClass")
CSI_NODES = Resource("storage.k8s.io", "v1", "csinodes", False, "CSINode")
DAEMON_SETS = Resource("apps", "v1", "daemonsets", True, "DaemonSet")
DEPLOYMENTS = Resource("apps", "v1", "deployments", True, "Deployment")
JOBS = Resource("batch", "v1", "jobs", True, "Job")
POD_DISRUPTION_BUDGETS = Resource("policy", "v1", "poddisruptionbudgets", True, "PodDisruptionBudget")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", False, "ClusterRole")
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", False, "ClusterRoleBinding"
)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False, "CustomResourceDefinition")
#: Bindery's own configuration (crds/resourcemanagers.bindery.dev.yaml).
RESOURCE_MANAGERS = Resource("bindery.dev", "v1alpha1", "resourcemanagers", False, "ResourceManager")
#: Gang scheduling's PodGroups (KEP-4671 workload API, see bindery.scheduling.podgroups).
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", True, "ResourceClaim")
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", False, "DeviceClass")
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", False, "ResourceSlice")
PODGROUPS = Resource("scheduling.k8s.io", "v1alpha2", "podgroups", True, "PodGroup")
