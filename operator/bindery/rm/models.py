"""Typed models of the resource-manager contract v1 (``contract/v1/openapi.yaml``).

The OpenAPI document is the source of truth; these pydantic models mirror it so that the operator's
client and the reference RM validate the same shapes.  JSON uses camelCase; Python code builds models
with snake_case names (``populate_by_name``).

Two deliberate asymmetries keep v1 evolvable:

* request models forbid unknown fields, so a server rejects a field it does not understand instead
  of silently ignoring it (a newer client learns at once that the server is older);
* response models ignore unknown fields, so a newer server can add fields (for example a group id
  for gang reservations) without breaking older clients.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from bindery.quantity import QuantityError, format_quantity, parse_nonnegative_quantity

__all__ = [
    "CONTRACT_VERSION",
    "FEATURES_HEADER",
    "MAX_BATCH_OPERATIONS",
    "MAX_DEVICE_CLAIMS",
    "MAX_GROUP_MEMBERS",
    "MAX_GROUP_TOPOLOGY_KEYS",
    "MAX_RULE_VICTIMS",
    "BatchOperation",
    "BatchOperationResult",
    "BatchRequest",
    "BatchResult",
    "ClaimAllocation",
    "ClaimDevices",
    "ClaimRef",
    "ClusterId",
    "ContractInfo",
    "DeviceConstraint",
    "DeviceReason",
    "DeviceRequest",
    "DeviceResult",
    "DeviceSubRequest",
    "Feature",
    "GroupIdentity",
    "GroupMemberRequest",
    "GroupRenewRequest",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "Placement",
    "PodIdentity",
    "PreferredSchedulingTerm",
    "Problem",
    "RenewRequest",
    "Reservation",
    "ReservationGroup",
    "ReservationGroupRequest",
    "ReservationList",
    "ReservationRef",
    "ReservationRequest",
    "ReservationState",
    "RulePreemption",
    "RuleVictim",
    "Toleration",
    "TopologyConstraint",
    "is_qualified_name",
]

#: The contract version these models implement (``info.version`` of the OpenAPI document).
CONTRACT_VERSION = "1.2.4"
#: The most members one reservation group may have (contract v1.1).
MAX_GROUP_MEMBERS = 1000
#: The most topology constraints one reservation group may have (contract v1.1).
MAX_GROUP_TOPOLOGY_KEYS = 8
#: The most victims one ``rulePreemption`` entry may name (contract v1.2.4).
MAX_RULE_VICTIMS = 100
#: The most operations one ``POST /v1/batch`` may carry (contract v1.1).
MAX_BATCH_OPERATIONS = 500

_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def is_qualified_name(name: str) -> bool:
    """A Kubernetes qualified name: ``[dns-subdomain-prefix/]name``, name at most 63 characters.

    Resource names (``cpu``, ``nvidia.com/gpu``, ``hugepages-2Mi``) and label keys use this grammar.
    """
    prefix, slash, local = name.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not all(_DNS_LABEL.match(p) for p in prefix.split("."))):
        return False
    return 0 < len(local) <= 63 and _NAME.match(local) is not None


def _check_resource_name(name: str) -> str:
    if not is_qualified_name(name):
        raise ValueError(
            f"{name!r} is not a valid resource name: use a Kubernetes qualified name such as 'cpu', "
            "'memory' or 'nvidia.com/gpu' (optional DNS prefix, then at most 63 alphanumerics, '-', '_', '.')"
        )
    return name


def _integral(value: object) -> object:
    """JSON has one number type: accept ``30.0`` as the integer 30 (as JSON Schema does), never ``30.5``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


ResourceName = Annotated[str, AfterValidator(_check_resource_name)]
Integer = Annotated[int, BeforeValidator(_integral)]
ShortText = Annotated[str, Field(min_length=1, max_length=253)]
LabelValue = Annotated[str, Field(max_length=63)]


