"""The chart against the real apiserver: server-side dry-run, install, upgrade, uninstall.

No kube-controller-manager runs in the test control plane, so Deployments create no pods and a
deleted PersistentVolumeClaim keeps its `kubernetes.io/pvc-protection` finalizer (normally removed
by the pvc-protection controller). The uninstall test accounts for exactly that and nothing else.
"""

from __future__ import annotations

import base64
import json
import pathlib
import uuid
from typing import Any

import pytest

from bindery.devcluster.plane import ControlPlane
from tests.chart import charttools as ct
from tests.chart.valuesets import VALUE_SETS

pytestmark = pytest.mark.controlplane

PVC_FINALIZER = "kubernetes.io/pvc-protection"


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _helm(plane: ControlPlane, helm: str, *args: str, check: bool = True) -> str:
    return ct.run([helm, *args], env=plane.env, check=check, timeout=180).stdout


def _get(plane: ControlPlane, *args: str) -> Any:
    return json.loads(plane.kubectl("get", *args, "-o", "json").stdout)


def _labelled(plane: ControlPlane, release: str) -> list[dict[str, Any]]:
    """Every object of every listable type, in every namespace, labelled with the release."""
    types = plane.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    out = plane.kubectl(
        "get",
        ",".join(types),
        "--all-namespaces",
        "-l",
        f"app.kubernetes.io/instance={release}",
        "--ignore-not-found",
        "-o",
        "json",
    ).stdout
    return list(json.loads(out)["items"]) if out.strip() else []


@pytest.fixture(scope="module")
def crd(controlplane: ControlPlane) -> None:
    """The ResourceManager CRD from crds/ (what helm installs from charts/bindery/crds)."""
    controlplane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ct.CRD_SOURCE))
    controlplane.kubectl("wait", "--for=condition=Established", f"crd/{ct.CRD_NAME}", "--timeout=60s")


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_renders_are_accepted_by_the_apiserver(
    controlplane: ControlPlane, helm: str, namespace: str, tmp_path: pathlib.Path, value_set: str
) -> None:
    args = ct.template_args(
        release=_unique("dry"), namespace=namespace, values=VALUE_SETS[value_set], tmp=tmp_path
    )
    manifest = _helm(controlplane, helm, *args)
    # --dry-run=server: admission, schema validation (incl. the CRD's CEL rules) and defaulting,
    # without persisting anything.
    result = controlplane.kubectl("apply", "--dry-run=server", "-f", "-", "-o", "name", input=manifest)
    applied = result.stdout.split()
    assert len(applied) == manifest.count("\nkind: "), result.stdout


