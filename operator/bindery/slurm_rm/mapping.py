"""Pure mappings between the contract and Slurm: node names, job sizes, the job comment.

**Nodes.** A node map names, for every Kubernetes node Slurm may place pods on, its Slurm
``NodeName`` and the labels and taints the request's constraints are checked against (the adapter
never reads the apiserver: like any third-party RM it speaks only the contract)::

    nodes:
      - name: worker-0        # the Kubernetes node name, as the reservation answers it
        slurm: slurm-0        # its Slurm NodeName (default: the same name)
        labels: {zone: a}
        taints: [{key: gpu, value: "true", effect: NoSchedule}]

``--node-map worker-0=slurm-0,worker-1=slurm-1`` is the same without labels or taints.

**Sizes.** A placeholder job asks for ``ceil(cpu)`` CPUs (Slurm allocates whole cores) and
``ceil(memory / MiB)`` MiB, at least 1 of each: a job without a memory request would get the whole
node under ``CR_Core_Memory``. ``pods`` and ``ephemeral-storage`` are not Slurm's to count and
are ignored.

**GRES.** An extended resource is asked of Slurm as a GRES (``--gres``, per node) by a mapping
from Kubernetes resource names to GRES names: ``--gres-map nvidia.com/gpu=gpu,example.com/fpga=fpga``
(default ``nvidia.com/gpu=gpu``; ``--gres-map ""`` maps nothing). Counts are whole numbers, as the
apiserver requires of extended resources. A node's GRES and what is in use come from slurmctld;
the adapter's map only names them. A resource with no mapping is never dropped: a pod asking for a
non-zero amount of it fits no node (``409`` "Insufficient example.com/fpga", saying it is not
mapped), as the contract says of a resource an RM does not know, so a pod asking for a GPU never
lands where Slurm allocated it none.

**State.** Everything the adapter knows about a reservation is in its job's ``comment`` (JSON), so
a restarted adapter, or another replica, reads it back from slurmctld. A group's heterogeneous job
has one component per member, whose comment is written compactly (:func:`encode_component`, which
could hold several members), since slurmctld keeps at most 1024 characters of a comment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import yaml

from bindery.constraints import matches_node_selector, matches_required_affinity, untolerated_taints
from bindery.rm.models import GroupMemberRequest, ReservationGroupRequest, ReservationRequest

MIB = Decimal(2**20)
IGNORED_RESOURCES = frozenset({"pods", "ephemeral-storage"})
COMMENT_TAG = "bindery/v1"
#: The comment of one component of a group's heterogeneous job: the members on its node.
GROUP_COMMENT_TAG = "bindery/g1"
#: slurmctld refuses a longer comment, on submit and on update (22.05 ``_test_job_desc_fields``).
MAX_COMMENT = 1024
#: Kubernetes extended resource name -> Slurm GRES name, unless ``--gres-map`` says otherwise.
DEFAULT_GRES_MAP: Mapping[str, str] = {"nvidia.com/gpu": "gpu"}
_GRES_NAME = re.compile(r"[A-Za-z0-9_]+")
_PARENTHESES = re.compile(r"\([^)]*\)")

#: What a placeholder job is sized and matched from: a single reserve, or one member of a group.
PodRequest = ReservationRequest | GroupMemberRequest


class NodeMapError(ValueError):
    """The node map is malformed; the message says where."""


@dataclasses.dataclass(frozen=True)
class MappedNode:
    name: str  # Kubernetes
    slurm: str  # Slurm NodeName
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()


def parse_node_map(text: str) -> tuple[MappedNode, ...]:
    """``k8s=slurm,k8s2=slurm2`` or the path of a YAML file (see the module docstring)."""
    path = pathlib.Path(text)
    if "=" not in text and path.is_file():
        return parse_node_map_document(yaml.safe_load(path.read_text(encoding="utf-8")), where=str(path))
    nodes = []
    for pair in filter(None, (part.strip() for part in text.split(","))):
        kube, sep, slurm = pair.partition("=")
        if not sep or not kube or not slurm:
            raise NodeMapError(f"--node-map entry {pair!r} is not KUBERNETES_NODE=SLURM_NODE")
        nodes.append(MappedNode(kube, slurm))
    return _checked(nodes, "--node-map")


def parse_node_map_document(document: Any, *, where: str) -> tuple[MappedNode, ...]:
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list):
        raise NodeMapError(f"{where}: expected a mapping with a list 'nodes'")
    nodes = []
    for index, item in enumerate(document["nodes"]):
        at = f"{where}: nodes[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise NodeMapError(f"{at}: each node needs a string 'name' (its Kubernetes node name)")
        unknown = set(item) - {"name", "slurm", "labels", "taints"}
        if unknown:
            raise NodeMapError(f"{at}: unknown keys {sorted(unknown)}")
        labels = item.get("labels") or {}
        taints = item.get("taints") or []
        if not isinstance(labels, dict) or not isinstance(taints, list):
            raise NodeMapError(f"{at}: 'labels' is a mapping and 'taints' a list")
        nodes.append(
            MappedNode(
                name=item["name"],
                slurm=str(item.get("slurm") or item["name"]),
                labels={str(k): str(v) for k, v in labels.items()},
                taints=tuple(taints),
            )
        )
    return _checked(nodes, where)


def _checked(nodes: Sequence[MappedNode], where: str) -> tuple[MappedNode, ...]:
    if not nodes:
        raise NodeMapError(f"{where}: no nodes; map at least one Kubernetes node to a Slurm node")
    for attribute in ("name", "slurm"):
        seen = [getattr(node, attribute) for node in nodes]
        if len(set(seen)) != len(seen):
            raise NodeMapError(f"{where}: a {attribute} appears twice; the mapping must be one to one")
    return tuple(nodes)


class GresMapError(ValueError):
    """``--gres-map`` is malformed; the message says which entry."""


def parse_gres_map(text: str) -> dict[str, str]:
    """``RESOURCE=GRES,…`` (e.g. ``nvidia.com/gpu=gpu``); an empty text maps nothing."""
    mapping: dict[str, str] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        resource, sep, gres = pair.partition("=")
        if not sep or "/" not in resource or not _GRES_NAME.fullmatch(gres):
            raise GresMapError(
                f"--gres-map entry {pair!r} is not KUBERNETES_RESOURCE=SLURM_GRES "
                "(an extended resource such as nvidia.com/gpu, and a GRES name such as gpu)"
            )
        if resource in mapping:
            raise GresMapError(f"--gres-map maps {resource} twice")
        if gres in mapping.values():
            # Two resources counted apart in Kubernetes but from one pool in Slurm would overcommit.
            raise GresMapError(f"--gres-map maps two resources to GRES {gres}; the mapping is one to one")
        mapping[resource] = gres
    return mapping


@dataclasses.dataclass(frozen=True)
class GresAsk:
    resource: str  # the Kubernetes name, as refusals say it
    gres: str  # the Slurm GRES name
    count: int


@dataclasses.dataclass(frozen=True)
class JobSize:
    cpus: int
    memory_mib: int
    gres: tuple[GresAsk, ...] = ()

    def gres_spec(self) -> str:
        """The job's ``gres`` (per node): ``gpu:1,fpga:2``."""
        return ",".join(f"{ask.gres}:{ask.count}" for ask in self.gres)

    def gres_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ask in self.gres:
            counts[ask.gres] = counts.get(ask.gres, 0) + ask.count
        return counts


