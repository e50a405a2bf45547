"""Least privilege, proven by the apiserver: what the chart's ServiceAccounts may and may not do.

The chart is installed once for this module; every question is asked with impersonation
(`--as=system:serviceaccount:NS:NAME`, which also carries the ServiceAccount groups), so the
answers come from the RBAC objects the chart created and the cluster's default bindings.
The full list of what is allowed is compared with rbac_allowed.json: growing it (or shrinking it)
means editing that file in the same change, where a reviewer sees it.
"""

from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bindery.devcluster.plane import ControlPlane
from tests.chart import charttools as ct

pytestmark = pytest.mark.controlplane

EXPECTED = pathlib.Path(__file__).with_name("rbac_allowed.json")
OTHER_NAMESPACE = "default"
WRITE_VERBS = {
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
    "approve",
    "sign",
    "*",
}
# The only writes the operator needs (bindery.controller.startup.rbac), plus the self-reviews every
# authenticated user may create (system:basic-user), which change nothing.
OPERATOR_WRITES = {
    "create pods/binding",
    "patch pods/status",
    # Preemption (issue 21): victims leave through the Eviction API, so PodDisruptionBudgets hold.
    "create pods/eviction",
    "patch podgroups.scheduling.k8s.io/status",
    "create events.events.k8s.io",
    "patch events.events.k8s.io",
    "patch resourcemanagers.bindery.dev/status",
    # Volume binding: a claim's selected-node annotation, a static volume's claimRef.
    "patch persistentvolumeclaims",
    "patch persistentvolumes",
    # DRA devices through the RM: the claim's finalizer, then its allocation and reservedFor.
    "update resourceclaims.resource.k8s.io",
    "update resourceclaims.resource.k8s.io/status",
    "update resourceclaims.resource.k8s.io/binding",
    # /debug/queue: whose is the caller's bearer token, and may that user get the URL (issue 20).
    "create tokenreviews.authentication.k8s.io",
    "create subjectaccessreviews.authorization.k8s.io",
}
# Leader election: its one Lease (named after the release, shown as {release}-bindery), in the
# release namespace only; create cannot be limited by name.
LEASE_WRITES = {
    "create leases.coordination.k8s.io",
    "update leases.coordination.k8s.io [{release}-bindery]",
}
SELF_REVIEWS = {
    "create selfsubjectreviews.authentication.k8s.io",
    "create selfsubjectaccessreviews.authorization.k8s.io",
    "create selfsubjectrulesreviews.authorization.k8s.io",
}


@dataclass(frozen=True)
class Release:
    namespace: str
    name: str
    operator_sa: str
    rm_sa: str


@pytest.fixture(scope="module")
def release(controlplane: ControlPlane, helm: str) -> Iterator[Release]:
    namespace = f"chart-rbac-{uuid.uuid4().hex[:6]}"
    name = f"rbac-{uuid.uuid4().hex[:6]}"
    controlplane.kubectl("create", "namespace", namespace)
    ct.run(
        [
            helm,
            "install",
            name,
            str(ct.CHART),
            "--namespace",
            namespace,
            "--set",
            f"referenceRM.schedulerNames={{{name}}}",
        ],
        env=controlplane.env,
    )
    yield Release(namespace=namespace, name=name, operator_sa=f"{name}-bindery", rm_sa=f"{name}-bindery-rm")
    ct.run([helm, "uninstall", name, "--namespace", namespace], env=controlplane.env)
    controlplane.kubectl("delete", "namespace", namespace, "--wait=false")


def _as(release: Release, sa: str) -> str:
    return f"--as=system:serviceaccount:{release.namespace}:{sa}"


def can(plane: ControlPlane, release: Release, sa: str, *args: str) -> bool:
    """`kubectl auth can-i VERB RESOURCE [-n NS | -A]` as the ServiceAccount."""
    proc = plane.kubectl("auth", "can-i", *args, _as(release, sa), check=False)
    answer = proc.stdout.strip()
    if answer not in ("yes", "no"):
        raise AssertionError(f"kubectl auth can-i {' '.join(args)}: {proc.stdout} {proc.stderr}")
    return answer == "yes"


