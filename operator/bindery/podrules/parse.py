"""Pod body (Kubernetes JSON shape) → the rules it states, and → the projection other pods' rules read.

The label-key lists are merged into the selectors the way kube-scheduler v1.36 does it
(``pkg/scheduler/framework/types.go`` ``newAffinityTerm`` / ``mergeAffinityTermLabelSelector``
for ``matchLabelKeys`` and ``mismatchLabelKeys``; ``podtopologyspread/common.go``
``filterTopologySpreadConstraints`` for spread's ``matchLabelKeys``): a key the pod carries becomes
``key In (its value)`` (``NotIn`` for ``mismatchLabelKeys``); a key it does not carry is ignored.
The apiserver of 1.34+ already merged them at admission; merging again adds an identical
requirement, which selects the same pods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bindery.podrules.model import (
    NO_RULES,
    NO_SOFT,
    NOTHING,
    AffinityTerm,
    HostPort,
    LabelSelector,
    PlacedPod,
    PodRules,
    Requirement,
    SoftRules,
    SpreadConstraint,
    WeightedTerm,
)

__all__ = [
    "host_ports",
    "label_selector",
    "placed_pod",
    "placed_unchanged",
    "pod_rules",
    "soft_rules",
    "with_service_spread",
]

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
#: The owners whose pods kube-scheduler spreads by default (``helper.DefaultSelector`` reads the
#: selectors of ReplicationControllers, ReplicaSets and StatefulSets; Services are not watched here).
_SPREAD_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})
#: Labels a controller sets per pod or per revision, never in its selector: left out of the default
#: spreading selector so that it selects the owner's other pods.
_PER_POD_LABELS = frozenset(
    {
        "statefulset.kubernetes.io/pod-name",
        "apps.kubernetes.io/pod-index",
        "controller-revision-hash",
    }
)


def label_selector(raw: Mapping[str, Any] | None, *, extra: Sequence[Requirement] = ()) -> LabelSelector:
    """A metav1.LabelSelector plus ``extra`` requirements (merged label keys); ``None`` selects
    nothing, and label keys are merged only into a selector that is present, as upstream."""
    if raw is None:
        return NOTHING
    requirements = [
        Requirement(key=str(key), operator="In", values=(str(value),))
        for key, value in sorted((raw.get("matchLabels") or {}).items())
    ]
    for expression in raw.get("matchExpressions") or ():
        requirements.append(
            Requirement(
                key=str(expression.get("key") or ""),
                operator=str(expression.get("operator") or ""),
                values=tuple(str(v) for v in expression.get("values") or ()),
            )
        )
    requirements.extend(extra)
    return LabelSelector(requirements=tuple(requirements))


def _label_keys(keys: Sequence[Any] | None, labels: Mapping[str, str], operator: str) -> list[Requirement]:
    return [
        Requirement(key=str(key), operator=operator, values=(labels[str(key)],))
        for key in keys or ()
        if str(key) in labels
    ]


def _affinity_terms(
    raw_terms: Sequence[Mapping[str, Any]], labels: Mapping[str, str]
) -> tuple[AffinityTerm, ...]:
    terms = []
    for raw in raw_terms:
        selector_raw = raw.get("labelSelector")
        extra = [
            *_label_keys(raw.get("matchLabelKeys"), labels, "In"),
            *_label_keys(raw.get("mismatchLabelKeys"), labels, "NotIn"),
        ]
        namespace_selector = raw.get("namespaceSelector")
        terms.append(
            AffinityTerm(
                selector=label_selector(selector_raw, extra=extra) if selector_raw is not None else NOTHING,
                topology_key=str(raw.get("topologyKey") or ""),
                namespaces=frozenset(str(n) for n in raw.get("namespaces") or ()),
                namespace_selector=label_selector(namespace_selector)
                if namespace_selector is not None
                else None,
            )
        )
    return tuple(terms)


def _weighted_terms(
    raw_terms: Sequence[Mapping[str, Any]], labels: Mapping[str, str]
) -> tuple[WeightedTerm, ...]:
    terms = _affinity_terms([item.get("podAffinityTerm") or {} for item in raw_terms], labels)
    return tuple(
        WeightedTerm(weight=int(item.get("weight") or 0), term=term)
        for item, term in zip(raw_terms, terms, strict=True)
    )


def host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """The host ports of the pod's containers (NodePorts reads ``spec.containers`` only:
    ``nodeports/node_ports.go`` ``getContainerPorts``); a port without ``hostPort`` takes none."""
    found = []
    for container in spec.get("containers") or ():
        for port in container.get("ports") or ():
            number = int(port.get("hostPort") or 0)
            if number <= 0:
                continue
            found.append(
                HostPort(
                    port=number,
                    protocol=str(port.get("protocol") or "TCP"),
                    ip=str(port.get("hostIP") or "0.0.0.0"),
                )
            )
    return tuple(found)


def _labels(metadata: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}


def pod_rules(body: Mapping[str, Any]) -> PodRules:
    """The required inter-pod rules and host ports of a pod (``NO_RULES`` for most pods).

    Spread constraints with ``whenUnsatisfiable: ScheduleAnyway`` are preferences, not rules, and are
    not returned here.
    """
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    spec: Mapping[str, Any] = body.get("spec") or {}
    affinity: Mapping[str, Any] = spec.get("affinity") or {}
    raw_spread = spec.get("topologySpreadConstraints") or ()
    ports = host_ports(spec)
    pod_affinity = (affinity.get("podAffinity") or {}).get(_REQUIRED) or ()
    pod_anti = (affinity.get("podAntiAffinity") or {}).get(_REQUIRED) or ()
    if not (pod_affinity or pod_anti or raw_spread or ports):
        return NO_RULES
    labels = _labels(metadata)
    return PodRules(
        affinity=_affinity_terms(pod_affinity, labels),
        anti_affinity=_affinity_terms(pod_anti, labels),
        spread=_spread(raw_spread, labels, "DoNotSchedule"),
        host_ports=ports,
    )


def _spread(
    raw_spread: Sequence[Mapping[str, Any]], labels: Mapping[str, str], when: str
) -> tuple[SpreadConstraint, ...]:
    spread = []
    for raw in raw_spread:
        if raw.get("whenUnsatisfiable", "DoNotSchedule") != when:
            continue
        selector_raw = raw.get("labelSelector")
        extra = _label_keys(raw.get("matchLabelKeys"), labels, "In")
        spread.append(
            SpreadConstraint(
                max_skew=int(raw.get("maxSkew") or 1),
                topology_key=str(raw.get("topologyKey") or ""),
                selector=label_selector(selector_raw, extra=extra) if selector_raw is not None else NOTHING,
                min_domains=int(raw.get("minDomains") or 1),
                honor_node_affinity=raw.get("nodeAffinityPolicy", "Honor") != "Ignore",
                honor_taints=raw.get("nodeTaintsPolicy", "Ignore") == "Honor",
            )
        )
    return tuple(spread)


def soft_rules(body: Mapping[str, Any]) -> SoftRules:
    """The inter-pod rules a pod prefers (``NO_SOFT`` for most pods): preferred pod (anti-)affinity,
    ``ScheduleAnyway`` spread, and kube-scheduler's default spreading.

    Default spreading (``podtopologyspread/common.go`` ``buildDefaultConstraints``, defaults of
    ``pkg/scheduler/apis/config/v1``): a pod with no ``topologySpreadConstraints`` at all, whose
    controller is a ReplicaSet, StatefulSet or ReplicationController, is spread with the selector of
    that controller. Bindery does not watch controllers, so it uses the pod's own labels minus the
    per-pod ones (:data:`_PER_POD_LABELS`): a controller's pods share its template's labels, which its
    selector selects (a ReplicaSet's includes ``pod-template-hash``, kept here). Services selecting the
    pod (upstream's fourth source) are added at cycle time (:func:`with_service_spread`), since they
    change apart from the pod.
    """
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    spec: Mapping[str, Any] = body.get("spec") or {}
    affinity: Mapping[str, Any] = spec.get("affinity") or {}
    raw_spread = spec.get("topologySpreadConstraints") or ()
    preferred = (affinity.get("podAffinity") or {}).get(_PREFERRED) or ()
    preferred_anti = (affinity.get("podAntiAffinity") or {}).get(_PREFERRED) or ()
    owned = not raw_spread and any(
        owner.get("controller") and owner.get("kind") in _SPREAD_OWNERS
        for owner in metadata.get("ownerReferences") or ()
    )
    if not (preferred or preferred_anti or raw_spread or owned):
        return NO_SOFT
    labels = _labels(metadata)
    default_spread = None
    if owned:
        selected = {k: v for k, v in labels.items() if k not in _PER_POD_LABELS}
        if selected:
            default_spread = label_selector({"matchLabels": selected})
    soft = SoftRules(
        affinity=_weighted_terms(preferred, labels),
        anti_affinity=_weighted_terms(preferred_anti, labels),
        spread=_spread(raw_spread, labels, "ScheduleAnyway"),
        default_spread=default_spread,
    )
    return soft if soft else NO_SOFT  # only DoNotSchedule constraints: the shared empty value


def placed_pod(body: Mapping[str, Any], *, node: str | None = None) -> PlacedPod | None:
    """The projection of a pod on a node (``node`` overrides ``spec.nodeName``, for an assumed pod);
    ``None`` for a pod on no node, or one that finished (Succeeded/Failed pods hold nothing)."""
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    spec: Mapping[str, Any] = body.get("spec") or {}
    node_name = node or spec.get("nodeName")
    if not node_name or (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    labels = _labels(metadata)
    affinity: Mapping[str, Any] = spec.get("affinity") or {}
    pod_affinity: Mapping[str, Any] = affinity.get("podAffinity") or {}
    pod_anti: Mapping[str, Any] = affinity.get("podAntiAffinity") or {}
    anti = pod_anti.get(_REQUIRED) or ()
    return PlacedPod(
        uid=str(metadata.get("uid") or ""),
        namespace=str(metadata.get("namespace") or ""),
        node=str(node_name),
        labels=labels,
        host_ports=host_ports(spec),
        anti_affinity=_affinity_terms(anti, labels),
        affinity=_affinity_terms(pod_affinity.get(_REQUIRED) or (), labels),
        preferred_affinity=_weighted_terms(pod_affinity.get(_PREFERRED) or (), labels),
        preferred_anti_affinity=_weighted_terms(pod_anti.get(_PREFERRED) or (), labels),
        claims=_claims(str(metadata.get("name") or ""), spec.get("volumes") or ()),
        terminating=metadata.get("deletionTimestamp") is not None,
        assumed=node is not None,
        name=str(metadata.get("name") or ""),
        priority=int(spec.get("priority") or 0),
        group=str((spec.get("schedulingGroup") or {}).get("podGroupName") or ""),
    )


def placed_unchanged(projection: PlacedPod, body: Mapping[str, Any]) -> bool:
    """Whether :func:`placed_pod` of `body`, a later copy of the pod `projection` was made from,
    would give `projection` again: the same node, labels, namespace and priority, still running,
    and terminating or not as before.

    The rest of a PlacedPod comes from fields of the pod's spec the apiserver keeps as they were
    created (its affinity, ports and volumes; a pod's nodeName once set), and its terms
    resolve ``matchLabelKeys`` against the labels compared here. So the watch's many status writes
    of a bound pod are recognised without projecting it again: its terms parsed, per event.
    """
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    spec: Mapping[str, Any] = body.get("spec") or {}
    return (
        spec.get("nodeName") == projection.node
        and (body.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and (metadata.get("deletionTimestamp") is not None) == projection.terminating
        and (metadata.get("labels") or {}) == projection.labels
        and metadata.get("namespace") == projection.namespace
        and int(spec.get("priority") or 0) == projection.priority  # immutable too; cheap to compare
    )


def _claims(pod_name: str, volumes: Any) -> tuple[str, ...]:
    """The claim names of the pod's volumes; a generic ephemeral volume's claim is ``<pod>-<volume>``
    (upstream counts both as the pod's use of a claim: NodeInfo's PVCRefCounts)."""
    found = []
    for volume in volumes:
        if (source := volume.get("persistentVolumeClaim")) and source.get("claimName"):
            found.append(str(source["claimName"]))
        elif volume.get("ephemeral"):
            found.append(f"{pod_name}-{volume.get('name')}")
    return tuple(found)


def with_service_spread(
    soft: SoftRules, *, spread: bool, labels: Mapping[str, str], services: Iterable[Mapping[str, str]]
) -> SoftRules:
    """`soft` with the selectors of the Services selecting the pod ANDed into its default spreading
    (``helper.DefaultSelector``: the selectors of every Service selecting the pod, merged, then the
    owner's). `spread`: the pod states topology spread constraints (hard or soft): then, as
    upstream, no default spreading. Unchanged (the same object) when no Service selects the pod.
    """
    if spread or soft.spread:
        return soft
    merged: dict[str, str] = {}
    for service in services:
        if service and all(labels.get(key) == value for key, value in service.items()):
            merged.update(service)
    if not merged:
        return soft
    selector = label_selector({"matchLabels": merged})
    if soft.default_spread is not None:
        selector = LabelSelector(requirements=(*soft.default_spread.requirements, *selector.requirements))
    return dataclasses.replace(soft, default_spread=selector)