ClusterId = Annotated[str, Field(min_length=1, max_length=253)]


class Feature(enum.StrEnum):
    """The optional features an RM lists in ``GET /v1/info`` (contract v1.2).

    A client sends a field of v1.2 or later only when the feature that defines it is listed, so an
    RM never sees a field it does not know; features a client does not know are ignored.
    """

    RENEW = "renew"  # v1.1
    RESERVATION_GROUPS = "reservation-groups"  # v1.1
    BATCH = "batch"  # v1.1
    CLUSTER_ID = "cluster-id"  # v1.2: clusterId on reserve, group reserve, reservations and the list
    #: v1.2: ``placement.preferredNodeAffinity``, and PreferNoSchedule taints scored against the
    #: tolerations the request already carries.
    NODE_PREFERENCES = "node-preferences"
    #: v1.2: tolerations with operator ``Gt`` or ``Lt`` (Kubernetes 1.35+), matched numerically.
    TOLERATION_COMPARISONS = "toleration-comparisons"
    #: v1.2: ``preemptionPolicy`` on reserve, a preemption plan on an Unschedulable answer, and
    #: ``POST /v1/preemptions/{planId}:confirm`` / ``:cancel``.
    PREEMPTION = "preemption"
    #: v1.2: ``preemptionPolicy`` on a group reserve, one plan for the whole group (victims on
    #: several nodes, ``members`` with their nodes) on its Unschedulable answer.
    GROUP_PREEMPTION = "group-preemption"
    #: v1.2: state ``revoked`` (with ``revokedReason``, ``revokedAt``): the RM took a committed or
    #: reserved reservation back. Shown only to a request carrying ``Bindery-Features: revocation``
    #: (:data:`FEATURES_HEADER`); any other caller sees such a reservation as ``released``.
    REVOCATION = "revocation"
    #: v1.2: ``rulePreemption`` on reserve: nodes where a plan may be proposed (with named victims)
    #: but the pod not placed, for kube-scheduler's preemption for an inter-pod rule.
    RULE_PREEMPTION = "rule-preemption"
    #: v1.3: ``devices`` on reserve and on group members (DRA claims still to allocate), the
    #: devices the RM chose on the answer, and per-request reasons on an Unschedulable answer.
    DEVICES = "devices"


#: The request header by which a client names the v1.2 features whose answers it understands
#: (comma-separated). Only ``revocation`` changes answers today: without it a revoked reservation
#: reads ``released``, so a v1.1 caller never meets a state it does not know.
FEATURES_HEADER = "Bindery-Features"


class _Request(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )


class _Response(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class PodIdentity(_Request):
    """Who the reservation is for.  The scheduler name lets several Bindery profiles share one RM."""

    uid: ShortText
    namespace: ShortText
    name: ShortText
    scheduler_name: ShortText
    priority: Integer = Field(default=0, ge=-(2**31), le=2**31 - 1)
    labels: dict[Annotated[str, Field(max_length=317)], LabelValue] = Field(
        default_factory=dict, max_length=256
    )


class Toleration(_Request):
    """A pod toleration in Kubernetes JSON shape."""

    key: Annotated[str, Field(max_length=317)] | None = None
    #: ``Gt`` and ``Lt`` are v1.2 (feature ``toleration-comparisons``): sent only to an RM listing it.
    operator: Literal["Equal", "Exists", "Gt", "Lt"] | None = None
    value: LabelValue | None = None
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Integer | None = None


class NodeSelectorRequirement(_Request):
    key: Annotated[str, Field(min_length=1, max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[Annotated[str, Field(max_length=317)]] = Field(default_factory=list, max_length=256)


class NodeSelectorTerm(_Request):
    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=64)
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=64)


class PreferredSchedulingTerm(_Request):
    """Contract v1.2 (feature ``node-preferences``): a node matching ``preference`` gets ``weight``.

    Kubernetes' ``preferredDuringSchedulingIgnoredDuringExecution`` item, with its meaning: an RM
    adds the weights of the terms a feasible node matches, and prefers the nodes with more.
    """

    weight: Integer = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class Placement(_Request):
    """The pod's hard placement constraints, and (v1.2) its weighted node preferences."""

    node_selector: dict[Annotated[str, Field(max_length=317)], LabelValue] = Field(
        default_factory=dict, max_length=256
    )
    required_node_affinity: list[NodeSelectorTerm] = Field(default_factory=list, max_length=64)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=256)
    #: v1.2 (feature ``node-preferences``): soft, weighted node terms. ``None`` (absent) is not the
    #: same as ``[]`` only in that it is left out of the JSON, so a v1.1 RM never sees the field
    #: and fingerprints of requests without it are those of v1.1.
    preferred_node_affinity: list[PreferredSchedulingTerm] | None = Field(default=None, max_length=64)

    @model_serializer(mode="wrap")
    def _omit_absent_preferences(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.preferred_node_affinity is None:
            data.pop("preferredNodeAffinity", None)
            data.pop("preferred_node_affinity", None)
        return data

    def affinity_terms(self) -> list[dict[str, Any]]:
        """The nodeSelectorTerms as plain dicts for :mod:`bindery.constraints`."""
        return [term.model_dump(by_alias=True, exclude_none=True) for term in self.required_node_affinity]

    def toleration_dicts(self) -> list[dict[str, Any]]:
        return [toleration.model_dump(by_alias=True, exclude_none=True) for toleration in self.tolerations]

    def preference_dicts(self) -> list[tuple[int, dict[str, Any]]]:
        """The preferred terms as ``(weight, nodeSelectorTerm as a plain dict)``."""
        return [
            (term.weight, term.preference.model_dump(by_alias=True, exclude_none=True))
            for term in self.preferred_node_affinity or ()
        ]

    def compares_tolerations(self) -> bool:
        """Whether a toleration uses ``Gt`` or ``Lt`` (v1.2, feature ``toleration-comparisons``)."""
        return any(toleration.operator in ("Gt", "Lt") for toleration in self.tolerations)


def _check_quantities(resources: dict[str, str]) -> dict[str, str]:
    for name, value in resources.items():
        try:
            parse_nonnegative_quantity(value, what=f"request for {name}")
        except QuantityError as error:
            raise ValueError(str(error)) from None
    return resources


Resources = Annotated[
    dict[ResourceName, Annotated[str, Field(max_length=64)]],
    Field(max_length=128),
    AfterValidator(_check_quantities),
]


class _Resourced(_Request):
    """A request for one pod's resources: the quantities as numbers, and in canonical form.

    The field itself is declared by each subclass, so that it keeps its place in the JSON (the
    reference RM stores fingerprints, which must not change across versions).
    """

    if TYPE_CHECKING:
        resources: dict[str, str]

    def requested(self) -> dict[str, Decimal]:
        """The requests as exact numbers (already validated, so this cannot fail)."""
        return {name: parse_nonnegative_quantity(value) for name, value in self.resources.items()}

    def canonical_resources(self) -> dict[str, str]:
        """Quantities by value and names sorted, so ``"1000m"`` and ``"1"`` compare equal."""
        return {name: format_quantity(value) for name, value in sorted(self.requested().items())}


class RuleVictim(_Request):
    """A pod a rule preemption names (v1.2, feature ``rule-preemption``)."""

    namespace: ShortText
    name: ShortText
    uid: ShortText


class RulePreemption(_Request):
    """v1.2 (feature ``rule-preemption``): a node the pod's inter-pod rules (topology spread, pod
    anti-affinity, host ports) exclude only because of the lower-priority pods ``victims``. The RM
    may propose a plan there, with every one of them among its victims (plus any it needs for room),
    but must never place the pod there: only the caller knows which pods a rule needs gone."""

    node: Annotated[str, Field(min_length=1, max_length=253)]
    victims: list[RuleVictim] = Field(min_length=1, max_length=MAX_RULE_VICTIMS)


#: A CEL expression as a DeviceSelector carries it (Kubernetes caps them at 10 KiB).
CelExpression = Annotated[str, Field(min_length=1, max_length=10_240)]

#: Contract v1.3 (feature ``devices``): at most this many claims in one request's ``devices``.
MAX_DEVICE_CLAIMS = 32


class ClaimRef(_Request):
    """Contract v1.3: the ResourceClaim a ``devices`` entry allocates (named, or made from a template)."""

    namespace: ShortText
    name: ShortText
    uid: ShortText


class DeviceCapacity(_Request):
    """Contract v1.3: consumable capacity a request asks of each device (``capacity.requests``)."""

    requests: dict[Annotated[str, Field(min_length=1, max_length=317)], ShortText] = Field(
        default_factory=dict, max_length=32
    )


class DeviceSubRequest(_Request):
    """Contract v1.3: one alternative of ``firstAvailable``, or the ``exactly`` body of a request.

    ``classSelectors`` are the DeviceClass's CEL selectors, resolved by the operator (which reads
    classes), so an RM evaluates expressions only and never needs the class itself.
    """

    name: Annotated[str, Field(min_length=1, max_length=63)] | None = None
    device_class_name: ShortText
    class_selectors: list[CelExpression] = Field(default_factory=list, max_length=32)
    selectors: list[CelExpression] = Field(default_factory=list, max_length=32)
    allocation_mode: Literal["ExactCount", "All"] = "ExactCount"
    count: Integer | None = Field(default=None, ge=1, le=128)
    admin_access: bool = False
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=16)
    capacity: DeviceCapacity | None = None


