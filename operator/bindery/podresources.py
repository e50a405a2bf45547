"""The capacity a pod occupies on a node, computed as kube-scheduler and the kubelet compute it.

Two parts of Bindery need the same arithmetic and may not import each other: the scheduler asks the
resource manager for a pod's effective requests (``bindery.scheduling.podspec``), and the reference RM
counts the pods it did not place on the nodes it mirrors (``bindery.reference_rm.accounting``).  If the two
disagreed, a node would look fuller or emptier to the RM than to kube-scheduler, and either
overcommit or strand capacity.  So the one pure function lives here, below both, and follows
``PodRequests`` in ``k8s.io/component-helpers/resource`` (v0.36):

* the sum of the regular containers' requests, plus every sidecar (an init container with
  ``restartPolicy: Always``), which keeps running;
* at least, per resource, the peak of the init phase: each regular init container runs alone next to
  the sidecars started before it; each sidecar's start counts the sidecars so far;
* pod-level ``spec.resources.requests`` replace the result for cpu, memory and ``hugepages-*``
  (``IsSupportedPodLevelResource``);
* plus ``spec.overhead`` (RuntimeClass overhead).

For a pod already running on a node, kube-scheduler also reads the resources the kubelet reports
(in-place resize, ``UseStatusResources``): a container that is being resized occupies the larger of
its spec, its actuated and its allocated requests (only the latter two when the resize is
infeasible).  ``status`` enables that; a pod that is not running yet has no such status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from bindery.quantity import QuantityError, parse_quantity

__all__ = ["POD_LEVEL_RESOURCES", "PodResourcesError", "effective_requests", "is_pod_level_resource"]

#: Resources that ``spec.resources.requests`` (pod-level resources) may set, as in Kubernetes,
#: besides every ``hugepages-<size>`` (see :func:`is_pod_level_resource`).
POD_LEVEL_RESOURCES: frozenset[str] = frozenset({"cpu", "memory"})
_HUGEPAGES_PREFIX = "hugepages-"


def is_pod_level_resource(name: str) -> bool:
    """``IsSupportedPodLevelResource`` (component-helpers/resource, v1.34+): cpu, memory, hugepages-*."""
    return name in POD_LEVEL_RESOURCES or name.startswith(_HUGEPAGES_PREFIX)


ResourceList = dict[str, Decimal]


class PodResourcesError(ValueError):
    """A quantity in the pod cannot be parsed; the message names the container and resource."""


def _parse_list(values: Mapping[str, Any], *, what: str) -> ResourceList:
    parsed: ResourceList = {}
    for name, value in values.items():
        try:
            parsed[str(name)] = parse_quantity(value)
        except QuantityError as error:
            raise PodResourcesError(f"{what} has an invalid quantity for {name}: {error}") from None
    return parsed


def _add(target: ResourceList, addend: Mapping[str, Decimal]) -> None:
    for name, value in addend.items():
        target[name] = target.get(name, Decimal(0)) + value


def _max_into(target: ResourceList, other: Mapping[str, Decimal]) -> None:
    for name, value in other.items():
        current = target.get(name)
        if current is None or value > current:
            target[name] = value


def _sum(lists: Iterable[Mapping[str, Decimal]]) -> ResourceList:
    total: ResourceList = {}
    for item in lists:
        _add(total, item)
    return total


def _resize_infeasible(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodResizePending":
            return bool(condition.get("reason") == "Infeasible")
    return False


class _StatusResources:
    """The kubelet's view of each container's requests (``status.*ContainerStatuses``), by name."""

    def __init__(self, status: Mapping[str, Any] | None) -> None:
        self._by_name: dict[str, Mapping[str, Any]] = {}
        self._infeasible = False
        if status is None:
            return
        self._infeasible = _resize_infeasible(status)
        for key in ("containerStatuses", "initContainerStatuses"):
            for entry in status.get(key) or ():
                self._by_name[str(entry.get("name", ""))] = entry

    def effective(self, container: Mapping[str, Any], spec_requests: ResourceList) -> ResourceList:
        """``determineEffectiveRequests``: max(spec, actuated, allocated) when the kubelet reports them."""
        entry = self._by_name.get(str(container.get("name", "")))
        if entry is None or entry.get("resources") is None:
            return spec_requests
        what = f"the status of container {container.get('name', '?')!r}"
        actuated = _parse_list((entry.get("resources") or {}).get("requests") or {}, what=what)
        allocated = _parse_list(entry.get("allocatedResources") or {}, what=what)
        result: ResourceList = {} if self._infeasible else dict(spec_requests)
        _max_into(result, actuated)
        _max_into(result, allocated)
        return result


def _container_requests(container: Mapping[str, Any]) -> ResourceList:
    """A container's requests; a resource with only a limit requests its limit (apiserver defaulting)."""
    resources: Mapping[str, Any] = container.get("resources") or {}
    merged: dict[str, Any] = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return _parse_list(merged, what=f"container {container.get('name', '?')!r}")


def effective_requests(
    *, spec: Mapping[str, Any], status: Mapping[str, Any] | None = None
) -> dict[str, Decimal]:
    """The resources a pod with this spec occupies on a node, per resource name (any name).

    ``status`` (the pod's ``status``) is for pods already on a node: see the module docstring.
    Raises :class:`PodResourcesError` on an unparsable quantity.
    """
    reported = _StatusResources(status)
    requests = _sum(reported.effective(c, _container_requests(c)) for c in spec.get("containers") or ())
    sidecars: ResourceList = {}
    init_peak: ResourceList = {}
    for container in spec.get("initContainers") or ():
        own = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            own = reported.effective(container, own)
            _add(requests, own)
            _add(sidecars, own)
            phase = dict(sidecars)
        else:
            phase = _sum((own, sidecars))
        _max_into(init_peak, phase)
    _max_into(requests, init_peak)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for name, value in _parse_list(pod_level, what="spec.resources").items():
        if is_pod_level_resource(name):
            requests[name] = value
    _add(requests, _parse_list(spec.get("overhead") or {}, what="spec.overhead"))
    return requests