def job_size(
    request: PodRequest, gres_map: Mapping[str, str] = DEFAULT_GRES_MAP
) -> tuple[JobSize, list[str]]:
    """The placeholder's size, and why Slurm cannot provide some request: a reason per
    non-zero resource that maps to no GRES, or is not a whole number of one."""
    requested = request.requested()
    refusals: list[str] = []
    asks: list[GresAsk] = []
    for name, value in sorted(requested.items()):
        if value <= 0 or name in ("cpu", "memory") or name in IGNORED_RESOURCES:
            continue
        gres = gres_map.get(name)
        if gres is None:
            refusals.append(f"Insufficient {name} (mapped to no Slurm GRES; see the adapter's --gres-map)")
        elif value != value.to_integral_value():
            refusals.append(
                f"{name} {request.resources[name]} is not a whole number (Slurm counts GRES {gres} in units)"
            )
        else:
            asks.append(GresAsk(name, gres, int(value)))
    cpus = max(1, math.ceil(requested.get("cpu", Decimal(0))))
    memory = max(1, math.ceil(requested.get("memory", Decimal(0)) / MIB))
    return JobSize(cpus, memory, tuple(asks)), refusals


def parse_gres(text: object) -> dict[str, int]:
    """GRES counts by name from slurmrestd's words: a node's ``gres`` / ``gres_used``
    (``gpu:2``, ``gpu:a100:1(IDX:0)``, ``gpu:1(S:0-1),fpga:2``) or a job's ``tres_per_node``
    (``gres:gpu:1``). Typed GRES count under their name; ``(null)`` and ``N/A`` are none."""
    counts: dict[str, int] = {}
    if not isinstance(text, str):
        return counts
    for token in _PARENTHESES.sub("", text).split(","):
        parts = token.strip().split(":")
        if parts and parts[0] == "gres":
            parts = parts[1:]
        if len(parts) < 2 or not parts[-1].isdigit():
            continue  # "(null)", "N/A", or a name without a count
        counts[parts[0]] = counts.get(parts[0], 0) + int(parts[-1])
    return counts


def allowed(node: MappedNode, request: PodRequest) -> str | None:
    """Why ``node`` is excluded by the request's constraints, or None when it is allowed."""
    placement = request.placement
    if not matches_node_selector(node_selector=placement.node_selector, labels=node.labels):
        return "didn't match Pod's node affinity/selector"
    if not matches_required_affinity(
        terms=placement.affinity_terms(), labels=node.labels, node_name=node.name
    ):
        return "didn't match Pod's node affinity/selector"
    taints = untolerated_taints(taints=node.taints, tolerations=placement.toleration_dicts())
    if taints:
        taint = taints[0]
        return f"had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    return None