def allowed(plane: ControlPlane, release: Release, sa: str, namespace: str) -> list[str]:
    """What `kubectl auth can-i --list` shows, from the same API (SelfSubjectRulesReview), as
    sorted "verb resource.group[/subresource] [names]" and "verb /url" lines; the release's
    random name reads `{release}` in resource names."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    out = plane.kubectl(
        "create", "--validate=false", "-f", "-", "-o", "json", _as(release, sa), input=json.dumps(review)
    ).stdout
    status: dict[str, Any] = json.loads(out)["status"]
    assert not status.get("incomplete"), status.get("evaluationError")
    lines: set[str] = set()
    for rule in status.get("resourceRules", []):
        named = sorted(n.replace(release.name, "{release}") for n in rule.get("resourceNames", []))
        names = f" [{','.join(named)}]" if named else ""
        for group in rule.get("apiGroups", [""]):
            for resource in rule["resources"]:
                base, _, sub = resource.partition("/")
                qualified = f"{base}.{group}" if group else base
                qualified += f"/{sub}" if sub else ""
                lines.update(f"{verb} {qualified}{names}" for verb in rule["verbs"])
    for rule in status.get("nonResourceRules", []):
        lines.update(f"{verb} {url}" for verb in rule["verbs"] for url in rule["nonResourceURLs"])
    return sorted(lines)


def _snapshot(plane: ControlPlane, release: Release) -> dict[str, dict[str, list[str]]]:
    return {
        role: {
            "release-namespace": allowed(plane, release, sa, release.namespace),
            "other-namespace": allowed(plane, release, sa, OTHER_NAMESPACE),
        }
        for role, sa in (("operator", release.operator_sa), ("reference-rm", release.rm_sa))
    }


def test_allowed_list_matches_the_checked_in_expectation(
    controlplane: ControlPlane, release: Release
) -> None:
    actual = _snapshot(controlplane, release)
    expected = json.loads(EXPECTED.read_text())
    problems = []
    for role, by_ns in actual.items():
        for where, lines in by_ns.items():
            want = set(expected.get(role, {}).get(where, []))
            grown, shrunk = sorted(set(lines) - want), sorted(want - set(lines))
            if grown:
                problems.append(f"{role} in {where} may now also: {grown}")
            if shrunk:
                problems.append(f"{role} in {where} may no longer: {shrunk}")
    assert not problems, (
        "RBAC changed; if intended, update tests/chart/rbac_allowed.json:\n"
        + "\n".join(problems)
        + f"\nactual:\n{json.dumps(actual, indent=2, sort_keys=True)}"
    )


def test_operator_writes_only_what_it_needs(controlplane: ControlPlane, release: Release) -> None:
    for namespace in (release.namespace, OTHER_NAMESPACE):
        lines = allowed(controlplane, release, release.operator_sa, namespace)
        writes = {line for line in lines if line.split()[0] in WRITE_VERBS}
        expected = (
            OPERATOR_WRITES | SELF_REVIEWS | (LEASE_WRITES if namespace == release.namespace else set())
        )
        assert writes == expected, sorted(writes ^ expected)


@pytest.mark.parametrize(
    "question",
    [
        # Never deletes, creates or updates pods (it evicts preemption victims: OPERATOR_WRITES).
        ("delete", "pods", "-A"),
        ("delete", "pods", "-n", "{ns}"),
        ("create", "pods", "-A"),
        ("update", "pods", "-A"),
        ("patch", "pods", "-A"),
        ("update", "pods", "--subresource=status", "-A"),
        # Volumes: annotate a claim or pre-bind a volume, never create, delete or resize them.
        ("create", "persistentvolumes"),
        ("delete", "persistentvolumes"),
        ("create", "persistentvolumeclaims", "-A"),
        ("delete", "persistentvolumeclaims", "-A"),
        ("update", "persistentvolumeclaims", "--subresource=status", "-A"),
        ("patch", "storageclasses.storage.k8s.io"),
        # Secrets: get, in the release namespace only.
        ("get", "secrets", "-n", OTHER_NAMESPACE),
        ("get", "secrets", "-A"),
        ("list", "secrets", "-n", "{ns}"),
        ("watch", "secrets", "-n", "{ns}"),
        ("create", "secrets", "-n", "{ns}"),
        # Nodes and configuration are read-only.
        ("get", "nodes"),
        ("patch", "nodes"),
        ("delete", "nodes"),
        ("create", "resourcemanagers.bindery.dev"),
        ("update", "resourcemanagers.bindery.dev"),
        ("delete", "resourcemanagers.bindery.dev"),
        ("update", "resourcemanagers.bindery.dev", "--subresource=status"),
        # Nothing else.
        ("create", "events", "-A"),
        ("delete", "events.events.k8s.io", "-A"),
        # Leases: its own one, in the release namespace only.
        ("create", "leases.coordination.k8s.io", "-n", OTHER_NAMESPACE),
        ("update", "leases.coordination.k8s.io/{release}-bindery", "-n", OTHER_NAMESPACE),
        ("update", "leases.coordination.k8s.io/kube-scheduler", "-n", "{ns}"),
        ("get", "leases.coordination.k8s.io/kube-scheduler", "-n", "{ns}"),
        ("list", "leases.coordination.k8s.io", "-n", "{ns}"),
        ("delete", "leases.coordination.k8s.io/{release}-bindery", "-n", "{ns}"),
        ("create", "configmaps", "-n", "{ns}"),
        ("create", "serviceaccounts", "--subresource=token", "-n", "{ns}"),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        ("escalate", "clusterroles.rbac.authorization.k8s.io"),
        ("impersonate", "users"),
        ("create", "kopfpeerings.kopf.dev", "-A"),
    ],
    ids=" ".join,
)
def test_operator_is_denied(controlplane: ControlPlane, release: Release, question: tuple[str, ...]) -> None:
    args = [a.replace("{ns}", release.namespace).replace("{release}", release.name) for a in question]
    assert not can(controlplane, release, release.operator_sa, *args)


@pytest.mark.parametrize(
    "question",
    [
        ("watch", "pods", "-A"),
        ("get", "pods", "-n", "{ns}"),
        ("create", "pods", "--subresource=binding", "-A"),
        ("patch", "pods", "--subresource=status", "-A"),
        ("create", "events.events.k8s.io", "-A"),
        ("patch", "events.events.k8s.io", "-A"),
        ("watch", "nodes"),
        ("watch", "resourcemanagers.bindery.dev"),
        ("patch", "resourcemanagers.bindery.dev", "--subresource=status"),
        ("get", "secrets", "-n", "{ns}"),
        ("get", "persistentvolumeclaims", "-A"),
        ("patch", "persistentvolumeclaims", "-A"),
        ("list", "persistentvolumes"),
        ("patch", "persistentvolumes"),
        ("get", "storageclasses.storage.k8s.io"),
        ("create", "leases.coordination.k8s.io", "-n", "{ns}"),
        ("get", "leases.coordination.k8s.io/{release}-bindery", "-n", "{ns}"),
        ("update", "leases.coordination.k8s.io/{release}-bindery", "-n", "{ns}"),
    ],
    ids=" ".join,
)
def test_operator_is_allowed(controlplane: ControlPlane, release: Release, question: tuple[str, ...]) -> None:
    args = [a.replace("{ns}", release.namespace).replace("{release}", release.name) for a in question]
    assert can(controlplane, release, release.operator_sa, *args)


def test_reference_rm_only_reads_nodes_and_pods(controlplane: ControlPlane, release: Release) -> None:
    # Pods: it counts the pods it did not place on the nodes it mirrors (refrm/accounting.py).
    sa = release.rm_sa
    for verb in ("get", "list", "watch"):
        assert can(controlplane, release, sa, verb, "nodes")
        assert can(controlplane, release, sa, verb, "pods", "-A")
    for question in (
        ("patch", "nodes"),
        ("patch", "pods", "-A"),
        ("delete", "pods", "-A"),
        ("get", "pods", "--subresource=log", "-A"),
        ("get", "secrets", "-n", release.namespace),
        ("create", "pods", "--subresource=binding", "-A"),
        ("list", "resourcemanagers.bindery.dev"),
    ):
        assert not can(controlplane, release, sa, *question), question


def test_a_secret_outside_the_release_namespace_is_forbidden(
    controlplane: ControlPlane, release: Release
) -> None:
    # Not just can-i: the real request is refused.
    name = f"other-{uuid.uuid4().hex[:6]}"
    controlplane.kubectl("create", "secret", "generic", name, "-n", OTHER_NAMESPACE, "--from-literal=token=x")
    try:
        proc = controlplane.kubectl(
            "get", "secret", name, "-n", OTHER_NAMESPACE, _as(release, release.operator_sa), check=False
        )
        assert proc.returncode != 0
        assert "Forbidden" in proc.stderr
        own = controlplane.kubectl(
            "get",
            "secret",
            f"{release.operator_sa}-rm-token",
            "-n",
            release.namespace,
            "-o",
            "name",
            _as(release, release.operator_sa),
        )
        assert own.stdout.strip() == f"secret/{release.operator_sa}-rm-token"
    finally:
        controlplane.kubectl("delete", "secret", name, "-n", OTHER_NAMESPACE)
