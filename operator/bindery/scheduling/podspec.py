"""What the scheduler needs to know about a pod, and what it asks the resource manager for.

A pod body is large and changes often (every status write produces a new one).  The queue and the
cycle keep a small immutable :class:`PodInfo` instead: identity, priority and age for ordering, the
few flags that say whether the pod may be scheduled at all, and the pod's placement inputs already
reduced to what the RM contract carries (effective requests, nodeSelector, required node affinity,
tolerations, and the weighted preferred node affinity of contract v1.2).

:func:`effective_requests` computes the capacity a pod occupies exactly as the kubelet admits it
and kube-scheduler accounts it (``k8s.io/component-helpers/resource.PodRequests``): regular
containers run together, init containers one after another, restartable init containers
("sidecars", ``restartPolicy: Always``) keep running alongside everything started after them, pod
overhead is added on top, and pod-level requests (``spec.resources``) override cpu and memory.
Getting this wrong in either direction either overcommits nodes or strands capacity.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

import annotated_types
import pydantic

from bindery import podresources
from bindery.podresources import POD_LEVEL_RESOURCES
from bindery.podrules.model import NO_RULES, NO_SOFT, PodRules, SoftRules
from bindery.podrules.parse import pod_rules, soft_rules
from bindery.quantity import format_quantity
from bindery.rm.models import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Placement,
    PodIdentity,
    ReservationRequest,
)
from bindery.scheduling.devices.claims import ClaimWait, PodClaim
from bindery.scheduling.devices.claims import pod_claims as device_claims

__all__ = [
    "POD_LEVEL_RESOURCES",
    "PodInfo",
    "PodSpecError",
    "beyond_contract",
    "effective_requests",
    "reservation_request",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PodSpecError(ValueError):
    """A pod body cannot be turned into a reservation request (e.g. an unparsable quantity)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PodInfo:
    """An immutable projection of a pod: identity, queue order, schedulability and placement inputs."""

    uid: str
    namespace: str
    name: str
    scheduler_name: str
    priority: int = 0
    created: datetime = _EPOCH
    node_name: str | None = None
    deleting: bool = False
    gated: bool = False
    requests: Mapping[str, Decimal] = dataclasses.field(default_factory=dict)
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    affinity_terms: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    #: ``preferredDuringSchedulingIgnoredDuringExecution`` of the pod's node affinity, as
    #: ``(weight, nodeSelectorTerm)``: contract v1.2's ``placement.preferredNodeAffinity``.
    preferred_terms: tuple[tuple[int, Mapping[str, Any]], ...] = ()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: ``(reason, message)`` of the pod's current ``PodScheduled=False`` condition, if any, so that
    #: the cycle can skip rewriting an identical condition.
    unschedulable_condition: tuple[str, str] | None = None
    #: ``metadata.resourceVersion`` of the copy this projection was made from; events name it in
    #: ``regarding`` as kube-scheduler's do. Not a placement input: a status write changes it.
    resource_version: str | None = None
    #: ``metadata.generation`` (bumped by spec changes): PodScheduled's ``observedGeneration``.
    generation: int | None = None
    #: The PersistentVolumeClaims the pod uses, by name (an ephemeral volume's claim is
    #: ``<pod>-<volume>``, as the ephemeral-volume controller names it).
    claims: tuple[str, ...] = ()
    #: The DRA ResourceClaims the pod uses (``spec.resourceClaims``), or why it waits for one (a
    #: template's claim not created yet): the DynamicResources plugin's input.
    device_claims: tuple[PodClaim, ...] | ClaimWait = ()
    #: ``spec.schedulingGroup.podGroupName``: the PodGroup (same namespace) this pod is a member
    #: of; such a pod is placed with its group (bindery.controller.podgroups), never on its own.
    scheduling_group: str | None = None
    #: Required pod (anti-)affinity, DoNotSchedule spread and host ports (bindery.podrules);
    #: ``NO_RULES`` for most pods.
    rules: PodRules = NO_RULES
    #: Preferred pod (anti-)affinity, ScheduleAnyway spread and default spreading: weighted node
    #: preferences (bindery.podrules.soft); ``NO_SOFT`` for most pods.
    soft: SoftRules = NO_SOFT
    #: ``spec.preemptionPolicy`` (the apiserver defaults it): contract v1.2's ``preemptionPolicy``.
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"
    #: ``status.nominatedNodeName``: where a preemption plan holds room for the pod (not a
    #: placement input: a status write is no reason to retry).
    nominated_node: str | None = None

    @property
    def key(self) -> str:
        """``namespace/name``, the way kube-scheduler names a pod in messages."""
        return f"{self.namespace}/{self.name}"

    @property
    def schedulable(self) -> bool:
        """Whether the pod may be scheduled now: unbound, not terminating, no scheduling gates."""
        return not self.node_name and not self.deleting and not self.gated

    def placement_inputs(self) -> tuple[object, ...]:
        """Everything that can change where (or whether) the pod fits.

        An update that leaves this unchanged (a status write, an annotation) is no reason to retry a
        pod that was found unschedulable; one that changes it is.
        """
        return (
            self.priority,
            # Labels: existing pods' anti-affinity and spread selectors read them (PodPlacementRules).
            tuple(sorted(self.labels.items())),
            tuple(sorted(self.requests.items())),
            tuple(sorted(self.node_selector.items())),
            repr(self.affinity_terms),
            repr(self.tolerations),
            repr(self.preferred_terms),
            self.gated,
            self.rules,
            self.soft,
            # pod.status.resourceClaimStatuses naming a template's claim: the pod may go on.
            self.device_claims,
        )

    @classmethod
    def slim(cls, body: Mapping[str, Any]) -> PodInfo:
        """Only what identifies the pod, orders it and says whether it is pending: no placement
        inputs. For a pod that is refused (see :func:`beyond_contract`): its spec is not copied."""
        metadata: Mapping[str, Any] = body.get("metadata") or {}
        spec: Mapping[str, Any] = body.get("spec") or {}
        return cls(
            uid=str(metadata.get("uid") or ""),
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
            priority=int(spec.get("priority") or 0),
            created=_timestamp(metadata.get("creationTimestamp")),
            node_name=str(spec.get("nodeName")) if spec.get("nodeName") else None,
            deleting=metadata.get("deletionTimestamp") is not None,
            gated=bool(spec.get("schedulingGates")),
            resource_version=str(metadata["resourceVersion"]) if metadata.get("resourceVersion") else None,
            generation=int(metadata["generation"]) if metadata.get("generation") else None,
        )

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodInfo:
        """Project a pod in Kubernetes JSON shape (camelCase), as a Kopf handler receives it.

        Raises :class:`PodSpecError` if a resource quantity cannot be parsed (the apiserver
        validates them, so this means the body did not come from an apiserver).
        """
        metadata: Mapping[str, Any] = body.get("metadata") or {}
        spec: Mapping[str, Any] = body.get("spec") or {}
        status: Mapping[str, Any] = body.get("status") or {}
        node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        affinity = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
        preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
        return cls(
            uid=str(metadata.get("uid") or ""),
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
            priority=int(spec.get("priority") or 0),
            created=_timestamp(metadata.get("creationTimestamp")),
            node_name=str(spec.get("nodeName")) if spec.get("nodeName") else None,
            deleting=metadata.get("deletionTimestamp") is not None,
            gated=bool(spec.get("schedulingGates")),
            requests=effective_requests(spec=spec),
            node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
            affinity_terms=tuple(dict(term) for term in affinity.get("nodeSelectorTerms") or ()),
            tolerations=tuple(dict(toleration) for toleration in spec.get("tolerations") or ()),
            preferred_terms=tuple(
                (int(item.get("weight") or 0), dict(item.get("preference") or {})) for item in preferred
            ),
            labels={str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
            preemption_policy="Never" if spec.get("preemptionPolicy") == "Never" else "PreemptLowerPriority",
            unschedulable_condition=_unschedulable_condition(status),
            nominated_node=str(status.get("nominatedNodeName") or "") or None,
            resource_version=str(metadata["resourceVersion"]) if metadata.get("resourceVersion") else None,
            generation=int(metadata["generation"]) if metadata.get("generation") else None,
            claims=pod_claims(name=str(metadata.get("name") or ""), volumes=spec.get("volumes") or ()),
            device_claims=device_claims(body),
            scheduling_group=str(group)
            if (group := (spec.get("schedulingGroup") or {}).get("podGroupName"))
            else None,
            rules=pod_rules(body),
            soft=soft_rules(body),
        )


@functools.cache
def max_items(model: type[pydantic.BaseModel], field: str) -> int:
    """The contract's cap on the length of `model.field` (its ``max_length``), read from the model
    so that the check here and the validation of the request cannot disagree (once per field: a
    rules pod's caps are checked per requirement, and the read walks pydantic's field info)."""
    for constraint in model.model_fields[field].metadata:
        if isinstance(constraint, annotated_types.MaxLen):
            return int(constraint.max_length)
    raise LookupError(f"{model.__name__}.{field} has no max_length")


#: (path in the pod, contract model, field) of every list or map of a pod that the reservation
#: request carries, with the cap contract v1 puts on its length.
_CAPPED: tuple[tuple[str, type[pydantic.BaseModel], str], ...] = (
    ("spec.tolerations", Placement, "tolerations"),
    ("spec.nodeSelector", Placement, "node_selector"),
    ("metadata.labels", PodIdentity, "labels"),
    (
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
        Placement,
        "required_node_affinity",
    ),
    (
        "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
        Placement,
        "preferred_node_affinity",
    ),
)


def beyond_contract(body: Mapping[str, Any]) -> str | None:
    """Pure: why the pod cannot be carried by a reservation request of contract v1, or None.

    A pod with DRA ``spec.resourceClaims`` is not refused here: the DynamicResources plugin has
    its claims allocated through the RM (contract v1.3 ``devices``), and the RM client refuses
    them, as unschedulable, for an RM that does not offer the feature.

    Only counts are read (nothing is copied), so that a pod with 20,000 tolerations (1.5 MB of JSON)
    is refused without being projected: a projection would keep every one of them for as long as
    the pod waits. The caps are the contract's own (``rm/models.py``); a pod past one could never be
    reserved, and trying would fail every cycle with a validation error.
    """
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    spec: Mapping[str, Any] = body.get("spec") or {}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    values: dict[str, Any] = {
        "spec.tolerations": spec.get("tolerations"),
        "spec.nodeSelector": spec.get("nodeSelector"),
        "metadata.labels": metadata.get("labels"),
        _CAPPED[3][0]: required.get("nodeSelectorTerms"),
        _CAPPED[4][0]: preferred,
    }
    for path, model, field in _CAPPED:
        found = len(values[path] or ())
        cap = max_items(model, field)
        if found > cap:
            return _too_many(path=path, found=found, cap=cap)
    terms = [(f"{_CAPPED[3][0]}[{i}]", term) for i, term in enumerate(values[_CAPPED[3][0]] or ())]
    terms += [
        (f"{_CAPPED[4][0]}[{i}].preference", item.get("preference") or {}) for i, item in enumerate(preferred)
    ]
    for term_path, term in terms:
        for key, field in (("matchExpressions", "match_expressions"), ("matchFields", "match_fields")):
            requirements = term.get(key) or ()
            if len(requirements) > (cap := max_items(NodeSelectorTerm, field)):
                return _too_many(path=f"{term_path}.{key}", found=len(requirements), cap=cap)
            for j, requirement in enumerate(requirements):
                found = len(requirement.get("values") or ())
                if found > (cap := max_items(NodeSelectorRequirement, "values")):
                    return _too_many(path=f"{term_path}.{key}[{j}].values", found=found, cap=cap)
    return None


def _too_many(*, path: str, found: int, cap: int) -> str:
    return (
        f"{path} has {found} entries, more than the {cap} that a reservation request of the resource "
        f"manager contract (v1) carries, so Bindery cannot ask for room for this pod; recreate it with "
        f"at most {cap}"
    )


def pod_claims(*, name: str, volumes: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The claim names of pod `name`'s volumes (an ephemeral volume's claim is `<pod>-<volume>`)."""
    claims: list[str] = []
    for volume in volumes:
        if (source := volume.get("persistentVolumeClaim")) and source.get("claimName"):
            claims.append(str(source["claimName"]))
        elif volume.get("ephemeral"):
            claims.append(f"{name}-{volume.get('name')}")
    return tuple(claims)


def _timestamp(value: object) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and value:
        parsed = datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return _EPOCH


def _unschedulable_condition(status: Mapping[str, Any]) -> tuple[str, str] | None:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return (str(condition.get("reason") or ""), str(condition.get("message") or ""))
    return None


def effective_requests(*, spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """The resources a pod with this spec occupies on a node, per resource name (any name).

    The arithmetic is :func:`bindery.podresources.effective_requests` (``PodRequests`` of
    ``k8s.io/component-helpers/resource``), shared with the reference RM, which counts the pods it
    did not place the same way.  Raises :class:`PodSpecError` on an unparsable quantity.
    """
    try:
        return podresources.effective_requests(spec=spec)
    except podresources.PodResourcesError as error:
        raise PodSpecError(str(error)) from None


def reservation_request(
    *,
    pod: PodInfo,
    ttl_seconds: int,
    required_node_affinity: Sequence[Mapping[str, Any]] | None = None,
    preferred_node_affinity: Sequence[tuple[int, Mapping[str, Any]]] | None = None,
) -> ReservationRequest:
    """The RM request that reserves room for ``pod``; the pod UID is the idempotency key.

    Using the UID (not namespace/name) means a retry after a lost response gets the same
    reservation back, while a recreated pod of the same name gets a new one.
    ``required_node_affinity``: the nodeSelectorTerms to send instead of the pod's own (the cycle
    ANDs PreFilter constraints such as volume topology into them).
    ``preferred_node_affinity``: the ``(weight, nodeSelectorTerm)`` preferences to send instead of the
    pod's own (the cycle adds the soft inter-pod rules' to them).
    """
    terms = pod.affinity_terms if required_node_affinity is None else required_node_affinity
    fields: dict[str, Any] = {
        "nodeSelector": dict(pod.node_selector),
        "requiredNodeAffinity": [dict(term) for term in terms],
        "tolerations": [_contract_toleration(t) for t in pod.tolerations],
    }
    preferred = pod.preferred_terms if preferred_node_affinity is None else preferred_node_affinity
    if preferred:
        # Contract v1.2 (feature node-preferences): the client leaves it out for an RM without it.
        fields["preferredNodeAffinity"] = [
            {"weight": weight, "preference": dict(term)} for weight, term in preferred
        ]
    placement = Placement.model_validate(fields)
    return ReservationRequest(
        pod=PodIdentity(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            scheduler_name=pod.scheduler_name,
            priority=pod.priority,
            labels=dict(pod.labels),
        ),
        resources={name: format_quantity(value) for name, value in sorted(pod.requests.items())},
        placement=placement,
        idempotency_key=pod.uid,
        ttl_seconds=ttl_seconds,
        # Contract v1.2 (feature preemption): the client leaves it out for an RM without it.
        preemption_policy=pod.preemption_policy,
    )


_TOLERATION_FIELDS: Sequence[str] = ("key", "operator", "value", "effect", "tolerationSeconds")


def _contract_toleration(toleration: Mapping[str, Any]) -> dict[str, Any]:
    """A toleration restricted to the fields of contract v1 (Kubernetes may add more)."""
    return {field: toleration[field] for field in _TOLERATION_FIELDS if toleration.get(field) is not None}