class DeviceRequest(_Request):
    """Contract v1.3: one of a claim's ``spec.devices.requests``: ``exactly`` or ``firstAvailable``."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    exactly: DeviceSubRequest | None = None
    first_available: list[DeviceSubRequest] | None = Field(default=None, min_length=1, max_length=8)


class DeviceConstraint(_Request):
    """Contract v1.3: ``spec.devices.constraints[]`` (``requests`` absent = all of the claim's)."""

    requests: list[Annotated[str, Field(min_length=1, max_length=127)]] | None = None
    match_attribute: ShortText | None = None
    distinct_attribute: ShortText | None = None


class ClaimDevices(_Request):
    """Contract v1.3: a claim still to allocate, as a reservation request carries it."""

    claim: ClaimRef
    requests: list[DeviceRequest] = Field(min_length=1, max_length=32)
    constraints: list[DeviceConstraint] = Field(default_factory=list, max_length=32)


class ReservationRequest(_Resourced):
    """``POST /v1/reservations``: reserve capacity for one pod and let the RM pick its node."""

    pod: PodIdentity
    resources: Resources
    placement: Placement = Field(default_factory=Placement)
    idempotency_key: ShortText
    ttl_seconds: Integer = Field(ge=1, le=86_400)
    #: v1.2 (feature ``cluster-id``): the cluster asking; sent only to an RM that lists the feature.
    cluster_id: ClusterId | None = None
    #: v1.2 (feature ``preemption``): the pod's ``spec.preemptionPolicy``. Present, it asks for a
    #: preemption plan on an Unschedulable answer (``PreemptLowerPriority``) or says none is wanted
    #: (``Never``); absent (a v1.1 client, or an RM without the feature), no plan is proposed.
    preemption_policy: Literal["PreemptLowerPriority", "Never"] | None = None
    #: v1.2 (feature ``rule-preemption``): nodes where a plan may be proposed but the pod not placed,
    #: each with the pods that must be among the plan's victims; only with ``PreemptLowerPriority``.
    rule_preemption: list[RulePreemption] | None = Field(default=None, max_length=100)
    #: v1.3 (feature ``devices``): the pod's claims still to allocate; sent only to an RM listing
    #: the feature. Part of the request's identity (absent, the fingerprint is that of v1.2).
    devices: list[ClaimDevices] | None = Field(default=None, max_length=MAX_DEVICE_CLAIMS)

    def fingerprint(self) -> str:
        """A canonical form: two requests with the same fingerprint are "the same request".

        Quantities are compared by value, so ``"1000m"`` and ``"1"`` are the same request. A request
        without ``clusterId`` has the fingerprint it had before v1.2 (stored fingerprints stay valid).
        ``preemptionPolicy`` and ``rulePreemption`` are never part of it: they say what to answer
        when nothing fits, not what to reserve, so a reservation made before a client upgrade replays
        after it (and the victims a rule needs change from one cycle to the next).
        """
        canonical = self.model_copy(update={"resources": self.canonical_resources()})
        return canonical.model_dump_json(
            by_alias=True,
            exclude={
                "preemption_policy",
                "rule_preemption",
                *(_absent_cluster(self.cluster_id) or ()),
                *(() if self.devices is not None else ("devices",)),
            },
        )


class RenewRequest(_Request):
    """``POST /v1/reservations/{id}/renew`` (v1.1): extend a reserved lease to now + ``ttlSeconds``.

    The pod UID is required, not optional as on commit and release: renew is new in v1.1, so no
    v1.0 caller needs a form without it, and an RM must never extend another pod's lease.
    """

    pod_uid: ShortText
    ttl_seconds: Integer = Field(ge=1, le=86_400)


class GroupIdentity(_Request):
    """Contract v1.1: whom a reservation group is for, e.g. a Kubernetes PodGroup.

    ``uid`` is the PodGroup's UID when there is one; the scheduler name is every member's.
    """

    namespace: ShortText
    name: ShortText
    uid: ShortText | None = None
    scheduler_name: ShortText


class TopologyConstraint(_Request):
    """Contract v1.1: every member of the group on nodes that share ONE value of the label ``key``.

    As ``schedulingConstraints.topology[].key`` of a Kubernetes PodGroup asks; a node without the
    label takes no member of such a group.
    """

    key: Annotated[str, Field(min_length=1, max_length=317)]


class GroupMemberRequest(_Resourced):
    """One member of a reservation group: a pod, what it requests, and its own hard constraints."""

    pod: PodIdentity
    resources: Resources
    placement: Placement = Field(default_factory=Placement)
    #: v1.3 (feature ``devices``): this member's claims still to allocate, in the one group call.
    devices: list[ClaimDevices] | None = Field(default=None, max_length=MAX_DEVICE_CLAIMS)


class ReservationGroupRequest(_Request):
    """``POST /v1/reservation-groups`` (v1.1): reserve for every member or for none, atomically.

    One idempotency key and one lease (``ttlSeconds``) for the whole group; the answer holds one
    ordinary reservation per member, in the order of ``members``.
    """

    group: GroupIdentity
    members: list[GroupMemberRequest] = Field(min_length=1, max_length=MAX_GROUP_MEMBERS)
    topology: list[TopologyConstraint] = Field(default_factory=list, max_length=MAX_GROUP_TOPOLOGY_KEYS)
    idempotency_key: ShortText
    ttl_seconds: Integer = Field(ge=1, le=86_400)
    #: v1.2 (feature ``cluster-id``): the cluster asking, stored on every member.
    cluster_id: ClusterId | None = None
    #: v1.2 (feature ``group-preemption``): ``PreemptLowerPriority`` asks for one preemption plan
    #: for the whole group on an Unschedulable answer (victims below every member's
    #: ``pod.priority``); ``Never`` or absent, no plan. A caller sends ``PreemptLowerPriority`` only
    #: when no member has ``preemptionPolicy: Never``.
    preemption_policy: Literal["PreemptLowerPriority", "Never"] | None = None

    @model_validator(mode="after")
    def _members_are_one_group(self) -> ReservationGroupRequest:
        seen: set[str] = set()
        for index, member in enumerate(self.members):
            pod = member.pod
            if pod.uid in seen:
                raise ValueError(
                    f"members[{index}]: pod uid {pod.uid!r} appears twice; each member is a distinct pod"
                )
            seen.add(pod.uid)
            if pod.namespace != self.group.namespace or pod.scheduler_name != self.group.scheduler_name:
                raise ValueError(
                    f"members[{index}]: pod {pod.namespace}/{pod.name} (scheduler {pod.scheduler_name!r}) "
                    f"is not in the group's namespace {self.group.namespace!r} with its scheduler "
                    f"{self.group.scheduler_name!r}; a group's members share both"
                )
        keys = [constraint.key for constraint in self.topology]
        if len(set(keys)) != len(keys):
            raise ValueError(f"topology names a key twice: {keys}")
        return self

    def fingerprint(self) -> str:
        """A canonical form: two requests with the same fingerprint are "the same request"
        (quantities compared by value, as for a single reservation)."""
        canonical = self.model_copy(
            update={
                "members": [
                    member.model_copy(update={"resources": member.canonical_resources()})
                    for member in self.members
                ]
            }
        )
        # preemptionPolicy says what to answer when nothing fits, not what to reserve (as on reserve).
        return canonical.model_dump_json(by_alias=True, exclude=self._fingerprint_exclude())

    def _fingerprint_exclude(self) -> dict[str, Any]:
        """What a fingerprint leaves out: v1.2+ fields that say what to answer, and absent new fields.

        Members without ``devices`` (v1.3) keep the fingerprint of v1.2.
        """
        exclude: dict[str, Any] = {"preemption_policy": True}
        if self.cluster_id is None:
            exclude["cluster_id"] = True
        if all(member.devices is None for member in self.members):
            exclude["members"] = {"__all__": {"devices"}}
        return exclude


def _absent_cluster(cluster_id: str | None) -> set[str] | None:
    """Leave out an absent ``clusterId`` (v1.2) so a fingerprint of a v1.1 request does not change."""
    return {"cluster_id"} if cluster_id is None else None


class GroupRenewRequest(_Request):
    """``POST /v1/reservation-groups/{id}/renew`` (v1.1): one lease for the group, to now + ttl."""

    ttl_seconds: Integer = Field(ge=1, le=86_400)


class ReservationRef(_Request):
    """The target of a batched commit or release (v1.1): what the single call has in its path and
    ``podUid`` query parameter."""

    reservation_id: ShortText
    pod_uid: ShortText | None = None


class BatchOperation(_Request):
    """One operation of ``POST /v1/batch`` (v1.1): exactly one of ``reserve``, ``commit``, ``release``.

    Each means what its single call means (``POST /v1/reservations``, ``POST /v1/reservations/{id}/
    commit``, ``DELETE /v1/reservations/{id}``), idempotency included.
    """

    reserve: ReservationRequest | None = None
    commit: ReservationRef | None = None
    release: ReservationRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> BatchOperation:
        given = [name for name in ("reserve", "commit", "release") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"a batch operation names exactly one of reserve, commit, release; this one names "
                f"{', '.join(given) if given else 'none'}"
            )
        return self


class BatchRequest(_Request):
    """``POST /v1/batch`` (v1.1): many independent operations in one round trip.

    Not atomic (that is what reservation groups are for): the RM carries the operations out in
    order, each exactly as its single call would be, and answers one result per operation.
    """

    operations: list[BatchOperation] = Field(min_length=1, max_length=MAX_BATCH_OPERATIONS)


class ReservationState(enum.StrEnum):
    RESERVED = "reserved"
    COMMITTED = "committed"
    RELEASED = "released"
    EXPIRED = "expired"
    #: v1.2 feature ``revocation``: the RM took the capacity back (an administrator, its own
    #: preemption, a node lost); shown only to callers that asked for it (:data:`FEATURES_HEADER`).
    REVOKED = "revoked"

    @property
    def active(self) -> bool:
        """Whether capacity is held: reserved (until it expires) or committed."""
        return self in (ReservationState.RESERVED, ReservationState.COMMITTED)


class ClaimAnswerRef(_Response):
    """Contract v1.3: the claim a ``devices`` answer entry is for."""

    namespace: str
    name: str
    uid: str


class DeviceResult(_Response):
    """Contract v1.3: one allocated device, as ``status.allocation.devices.results[]`` holds it."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: list[dict[str, Any]] | None = None
    consumed_capacity: dict[str, str] | None = None
    share_id: str | None = Field(default=None, alias="shareID")
    binding_conditions: list[str] | None = None
    binding_failure_conditions: list[str] | None = None


class DeviceConfigAnswer(_Response):
    """Contract v1.3: opaque config the RM adds for some requests (written with source FromClaim)."""

    requests: list[str] = Field(default_factory=list)
    opaque: dict[str, Any]


class ClaimAllocation(_Response):
    """Contract v1.3: what the RM allocated for one claim; the operator writes ``status.allocation``."""

    claim: ClaimAnswerRef
    results: list[DeviceResult] = Field(default_factory=list)
    #: a core/v1 NodeSelector; ``None``: the reservation's node only
    node_selector: dict[str, Any] | None = None
    config: list[DeviceConfigAnswer] = Field(default_factory=list)


class DeviceReason(_Response):
    """Contract v1.3: why one request of one claim found no device (``Problem.devices[]``)."""

    claim: ClaimAnswerRef
    request: str | None = None
    reason: str
    nodes_tried: int | None = None


class Reservation(_Response):
    """A reservation as the RM reports it."""

    id: Annotated[str, Field(min_length=1, max_length=253)]
    node: Annotated[str, Field(min_length=1, max_length=253)]
    state: ReservationState
    expires_at: datetime | None = None
    pod_uid: str
    scheduler_name: str
    namespace: str | None = None
    name: str | None = None
    resources: dict[str, str] = Field(default_factory=dict)
    created_at: datetime | None = None
    group_id: str | None = None  # v1.1: the reservation group this one is a member of
    cluster_id: str | None = None  # v1.2: the cluster it was made for (None: made without one)
    revoked_reason: str | None = None  # v1.2 revocation: why the RM took it back (state revoked)
    revoked_at: datetime | None = None  # v1.2 revocation: when
    #: v1.3 (feature ``devices``): the devices chosen, one entry per claim the request carried.
    devices: list[ClaimAllocation] | None = None


class ReservationGroup(_Response):
    """A reservation group as the RM reports it (v1.1): one reservation per member, in request order.

    ``expiresAt`` is the group's lease (that of its members still ``reserved``; absent when none
    is); ``topologyValue`` maps each requested topology key to the value the group landed on.
    """

    id: Annotated[str, Field(min_length=1, max_length=253)]
    members: list[Reservation]
    expires_at: datetime | None = None
    topology_value: dict[str, str] = Field(default_factory=dict)


class ReservationList(_Response):
    """One page of ``GET /v1/reservations``; follow ``nextCursor`` until it is absent."""

    items: list[Reservation]
    next_cursor: str | None = None


class ContractInfo(_Response):
    """``GET /v1/info`` (contract v1.2): the version an RM speaks and the optional features it offers.

    An RM without the path (404 or 405) speaks v1.1 or older: :meth:`legacy` stands for it.
    """

    contract_version: str
    features: frozenset[str] = frozenset()

    @classmethod
    def legacy(cls) -> ContractInfo:
        """What a client assumes of an RM without ``/v1/info``: v1.1 at most, no v1.2 feature."""
        return cls(contract_version="1.1.0", features=frozenset())

    def offers(self, feature: Feature) -> bool:
        return feature.value in self.features


class VictimPod(_Response):
    """Which pod a preemption plan would evict (v1.2, feature ``preemption``)."""

    namespace: str
    name: str
    uid: str


class PreemptionVictim(_Response):
    """One victim of a plan: the pod, the RM's reservation for it (absent for a pod the RM did not
    place but counts, e.g. one bound by kube-scheduler), and what evicting it frees on the node."""

    reservation_id: str | None = None
    pod: VictimPod
    frees: dict[str, str] = Field(default_factory=dict)
    #: The PodDisruptionBudgets (in the victim's namespace) its eviction would exceed, as the RM
    #: last saw them; empty when none or when the RM knows no budgets. The Eviction API would answer
    #: 429, so a caller refuses such a plan before evicting anything.
    violated_budgets: list[str] = Field(default_factory=list)
    #: The victim's node: always present in a group's plan (feature ``group-preemption``), whose
    #: victims may be on several nodes; absent, it is the plan's ``node``.
    node: str | None = None


class PlanState(enum.StrEnum):
    PROPOSED = "proposed"  # not holding anything; confirm before ``expiresAt`` or it lapses
    CONFIRMED = "confirmed"  # the freed capacity is held for the preemptor until ``expiresAt``
    USED = "used"  # the preemptor reserved: the hold became its reservation
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class PlanMember(_Response):
    """A member of a group's preemption plan and the node its room is held on."""

    pod_uid: str
    node: str