def test_install_upgrade_uninstall(controlplane: ControlPlane, helm: str, namespace: str) -> None:
    release = _unique("lc")
    scheduler = _unique("chart-lc")
    install = _helm(
        controlplane,
        helm,
        "install",
        release,
        str(ct.CHART),
        "--namespace",
        namespace,
        "--set",
        f"referenceRM.schedulerNames={{{scheduler}}}",
    )
    # NOTES.txt tells how to opt a pod in.
    assert f"schedulerName: {scheduler}" in install
    assert "STATUS: deployed" in install

    full = f"{release}-bindery"
    deployments = _get(controlplane, "deployments", "-n", namespace)["items"]
    assert sorted(d["metadata"]["name"] for d in deployments) == [full, f"{full}-rm"]
    rm = _get(controlplane, "resourcemanager", f"{full}-rm")
    assert rm["spec"]["schedulerNames"] == [scheduler]
    assert rm["spec"]["maxInFlight"] == 256, "CRD defaults are applied to the chart's object"
    secret = _get(controlplane, "secret", f"{full}-rm-token", "-n", namespace)
    token = base64.b64decode(secret["data"]["token"])
    assert len(token) == 48
    certificate = _get(controlplane, "secret", f"{full}-rm-tls", "-n", namespace)["data"]
    pvc = _get(controlplane, "pvc", f"{full}-rm-data", "-n", namespace)
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"

    # Upgrade: drop the PVC, add a ResourceManager, pass an extra operator argument.
    other = _unique("chart-up")
    _helm(
        controlplane,
        helm,
        "upgrade",
        release,
        str(ct.CHART),
        "--namespace",
        namespace,
        "--set",
        f"referenceRM.schedulerNames={{{scheduler}}}",
        "--set",
        "referenceRM.persistence.enabled=false",
        "--set",
        f"resourceManagers[0].name={other}",
        "--set",
        f"resourceManagers[0].spec.schedulerNames={{{other}}}",
        "--set",
        "resourceManagers[0].spec.endpoint=https://rm.example.com",
        "--set",
        "operator.extraArgs={--verbose}",
    )
    status = json.loads(_helm(controlplane, helm, "status", release, "-n", namespace, "-o", "json"))
    assert status["version"] == 2
    assert status["info"]["status"] == "deployed"
    again = _get(controlplane, "secret", f"{full}-rm-token", "-n", namespace)
    assert base64.b64decode(again["data"]["token"]) == token, "the generated token must survive upgrades"
    kept = _get(controlplane, "secret", f"{full}-rm-tls", "-n", namespace)["data"]
    assert kept == certificate, "the generated CA and certificate must survive upgrades"
    ca = _get(controlplane, "secret", f"{full}-rm-ca", "-n", namespace)["data"]
    assert ca == {"ca.crt": certificate["ca.crt"]}
    assert _get(controlplane, "resourcemanager", other)["spec"]["endpoint"] == "https://rm.example.com"
    operator = _get(controlplane, "deployment", full, "-n", namespace)
    assert operator["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--verbose"
    rm_pod = _get(controlplane, "deployment", f"{full}-rm", "-n", namespace)["spec"]["template"]["spec"]
    assert {"name": "data", "emptyDir": {}} in rm_pod["volumes"]

    _helm(controlplane, helm, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s")
    leftovers = _labelled(controlplane, release)
    # Only the PVC remains, deleted and waiting for the pvc-protection controller, which this
    # control plane does not run; in a real cluster it is gone once no pod uses it.
    waiting = [
        o
        for o in leftovers
        if o["kind"] == "PersistentVolumeClaim"
        and o["metadata"].get("deletionTimestamp")
        and o["metadata"].get("finalizers") == [PVC_FINALIZER]
    ]
    assert leftovers == waiting, [f"{o['kind']}/{o['metadata']['name']}" for o in leftovers]
    assert len(waiting) == 1
    # Play the missing controller so the namespace is clean.
    controlplane.kubectl(
        "patch",
        "pvc",
        waiting[0]["metadata"]["name"],
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
    )
    assert _labelled(controlplane, release) == []
    # Helm's own release records are gone too, and the CRD stays (Helm never deletes CRDs).
    records = _get(controlplane, "secrets", "-n", namespace, "-l", f"owner=helm,name={release}")
    assert records["items"] == []
    assert _get(controlplane, "crd", ct.CRD_NAME)["metadata"]["name"] == ct.CRD_NAME


def test_install_refuses_bad_values_before_touching_the_cluster(
    controlplane: ControlPlane, helm: str, namespace: str
) -> None:
    release = _unique("bad")
    proc = ct.run(
        [
            helm,
            "install",
            release,
            str(ct.CHART),
            "--namespace",
            namespace,
            "--set",
            "operator.replicaCount=2",
            "--set",
            "operator.leaderElection.enabled=false",
        ],
        env=controlplane.env,
        check=False,
    )
    assert proc.returncode != 0
    assert "at '/operator/replicaCount': value must be 1" in proc.stderr
    assert _labelled(controlplane, release) == []


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["--set", "referenceRM.enabled=false"], "No ResourceManager was created by this release"),
        (
            [
                "--set",
                "referenceRM.enabled=false",
                "--set",
                "resourceManagers[0].name=n-a",
                "--set",
                "resourceManagers[0].spec.schedulerNames={n-a,n-b}",
                "--set",
                "resourceManagers[0].spec.endpoint=https://rm.example.com",
            ],
            "Scheduler names configured by this release: n-a, n-b",
        ),
    ],
    ids=["no-rm", "own-rm"],
)
def test_notes_explain_how_to_opt_in(
    controlplane: ControlPlane, helm: str, namespace: str, values: list[str], expected: str
) -> None:
    out = _helm(
        controlplane,
        helm,
        "install",
        _unique("notes"),
        str(ct.CHART),
        "--namespace",
        namespace,
        "--dry-run=server",
        *values,
    )
    assert expected in out
    assert "spec:\n    schedulerName: " in out
