"""The independent placement checker, on hand-made Pods and Nodes: it must find each kind of
violation (with the pod, node and rule named) and must pass placements kube-scheduler would make."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import pytest

from tests.placement import checker
from tests.placement.checker import Violation, check, pod_requests, quantity

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def node(
    name: str,
    *,
    zone: str | None = "a",
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
    cpu: str = "4",
    pods: str = "110",
    unschedulable: bool = False,
) -> dict[str, Any]:
    all_labels = {HOST: name, **({ZONE: zone} if zone else {}), **(labels or {})}
    return {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"taints": list(taints), "unschedulable": unschedulable},
        "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": pods}},
    }


def pod(
    name: str,
    on: str | None,
    *,
    ns: str = "default",
    labels: Mapping[str, str] | None = None,
    cpu: str = "100m",
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {})},
        "spec": {
            **({"nodeName": on} if on else {}),
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
            **spec,
        },
        "status": {"phase": "Running"},
    }


def anti(key: str, selector: Mapping[str, Any], **term: Any) -> dict[str, Any]:
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": key, "labelSelector": dict(selector), **term}
            ]
        }
    }


def affine(key: str, selector: Mapping[str, Any], **term: Any) -> dict[str, Any]:
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": key, "labelSelector": dict(selector), **term}
            ]
        }
    }


def spread(key: str, max_skew: int = 1, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "maxSkew": max_skew,
            "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
            **extra,
        }
    ]


def rules(found: Sequence[Violation]) -> list[tuple[str, str, str]]:
    return [(v.rule, v.pod, v.node) for v in found]


def test_the_checker_imports_nothing_from_bindery() -> None:
    source = pathlib.Path(checker.__file__).read_text()
    imported = set()
    for item in ast.walk(ast.parse(source)):
        if isinstance(item, ast.Import):
            imported |= {alias.name for alias in item.names}
        elif isinstance(item, ast.ImportFrom):
            imported.add(item.module or "")
    assert not {name for name in imported if name.split(".")[0] in ("bindery", "kubernetes_asyncio", "tests")}


@pytest.mark.parametrize(
    ("text", "value"),
    [("100m", Fraction(1, 10)), ("1.5Gi", Fraction(3 * 2**29)), ("2e3", Fraction(2000)), ("4", Fraction(4))],
)
def test_quantities(text: str, value: Fraction) -> None:
    assert quantity(text) == value


def test_node_selector_and_required_node_affinity() -> None:
    nodes = [node("n1", labels={"disk": "ssd"}), node("n2", labels={"disk": "hdd", "gen": "7"})]
    needs_ssd = {"disk": "ssd"}
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["5"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]},
                ]
            }
        }
    }
    found = check(
        pods=[
            pod("ok-sel", "n1", nodeSelector=needs_ssd),
            pod("bad-sel", "n2", nodeSelector=needs_ssd),
            pod("ok-aff", "n2", affinity=affinity),
            pod("bad-aff", "n1", affinity=affinity),
        ],
        nodes=nodes,
    )
    assert rules(found) == [
        ("nodeSelector", "default/bad-sel", "n2"),
        ("nodeAffinity", "default/bad-aff", "n1"),
    ]
    assert "{'disk': 'ssd'} but the node has {'disk': 'hdd'}" in found[0].detail


def test_an_empty_node_selector_term_matches_no_node() -> None:
    affinity: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}
    }
    assert rules(check(pods=[pod("p", "n1", affinity=affinity)], nodes=[node("n1")])) == [
        ("nodeAffinity", "default/p", "n1")
    ]


def test_taints_noschedule_noexecute_and_unschedulable() -> None:
    gpu = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
    drain = {"key": "drain", "effect": "NoExecute"}
    soft = {"key": "soft", "effect": "PreferNoSchedule"}
    nodes = [
        node("gpu", taints=[gpu]),
        node("drain", taints=[drain]),
        node("soft", taints=[soft]),
        node("cordoned", unschedulable=True),
    ]
    tolerate_gpu = [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    found = check(
        pods=[
            pod("tolerates", "gpu", tolerations=tolerate_gpu),
            pod("wrong-value", "gpu", tolerations=[{"key": "gpu", "value": "false"}]),
            pod("everything", "drain", tolerations=[{"operator": "Exists"}]),
            pod("plain", "drain"),
            pod("preferred-only", "soft"),
            pod("cordoned", "cordoned"),
        ],
        nodes=nodes,
    )
    assert rules(found) == [
        ("taints", "default/cordoned", "cordoned"),
        ("taints", "default/plain", "drain"),
        ("taints", "default/wrong-value", "gpu"),
    ]
    assert "node.kubernetes.io/unschedulable" in found[0].detail


def test_gt_lt_tolerations_compare_integers() -> None:
    taint = {"key": "tier", "value": "5", "effect": "NoSchedule"}
    found = check(
        pods=[
            pod(
                "gt",
                "n1",
                tolerations=[{"key": "tier", "operator": "Gt", "value": "3", "effect": "NoSchedule"}],
            ),
            pod(
                "lt",
                "n1",
                tolerations=[{"key": "tier", "operator": "Lt", "value": "3", "effect": "NoSchedule"}],
            ),
        ],
        nodes=[node("n1", taints=[taint])],
    )
    assert rules(found) == [("taints", "default/lt", "n1")]


def test_hostname_anti_affinity_finds_every_pod_of_a_crowded_node() -> None:
    web = {"app": "web"}
    term = anti(HOST, {"matchLabels": web})
    found = check(
        pods=[
            pod("w1", "n1", labels=web, affinity=term),
            pod("w2", "n1", labels=web, affinity=term),
            pod("w3", "n2", labels=web, affinity=term),
        ],
        nodes=[node("n1"), node("n2")],
    )
    assert {(v.rule, v.pod) for v in found} == {
        ("podAntiAffinity", "default/w1"),
        ("podAntiAffinity", "default/w2"),
    }
    assert any("default/w2 on n1 shares kubernetes.io/hostname=n1" in v.detail for v in found)


def test_anti_affinity_is_symmetric_an_existing_pods_term_repels_a_pod_without_terms() -> None:
    found = check(
        pods=[
            pod("db", "n1", labels={"app": "db"}, affinity=anti(ZONE, {"matchLabels": {"app": "batch"}})),
            pod("batch", "n2", labels={"app": "batch"}),  # same zone "a", no terms of its own
        ],
        nodes=[node("n1"), node("n2")],
    )
    assert ("podAntiAffinity", "default/batch", "n2") in rules(found)
    symmetric = next(v for v in found if v.pod == "default/batch")
    assert "symmetry" in symmetric.detail
    assert "default/db" in symmetric.detail


def test_anti_affinity_namespaces_and_namespace_selector() -> None:
    nodes = [node("n1")]
    namespaces = [
        {"metadata": {"name": "team-a", "labels": {"team": "a"}}},
        {"metadata": {"name": "team-b", "labels": {"team": "b"}}},
    ]
    web = {"app": "web"}
    own_ns_only = anti(HOST, {"matchLabels": web})
    by_selector = anti(HOST, {"matchLabels": web}, namespaceSelector={"matchLabels": {"team": "b"}})
    # Unset namespaces: only the pod's own namespace, so a web pod of team-b does not count.
    assert (
        check(
            pods=[
                pod("x", "n1", ns="team-a", labels=web, affinity=own_ns_only),
                pod("y", "n1", ns="team-b", labels=web),
            ],
            nodes=nodes,
            namespaces=namespaces,
        )
        == []
    )
    found = check(
        pods=[
            pod("x", "n1", ns="team-a", labels=web, affinity=by_selector),
            pod("y", "n1", ns="team-b", labels=web),
        ],
        nodes=nodes,
        namespaces=namespaces,
    )
    assert ("podAntiAffinity", "team-a/x", "n1") in rules(found)
    listed = anti(HOST, {"matchLabels": web}, namespaces=["team-b"])
    assert ("podAntiAffinity", "team-a/x", "n1") in rules(
        check(
            pods=[pod("x", "n1", ns="team-a", affinity=listed), pod("y", "n1", ns="team-b", labels=web)],
            nodes=nodes,
        )
    )


def test_match_label_keys_narrow_the_selector_to_the_pods_own_revision() -> None:
    term = anti(HOST, {"matchLabels": {"app": "web"}}, matchLabelKeys=["rev"])
    old = {"app": "web", "rev": "1"}
    new = {"app": "web", "rev": "2"}
    nodes = [node("n1")]
    assert (
        check(
            pods=[pod("a", "n1", labels=old, affinity=term), pod("b", "n1", labels=new, affinity=term)],
            nodes=nodes,
        )
        == []
    )
    found = check(
        pods=[pod("a", "n1", labels=old, affinity=term), pod("b", "n1", labels=old, affinity=term)],
        nodes=nodes,
    )
    assert {v.pod for v in found} == {"default/a", "default/b"}


def test_pod_affinity_needs_a_matching_pod_in_the_domain_except_for_the_first_of_a_group() -> None:
    cache = {"app": "cache"}
    web = {"app": "web"}
    near_cache = affine(ZONE, {"matchLabels": cache})
    nodes = [node("n1", zone="a"), node("n2", zone="b")]
    assert (
        check(
            pods=[pod("c", "n1", labels=cache), pod("w", "n1", labels=web, affinity=near_cache)], nodes=nodes
        )
        == []
    )
    found = check(
        pods=[pod("c", "n1", labels=cache), pod("w", "n2", labels=web, affinity=near_cache)], nodes=nodes
    )
    assert rules(found) == [("podAffinity", "default/w", "n2")]
    assert "no matching pod in topology.kubernetes.io/zone=b" in found[0].detail
    # Nobody matches and the pod does not match its own term: it may not go anywhere.
    assert rules(check(pods=[pod("w", "n1", labels=web, affinity=near_cache)], nodes=nodes)) == [
        ("podAffinity", "default/w", "n1")
    ]
    # A group affine to itself: the first pod may start anywhere, the rest must follow it.
    self_affine = affine(ZONE, {"matchLabels": cache})
    assert check(pods=[pod("c1", "n1", labels=cache, affinity=self_affine)], nodes=nodes) == []
    found = check(
        pods=[
            pod("c1", "n1", labels=cache, affinity=self_affine),
            pod("c2", "n2", labels=cache, affinity=self_affine),
        ],
        nodes=nodes,
    )
    assert {v.pod for v in found} == {"default/c1", "default/c2"}


def test_zone_spread_six_pods_on_one_zone_break_max_skew_two_per_zone_does_not() -> None:
    nodes = [node("n1", zone="a"), node("n2", zone="b"), node("n3", zone="c")]
    web = {"app": "web"}
    piled = [pod(f"w{i}", "n1", labels=web, topologySpreadConstraints=spread(ZONE)) for i in range(6)]
    found = check(pods=piled, nodes=nodes)
    assert {v.rule for v in found} == {"topologySpread"}
    assert len(found) == 6
    assert "zone=a: skew 6 > maxSkew 1" in found[0].detail
    even = [
        pod(f"w{i}", f"n{i % 3 + 1}", labels=web, topologySpreadConstraints=spread(ZONE)) for i in range(6)
    ]
    assert check(pods=even, nodes=nodes) == []


def test_spread_counts_only_eligible_nodes_and_the_pods_namespace() -> None:
    web = {"app": "web"}
    nodes = [
        node("n1", zone="a", labels={"pool": "p"}),
        node("n2", zone="b", labels={"pool": "p"}),
        node("n3", zone="c"),
    ]  # zone c is not in the pod's pool: not a domain (nodeAffinityPolicy Honor)
    constraint = spread(ZONE)
    pods = [
        pod(
            f"w{i}",
            f"n{i % 2 + 1}",
            labels=web,
            nodeSelector={"pool": "p"},
            topologySpreadConstraints=constraint,
        )
        for i in range(4)
    ]
    pods.append(pod("other-ns", "n1", ns="elsewhere", labels=web))
    assert check(pods=pods, nodes=nodes) == []
    # With nodeAffinityPolicy Ignore, the empty zone c counts: 2/2/0 is a skew of 2.
    ignoring = spread(ZONE, nodeAffinityPolicy="Ignore")
    pods = [
        pod(
            f"w{i}",
            f"n{i % 2 + 1}",
            labels=web,
            nodeSelector={"pool": "p"},
            topologySpreadConstraints=ignoring,
        )
        for i in range(4)
    ]
    assert {v.rule for v in check(pods=pods, nodes=nodes)} == {"topologySpread"}


def test_spread_node_taints_policy_honor_drops_tainted_domains() -> None:
    web = {"app": "web"}
    nodes = [
        node("n1", zone="a"),
        node("n2", zone="b"),
        node("n3", zone="c", taints=[{"key": "x", "effect": "NoSchedule"}]),
    ]
    pods = [
        pod(f"w{i}", f"n{i % 2 + 1}", labels=web, topologySpreadConstraints=spread(ZONE)) for i in range(4)
    ]
    assert {v.rule for v in check(pods=pods, nodes=nodes)} == {"topologySpread"}  # Ignore: zone c counts as 0
    honor = spread(ZONE, nodeTaintsPolicy="Honor")
    pods = [pod(f"w{i}", f"n{i % 2 + 1}", labels=web, topologySpreadConstraints=honor) for i in range(4)]
    assert check(pods=pods, nodes=nodes) == []


def test_spread_min_domains_makes_the_minimum_zero_until_enough_domains_exist() -> None:
    web = {"app": "web"}
    nodes = [node("n1", zone="a"), node("n2", zone="b")]
    constraint = spread(ZONE, minDomains=3)
    # 1/1 on two domains: each pod sees count 0 + self 1 - min 0 (only 2 < 3 domains) = 1: fine.
    pods = [pod(f"w{i}", f"n{i + 1}", labels=web, topologySpreadConstraints=constraint) for i in range(2)]
    assert check(pods=pods, nodes=nodes) == []
    # 2/2: count 1 + 1 - 0 = 2 > 1, though without minDomains 2/2 is even.
    pods = [pod(f"w{i}", f"n{i % 2 + 1}", labels=web, topologySpreadConstraints=constraint) for i in range(4)]
    assert {v.rule for v in check(pods=pods, nodes=nodes)} == {"topologySpread"}
    plain = [
        pod(f"w{i}", f"n{i % 2 + 1}", labels=web, topologySpreadConstraints=spread(ZONE)) for i in range(4)
    ]
    assert check(pods=plain, nodes=nodes) == []


def test_schedule_anyway_spread_is_not_a_required_rule() -> None:
    web = {"app": "web"}
    soft = [{**spread(ZONE)[0], "whenUnsatisfiable": "ScheduleAnyway"}]
    pods = [pod(f"w{i}", "n1", labels=web, topologySpreadConstraints=soft) for i in range(4)]
    assert check(pods=pods, nodes=[node("n1", zone="a"), node("n2", zone="b")]) == []


def test_host_ports_conflict_on_protocol_port_and_overlapping_ip() -> None:
    def ports(*items: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [{"name": "c", "ports": [{"containerPort": 80, **i} for i in items]}]

    found = check(
        pods=[
            pod("a", "n1", containers=ports({"hostPort": 8080})),
            pod("b", "n1", containers=ports({"hostPort": 8080, "hostIP": "10.0.0.1"})),  # 0.0.0.0 overlaps
            pod("udp", "n1", containers=ports({"hostPort": 8080, "protocol": "UDP"})),
            pod("elsewhere", "n2", containers=ports({"hostPort": 8080})),
        ],
        nodes=[node("n1"), node("n2")],
    )
    assert rules(found) == [("hostPorts", "default/a", "n1"), ("hostPorts", "default/b", "n1")]


def test_requests_count_init_containers_sidecars_pod_level_and_overhead() -> None:
    p = pod("p", "n1")
    p["spec"]["containers"] = [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]
    p["spec"]["initContainers"] = [
        {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
        {"name": "init", "resources": {"requests": {"cpu": "3"}}},
    ]
    p["spec"]["overhead"] = {"cpu": "100m"}
    assert pod_requests(p)["cpu"] == Fraction(36, 10)  # max(1 + 0.5, 0.5 + 3) + 0.1
    p["spec"]["resources"] = {"requests": {"cpu": "2"}}
    assert pod_requests(p)["cpu"] == Fraction(21, 10)


def test_resources_overcommit_and_pod_count() -> None:
    found = check(pods=[pod(f"p{i}", "n1", cpu="1500m") for i in range(3)], nodes=[node("n1", cpu="4")])
    assert {v.rule for v in found} == {"resources"}
    assert len(found) == 3
    assert "request 9/2 cpu" not in found[0].detail
    assert "4.5 cpu, allocatable 4" in found[0].detail
    found = check(pods=[pod(f"p{i}", "n1") for i in range(3)], nodes=[node("n1", pods="2")])
    assert "request 3 pods, allocatable 2" in found[0].detail


def test_an_overcommitted_resource_is_charged_only_to_the_pods_that_request_it() -> None:
    # NodeResourcesFit checks the resources the incoming pod requests, nothing else: a pod asking for
    # no example.com/beardsecond fits a node whose earlier pods hold more of it than the node offers
    # now (Kubernetes' pod overhead e2e test takes the resource off the nodes as it ends, while its
    # pods are still terminating and the next test's pods arrive).
    beard = "example.com/beardsecond"
    old = pod("old", "n1")
    old["spec"]["containers"][0]["resources"]["requests"][beard] = "700"
    asking = pod("asking", "n1")
    asking["spec"]["containers"][0]["resources"]["requests"][beard] = "1"
    found = check(pods=[old, pod("new", "n1"), asking], nodes=[node("n1")])
    assert rules(found) == [("resources", "default/asking", "n1"), ("resources", "default/old", "n1")]
    assert "request 701 example.com/beardsecond, allocatable 0" in found[0].detail


def test_terminal_pods_hold_nothing_and_pods_out_of_scope_still_count() -> None:
    done = pod("done", "n1", cpu="4")
    done["status"]["phase"] = "Succeeded"
    assert check(pods=[done, pod("p", "n1", cpu="4")], nodes=[node("n1", cpu="4")]) == []
    web = {"app": "web"}
    found = check(
        pods=[
            pod("theirs", "n1", labels=web),
            pod(
                "mine",
                "n1",
                ns="mine",
                labels=web,
                affinity=anti(HOST, {"matchLabels": web}, namespaces=["default"]),
            ),
        ],
        nodes=[node("n1")],
        scope=lambda p: p["metadata"]["namespace"] == "mine",
    )
    # Only the pod in scope is reported; the default-namespace pod has no terms of its own anyway.
    assert rules(found) == [("podAntiAffinity", "mine/mine", "n1")]


def test_volume_zone_labels_of_bound_volumes_must_match_the_nodes() -> None:
    def pv(name: str, **labels: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": labels}, "spec": {}}

    def claim(name: str, volume: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default"}, "spec": {"volumeName": volume}}

    def using(name: str, on: str, claim_name: str) -> dict[str, Any]:
        return pod(name, on, volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": claim_name}}])

    beta = "failure-domain.beta.kubernetes.io/zone"
    found = check(
        pods=[
            using("right", "a1", "in-a"),
            using("wrong", "b1", "in-a"),
            using("bare", "bare", "in-a"),  # a node with no topology label accepts any volume
            using("beta-ga", "a1", "beta-a"),  # a beta key on the volume matches the node's GA key
            using("multi", "b1", "a-or-b"),
        ],
        nodes=[node("a1", zone="a"), node("b1", zone="b"), node("bare", zone=None)],
        claims=[claim("in-a", "pv-a"), claim("beta-a", "pv-beta"), claim("a-or-b", "pv-ab")],
        volumes=[pv("pv-a", **{ZONE: "a"}), pv("pv-beta", **{beta: "a"}), pv("pv-ab", **{ZONE: "a__b"})],
    )
    assert rules(found) == [("volumeZone", "default/wrong", "b1")]


def test_a_read_write_once_pod_claim_used_by_two_bound_pods_is_a_violation_for_both() -> None:
    def claim(name: str, mode: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default"}, "spec": {"accessModes": [mode]}}

    def using(name: str, on: str | None, claim_name: str) -> dict[str, Any]:
        return pod(name, on, volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": claim_name}}])

    found = check(
        pods=[
            using("a", "n1", "single"),
            using("b", "n2", "single"),
            using("pending", None, "single"),  # not bound: holds nothing
            using("c", "n1", "shared"),
            using("d", "n1", "shared"),  # ReadWriteOnce: two pods on a node may share it
            using("alone", "n2", "other"),
        ],
        nodes=[node("n1"), node("n2")],
        claims=[
            claim("single", "ReadWriteOncePod"),
            claim("shared", "ReadWriteOnce"),
            claim("other", "ReadWriteOncePod"),
        ],
    )
    assert rules(found) == [
        ("readWriteOncePod", "default/a", "n1"),
        ("readWriteOncePod", "default/b", "n2"),
    ]


def test_csi_volumes_past_a_nodes_attach_limit_are_a_violation_for_their_pods() -> None:
    def pv(name: str, handle: str, driver: str = "csi.x") -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"csi": {"driver": driver, "volumeHandle": handle}}}

    def claim(name: str, volume: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default"}, "spec": {"volumeName": volume}}

    def using(name: str, on: str, *claims: str) -> dict[str, Any]:
        volumes = [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
        return pod(name, on, volumes=volumes)

    def csi_node(name: str, count: int) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {"drivers": [{"name": "csi.x", "allocatable": {"count": count}}]},
        }

    found = check(
        pods=[
            using("a", "n1", "c1"),
            using("b", "n1", "c2"),  # a second volume on n1, which attaches one
            using("c", "n2", "c3"),
            using("d", "n2", "c3"),  # the same volume twice counts once
            using("e", "n3", "c4", "c5"),  # n3 has no CSINode: no limit
        ],
        nodes=[node("n1"), node("n2"), node("n3")],
        claims=[claim(f"c{i}", f"pv{i}") for i in range(1, 6)],
        volumes=[pv(f"pv{i}", f"h{i}") for i in range(1, 6)],
        csi_nodes=[csi_node("n1", 1), csi_node("n2", 1)],
    )
    assert rules(found) == [("volumeLimits", "default/a", "n1"), ("volumeLimits", "default/b", "n1")]
