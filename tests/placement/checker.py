"""An independent check of where pods were bound: every required placement rule a pod states.

It shares no code with ``bindery`` (it imports nothing from it, on purpose: a rule Bindery gets wrong
must not be got wrong here the same way). It reads plain JSON objects, as the apiserver returns
them (Pods, Nodes, Namespaces), and answers with one :class:`Violation` per broken rule, naming the
pod, its node, the rule and what broke it.

Semantics are kube-scheduler v1.36's filters, written from the Kubernetes API reference and from
reading the upstream plugins (``k8s.io/kubernetes@v1.36.3/pkg/scheduler/framework/plugins/``):

- ``nodeSelector`` and required node affinity (``nodeaffinity``; ``component-helpers``
  ``scheduling/corev1/nodeaffinity``): terms are ORed, a term's requirements ANDed, a term with no
  requirement matches nothing; ``matchFields`` knows only ``metadata.name``.
- taints (``tainttoleration``): every ``NoSchedule`` / ``NoExecute`` taint must be tolerated;
  ``spec.unschedulable`` acts as the ``node.kubernetes.io/unschedulable:NoSchedule`` taint
  (``nodeunschedulable``).
- required pod affinity and anti-affinity (``interpodaffinity/filtering.go``): the pod's own terms,
  and the other pods' anti-affinity terms against it (symmetry); a term's namespaces are its
  ``namespaces`` plus those its ``namespaceSelector`` matches, or the pod's own when both are unset;
  ``matchLabelKeys`` / ``mismatchLabelKeys`` join the selector (the apiserver merges them already; a
  second merge adds the same requirement). An affinity term may be met by nobody when no other pod
  matches all the pod's affinity terms and the pod matches them itself (the first of a group).
- topology spread with ``DoNotSchedule`` (``podtopologyspread/filtering.go``, ``common.go``): pods
  counted in the pod's namespace, on nodes that carry every constraint's key and pass
  ``nodeAffinityPolicy`` (default Honor) and ``nodeTaintsPolicy`` (default Ignore); terminating pods
  are not counted; an empty selector counts nobody; fewer eligible domains than ``minDomains`` makes
  the global minimum 0; ``count + self - min <= maxSkew``.
- host ports (``nodeports``): same protocol and port, and the same host IP or either side 0.0.0.0;
  ports of regular containers and of restartable (sidecar) init containers.
- volume zones (``volumezone/volume_zone.go``): for each claim of the pod bound to a PV, every
  zone/region label of the PV (GA or beta key; ``a__b`` lists zones) must be matched by the node's
  label of the same key, or, for a beta key the node lacks, by its GA key; a node with none of the
  four labels is exempt. Needs ``claims`` and ``volumes``.
- ReadWriteOncePod claims (``volumerestrictions``): at most one bound pod uses such a claim; every
  pod of a claim used by two or more is reported. Needs ``claims``.
- CSI attach limits (``nodevolumelimits/csi.go``): on each node, the distinct CSI volumes (driver and
  ``volumeHandle`` of the PVs the node's pods' claims are bound to) of a driver stay within its
  CSINode ``allocatable.count``; every pod there using that driver is reported. Needs ``claims``,
  ``volumes`` and ``csi_nodes``.
- node resources (``noderesources/fit.go``): the requests of the node's pods (containers, init
  containers and sidecars as the kubelet admits them, pod-level requests, overhead) within the
  node's allocatable, and the number of pods within ``allocatable.pods``; an overcommitted
  resource is reported for the pods that request some of it (fit.go checks no other).

It checks a snapshot: each bound pod against every other pod bound now (as kube-scheduler checks
the incoming pod against the pods already there). Required affinity is "ignored during execution",
so after deletions a snapshot can report one that held when the pod was placed: the workloads of
the tests that use it create pods and do not delete them. Terminal pods (Succeeded, Failed) hold
nothing, as kube-scheduler's informer drops them.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

Obj = Mapping[str, Any]

TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
_FILTER_EFFECTS = ("NoSchedule", "NoExecute")


@dataclasses.dataclass(frozen=True, order=True)
class Violation:
    """One broken rule: `pod` (namespace/name) on `node` breaks `rule`; `detail` says how."""

    rule: str
    pod: str
    node: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.pod} on {self.node}: {self.detail}"


# Rules, in the order a report lists them.
RULES = (
    "nodeSelector",
    "nodeAffinity",
    "taints",
    "podAffinity",
    "podAntiAffinity",
    "topologySpread",
    "hostPorts",
    "volumeZone",
    "readWriteOncePod",
    "volumeLimits",
    "resources",
)


# ---------------------------------------------------------------------------------------------
# Quantities (resource.Quantity's text form)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def quantity(text: str | int | float) -> Fraction:
    """The exact value of a Kubernetes quantity ("100m", "1.5Gi", "2e3", 4)."""
    if isinstance(text, int | float):
        return Fraction(text)
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent:
        return value * Fraction(10) ** int(exponent[1:])
    suffix = suffix or ""
    return value * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


# ---------------------------------------------------------------------------------------------
# Selectors


def _requirement_matches(labels: Mapping[str, str], expr: Obj) -> bool:
    key, op, values = expr["key"], expr["operator"], list(expr.get("values") or [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):  # node selector requirements only; one integer value
        if not present or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown selector operator {op!r}")


def label_selector_matches(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector: nil matches nothing, {} matches everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_requirement_matches(labels, expr) for expr in selector.get("matchExpressions") or [])


def _selector_is_empty(selector: Obj | None) -> bool:
    return selector is not None and not selector.get("matchLabels") and not selector.get("matchExpressions")


def _merge_label_keys(
    selector: Obj | None, pod_labels: Mapping[str, str], match: Sequence[str], mismatch: Sequence[str] = ()
) -> Obj | None:
    """The selector with `key In (pod's value)` per matchLabelKeys, `NotIn` per mismatchLabelKeys
    (keys the pod lacks are skipped); KEP-3633 and the spread's matchLabelKeys."""
    extra = [{"key": k, "operator": "In", "values": [pod_labels[k]]} for k in match if k in pod_labels] + [
        {"key": k, "operator": "NotIn", "values": [pod_labels[k]]} for k in mismatch if k in pod_labels
    ]
    if not extra or selector is None:
        return selector
    return {
        "matchLabels": dict(selector.get("matchLabels") or {}),
        "matchExpressions": [*(selector.get("matchExpressions") or []), *extra],
    }


