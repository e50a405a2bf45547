"""The chart offline, with the real helm: lint, render, schema rejections, invariants.

Nothing here needs a cluster; test_chart_install.py applies the same renders to the apiserver.
"""

from __future__ import annotations

import base64
import json
import pathlib
import ssl
import tarfile
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml

from bindery.controller.secrets import CREDENTIALS_LABEL
from tests.chart import charttools as ct
from tests.chart.valuesets import VALUE_SETS

NAMESPACE = "bindery-system"


def _pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for dep in ct.by_kind(objects, "Deployment"):
        yield dep["metadata"]["name"], dep["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def rendered(
    helm: str, helm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("render")
    return {
        name: ct.render(helm=helm, env=helm_env, tmp=tmp, values=values, namespace=NAMESPACE)
        for name, values in VALUE_SETS.items()
    }


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_lint_strict(helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path, value_set: str) -> None:
    args = [helm, "lint", "--strict", str(ct.CHART), "--namespace", NAMESPACE]
    if VALUE_SETS[value_set]:
        args += ["--values", str(ct.values_file(VALUE_SETS[value_set], tmp_path))]
    out = ct.run(args, env=helm_env).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out, out
    assert "[ERROR]" not in out, out


def test_crd_in_chart_is_the_file_in_crds(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    # One source of truth: the chart links to crds/, and `helm package` ships its bytes.
    assert ct.CRD_IN_CHART.is_symlink(), f"{ct.CRD_IN_CHART} must be a symlink to {ct.CRD_SOURCE}"
    assert ct.CRD_IN_CHART.resolve() == ct.CRD_SOURCE.resolve()
    ct.run([helm, "package", str(ct.CHART), "--destination", str(tmp_path)], env=helm_env)
    (package,) = tmp_path.glob("bindery-*.tgz")
    with tarfile.open(package) as tar:
        member = tar.extractfile("bindery/crds/resourcemanagers.bindery.dev.yaml")
        assert member is not None
        assert member.read() == ct.CRD_SOURCE.read_bytes()
    # Only the CRD lives in crds/ (helm installs everything there before the templates).
    assert sorted(p.name for p in (ct.CHART / "crds").iterdir()) == [ct.CRD_SOURCE.name]


def test_chart_versions_agree() -> None:
    chart = yaml.safe_load((ct.CHART / "Chart.yaml").read_text())
    pyproject = (ct.REPO / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in pyproject, (
        "Chart appVersion must equal the package version"
    )
    assert chart["kubeVersion"] == ">=1.29.0-0"


def test_default_install_has_every_part(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = sorted({(o["kind"], o["metadata"]["name"]) for o in rendered["defaults"]})
    assert kinds == sorted(
        [
            ("ClusterRole", "rel-bindery"),
            ("ClusterRole", "rel-bindery-debug-reader"),
            ("ClusterRole", "rel-bindery-rm"),
            ("ClusterRoleBinding", "rel-bindery"),
            ("ClusterRoleBinding", "rel-bindery-rm"),
            ("Deployment", "rel-bindery"),
            ("Deployment", "rel-bindery-rm"),
            ("NetworkPolicy", "rel-bindery"),
            ("NetworkPolicy", "rel-bindery-rm"),
            ("PersistentVolumeClaim", "rel-bindery-rm-data"),
            ("PodDisruptionBudget", "rel-bindery"),
            ("ResourceManager", "rel-bindery-rm"),
            ("Role", "rel-bindery-leader-election"),
            ("Role", "rel-bindery-secrets"),
            ("RoleBinding", "rel-bindery-leader-election"),
            ("RoleBinding", "rel-bindery-secrets"),
            ("Secret", "rel-bindery-rm-ca"),
            ("Secret", "rel-bindery-rm-tls"),
            ("Secret", "rel-bindery-rm-token"),
            ("Service", "rel-bindery-metrics"),
            ("Service", "rel-bindery-rm"),
            ("ServiceAccount", "rel-bindery"),
            ("ServiceAccount", "rel-bindery-rm"),
        ]
    )
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ResourceManager"}
    for obj in rendered["defaults"]:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"


def test_minimal_install_is_just_the_operator(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = sorted(o["kind"] for o in rendered["minimal"])
    assert kinds == ["Deployment"]
    dep = ct.one(rendered["minimal"], "Deployment")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "existing-operator-sa"


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_operator_deployment(rendered: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    values = VALUE_SETS[value_set]
    health_port = values.get("operator", {}).get("healthPort", 8080)
    metrics = values.get("metrics", {})
    metrics_port = metrics.get("port", 9090)
    deps = [
        d
        for d in ct.by_kind(rendered[value_set], "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    assert len(deps) == 1
    spec = deps[0]["spec"]
    operator = values.get("operator", {})
    election = operator.get("leaderElection", {})
    assert spec["replicas"] == operator.get("replicaCount", 2)
    (container,) = spec["template"]["spec"]["containers"]
    if election.get("enabled", True):
        # Only the Lease holder schedules, so a rolling update may overlap old and new pods.
        assert spec["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }
        lease = election.get("leaseName") or deps[0]["metadata"]["name"]
        assert container["args"][-6 - len(operator.get("extraArgs", [])) :][:6] == [
            "--leader-elect",
            f"--lease-namespace={NAMESPACE}",
            f"--lease-name={lease}",
            f"--lease-duration={election.get('leaseDuration', 15)}",
            f"--renew-deadline={election.get('renewDeadline', 10)}",
            f"--retry-period={election.get('retryPeriod', 2)}",
        ]
    else:
        assert spec["strategy"] == {"type": "Recreate"}
        assert not any(a.startswith("--lease") or a == "--leader-elect" for a in container["args"])
    assert container["args"][0] == f"--liveness=http://0.0.0.0:{health_port}/healthz"
    health = {"name": "health", "containerPort": health_port, "protocol": "TCP"}
    if metrics.get("enabled", True):
        assert container["args"][1] == f"--metrics-addr=0.0.0.0:{metrics_port}"
        assert container["ports"] == [
            health,
            {"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"},
        ]
        service = ct.one(rendered[value_set], "Service", deps[0]["metadata"]["name"] + "-metrics")
        assert service["spec"]["ports"] == [
            {
                "name": "metrics",
                "port": metrics.get("service", {}).get("port", 9090),
                "targetPort": "metrics",
                "protocol": "TCP",
            }
        ]
    else:
        assert not any(a.startswith("--metrics-addr") for a in container["args"])
        assert container["ports"] == [health]
    policies = [
        p
        for p in ct.by_kind(rendered[value_set], "NetworkPolicy")
        if p["metadata"]["name"] == deps[0]["metadata"]["name"]
    ]
    policy_values = values.get("networkPolicy", {})
    for policy in policies:  # the operator's policy admits exactly its health and metrics ports
        rules = policy["spec"]["ingress"]
        expected = [["health"], ["metrics"]] if metrics.get("enabled", True) else [["health"]]
        assert [[port["port"] for port in rule["ports"]] for rule in rules] == expected
        if len(rules) == 2:  # the metrics port is restricted unless opened explicitly (issue 20, scenario 9)
            peers = policy_values.get("metricsFrom") or [{"podSelector": {}}]
            assert rules[1].get("from") == (None if policy_values.get("metricsOpen") else peers)
    # The queue views listen on loopback by default (reached by kubectl port-forward).
    debug_address = operator.get("debugAddress", "127.0.0.1:9091")
    assert (f"--debug-addr={debug_address}" in container["args"]) is bool(debug_address)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "command" not in container, "the image ENTRYPOINT (bindery run) must start the operator"
    selector = spec["selector"]["matchLabels"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_pod_is_hardened(rendered: dict[str, list[dict[str, Any]]], value_set: str) -> None:
    for name, pod in _pod_specs(rendered[value_set]):
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True, name
        assert psc["runAsUser"] > 0, name
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["privileged"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert container["resources"]["requests"], name
            assert {"livenessProbe", "readinessProbe"} <= container.keys(), name
            # A read-only root needs a writable scratch directory.
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], name


def test_rbac_is_exactly_what_the_operator_declares(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rbac = pytest.importorskip("bindery.controller.startup.rbac")
    objects = rendered["external-rms"]
    cluster_rules = ct.one(objects, "ClusterRole", "rel-bindery")["rules"]
    lease_role = ct.one(objects, "Role", "rel-bindery-leader-election")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert lease_role["rules"] == rbac.leader_election_rules(lease_name="rel-bindery")
    roles = [r for r in ct.by_kind(objects, "Role") if r is not lease_role]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted([NAMESPACE, "default"])
    role_rules = [rule for role in roles for rule in role["rules"]]
    assert role_rules == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}] * 2

    def flatten(rules: list[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
        return {
            (g, r, v)
            for rule in rules
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    declared = flatten(rbac.OPERATOR_RULES)
    chart = flatten(cluster_rules) | flatten(role_rules)
    assert chart == declared, (
        f"chart grants {sorted(chart - declared)} beyond bindery.controller.startup.rbac "
        f"and lacks {sorted(declared - chart)}"
    )
    # The queue views' reader role, bound by the user to whom they choose (the chart binds nobody).
    reader = ct.one(objects, "ClusterRole", "rel-bindery-debug-reader")
    assert reader["rules"] == rbac.DEBUG_READER_RULES
    assert not any(
        b["roleRef"]["name"] == "rel-bindery-debug-reader" for b in ct.by_kind(objects, "ClusterRoleBinding")
    )
    # Secrets: only through namespaced Roles, never cluster-wide.
    assert not any("secrets" in rule["resources"] for rule in cluster_rules)
    for binding in ct.by_kind(objects, "ClusterRoleBinding") + ct.by_kind(objects, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rel-bindery", "namespace": NAMESPACE}
        ]


def test_reference_rm_wiring(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["defaults"]
    rm = ct.one(objects, "ResourceManager")
    assert rm["spec"] == {
        "schedulerNames": ["bindery"],
        "endpoint": f"https://rel-bindery-rm.{NAMESPACE}.svc:8080",
        "auth": {"tokenSecretRef": {"namespace": NAMESPACE, "name": "rel-bindery-rm-token", "key": "token"}},
        "tls": {"caSecretRef": {"namespace": NAMESPACE, "name": "rel-bindery-rm-ca", "key": "ca.crt"}},
        "maxInFlightPerNamespace": 64,
        "maxBindingWaitsPerNamespace": 16,
    }
    secret = ct.one(objects, "Secret", "rel-bindery-rm-token")
    assert len(secret["data"]["token"]) >= 48
    assert secret["metadata"]["labels"][CREDENTIALS_LABEL] == "true", "the operator would not use it"
    dep = ct.one(objects, "Deployment", "rel-bindery-rm")
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rel-bindery-rm"
    (container,) = pod["containers"]
    assert container["command"] == ["bindery"]
    assert container["args"] == [
        "rm",
        "serve",
        "--listen=0.0.0.0:8080",
        "--db=/var/lib/bindery-rm/rm.sqlite",
        "--mirror-nodes",
        "--policy=spread",  # kube-scheduler's default spreads a Deployment; so does the chart's RM
        "--token-file=/etc/bindery-rm/token/token",
        "--tls-cert=/etc/bindery-rm/tls/tls.crt",
        "--tls-key=/etc/bindery-rm/tls/tls.key",
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTPS"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "rel-bindery-rm-data"}
    assert volumes["token"]["secret"]["secretName"] == "rel-bindery-rm-token"
    assert volumes["tls"]["secret"]["secretName"] == "rel-bindery-rm-tls"
    # Only the operator may talk to the reference RM.
    policy = ct.one(objects, "NetworkPolicy", "rel-bindery-rm")
    assert policy["spec"]["ingress"][0]["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "bindery",
                    "app.kubernetes.io/instance": "rel",
                    "app.kubernetes.io/component": "operator",
                }
            }
        }
    ]
    rm_role = ct.one(objects, "ClusterRole", "rel-bindery-rm")
    # Read-only: Nodes, and the pods bound to them (pods it did not place use capacity too), and
    # PodDisruptionBudgets (preemption spares the pods they protect).
    assert rm_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list", "watch"]},
    ]


def test_reference_rm_serves_https_with_a_certificate_the_resource_managers_ca_verifies(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: pathlib.Path
) -> None:
    """Issue 20, item 10: the bearer token no longer crosses the cluster network in clear. The CA
    Secret the ResourceManager names carries the credentials label and no private key."""
    objects = rendered["defaults"]
    tls = ct.one(objects, "Secret", "rel-bindery-rm-tls")
    ca = ct.one(objects, "Secret", "rel-bindery-rm-ca")
    assert ca["metadata"]["labels"][CREDENTIALS_LABEL] == "true"
    assert set(ca["data"]) == {"ca.crt"}
    assert ca["data"]["ca.crt"] == tls["data"]["ca.crt"]
    files = {}
    for key in ("ca.crt", "tls.crt", "tls.key"):
        files[key] = tmp_path / key
        files[key].write_bytes(base64.b64decode(tls["data"][key]))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certfile=files["tls.crt"], keyfile=files["tls.key"])
    client_side = ssl.create_default_context(cafile=files["ca.crt"])
    for name in (
        "rel-bindery-rm",
        f"rel-bindery-rm.{NAMESPACE}.svc",
        f"rel-bindery-rm.{NAMESPACE}.svc.cluster.local",
    ):
        _handshake(server=server, client_side=client_side, hostname=name)


def test_reference_rm_without_tls_is_plain_http_as_before(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    objects = ct.render(
        helm=helm, env=helm_env, tmp=tmp_path, values={"referenceRM": {"tls": {"enabled": False}}}
    )
    rm = ct.one(objects, "ResourceManager")
    assert rm["spec"]["endpoint"] == f"http://rel-bindery-rm.{NAMESPACE}.svc:8080"
    assert rm["spec"]["allowInsecureHTTP"] is True
    assert "tls" not in rm["spec"]
    assert [o["metadata"]["name"] for o in ct.by_kind(objects, "Secret")] == ["rel-bindery-rm-token"]
    container = ct.one(objects, "Deployment", "rel-bindery-rm")["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in container["args"] if a.startswith("--tls")]
    assert "scheme" not in container["readinessProbe"]["httpGet"]


def _handshake(*, server: ssl.SSLContext, client_side: ssl.SSLContext, hostname: str) -> None:
    """A TLS handshake in memory: raises ssl.SSLCertVerificationError if `hostname` is not covered."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client_side.wrap_bio(c_in, c_out, server_hostname=hostname)
    server_end = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, end in (("client", client_end), ("server", server_end)):
            if not done[side]:
                try:
                    end.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError(f"the TLS handshake for {hostname} did not finish")


def test_reference_rm_tuned(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["reference-rm-tuned"]
    assert not [o for o in ct.by_kind(objects, "Secret") if o["metadata"]["name"].endswith("-token")], (
        "an existing token Secret must not be generated"
    )
    assert not ct.by_kind(objects, "PersistentVolumeClaim")
    rm = ct.one(objects, "ResourceManager", "sched-rm")
    assert rm["spec"]["schedulerNames"] == ["bindery", "bindery-batch"]
    assert rm["spec"]["endpoint"] == f"https://sched-rm.{NAMESPACE}.svc:9000"
    assert rm["spec"]["auth"]["tokenSecretRef"]["name"] == "my-rm-token"
    assert rm["spec"]["maxInFlight"] == 32
    assert rm["spec"]["nodeCheck"] == "Basic"
    dep = ct.one(objects, "Deployment", "sched-rm")
    pod = dep["spec"]["template"]["spec"]
    assert "--node-selector=bindery.dev/pool=default" in pod["containers"][0]["args"]
    assert {"name": "data", "emptyDir": {}} in pod["volumes"]
    assert ct.one(objects, "Service", "sched-metrics")["spec"]["ports"][0]["port"] == 9808


def test_resource_managers_from_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rms = {o["metadata"]["name"]: o for o in ct.by_kind(rendered["external-rms"], "ResourceManager")}
    assert sorted(rms) == ["batch", "gpu-pool"]
    # The values' spec, and each namespace's share of its budgets (namespaceShare, a quarter).
    assert rms["gpu-pool"]["spec"] == {
        **VALUE_SETS["external-rms"]["resourceManagers"][0]["spec"],
        "maxInFlightPerNamespace": 2,
        "maxBindingWaitsPerNamespace": 16,
    }
    assert rms["batch"]["metadata"]["annotations"] == {"example.com/owner": "batch-team"}
    dep = ct.one(rendered["external-rms"], "Deployment")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/bindery@sha256:" + "ab" * 32
    assert container["args"][-1:] == ["--verbose"]  # extraArgs come last
    assert container["env"] == [{"name": "EXAMPLE", "value": "1"}]
    assert (
        "env"
        not in ct.one(rendered["defaults"], "Deployment", "rel-bindery")["spec"]["template"]["spec"][
            "containers"
        ][0]
    )


def test_every_resource_manager_gives_each_namespace_a_share_of_its_budgets(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """A quarter of maxInFlight and of maxBindingWaits (their CRD defaults when unset), rounded up:
    no tenant takes every scheduling slot or every place of the binding pool."""
    shares = {
        (value_set, o["metadata"]["name"]): (
            o["spec"].get("maxInFlightPerNamespace"),
            o["spec"].get("maxBindingWaitsPerNamespace"),
        )
        for value_set in ("defaults", "reference-rm-tuned", "external-rms")
        for o in ct.by_kind(rendered[value_set], "ResourceManager")
    }
    assert shares == {
        ("defaults", "rel-bindery-rm"): (64, 16),
        ("reference-rm-tuned", "sched-rm"): (8, 16),
        ("external-rms", "gpu-pool"): (2, 16),
        ("external-rms", "batch"): (64, 16),
    }


def test_a_spec_that_sets_its_own_share_keeps_it_and_zero_sets_none(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    values = {
        "namespaceShare": {"inFlight": 0.5, "bindingWaits": 0},
        "referenceRM": {"resourceManagerSpec": {"maxInFlight": 5, "maxBindingWaitsPerNamespace": 3}},
    }
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values, namespace=NAMESPACE)
    spec = ct.one(objects, "ResourceManager")["spec"]
    assert (spec["maxInFlightPerNamespace"], spec["maxBindingWaitsPerNamespace"]) == (3, 3)
    values["referenceRM"] = {"resourceManagerSpec": {}}
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values, namespace=NAMESPACE)
    spec = ct.one(objects, "ResourceManager")["spec"]
    assert "maxBindingWaitsPerNamespace" not in spec


def test_generated_token_differs_per_render(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    # Offline there is nothing to look up, so each render generates; install keeps it (see install tests).
    tokens = {
        ct.one(ct.render(helm=helm, env=helm_env, tmp=tmp_path), "Secret", "rel-bindery-rm-token")["data"][
            "token"
        ]
        for _ in range(2)
    }
    assert len(tokens) == 2


def test_long_release_names_stay_valid(helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path) -> None:
    release = "a-long-release-name-at-the-limit-helm-allows-53-chars"  # helm refuses longer ones
    assert len(release) == 53
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, release=release)
    for obj in objects:
        # Services are DNS labels (63); other names are DNS subdomains (253).
        limit = 63 if obj["kind"] in ("Service", "Deployment") else 253
        assert len(obj["metadata"]["name"]) <= limit, obj["metadata"]["name"]
    names = [o["metadata"]["name"] for o in ct.by_kind(objects, "Deployment")]
    assert len(set(names)) == 2


def test_grafana_dashboard_is_off_by_default_and_a_sidecar_configmap_when_on(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    assert not [
        o for o in ct.by_kind(rendered["defaults"], "ConfigMap") if "dashboard" in o["metadata"]["name"]
    ]
    config_map = ct.one(rendered["external-rms"], "ConfigMap", "rel-bindery-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Bindery"}
    assert config_map["metadata"]["namespace"] == NAMESPACE
    shipped = json.loads((ct.CHART / "dashboards" / "bindery.json").read_text())
    assert json.loads(config_map["data"]["bindery.json"]) == shipped
    titles = {panel["title"] for panel in shipped["panels"]}
    for wanted in (
        "Scheduling attempts by result",  # throughput
        "Pod scheduling latency (first seen → bound)",  # latency percentiles
        "Pending pods by queue",  # queue depth
        "RM request latency by verb (p99)",
        "RM errors by verb and outcome",
        "Reconcile actions",
    ):
        assert wanted in titles, sorted(titles)


def test_grafana_dashboard_needs_metrics(helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path) -> None:
    values = {"metrics": {"enabled": False, "grafanaDashboard": {"enabled": True}}}
    error = ct.render_error(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    assert "metrics.grafanaDashboard.enabled is true but metrics.enabled is false" in error


def test_service_monitor(helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path) -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    error = ct.render_error(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    assert "does not serve monitoring.coreos.com/v1 ServiceMonitor" in error
    objects = ct.render(
        helm=helm,
        env=helm_env,
        tmp=tmp_path,
        values=values,
        extra=["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"],
    )
    monitor = ct.one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = ct.one(objects, "Service", "rel-bindery-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # ServiceMonitor → Service port "metrics" → container port "metrics", where the operator
    # serves the path the monitor scrapes (bindery run --metrics-addr serves /metrics).
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    (container,) = ct.one(objects, "Deployment", "rel-bindery")["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_metrics_and_health_ports_must_differ(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    error = ct.render_error(helm=helm, env=helm_env, tmp=tmp_path, values={"metrics": {"port": 8080}})
    assert "metrics.port and operator.healthPort are both 8080" in error


def test_kube_version_constraint(helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path) -> None:
    error = ct.render_error(helm=helm, env=helm_env, tmp=tmp_path, extra=["--kube-version", "1.28.9"])
    assert "chart requires kubeVersion: >=1.29.0-0 which is incompatible with Kubernetes v1.28.9" in error


# (values, fragments the error must contain): the path of the bad value and what is wrong with it.
REJECTED: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "two replicas without leader election",
        {"operator": {"replicaCount": 2, "leaderElection": {"enabled": False}}},
        ["/operator/replicaCount", "value must be 1"],
    ),
    (
        "no retry period",
        {"operator": {"leaderElection": {"retryPeriod": 0}}},
        ["/operator/leaderElection/retryPeriod"],
    ),
    (
        "bad lease name",
        {"operator": {"leaderElection": {"leaseName": "Bindery Lease"}}},
        ["/operator/leaderElection/leaseName", "does not match pattern"],
    ),
    (
        "typo in a key",
        {"operator": {"replicas": 1}},
        ["/operator", "additional properties 'replicas' not allowed"],
    ),
    (
        "writable root",
        {"securityContext": {"readOnlyRootFilesystem": False}},
        ["/securityContext/readOnlyRootFilesystem", "value must be true"],
    ),
    (
        "privilege escalation",
        {"securityContext": {"allowPrivilegeEscalation": True}},
        ["/securityContext/allowPrivilegeEscalation", "value must be false"],
    ),
    (
        "privileged",
        {"securityContext": {"privileged": True}},
        ["/securityContext/privileged", "value must be false"],
    ),
    (
        "root user",
        {"podSecurityContext": {"runAsUser": 0}},
        ["/podSecurityContext/runAsUser", "minimum: got 0, want 1"],
    ),
    (
        "root allowed",
        {"podSecurityContext": {"runAsNonRoot": False}},
        ["/podSecurityContext/runAsNonRoot", "value must be true"],
    ),
    (
        "capabilities kept",
        {"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
        ["/securityContext/capabilities/drop", "value must be 'ALL'"],
    ),
    (
        "capability added",
        {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}},
        ["/securityContext/capabilities/add", "maxItems"],
    ),
    (
        "bad pull policy",
        {"image": {"pullPolicy": "Sometimes"}},
        ["/image/pullPolicy", "value must be one of 'Always', 'IfNotPresent', 'Never'"],
    ),
    ("bad digest", {"image": {"digest": "latest"}}, ["/image/digest", "does not match pattern"]),
    (
        "bad scheduler name",
        {"referenceRM": {"schedulerNames": ["Bad_Name"]}},
        ["/referenceRM/schedulerNames/0", "'Bad_Name' does not match pattern"],
    ),
    (
        "no scheduler name",
        {"referenceRM": {"schedulerNames": []}},
        ["/referenceRM/schedulerNames", "minItems"],
    ),
    (
        "privileged port",
        {"operator": {"healthPort": 80}},
        ["/operator/healthPort", "minimum: got 80, want 1,024"],
    ),
    (
        "blocking budget",
        {"podDisruptionBudget": {"maxUnavailable": 0}},
        ["/podDisruptionBudget/maxUnavailable"],
    ),
    (
        "bad size",
        {"referenceRM": {"persistence": {"size": "lots"}}},
        ["/referenceRM/persistence/size", "does not match pattern"],
    ),
    (
        "bad interval",
        {"metrics": {"serviceMonitor": {"interval": "30 seconds"}}},
        ["/metrics/serviceMonitor/interval", "does not match pattern"],
    ),
    (
        "RM without name",
        {"resourceManagers": [{"spec": {"schedulerNames": ["x"], "endpoint": "https://rm"}}]},
        ["/resourceManagers/0", "missing property 'name'"],
    ),
    (
        "RM with ftp endpoint",
        {"resourceManagers": [{"name": "x", "spec": {"schedulerNames": ["x"], "endpoint": "ftp://rm"}}]},
        ["/resourceManagers/0/spec/endpoint", "does not match pattern"],
    ),
    (
        "RM without scheduler names",
        {"resourceManagers": [{"name": "x", "spec": {"endpoint": "https://rm"}}]},
        ["/resourceManagers/0/spec", "missing property 'schedulerNames'"],
    ),
    (
        "secret namespace typo",
        {"rbac": {"secretNamespaces": ["Default"]}},
        ["/rbac/secretNamespaces/0", "does not match pattern"],
    ),
]


@pytest.mark.parametrize(
    ("values", "fragments"), [(v, f) for _, v, f in REJECTED], ids=[n for n, _, _ in REJECTED]
)
def test_schema_rejects_bad_values(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path, values: dict[str, Any], fragments: list[str]
) -> None:
    error = ct.render_error(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    assert "values don't meet the specifications of the schema" in error
    for fragment in fragments:
        assert fragment in error, f"{fragment!r} not in helm's message:\n{error}"


@pytest.mark.parametrize(
    "timing",
    [
        {"leaseDuration": 10, "renewDeadline": 10},
        {"leaseDuration": 15, "renewDeadline": 20},
        {"renewDeadline": 2, "retryPeriod": 2},
    ],
    ids=["renew deadline not below lease", "renew deadline above lease", "retry not below renew deadline"],
)
def test_unsafe_lease_timing_is_refused(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path, timing: dict[str, int]
) -> None:
    values = {"operator": {"leaderElection": timing}}
    error = ct.render_error(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    assert "leaseDuration" in error
    assert "> renewDeadline" in error
    assert "is required, so that a leader stops binding before a standby may take its Lease" in error


def test_leader_election_settings_reach_the_operator_and_its_role(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    timing = {"leaseName": "sched-lease", "leaseDuration": 30, "renewDeadline": 20, "retryPeriod": 4}
    objects = ct.render(
        helm=helm, env=helm_env, tmp=tmp_path, values={"operator": {"leaderElection": timing}}
    )
    deployment = ct.one(objects, "Deployment", "rel-bindery")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for arg in ("--lease-name=sched-lease", "--lease-duration=30", "--renew-deadline=20", "--retry-period=4"):
        assert arg in container["args"]
    role = ct.one(objects, "Role", "rel-bindery-leader-election")
    rbac = pytest.importorskip("bindery.controller.startup.rbac")
    assert role["rules"] == rbac.leader_election_rules(lease_name="sched-lease")
    # Spread over nodes where possible: a standby on the leader's node would die with it.
    affinity = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == deployment["spec"]["selector"]["matchLabels"]
    )


def test_a_lease_per_resource_manager_reaches_the_operator_and_widens_its_role(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    values = {"operator": {"leaderElection": {"perResourceManager": True}}}
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    (container,) = ct.one(objects, "Deployment", "rel-bindery")["spec"]["template"]["spec"]["containers"]
    assert "--lease-per-resource-manager" in container["args"]
    assert "--lease-name=rel-bindery" in container["args"]
    role = ct.one(objects, "Role", "rel-bindery-leader-election")
    rbac = pytest.importorskip("bindery.controller.startup.rbac")
    assert role["rules"] == rbac.leader_election_rules(lease_name=None)
    # the default keeps one Lease, and the Role on it alone
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values={})
    (container,) = ct.one(objects, "Deployment", "rel-bindery")["spec"]["template"]["spec"]["containers"]
    assert "--lease-per-resource-manager" not in container["args"]


def test_one_replica_without_leader_election(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    values = {"operator": {"replicaCount": 1, "leaderElection": {"enabled": False}}}
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    deployment = ct.one(objects, "Deployment", "rel-bindery")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "affinity" not in deployment["spec"]["template"]["spec"]
    assert not [o for o in ct.by_kind(objects, "Role") if o["metadata"]["name"].endswith("-leader-election")]


def test_existing_service_account_needs_a_name(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    error = ct.render_error(
        helm=helm, env=helm_env, tmp=tmp_path, values={"serviceAccount": {"create": False}}
    )
    assert "serviceAccount.name is required when serviceAccount.create is false" in error


def test_readme_lists_every_value() -> None:
    values = yaml.safe_load((ct.CHART / "values.yaml").read_text())
    whole = {
        "operator.resources",
        "operator.livenessProbe",
        "operator.readinessProbe",
        "referenceRM.resources",
        "podSecurityContext",
        "securityContext",
    }

    def keys(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
        for key, value in tree.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value and path not in whole:
                yield from keys(value, f"{path}.")
            else:
                yield path

    readme = (ct.CHART / "README.md").read_text()
    missing = [k for k in keys(values) if f"| `{k}` |" not in readme]
    assert not missing, f"charts/bindery/README.md does not list {missing}"
    # Scalar defaults are written as in values.yaml, so a changed default cannot go unnoticed.
    stale = []
    for key in keys(values):
        default: Any = values
        for part in key.split("."):
            default = default[part]
        if isinstance(default, bool | int | str):
            shown = json.dumps(default) if isinstance(default, bool) or default == "" else str(default)
            if f"| `{key}` | `{shown}` |" not in readme:
                stale.append((key, shown))
    assert not stale, f"charts/bindery/README.md shows other defaults than values.yaml for {stale}"


def test_cluster_id_reaches_the_operator_only_when_set(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """`clusterId` (RM contract v1.2) becomes `--cluster-id`; empty, the operator derives its own."""

    def args(values: dict[str, Any]) -> list[str]:
        objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values)
        (container,) = ct.one(objects, "Deployment", "rel-bindery")["spec"]["template"]["spec"]["containers"]
        return list(container["args"])

    assert "--cluster-id=eu-west-prod" in args({"clusterId": "eu-west-prod"})
    assert not [arg for arg in args({}) if arg.startswith("--cluster-id")]


def test_the_flow_schema_puts_the_operator_with_kube_scheduler(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Issue 20 (13): off by default; when on, the operator's ServiceAccount (only) is matched before
    the built-in `service-accounts` FlowSchema (9000) and lands in kube-scheduler's priority level."""
    assert ct.by_kind(rendered["defaults"], "FlowSchema") == []
    (schema,) = ct.by_kind(rendered["external-rms"], "FlowSchema")
    spec = schema["spec"]
    assert spec["priorityLevelConfiguration"] == {"name": "workload-high"}
    assert spec["matchingPrecedence"] < 9000
    (rule,) = spec["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": "rel-bindery", "namespace": NAMESPACE}}
    ]


def test_reference_rm_tls_from_an_existing_secret_is_stable_across_renders(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """Issue 20, item 6/10: `helm template` (GitOps) cannot look up the generated CA, so each render
    made a new one and restarted the RM. With `referenceRM.tls.existingSecret` (e.g. cert-manager's
    Certificate Secret: tls.crt, tls.key, ca.crt) nothing is generated: two renders are identical,
    the RM mounts that Secret and the ResourceManager trusts its `ca.crt`."""
    values = {
        "referenceRM": {
            "tls": {"enabled": True, "existingSecret": "rm-serving-cert"},
            "token": {"existingSecret": "rm-token"},
        }
    }
    renders = [ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values) for _ in range(2)]
    assert renders[0] == renders[1], "two renders with an existing TLS Secret differ"
    objects = renders[0]
    assert not ct.by_kind(objects, "Secret"), (
        "the chart must not generate a CA, certificate or token when given existing Secrets"
    )
    rm = ct.one(objects, "ResourceManager")
    assert rm["spec"]["endpoint"] == f"https://rel-bindery-rm.{NAMESPACE}.svc:8080"
    assert rm["spec"]["tls"]["caSecretRef"] == {
        "namespace": NAMESPACE,
        "name": "rm-serving-cert",
        "key": "ca.crt",
    }
    pod = ct.one(objects, "Deployment", "rel-bindery-rm")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "rm-serving-cert"
    args = pod["containers"][0]["args"]
    assert "--tls-cert=/etc/bindery-rm/tls/tls.crt" in args
    assert "--tls-key=/etc/bindery-rm/tls/tls.key" in args


def test_the_operator_can_trust_a_ca_secret_without_the_rms_key(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """With only existingSecret the operator reads ca.crt from the Secret that also holds the RM's
    key; caSecret points it at a Secret with the CA alone."""
    values = {"referenceRM": {"tls": {"existingSecret": "rm-serving-cert", "caSecret": "rm-ca-only"}}}
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    assert ct.one(objects, "ResourceManager")["spec"]["tls"]["caSecretRef"]["name"] == "rm-ca-only"
    pod = ct.one(objects, "Deployment", "rel-bindery-rm")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]["secretName"] == "rm-serving-cert"
    error = ct.render_error(
        helm=helm, env=helm_env, tmp=tmp_path, values={"referenceRM": {"tls": {"caSecret": "rm-ca-only"}}}
    )
    assert "referenceRM.tls.caSecret" in error


def test_reference_rm_tls_existing_secret_without_tls_is_refused(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    message = ct.render_error(
        helm=helm,
        env=helm_env,
        tmp=tmp_path,
        values={"referenceRM": {"tls": {"enabled": False, "existingSecret": "rm-serving-cert"}}},
    )
    assert "referenceRM.tls.existingSecret" in message
    assert "tls.enabled" in message


def test_metrics_behind_the_apiservers_authentication(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """Issue 20, item 8: `/metrics` can ask scrapers for a token RBAC lets `get` it (`--metrics-auth`),
    as kube-scheduler's secure port does. The chart turns it on with one value, ships the reader
    role (bound to nobody) and lets the ServiceMonitor send a token from a Secret."""
    plain = ct.render(helm=helm, env=helm_env, tmp=tmp_path)
    (container,) = ct.one(plain, "Deployment", "rel-bindery")["spec"]["template"]["spec"]["containers"]
    assert "--metrics-auth" not in container["args"]
    values = {
        "metrics": {
            "auth": True,
            "serviceMonitor": {
                "enabled": True,
                "bearerTokenSecret": {"name": "prometheus-token", "key": "token"},
            },
        }
    }
    objects = ct.render(
        helm=helm,
        env=helm_env,
        tmp=tmp_path,
        values=values,
        extra=["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"],
    )
    (container,) = ct.one(objects, "Deployment", "rel-bindery")["spec"]["template"]["spec"]["containers"]
    assert "--metrics-auth" in container["args"]
    reader = ct.one(objects, "ClusterRole", "rel-bindery-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not [
        b
        for b in ct.by_kind(objects, "ClusterRoleBinding")
        if b["roleRef"]["name"] == reader["metadata"]["name"]
    ]
    endpoint = ct.one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "prometheus-token", "key": "token"},
    }
    error = ct.render_error(
        helm=helm,
        env=helm_env,
        tmp=tmp_path,
        values={"metrics": {"auth": True, "serviceMonitor": {"enabled": True}}},
        extra=["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"],
    )
    assert "metrics.serviceMonitor.bearerTokenSecret" in error
