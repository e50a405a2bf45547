"""Volume binding: pods with PersistentVolumeClaims get their volumes on the node the RM picked.

kube-scheduler's VolumeBinding plugin, in Bindery's cycle. Without it a pod whose claim waits for its
first consumer would be bound to a node where no volume is, or ever will be, and stay in
ContainerCreating; a pod whose volume exists on another node would be bound where the kubelet cannot
mount it. The three extension points:

* **PreFilter** — before anything is reserved. A missing claim, a claim being deleted, or an unbound
  claim whose StorageClass binds immediately (the PV controller binds it, not the scheduler) makes the
  pod Unschedulable, with kube-scheduler's messages. Then the RM is told where the volumes can be, as
  required node affinity: a bound claim's volume's node affinity; for an unbound WaitForFirstConsumer
  claim, the node affinity of the static volumes that could take it, or, if its class provisions,
  the class's ``allowedTopologies`` (no limit without them). A class that cannot provision
  (``kubernetes.io/no-provisioner``) with no matching volume left is Unschedulable.
  A bound volume's zone and region labels limit the pod too (kube-scheduler's VolumeZone plugin,
  :func:`zone_terms`), whether or not the volume also has node affinity. And the nodes where the
  pod's CSI volumes would pass a driver's attach limit (CSINode ``allocatable.count``, counting the
  volumes of the pods already there) are excluded (NodeVolumeLimits, :func:`over_volume_limits`).
* **PreBind** — on the node the RM chose: bound volumes are checked against it; each unbound
  WaitForFirstConsumer claim gets the smallest matching static volume on that node (its
  ``claimRef``, which the PV controller completes) or, for a provisioning class, the annotation
  ``volume.kubernetes.io/selected-node`` that tells the provisioner where to create the volume.
  Then it waits, bounded by the ResourceManager's ``volumeBindTimeoutSeconds`` (kube-scheduler's
  ``bindTimeoutSeconds``, 600 s by default), until every claim is bound to a volume that can be on
  that node, renewing the reservation's lease meanwhile. Only then is the Binding sent. A claim not
  bound at the first look makes the pod wait apart (``ctx.wait_apart``): out of the scheduling
  slots, in the binding pool (:mod:`bindery.scheduling.binding`), so that pods waiting for volumes
  never hold back the scheduling of other pods.
* **Unreserve** — on any later failure (timeout, a volume on the wrong node, the Binding refused) the
  selected-node annotations this cycle set are removed from claims still unbound, so the provisioner
  does not create a volume for a placement that no longer holds; the reservation is then released.

Reads of claims and volumes go to the apiserver (:class:`~bindery.scheduling.ports.VolumeAccess`);
pods without claims never touch them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from bindery.constraints import matches_node_selector, matches_required_affinity, untolerated_taints
from bindery.quantity import QuantityError, parse_quantity
from bindery.rm.models import NodeSelectorTerm
from bindery.scheduling.decisions import Failure, FailureKind, Stage
from bindery.scheduling.defaults import call_budget
from bindery.scheduling.framework import CycleContext, Status
from bindery.scheduling.lease import MIN_CALL_SECONDS
from bindery.scheduling.placementrules import EXCLUSIVE_CLAIMS
from bindery.scheduling.podspec import max_items
from bindery.scheduling.ports import NodeProjection, VolumeAccess, VolumeError

__all__ = [
    "BOUND_BY_CONTROLLER",
    "NO_PROVISIONER",
    "SELECTED_NODE",
    "ClaimView",
    "VolumeBinding",
    "claim_problem",
    "claim_terms",
    "compact_terms",
    "csi_volume",
    "matching_volumes",
    "over_volume_limits",
    "volume_for_node",
    "zone_conflict",
    "zone_terms",
]

log = logging.getLogger(__name__)

SELECTED_NODE = "volume.kubernetes.io/selected-node"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"
#: How often PreBind looks at the claims while it waits for them to be bound.
POLL_SECONDS = 0.5
#: How long Unreserve may spend removing selected-node annotations (it also runs on a pause).
UNDO_SECONDS = 1.0
#: kube-scheduler's marker on a volume it pre-binds: the PV controller then owns the claimRef (and
#: resets a stale one) instead of treating it as a user's reservation of the volume for that claim.
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
_STATE = "VolumeBinding"

ZONE, REGION = "topology.kubernetes.io/zone", "topology.kubernetes.io/region"
BETA_ZONE, BETA_REGION = "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region"
#: The labels VolumeZone reads on volumes and nodes; a beta key on a volume also matches the node's
#: GA key when the node lacks the beta one (upstream's translateToGALabel).
TOPOLOGY_LABELS = (BETA_ZONE, BETA_REGION, ZONE, REGION)
_GA = {BETA_ZONE: ZONE, BETA_REGION: REGION}


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimView:
    """One claim of the pod as PreFilter read it: the claim, its volume if bound, its class."""

    name: str
    claim: Mapping[str, Any] | None
    volume: Mapping[str, Any] | None = None
    storage_class: Mapping[str, Any] | None = None

    @property
    def bound(self) -> bool:
        return bool(_spec(self.claim).get("volumeName"))

    @property
    def class_name(self) -> str:
        return str(_spec(self.claim).get("storageClassName") or "")

    @property
    def waits_for_first_consumer(self) -> bool:
        return (self.storage_class or {}).get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER

    @property
    def provisions(self) -> bool:
        provisioner = (self.storage_class or {}).get("provisioner")
        return bool(provisioner) and provisioner != NO_PROVISIONER


@dataclasses.dataclass(slots=True)
class _CycleVolumes:
    """What one cycle learned and did (ctx.state): claims read by PreFilter, annotations set by PreBind."""

    claims: list[ClaimView]
    candidates: dict[str, list[Mapping[str, Any]]]  # claim name → static volumes that could take it
    #: (claim name, node) of the selected-node annotations this cycle set (Unreserve removes them)
    selected: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: nodes where the pod's CSI volumes would pass a driver's attach limit (NodeCheck re-checks)
    over_limit: frozenset[str] = frozenset()


# -- pure decisions ------------------------------------------------------------------------------


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("spec") or {}


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _meta(obj).get("annotations") or {}


def claim_problem(view: ClaimView) -> str | None:
    """Pure: why the pod cannot be scheduled at all because of this claim (kube-scheduler's words)."""
    if view.claim is None:
        return f'persistentvolumeclaim "{view.name}" not found'
    if _meta(view.claim).get("deletionTimestamp"):
        return f'persistentvolumeclaim "{view.name}" is being deleted'
    if view.bound:
        if view.volume is None:
            return f'persistentvolume "{_spec(view.claim).get("volumeName")}" not found'
        return None
    if not view.waits_for_first_consumer:
        return "pod has unbound immediate PersistentVolumeClaims"
    return None


def _volume_terms(volume: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The volume's required node affinity (empty: it can be used on any node)."""
    required = (_spec(volume).get("nodeAffinity") or {}).get("required") or {}
    return list(required.get("nodeSelectorTerms") or ())


def _requested_storage(claim: Mapping[str, Any]) -> Decimal:
    requests = (_spec(claim).get("resources") or {}).get("requests") or {}
    try:
        return parse_quantity(str(requests.get("storage", "0")))
    except QuantityError:
        return Decimal(0)


def _capacity(volume: Mapping[str, Any]) -> Decimal:
    try:
        return parse_quantity(str((_spec(volume).get("capacity") or {}).get("storage", "0")))
    except QuantityError:
        return Decimal(0)


def _selector_matches(claim: Mapping[str, Any], volume: Mapping[str, Any]) -> bool:
    selector = _spec(claim).get("selector") or {}
    labels = _meta(volume).get("labels") or {}
    if selector.get("matchExpressions"):
        return False  # not supported here: such a claim matches no static volume
    return all(labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items())


def matching_volumes(
    *, claim: Mapping[str, Any], volumes: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """Pure: the static volumes that could take this unbound claim, smallest first.

    Available (or already pre-bound to this claim), same class, enough capacity, every access mode
    the claim asks for, the same volume mode, and the claim's label selector (matchLabels).
    """
    meta = _meta(claim)
    spec = _spec(claim)
    wanted_modes = set(spec.get("accessModes") or ())
    wanted_mode = spec.get("volumeMode") or "Filesystem"
    size = _requested_storage(claim)
    found = []
    for volume in volumes:
        vspec = _spec(volume)
        ref = vspec.get("claimRef")
        if ref and not (
            ref.get("namespace") == meta.get("namespace") and ref.get("name") == meta.get("name")
        ):
            continue
        if ((volume.get("status") or {}).get("phase") or "Available") not in ("Available", "Pending"):
            continue
        if _meta(volume).get("deletionTimestamp"):
            continue
        if (vspec.get("storageClassName") or "") != (spec.get("storageClassName") or ""):
            continue
        if (vspec.get("volumeMode") or "Filesystem") != wanted_mode:
            continue
        if not wanted_modes <= set(vspec.get("accessModes") or ()):
            continue
        if _capacity(volume) < size or not _selector_matches(claim, volume):
            continue
        found.append(volume)
    return sorted(found, key=lambda v: (_capacity(v), str(_meta(v).get("name"))))


def _topology_terms(storage_class: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A class's ``allowedTopologies`` as nodeSelectorTerms (empty: provisions anywhere)."""
    terms: list[Mapping[str, Any]] = []
    for topology in storage_class.get("allowedTopologies") or ():
        expressions = [
            {"key": item.get("key"), "operator": "In", "values": list(item.get("values") or ())}
            for item in topology.get("matchLabelExpressions") or ()
        ]
        if expressions:
            terms.append({"matchExpressions": expressions})
    return terms


def claim_terms(view: ClaimView, candidates: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
    """Pure: the nodeSelectorTerms this claim limits the pod to; ``None``: no limit; ``[]``: no node.

    Bound: its volume's node affinity. Unbound (WaitForFirstConsumer): a node where one of the
    candidate static volumes can be used, or, if the class provisions, where it may provision.
    """
    if view.bound:
        return _volume_terms(view.volume or {}) or None
    options: list[Mapping[str, Any]] = []
    for volume in candidates:
        terms = _volume_terms(volume)
        if not terms:
            return None  # a volume usable anywhere
        options.extend(terms)
    if view.provisions:
        topology = _topology_terms(view.storage_class or {})
        if not topology:
            return None
        options.extend(topology)
    return compact_terms(options)


def compact_terms(terms: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pure: the same ORed nodeSelectorTerms, fewer of them: duplicates dropped, and terms that are a
    single ``In`` on the same key (local volumes: one hostname each) merged into one.

    A hundred local volumes on ten nodes are ten hostnames, not a hundred terms; the contract allows
    64 terms per request.
    """
    merged: dict[str, list[str]] = {}
    rest: list[Mapping[str, Any]] = []
    for term in terms:
        expressions = term.get("matchExpressions") or []
        single_in = len(expressions) == 1 and expressions[0].get("operator") == "In"
        if single_in and not term.get("matchFields"):
            values = merged.setdefault(str(expressions[0].get("key")), [])
            values.extend(str(v) for v in expressions[0].get("values") or () if str(v) not in values)
        elif term not in rest:
            rest.append(term)
    singles = [{"matchExpressions": [{"key": k, "operator": "In", "values": v}]} for k, v in merged.items()]
    return [*singles, *rest]


def _label_zones(value: str) -> list[str] | None:
    """A zone label's values: ``a__b`` is zones a and b (upstream volumehelpers.LabelZonesToSet);
    ``None`` for a malformed value (an empty part), which upstream ignores with a log line."""
    zones = [part.strip() for part in value.split("__")]
    return None if any(not zone for zone in zones) else zones


def zone_terms(volume: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Pure: nodeSelectorTerms for kube-scheduler's VolumeZone rule on a bound volume; ``None``: none.

    Upstream (pkg/scheduler/framework/plugins/volumezone/volume_zone.go, v1.36): every zone or region
    label of the volume must be matched by the node's label of that key (for a beta key, by the GA
    key if the node lacks the beta one), except that a node with none of the four topology labels
    passes (a single-zone cluster whose nodes are unlabelled). As ORed terms: "no topology label at
    all", or, for every label of the volume, one of its allowed spellings. The volume's node affinity
    is not looked at here; it is a separate constraint, ANDed by the cycle.
    """
    labels = _meta(volume).get("labels") or {}
    alternatives: list[list[dict[str, Any]]] = [[]]  # ORed conjunctions, built label by label
    found = False
    for key in TOPOLOGY_LABELS:
        if key not in labels:
            continue
        zones = _label_zones(str(labels[key]))
        if zones is None:
            continue
        found = True
        spellings: list[list[dict[str, Any]]] = [[{"key": key, "operator": "In", "values": zones}]]
        if key in _GA:
            spellings.append(
                [
                    {"key": key, "operator": "DoesNotExist", "values": []},
                    {"key": _GA[key], "operator": "In", "values": zones},
                ]
            )
        alternatives = [have + more for have in alternatives for more in spellings]
    if not found:
        return None
    unlabelled = [{"key": key, "operator": "DoesNotExist", "values": []} for key in TOPOLOGY_LABELS]
    return [{"matchExpressions": unlabelled}, *({"matchExpressions": a} for a in alternatives)]


def zone_conflict(volume: Mapping[str, Any], node: NodeProjection) -> bool:
    """Pure: whether the volume's zone labels rule the node out (VolumeZone's Filter)."""
    terms = zone_terms(volume)
    return terms is not None and not matches_required_affinity(
        terms=terms, labels=node.labels, node_name=node.name
    )


def csi_volume(
    *,
    namespace: str,
    claim: Mapping[str, Any] | None,
    volume: Mapping[str, Any] | None,
    storage_class: Mapping[str, Any] | None,
) -> tuple[str, str] | None:
    """Pure: (driver, volume handle) of a claim's CSI volume, as NodeVolumeLimits counts it; None: it
    counts against no limit.

    Upstream (nodevolumelimits/csi.go, v1.36, getCSIDriverInfo): a bound claim's PV ``spec.csi``; an
    unbound claim's class provisioner, with ``<namespace>-<claim>`` standing in for the handle the
    volume will get. In-tree volume plugins migrated to CSI are not translated here.
    """
    if volume is not None:
        csi = _spec(volume).get("csi") or {}
        driver, handle = csi.get("driver"), csi.get("volumeHandle")
        return (str(driver), str(handle)) if driver and handle else None
    if claim is None or _spec(claim).get("volumeName"):
        return None
    provisioner = (storage_class or {}).get("provisioner")
    if not provisioner or provisioner == NO_PROVISIONER:
        return None
    return str(provisioner), f"{namespace}-{_meta(claim).get('name')}"


def _limits(csi_node: Mapping[str, Any]) -> dict[str, int]:
    """A CSINode's attach limit per driver (drivers without ``allocatable.count`` have none)."""
    limits: dict[str, int] = {}
    for driver in _spec(csi_node).get("drivers") or ():
        count = (driver.get("allocatable") or {}).get("count")
        if driver.get("name") and isinstance(count, int):
            limits[str(driver["name"])] = count
    return limits


def over_volume_limits(
    *,
    new: set[tuple[str, str]],
    csi_nodes: Sequence[Mapping[str, Any]],
    attached: Mapping[str, set[tuple[str, str]]],
) -> list[str]:
    """Pure: the nodes where the pod's CSI volumes `new` would pass a driver's attach limit.

    Upstream's Filter: on each node, the volumes of the pods there (`attached`, unique by driver and
    handle) plus the pod's volumes not already there, counted per driver, must stay within the
    CSINode's ``allocatable.count`` for that driver. A node without a CSINode, or without a count
    for the driver, has no limit.
    """
    drivers = {driver for driver, _ in new}
    excluded = []
    for csi_node in csi_nodes:
        name = str(_meta(csi_node).get("name") or "")
        limits = {d: c for d, c in _limits(csi_node).items() if d in drivers}
        if not limits:
            continue
        have = attached.get(name, set())
        adding = new - have
        for driver, limit in limits.items():
            more = sum(1 for d, _ in adding if d == driver)
            if more and sum(1 for d, _ in have if d == driver) + more > limit:
                excluded.append(name)
                break
    return sorted(excluded)


def _usable_on(volume: Mapping[str, Any], node: NodeProjection) -> bool:
    return matches_required_affinity(terms=_volume_terms(volume), labels=node.labels, node_name=node.name)


def volume_for_node(
    *, candidates: Sequence[Mapping[str, Any]], node: NodeProjection, taken: set[str]
) -> Mapping[str, Any] | None:
    """Pure: the smallest candidate usable on `node` that no other claim of the pod took."""
    for volume in candidates:
        if str(_meta(volume).get("name")) not in taken and _usable_on(volume, node):
            return volume
    return None


# -- the plugin ----------------------------------------------------------------------------------


class VolumeBinding:
    """PreFilter, Reserve (unreserve only) and PreBind for pods with PersistentVolumeClaims."""

    name = "VolumeBinding"

    async def pre_filter(self, *, ctx: CycleContext) -> Status:
        if not ctx.pod.claims:
            return Status.skip()
        access = ctx.ports.volumes
        if access is None:
            return Status.error("the pod uses PersistentVolumeClaims, but no volume adapter is configured")
        try:
            claims = [await _read_claim(access, ctx.pod.namespace, name) for name in ctx.pod.claims]
        except VolumeError as error:
            return Status.error(error.message)
        for view in claims:
            if (problem := claim_problem(view)) is not None:
                return Status.unschedulable(problem)
        unbound = [view for view in claims if not view.bound]
        try:
            volumes = await access.volumes() if unbound else []
        except VolumeError as error:
            return Status.error(error.message)
        candidates = {
            view.name: matching_volumes(claim=view.claim or {}, volumes=volumes) for view in unbound
        }
        for view in claims:
            if not view.bound and (selected := _annotations(view.claim).get(SELECTED_NODE)):
                # Provisioning for that node may be under way (an earlier cycle, another replica):
                # stay there, as kube-scheduler does, rather than ask for a second volume elsewhere.
                ctx.require_nodes(
                    [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [selected]}]}]
                )
            terms = claim_terms(view, candidates.get(view.name, ()))
            if terms is not None and not terms:
                return Status.unschedulable(
                    f'no persistent volume is available for claim "{view.name}" of class '
                    f'"{view.class_name}", and the class does not provision volumes'
                )
            if terms is not None:
                ctx.require_nodes(terms)
            if view.bound and (zoned := zone_terms(view.volume or {})) is not None:
                ctx.require_nodes(zoned)
        try:
            over_limit = await self._volume_limits(ctx, access, claims)
        except VolumeError as error:
            return Status.error(error.message)
        if isinstance(over_limit, Status):
            return over_limit
        ctx.state[_STATE] = _CycleVolumes(claims=claims, candidates=candidates, over_limit=over_limit)
        # VolumeRestrictions: PodPlacementRules refuses these if another pod uses one, once the
        # in-flight cycles of pods sharing a claim have named their nodes.
        exclusive = tuple(
            view.name
            for view in claims
            if READ_WRITE_ONCE_POD in (_spec(view.claim).get("accessModes") or ())
        )
        if exclusive:
            ctx.state[EXCLUSIVE_CLAIMS] = exclusive
        return Status.success()

    async def _volume_limits(
        self, ctx: CycleContext, access: VolumeAccess, claims: Sequence[ClaimView]
    ) -> frozenset[str] | Status:
        """NodeVolumeLimits: exclude the nodes where the pod's CSI volumes would pass a driver's attach
        limit (a ``metadata.name NotIn`` term for the RM); the nodes excluded, or a refusal.

        Only a pod with a CSI volume reads the CSINodes, and only if a node limits one of its drivers
        does it read every claim and volume to count what the pods on those nodes already use.
        """
        namespace = ctx.pod.namespace
        new = {
            found
            for view in claims
            if (
                found := csi_volume(
                    namespace=namespace,
                    claim=view.claim,
                    volume=view.volume,
                    storage_class=view.storage_class,
                )
            )
            is not None
        }
        if not new:
            return frozenset()
        drivers = {driver for driver, _ in new}
        csi_nodes = [n for n in await access.csi_nodes() if set(_limits(n)) & drivers]
        if not csi_nodes:
            return frozenset()
        placed = ctx.ports.placed
        if placed is None:
            return Status.error(
                "the pod's CSI volumes count against a node's attach limit, but this scheduler has no "
                "watch of placed pods to count the volumes already there; it is not placed without it"
            )
        limited = {str(_meta(n).get("name")) for n in csi_nodes}
        users = [
            pod
            for ns in list(placed.namespaces())
            for pod in placed.in_namespace(ns)
            if pod.claims and pod.node in limited and pod.uid != ctx.pod.uid
        ]
        attached: dict[str, set[tuple[str, str]]] = {}
        if users:
            by_key = {
                (str(_meta(c).get("namespace")), str(_meta(c).get("name"))): c
                for c in await access.all_claims()
            }
            volumes = {str(_meta(v).get("name")): v for v in await access.volumes()}
            for pod in users:
                for name in pod.claims:
                    claim = by_key.get((pod.namespace, name))
                    volume = volumes.get(str(_spec(claim).get("volumeName") or "")) if claim else None
                    if (
                        volume is not None
                        and (
                            found := csi_volume(
                                namespace=pod.namespace, claim=claim, volume=volume, storage_class=None
                            )
                        )
                        is not None
                    ):
                        attached.setdefault(pod.node, set()).add(found)
        excluded = over_volume_limits(new=new, csi_nodes=csi_nodes, attached=attached)
        if not excluded:
            return frozenset()
        # The nodes the pod may run on at all (its nodeSelector and required node affinity): nodes of
        # other pools are no room for it, so they must not turn this refusal into the RM's.
        incoming = ctx.pod
        candidates = {
            node.name
            for node in placed.nodes()
            if matches_node_selector(node_selector=incoming.node_selector, labels=node.labels)
            and matches_required_affinity(
                terms=incoming.affinity_terms, labels=node.labels, node_name=node.name
            )
            and not untolerated_taints(taints=node.taints, tolerations=incoming.tolerations)
        }
        if candidates:  # only those need excluding: the others are no room for the pod anyway
            excluded = [name for name in excluded if name in candidates]
            if not excluded:
                return frozenset()
        if candidates and candidates <= set(excluded):
            return Status.unschedulable(
                f"NodeVolumeLimits: node(s) exceed max volume count (the pod's CSI volumes would pass "
                f"the attach limit of driver(s) {', '.join(sorted(drivers))} on every node)"
            )
        # One requirement per node: Kubernetes allows exactly one value in a metadata.name field.
        if len(excluded) > (cap := max_items(NodeSelectorTerm, "match_fields")):
            return Status.unschedulable(
                f"TooManyTerms: NodeVolumeLimits excludes {len(excluded)} nodes, more than the {cap} "
                "matchFields a placement.requiredNodeAffinity term carries in the resource manager contract"
            )
        ctx.require_nodes(
            [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": [name]} for name in excluded
                    ]
                }
            ]
        )
        return frozenset(excluded)

    async def reserve(self, *, ctx: CycleContext) -> Status:
        return Status.success()

    async def unreserve(self, *, ctx: CycleContext) -> None:
        """Remove the selected node this cycle set from claims still unbound, within UNDO_SECONDS.

        Bounded: it also runs when a lost lease pauses the cycles, which must be over quickly. A claim
        whose annotation names another node now (another pod, another scheduler) is left alone.
        """
        state = ctx.state.get(_STATE)
        access = ctx.ports.volumes
        if not isinstance(state, _CycleVolumes) or access is None or not state.selected:
            return
        try:
            async with asyncio.timeout(UNDO_SECONDS):
                while state.selected:
                    name, node = state.selected[-1]
                    current = await access.claim(namespace=ctx.pod.namespace, name=name)
                    if (
                        current is not None
                        and not _spec(current).get("volumeName")
                        and _annotations(current).get(SELECTED_NODE) == node
                    ):
                        await access.select_node(claim=current, node=None)
                    state.selected.pop()
        except (VolumeError, TimeoutError) as error:
            log.warning(
                "could not remove the selected node from claim(s) %s of pod %s: %s; their provisioner may "
                "still create a volume there",
                ", ".join(name for name, _ in state.selected),
                ctx.pod.key,
                error or "timed out",
            )

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        state = ctx.state.get(_STATE)
        access = ctx.ports.volumes
        if not isinstance(state, _CycleVolumes) or access is None:
            return Status.skip()  # no claims
        node_name = ctx.node
        node = ctx.ports.nodes.get(node_name) if node_name else None
        if node is None:
            return Status.error(f"the chosen node {node_name!r} is not known")
        try:
            if (failure := await self._prepare(ctx, state, access, node)) is not None:
                return Status.failed(failure)
            return await self._wait_bound(ctx, state, access, node)
        except VolumeError as error:
            return Status.failed(self._failure(FailureKind.PLUGIN_ERROR, f"binding volumes: {error.message}"))

    async def _prepare(
        self, ctx: CycleContext, state: _CycleVolumes, access: VolumeAccess, node: NodeProjection
    ) -> Failure | None:
        """Check bound volumes against the node; give each unbound claim a volume or a selected node."""
        if node.name in state.over_limit:
            return self._failure(
                FailureKind.NODE_CHECK,
                f'resource manager "{ctx.profile.name}" chose node "{node.name}", where the pod\'s CSI '
                "volumes would pass a driver's attach limit (NodeVolumeLimits: node(s) exceed max volume "
                "count)",
            )
        taken: set[str] = set()
        for view in state.claims:
            if view.bound:
                if view.volume is not None and not _usable_on(view.volume, node):
                    return self._failure(
                        FailureKind.NODE_CHECK,
                        f'resource manager "{ctx.profile.name}" chose node "{node.name}", but volume '
                        f'"{_meta(view.volume).get("name")}" of claim "{view.name}" cannot be used there '
                        "(volume node affinity conflict)",
                    )
                if view.volume is not None and zone_conflict(view.volume, node):
                    return self._failure(
                        FailureKind.NODE_CHECK,
                        f'resource manager "{ctx.profile.name}" chose node "{node.name}", but the zone '
                        f'labels of volume "{_meta(view.volume).get("name")}" of claim "{view.name}" rule '
                        "it out (VolumeZone: node(s) had no available volume zone)",
                    )
                continue
            current = await access.claim(namespace=ctx.pod.namespace, name=view.name)
            if current is None:
                return self._failure(
                    FailureKind.PLUGIN_ERROR, f'persistentvolumeclaim "{view.name}" was deleted'
                )
            if _spec(current).get("volumeName"):
                continue  # bound meanwhile (another pod of the claim, the PV controller): checked below
            volume = volume_for_node(candidates=state.candidates.get(view.name, ()), node=node, taken=taken)
            if volume is not None:
                taken.add(str(_meta(volume).get("name")))
                await access.bind_volume(volume=volume, claim=current)
                log.info(
                    "pod %s: pre-bound volume %s to claim %s",
                    ctx.pod.key,
                    _meta(volume).get("name"),
                    view.name,
                )
            elif view.provisions:
                state.selected.append((view.name, node.name))  # before the write: a cancel may cut it
                await access.select_node(claim=current, node=node.name)
                log.info("pod %s: claim %s to be provisioned on node %s", ctx.pod.key, view.name, node.name)
            else:
                return self._failure(
                    FailureKind.PLUGIN_UNSCHEDULABLE,
                    f'no persistent volume for claim "{view.name}" can be used on node "{node.name}"',
                )
        return None

    async def _wait_bound(
        self, ctx: CycleContext, state: _CycleVolumes, access: VolumeAccess, node: NodeProjection
    ) -> Status:
        """Until every claim is bound to a volume usable on the node, the timeout, or the lease's end.

        It gives up early, as kube-scheduler does, when waiting cannot succeed: the pod is gone, a
        claim was deleted or bound to a volume elsewhere, or its provisioner removed the selected node
        (how an external provisioner asks for another node). A failed read is retried until the
        deadline: one 500 from a busy apiserver must not undo provisioning under way.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ctx.profile.volume_bind_timeout_seconds
        waiting = [view.name for view in state.claims]
        selected = dict(state.selected)
        apart = False  # whether it asked to wait apart yet
        while True:
            if ctx.ports.pods.get(ctx.pod.uid) is None:
                return Status.failed(
                    Failure(
                        kind=FailureKind.POD_GONE,
                        message="the pod was deleted or bound by someone else while its volumes were bound",
                        stage=Stage.PRE_BIND,
                        plugin=self.name,
                    )
                )
            try:
                still = await self._unbound(ctx, access, node, waiting, selected)
            except VolumeError as error:
                log.info("pod %s: reading its claims failed (%s); trying again", ctx.pod.key, error.message)
                still = waiting
            if isinstance(still, Failure):
                return Status.failed(still)
            if not still:
                return Status.success()
            waiting = still
            if not apart:
                apart = True
                # Waiting from here on: out of the scheduling slots, into the binding pool (queued
                # there while it is full, the time counted against the same timeout).
                try:
                    async with asyncio.timeout_at(deadline):
                        status = await ctx.wait_apart()
                except TimeoutError:
                    return Status.failed(self._timed_out(ctx, node, still, " (the binding pool stayed full)"))
                if not status.ok:
                    return status
                continue  # look again at once: the claims may have been bound meanwhile
            left = deadline - loop.time()
            if left <= 0:
                return Status.failed(self._timed_out(ctx, node, still, " (is their provisioner running?)"))
            # Keeps the reservation alive while the provisioner works (renews when it runs low).
            if await call_budget(ctx, cap=POLL_SECONDS, needed=MIN_CALL_SECONDS) is None:
                return Status.failed(
                    self._failure(
                        FailureKind.LEASE_EXPIRED,
                        "binding volumes: the reservation's lease ran out and could not be renewed while "
                        f"waiting for claim(s) {', '.join(sorted(still))}",
                    )
                )
            await asyncio.sleep(min(POLL_SECONDS, left))

    async def _unbound(
        self,
        ctx: CycleContext,
        access: VolumeAccess,
        node: NodeProjection,
        waiting: Sequence[str],
        selected: Mapping[str, str],
    ) -> list[str] | Failure:
        """The claims of `waiting` not bound yet; a Failure when waiting on cannot succeed."""
        still: list[str] = []
        for name in waiting:
            claim = await access.claim(namespace=ctx.pod.namespace, name=name)
            if claim is None:
                return self._failure(FailureKind.PLUGIN_ERROR, f'persistentvolumeclaim "{name}" was deleted')
            volume_name = _spec(claim).get("volumeName")
            if not volume_name or (claim.get("status") or {}).get("phase") != "Bound":
                if name in selected and _annotations(claim).get(SELECTED_NODE) != selected[name]:
                    return self._failure(
                        FailureKind.PLUGIN_ERROR,
                        f'binding volumes: the provisioner of claim "{name}" gave up on node '
                        f'"{selected[name]}" (it removed the selected node)',
                    )
                still.append(name)
                continue
            volume = await access.volume(str(volume_name))
            if volume is None or not _usable_on(volume, node):
                return self._failure(
                    FailureKind.PLUGIN_ERROR,
                    f'claim "{name}" was bound to volume "{volume_name}", which cannot be used on node '
                    f'"{node.name}"',
                )
        return still

    def _timed_out(self, ctx: CycleContext, node: NodeProjection, still: Sequence[str], why: str) -> Failure:
        return self._failure(
            FailureKind.PLUGIN_ERROR,
            f"binding volumes: timed out after {ctx.profile.volume_bind_timeout_seconds:g} s "
            f"waiting for claim(s) {', '.join(sorted(still))} to be bound on node "
            f'"{node.name}"{why}',
        )

    def _failure(self, kind: FailureKind, message: str) -> Failure:
        return Failure(kind=kind, message=message, stage=Stage.PRE_BIND, plugin=self.name)


async def _read_claim(access: VolumeAccess, namespace: str, name: str) -> ClaimView:
    claim = await access.claim(namespace=namespace, name=name)
    if claim is None:
        return ClaimView(name=name, claim=None)
    volume_name = _spec(claim).get("volumeName")
    volume = await access.volume(str(volume_name)) if volume_name else None
    class_name = _spec(claim).get("storageClassName")
    storage_class = await access.storage_class(str(class_name)) if class_name else None
    return ClaimView(name=name, claim=claim, volume=volume, storage_class=storage_class)