def _node_term_matches(term: Obj, node: Obj) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no node
    labels = _labels(node)
    if not all(_requirement_matches(labels, e) for e in exprs):
        return False
    for f in fields:
        if f["key"] != "metadata.name":
            return False
        if not _requirement_matches({"metadata.name": node["metadata"]["name"]}, f):
            return False
    return True


def node_selector_matches(pod: Obj, node: Obj) -> bool:
    labels = _labels(node)
    return all(labels.get(k) == v for k, v in (pod["spec"].get("nodeSelector") or {}).items())


def node_affinity_matches(pod: Obj, node: Obj) -> bool:
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(_node_term_matches(t, node) for t in required.get("nodeSelectorTerms") or [])


# ---------------------------------------------------------------------------------------------
# Taints


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    op = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if not key and op != "Exists":
        return False
    if op == "Exists":
        return True
    if op == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    if op in ("Gt", "Lt"):  # KEP-5471: integer comparison of the taint's value with the toleration's
        try:
            have, want = int(taint.get("value") or ""), int(toleration.get("value") or "")
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    """The first NoSchedule/NoExecute taint of `node` (spec.unschedulable counting as one) that the
    pod does not tolerate."""
    taints: list[Obj] = [
        t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") in _FILTER_EFFECTS
    ]
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": TAINT_UNSCHEDULABLE, "effect": "NoSchedule"})
    tolerations = pod["spec"].get("tolerations") or []
    for taint in taints:
        if not any(_tolerates(t, taint) for t in tolerations):
            return taint
    return None