class PreemptionPlan(_Response):
    """A preemption plan (v1.2, feature ``preemption``): carried by an Unschedulable answer to a
    reserve whose request had ``preemptionPolicy: PreemptLowerPriority``, and answered by confirm
    and cancel. Evicting ``victims`` from ``node`` makes room for the preemptor ``podUid``."""

    plan_id: Annotated[str, Field(min_length=1, max_length=253)]
    node: Annotated[str, Field(min_length=1, max_length=253)]
    pod_uid: str
    victims: list[PreemptionVictim] = Field(min_length=1)
    lease_seconds: Integer = Field(ge=1)
    state: PlanState = PlanState.PROPOSED
    expires_at: datetime | None = None
    #: A group's plan (feature ``group-preemption``): each member and the node the room is held for
    #: it on. Empty for a pod's plan. A group's plan's ``podUid`` is ``group/<namespace>/<name>``.
    members: list[PlanMember] = Field(default_factory=list)

    def node_of(self, victim: PreemptionVictim) -> str:
        """The node a victim is evicted from."""
        return victim.node or self.node


class Problem(_Response):
    """An RFC 9457 problem; ``type`` is a stable URI per error kind (see ``bindery.rm.errors``)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)

    type: str = "about:blank"
    title: str | None = None
    status: int | None = None
    detail: str | None = None
    instance: str | None = None
    reason: str | None = None
    retry_after_seconds: float | None = None
    errors: list[dict[str, Any]] | None = None
    #: v1.2 (feature ``preemption``): on an ``unschedulable`` answer to a reserve, the plan that
    #: would make room, when the request asked for one and one exists.
    preemption: PreemptionPlan | None = None
    #: v1.3 (feature ``devices``): on ``unschedulable``, why each claim's request found no device.
    devices: list[DeviceReason] | None = None


class BatchOperationResult(_Response):
    """What one batched operation's single call would have answered: its HTTP ``status`` and its
    body, a ``reservation`` (reserve 200/201, commit 200) or a ``problem`` (any 4xx/5xx); a release
    answers ``204`` with neither."""

    status: int = Field(ge=200, le=599)
    reservation: Reservation | None = None
    problem: Problem | None = None


class BatchResult(_Response):
    """The answer to ``POST /v1/batch``: one result per operation, in the order of ``operations``."""

    results: list[BatchOperationResult]