def fingerprint(request: ReservationRequest | ReservationGroupRequest) -> str:
    return hashlib.sha256(request.fingerprint().encode()).hexdigest()[:32]


@dataclasses.dataclass
class JobRecord:
    """What the adapter writes into a placeholder job's comment.

    ``expires_at`` is None until the pod claims the running job (its first reserve answered 201)
    and again once committed; ``hold_until`` bounds how long an unclaimed job (pending, or running
    but not yet answered) waits for its pod to ask again before the adapter cancels it.
    """

    key: str
    pod_uid: str
    scheduler: str
    namespace: str
    name: str
    node: str  # Kubernetes node name
    fingerprint: str
    resources: dict[str, str]
    ttl: int
    created: float
    hold_until: float
    claimed: bool = False
    committed: bool = False
    expires_at: float | None = None
    ended: str | None = None  # "released" or "expired" when the adapter ended it
    # A member of a reservation group (contract v1.1): the group's id, its idempotency key (a
    # namespace apart from single reserves' keys), the member's place in the request, and the value
    # of each topology key the group landed on. ``fingerprint`` is then the whole group request's.
    group: str | None = None
    group_key: str | None = None
    index: int = 0
    topology: dict[str, str] = dataclasses.field(default_factory=dict)
    # Contract v1.2 ``clusterId``: the cluster the reservation was made for (None: made without one).
    # Lists filter by it, so two clusters sharing one Slurm never settle each other's placeholders.
    cluster: str | None = None

    def encode(self) -> str:
        return json.dumps({"tag": COMMENT_TAG, **dataclasses.asdict(self)}, separators=(",", ":"))

    @classmethod
    def decode(cls, comment: str | None) -> JobRecord | None:
        """The record of a job's comment, or None for a job that is not a Bindery placeholder."""
        if not comment or not comment.startswith("{"):
            return None
        try:
            document = json.loads(comment)
        except ValueError:
            return None
        if not isinstance(document, dict) or document.pop("tag", None) != COMMENT_TAG:
            return None
        try:
            return cls(**document)
        except TypeError:
            return None


class CommentTooLong(ValueError):
    """The members placed on one node do not fit in one Slurm job comment (1024 characters)."""


_SHARED = (
    *("key", "scheduler", "namespace", "node", "fingerprint", "ttl", "created", "hold_until", "claimed"),
    *("group", "topology", "cluster", "resources"),
)


def encode_component(records: Sequence[JobRecord]) -> str:
    """The comment of one hetjob component: what its members share once, then each member as
    ``[index, podUid, name, resources, committed, expiresAt, ended]`` (resources null when the
    first's; the member's own namespace and scheduler appended when they differ from the first's).
    Raises CommentTooLong past 1024 characters."""
    first = records[0]
    shared = {name: getattr(first, name) for name in _SHARED}
    shared["created"], shared["hold_until"] = round(first.created, 2), round(first.hold_until, 2)
    members = []
    for record in records:
        item: list[Any] = [
            record.index, record.pod_uid, record.name,
            None if record.resources == first.resources else record.resources,
            int(record.committed), None if record.expires_at is None else round(record.expires_at, 2),
            record.ended,
        ]  # fmt: skip
        if (record.namespace, record.scheduler) != (first.namespace, first.scheduler):
            item += [record.namespace, record.scheduler]
        members.append(item)
    text = json.dumps({"tag": GROUP_COMMENT_TAG, **shared, "m": members}, separators=(",", ":"))
    if len(text) > MAX_COMMENT:
        who = (
            f"member {first.namespace}/{first.name} on node {first.node} needs"
            if len(records) == 1
            else f"{len(records)} members on node {first.node} need"
        )
        raise CommentTooLong(
            f"{who} a {len(text)}-character Slurm job comment; slurmctld keeps at most {MAX_COMMENT}"
        )
    return text


def decode_records(comment: str | None) -> list[JobRecord]:
    """The reservations a placeholder job's comment holds: one for a single pod's job, the
    members on its node for a group's hetjob component, none for anybody else's job."""
    single = JobRecord.decode(comment)
    if single is not None:
        return [single]
    if not comment or not comment.startswith("{"):
        return []
    try:
        document = json.loads(comment)
        if not isinstance(document, dict) or document.get("tag") != GROUP_COMMENT_TAG:
            return []
        shared = {name: document[name] for name in _SHARED}
        records = []
        for item in document["m"]:
            index, pod_uid, name, resources, committed, expires_at, ended, *rest = item
            namespace, scheduler = rest if rest else (shared["namespace"], shared["scheduler"])
            records.append(
                JobRecord(
                    **{
                        **shared,
                        "namespace": namespace,
                        "scheduler": scheduler,
                        "resources": resources or shared["resources"],
                    },
                    pod_uid=pod_uid,
                    name=name,
                    committed=bool(committed),
                    expires_at=expires_at,
                    ended=ended,
                    index=index,
                    group_key=shared["key"],
                )
            )
        return records
    except (KeyError, TypeError, ValueError):
        return []