# ---------------------------------------------------------------------------------------------
# Helpers over objects


def _labels(obj: Obj) -> Mapping[str, str]:
    labels: Mapping[str, str] = obj["metadata"].get("labels") or {}
    return labels


def _key(pod: Obj) -> str:
    return f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}"


def _terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _affinity_terms(pod: Obj, kind: str) -> list[Obj]:
    section = (pod["spec"].get("affinity") or {}).get(kind) or {}
    terms: list[Obj] = section.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    return terms


@dataclasses.dataclass(frozen=True)
class _Term:
    """A pod affinity term made concrete for the pod that states it."""

    owner: Obj
    topology_key: str
    selector: Obj | None
    namespaces: frozenset[str]
    namespace_selector: Obj | None

    @classmethod
    def of(cls, owner: Obj, term: Obj) -> _Term:
        names = frozenset(term.get("namespaces") or [])
        ns_selector = term.get("namespaceSelector")
        if not names and ns_selector is None:
            names = frozenset({owner["metadata"].get("namespace", "")})
        selector = _merge_label_keys(
            term.get("labelSelector"),
            _labels(owner),
            term.get("matchLabelKeys") or [],
            term.get("mismatchLabelKeys") or [],
        )
        return cls(owner, term["topologyKey"], selector, names, ns_selector)

    def matches(self, pod: Obj, namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
        ns = pod["metadata"].get("namespace", "")
        in_scope = ns in self.namespaces or (
            self.namespace_selector is not None
            and label_selector_matches(self.namespace_selector, namespace_labels.get(ns, {}))
        )
        return in_scope and label_selector_matches(self.selector, _labels(pod))

    def describe(self) -> str:
        return f"topologyKey {self.topology_key}, selector {_show(self.selector)}"


def _show(selector: Obj | None) -> str:
    if selector is None:
        return "<none>"
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    parts += [
        f"{e['key']} {e['operator']} {list(e.get('values') or [])}".rstrip(" []")
        for e in selector.get("matchExpressions") or []
    ]
    return "{" + ", ".join(parts) + "}"


# ---------------------------------------------------------------------------------------------
# Resources


def _container_requests(container: Obj) -> dict[str, Fraction]:
    requests = (container.get("resources") or {}).get("requests") or {}
    return {name: quantity(v) for name, v in requests.items()}


def _add(total: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, Fraction(0)) + value


def _max_into(total: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for name, value in other.items():
        if value > total.get(name, Fraction(0)):
            total[name] = value


def pod_requests(pod: Obj) -> dict[str, Fraction]:
    """What the pod asks of its node: the larger of its running containers (with sidecars) and any
    init container's peak (with the sidecars started before it), pod-level requests for the
    resources they name, plus overhead."""
    spec = pod["spec"]
    running: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        _add(running, _container_requests(c))
    sidecars: dict[str, Fraction] = {}
    peak: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or []:
        wants = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            _add(sidecars, wants)
            step = dict(sidecars)
        else:
            step = dict(sidecars)
            _add(step, wants)
        _max_into(peak, step)
    _add(running, sidecars)
    total = dict(running)
    _max_into(total, peak)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for name, value in pod_level.items():
        total[name] = quantity(value)
    _add(total, {name: quantity(v) for name, v in (spec.get("overhead") or {}).items()})
    return total


# ---------------------------------------------------------------------------------------------
# Host ports


def _host_ports(pod: Obj) -> list[tuple[str, str, int]]:
    spec = pod["spec"]
    containers = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    containers += list(spec.get("containers") or [])
    ports = []
    for c in containers:
        for p in c.get("ports") or []:
            if int(p.get("hostPort") or 0) > 0:
                ports.append((p.get("hostIP") or "0.0.0.0", p.get("protocol") or "TCP", int(p["hostPort"])))
    return ports


def _ports_conflict(a: tuple[str, str, int], b: tuple[str, str, int]) -> bool:
    (ip_a, proto_a, port_a), (ip_b, proto_b, port_b) = a, b
    if (proto_a, port_a) != (proto_b, port_b):
        return False
    return ip_a == ip_b or "0.0.0.0" in (ip_a, ip_b)


# ---------------------------------------------------------------------------------------------
# The check


@dataclasses.dataclass
class _World:
    nodes: dict[str, Obj]
    pods: list[Obj]  # bound, not terminal
    by_node: dict[str, list[Obj]]
    namespace_labels: dict[str, Mapping[str, str]]
    claims: dict[tuple[str, str], Obj] = dataclasses.field(default_factory=dict)  # (namespace, name)
    volumes: dict[str, Obj] = dataclasses.field(default_factory=dict)
    csi_limits: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # node → driver → count


def check(
    *,
    pods: Iterable[Obj],
    nodes: Iterable[Obj],
    namespaces: Iterable[Obj] = (),
    claims: Iterable[Obj] = (),
    volumes: Iterable[Obj] = (),
    csi_nodes: Iterable[Obj] = (),
    scope: Callable[[Obj], bool] | None = None,
) -> list[Violation]:
    """Every violation of a required rule by a bound pod in `scope` (default: every bound pod).

    `pods` is everything bound in the cluster (pods out of scope still count: their ports, their
    requests, their anti-affinity against pods in scope); `namespaces` feed namespaceSelectors;
    `claims` (PersistentVolumeClaims) and `volumes` (PersistentVolumes) feed the volume rules.
    """
    node_map = {n["metadata"]["name"]: n for n in nodes}
    bound = [p for p in pods if p["spec"].get("nodeName") and not _terminal(p)]
    by_node: dict[str, list[Obj]] = defaultdict(list)
    for p in bound:
        by_node[p["spec"]["nodeName"]].append(p)
    world = _World(
        nodes=node_map,
        pods=bound,
        by_node=by_node,
        namespace_labels={n["metadata"]["name"]: _labels(n) for n in namespaces},
        claims={(c["metadata"].get("namespace", ""), c["metadata"]["name"]): c for c in claims},
        volumes={v["metadata"]["name"]: v for v in volumes},
        csi_limits={
            n["metadata"]["name"]: {
                d["name"]: int(d["allocatable"]["count"])
                for d in (n.get("spec") or {}).get("drivers") or ()
                if (d.get("allocatable") or {}).get("count") is not None
            }
            for n in csi_nodes
        },
    )
    checked = [p for p in bound if scope is None or scope(p)]
    found: list[Violation] = []
    for pod in checked:
        node_name = pod["spec"]["nodeName"]
        node = node_map.get(node_name)
        if node is None:
            found.append(
                Violation("nodeAffinity", _key(pod), node_name, "bound to a node that does not exist")
            )
            continue
        found += _check_node_rules(pod, node)
        found += _check_pod_affinity(pod, node, world)
        found += _check_pod_anti_affinity(pod, node, world)
        found += _check_spread(pod, node, world)
        found += _check_host_ports(pod, node, world)
        found += _check_volume_zone(pod, node, world)
    found += _check_read_write_once_pod(checked, world)
    found += _check_volume_limits(checked, world)
    found += _check_resources(world, {_key(p) for p in checked})
    return sorted(set(found), key=lambda v: (RULES.index(v.rule), v.pod, v.node, v.detail))


def _check_node_rules(pod: Obj, node: Obj) -> list[Violation]:
    out = []
    name = node["metadata"]["name"]
    if not node_selector_matches(pod, node):
        want = pod["spec"].get("nodeSelector") or {}
        have = {k: _labels(node).get(k) for k in want}
        out.append(Violation("nodeSelector", _key(pod), name, f"nodeSelector {want} but the node has {have}"))
    if not node_affinity_matches(pod, node):
        out.append(
            Violation(
                "nodeAffinity",
                _key(pod),
                name,
                "no required nodeSelectorTerm matches the node's labels/name",
            )
        )
    taint = untolerated_taint(pod, node)
    if taint is not None:
        shown = f"{taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}"
        out.append(Violation("taints", _key(pod), name, f"taint {shown} is not tolerated"))
    return out


def _others(pod: Obj, world: _World) -> Iterable[Obj]:
    me = _key(pod)
    return (p for p in world.pods if _key(p) != me)


def _check_pod_affinity(pod: Obj, node: Obj, world: _World) -> list[Violation]:
    terms = [_Term.of(pod, t) for t in _affinity_terms(pod, "podAffinity")]
    if not terms:
        return []
    name = node["metadata"]["name"]
    labels = _labels(node)
    missing = [t.topology_key for t in terms if t.topology_key not in labels]
    if missing:
        return [
            Violation(
                "podAffinity", _key(pod), name, f"the node lacks the affinity topology key(s) {missing}"
            )
        ]
    # Upstream counts, per term's domain, the other pods that match ALL the pod's terms.
    matching_all = [
        o for o in _others(pod, world) if all(t.matches(o, world.namespace_labels) for t in terms)
    ]
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for other in matching_all:
        other_node = world.nodes.get(other["spec"]["nodeName"])
        if other_node is None:
            continue
        for t in terms:
            value = _labels(other_node).get(t.topology_key)
            if value is not None:
                counts[(t.topology_key, value)] += 1
    unmet = [t for t in terms if counts[(t.topology_key, labels[t.topology_key])] <= 0]
    if not unmet:
        return []
    nobody_matches = not any(v > 0 for v in counts.values())
    if nobody_matches and all(t.matches(pod, world.namespace_labels) for t in terms):
        return []  # the first pod of a group that is affine to itself
    return [
        Violation(
            "podAffinity",
            _key(pod),
            name,
            f"no matching pod in {t.topology_key}={labels[t.topology_key]} ({t.describe()})",
        )
        for t in unmet
    ]


def _check_pod_anti_affinity(pod: Obj, node: Obj, world: _World) -> list[Violation]:
    """The pod's own anti-affinity terms against the others, and the others' against the pod."""
    out: list[Violation] = []
    name = node["metadata"]["name"]
    labels = _labels(node)
    mine = [_Term.of(pod, t) for t in _affinity_terms(pod, "podAntiAffinity")]
    for other in _others(pod, world):
        other_node = world.nodes.get(other["spec"]["nodeName"])
        if other_node is None:
            continue
        other_labels = _labels(other_node)
        for t in mine:
            value = labels.get(t.topology_key)
            if value is None or other_labels.get(t.topology_key) != value:
                continue
            if t.matches(other, world.namespace_labels):
                out.append(
                    Violation(
                        "podAntiAffinity",
                        _key(pod),
                        name,
                        f"{_key(other)} on {other['spec']['nodeName']} shares {t.topology_key}={value} "
                        f"and matches the pod's term ({t.describe()})",
                    )
                )
        for raw in _affinity_terms(other, "podAntiAffinity"):
            t = _Term.of(other, raw)
            value = other_labels.get(t.topology_key)
            if value is None or labels.get(t.topology_key) != value:
                continue
            if t.matches(pod, world.namespace_labels):
                out.append(
                    Violation(
                        "podAntiAffinity",
                        _key(pod),
                        name,
                        f"{_key(other)} on {other['spec']['nodeName']} shares {t.topology_key}={value} "
                        f"and its term matches this pod (symmetry; {t.describe()})",
                    )
                )
    return out


def _check_spread(pod: Obj, node: Obj, world: _World) -> list[Violation]:
    constraints = [
        c
        for c in pod["spec"].get("topologySpreadConstraints") or []
        if c.get("whenUnsatisfiable") == "DoNotSchedule"
    ]
    if not constraints:
        return []
    out: list[Violation] = []
    name = node["metadata"]["name"]
    namespace = pod["metadata"].get("namespace", "")
    keys = [c["topologyKey"] for c in constraints]
    me = _key(pod)
    for c in constraints:
        key = c["topologyKey"]
        selector = _merge_label_keys(c.get("labelSelector"), _labels(pod), c.get("matchLabelKeys") or [])
        affinity_policy = c.get("nodeAffinityPolicy") or "Honor"
        taints_policy = c.get("nodeTaintsPolicy") or "Ignore"
        counts: dict[str, int] = {}
        for candidate in world.nodes.values():
            labels = _labels(candidate)
            if not all(k in labels for k in keys):
                continue
            if affinity_policy == "Honor" and not (
                node_selector_matches(pod, candidate) and node_affinity_matches(pod, candidate)
            ):
                continue
            if taints_policy == "Honor" and untolerated_taint(pod, candidate) is not None:
                continue
            matched = 0
            if not _selector_is_empty(selector):
                for other in world.by_node.get(candidate["metadata"]["name"], []):
                    if _key(other) == me or other["metadata"].get("deletionTimestamp"):
                        continue
                    if other["metadata"].get("namespace", "") != namespace:
                        continue
                    if label_selector_matches(selector, _labels(other)):
                        matched += 1
            counts[labels[key]] = counts.get(labels[key], 0) + matched
        value = _labels(node).get(key)
        if value is None:
            out.append(Violation("topologySpread", me, name, f"the node lacks the spread key {key}"))
            continue
        minimum = min(counts.values()) if counts else 0
        min_domains = int(c.get("minDomains") or 1)
        if len(counts) < min_domains:
            minimum = 0
        self_match = 1 if label_selector_matches(selector, _labels(pod)) else 0
        skew = counts.get(value, 0) + self_match - minimum
        if skew > int(c["maxSkew"]):
            spread = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            out.append(
                Violation(
                    "topologySpread",
                    me,
                    name,
                    f"{key}={value}: skew {skew} > maxSkew {c['maxSkew']} "
                    f"(others matching {_show(selector)} per domain: {spread}; min {minimum}"
                    f"{f', minDomains {min_domains}' if min_domains > 1 else ''})",
                )
            )
    return out


def _check_host_ports(pod: Obj, node: Obj, world: _World) -> list[Violation]:
    mine = _host_ports(pod)
    if not mine:
        return []
    out = []
    me = _key(pod)
    name = node["metadata"]["name"]
    for other in world.by_node.get(name, []):
        if _key(other) == me:
            continue
        for a in mine:
            for b in _host_ports(other):
                if _ports_conflict(a, b):
                    out.append(
                        Violation(
                            "hostPorts",
                            me,
                            name,
                            f"{a[1]} {a[0]}:{a[2]} conflicts with {_key(other)}'s {b[0]}:{b[2]}",
                        )
                    )
    return out


_ZONE_LABELS = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone": None,
    "topology.kubernetes.io/region": None,
}


def _pod_volumes(pod: Obj, world: _World) -> list[Obj]:
    """The PVs the pod's claims are bound to (claims not bound, or not given, are skipped)."""
    found = []
    for volume in pod["spec"].get("volumes") or ():
        source = volume.get("persistentVolumeClaim")
        if not source:
            continue
        claim = world.claims.get((pod["metadata"].get("namespace", ""), source.get("claimName")))
        pv_name = ((claim or {}).get("spec") or {}).get("volumeName")
        if pv_name and pv_name in world.volumes:
            found.append(world.volumes[pv_name])
    return found


def _check_volume_zone(pod: Obj, node: Obj, world: _World) -> list[Violation]:
    node_labels = _labels(node)
    if not any(key in node_labels for key in _ZONE_LABELS):
        return []  # upstream: a node without topology labels accepts any volume
    out = []
    for pv in _pod_volumes(pod, world):
        for key, ga in _ZONE_LABELS.items():
            value = _labels(pv).get(key)
            if value is None:
                continue
            zones = value.split("__")
            if "" in [z.strip() for z in zones]:
                continue  # malformed: upstream ignores the label
            have = node_labels.get(key, node_labels.get(ga) if ga else None)
            if have not in {z.strip() for z in zones}:
                out.append(
                    Violation(
                        "volumeZone",
                        _key(pod),
                        node["metadata"]["name"],
                        f"volume {pv['metadata']['name']} has {key}={value}, the node {have!r}",
                    )
                )
    return out


def _claim_names(pod: Obj) -> set[str]:
    return {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or ()
        if (v.get("persistentVolumeClaim") or {}).get("claimName")
    }


def _check_read_write_once_pod(checked: Sequence[Obj], world: _World) -> list[Violation]:
    users: dict[tuple[str, str], list[Obj]] = defaultdict(list)
    for p in world.pods:
        for name in _claim_names(p):
            users[(p["metadata"].get("namespace", ""), name)].append(p)
    in_scope = {_key(p) for p in checked}
    out = []
    for (namespace, name), pods in users.items():
        claim = world.claims.get((namespace, name))
        modes = ((claim or {}).get("spec") or {}).get("accessModes") or ()
        if "ReadWriteOncePod" not in modes or len(pods) < 2:
            continue
        for p in pods:
            if _key(p) in in_scope:
                others = ", ".join(sorted(_key(o) for o in pods if o is not p))
                detail = f"claim {name} is ReadWriteOncePod and also used by {others}"
                out.append(Violation("readWriteOncePod", _key(p), p["spec"]["nodeName"], detail))
    return out


def _check_volume_limits(checked: Sequence[Obj], world: _World) -> list[Violation]:
    in_scope = {_key(p) for p in checked}
    out = []
    for node_name, limits in world.csi_limits.items():
        handles: dict[str, set[str]] = defaultdict(set)
        users: dict[str, list[Obj]] = defaultdict(list)
        for p in world.by_node.get(node_name, ()):
            for pv in _pod_volumes(p, world):
                csi = (pv.get("spec") or {}).get("csi") or {}
                if csi.get("driver") and csi.get("volumeHandle"):
                    handles[csi["driver"]].add(csi["volumeHandle"])
                    users[csi["driver"]].append(p)
        for driver, limit in limits.items():
            if len(handles[driver]) > limit:
                for p in users[driver]:
                    if _key(p) in in_scope:
                        count = len(handles[driver])
                        detail = f"{count} volumes of CSI driver {driver}, the node attaches {limit}"
                        out.append(Violation("volumeLimits", _key(p), node_name, detail))
    return out


def _check_resources(world: _World, in_scope: set[str]) -> list[Violation]:
    out: list[Violation] = []
    for name, pods in sorted(world.by_node.items()):
        node = world.nodes.get(name)
        if node is None:
            continue
        scoped = sorted(_key(p) for p in pods if _key(p) in in_scope)
        if not scoped:
            continue
        allocatable = {
            k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()
        }
        used: dict[str, Fraction] = {}
        asks: dict[str, dict[str, Fraction]] = {}
        for p in pods:
            requests = pod_requests(p)
            _add(used, requests)
            if _key(p) in in_scope:
                asks[_key(p)] = requests
        used["pods"] = Fraction(len(pods))
        for resource, amount in sorted(used.items()):
            if amount == 0:
                continue
            have = allocatable.get(resource, Fraction(0))
            if amount > have:
                # fit.go checks only what the pod requests: a pod asking for none of an
                # overcommitted resource did not overcommit it (every pod asks for one pod slot).
                out.extend(
                    Violation(
                        "resources",
                        pod,
                        name,
                        f"the node's pods request {_fmt(amount)} {resource}, allocatable {_fmt(have)}",
                    )
                    for pod in scoped
                    if resource == "pods" or asks[pod].get(resource, 0) > 0
                )
    return out


def _fmt(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


# ---------------------------------------------------------------------------------------------
# Evictions for a preemptor (DefaultPreemption, ``framework/preemption/preemption.go`` and
# ``defaultpreemption/default_preemption.go`` ``SelectVictimsOnNode``)


def _priority(pod: Obj) -> int:
    return int((pod.get("spec") or {}).get("priority") or 0)


def _fits(preemptor: Obj, node: Obj, pods: Sequence[Obj]) -> bool:
    """Whether the preemptor's requests fit beside ``pods`` within the node's allocatable."""
    allocatable = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    used: dict[str, Fraction] = {}
    for pod in pods:
        _add(used, pod_requests(pod))
    used["pods"] = Fraction(len(pods))
    asks = {**pod_requests(preemptor), "pods": Fraction(1)}
    return all(
        used.get(resource, Fraction(0)) + amount <= allocatable.get(resource, Fraction(0))
        for resource, amount in asks.items()
        if amount > 0
    )


def eviction_violations(
    *, preemptor: Obj, node: Obj, victims: Sequence[Obj], pods_on_node: Sequence[Obj] | None = None
) -> list[Violation]:
    """Why kube-scheduler's DefaultPreemption would not evict ``victims`` to place ``preemptor`` on
    ``node``; empty when it might. ``victims`` are the Pods as they were just before the eviction.

    - the preemptor must be allowed on the node by its own node rules (nodeSelector, required node
      affinity, NoSchedule/NoExecute taints and ``spec.unschedulable``): upstream only considers
      nodes that fail no filter but for resources and inter-pod rules;
    - a preemptor with ``preemptionPolicy: Never`` evicts nobody;
    - every victim is bound to that node, not terminal, and of strictly lower priority;
    - with ``pods_on_node`` (every pod bound there before the evictions): the preemptor fits once
      every lower-priority pod is gone, and every victim is needed (the reprieve gives a victim back
      when the preemptor still fits with it, so no victim may be given back on its own).
    """
    name = str(node["metadata"]["name"])
    who = _key(preemptor)
    out: list[Violation] = []
    if (preemptor.get("spec") or {}).get("preemptionPolicy") == "Never":
        out.append(Violation("preemption", who, name, "the preemptor has preemptionPolicy Never"))
    if not node_selector_matches(preemptor, node):
        out.append(Violation("preemption", who, name, "the node does not match the preemptor's nodeSelector"))
    if not node_affinity_matches(preemptor, node):
        out.append(
            Violation("preemption", who, name, "the node fails the preemptor's required node affinity")
        )
    if (taint := untolerated_taint(preemptor, node)) is not None:
        out.append(Violation("preemption", who, name, f"the preemptor does not tolerate taint {taint}"))
    for victim in victims:
        where = (victim.get("spec") or {}).get("nodeName")
        if where != name:
            out.append(Violation("preemption", _key(victim), str(where), f"victim not on node {name}"))
        if _terminal(victim):
            out.append(Violation("preemption", _key(victim), name, "victim already finished"))
        if _priority(victim) >= _priority(preemptor):
            out.append(
                Violation(
                    "preemption",
                    _key(victim),
                    name,
                    f"victim priority {_priority(victim)} is not below the preemptor's "
                    f"{_priority(preemptor)}",
                )
            )
    if pods_on_node is not None:
        live = [pod for pod in pods_on_node if not _terminal(pod)]
        lower = {_key(pod) for pod in live if _priority(pod) < _priority(preemptor)}
        gone = {_key(victim) for victim in victims}
        if not _fits(preemptor, node, [pod for pod in live if _key(pod) not in lower]):
            out.append(
                Violation("preemption", who, name, "does not fit even with every lower-priority pod gone")
            )
        for victim in victims:
            kept = [pod for pod in live if _key(pod) not in gone or _key(pod) == _key(victim)]
            if _fits(preemptor, node, kept):
                out.append(
                    Violation("preemption", _key(victim), name, "not needed: the preemptor fits with it kept")
                )
    return sorted(out)
