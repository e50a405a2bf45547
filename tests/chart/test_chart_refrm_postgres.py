"""The reference RM on PostgreSQL in the chart (issue 22): `referenceRM.database` and `referenceRM.replicas`.

Offline renders with the real helm (unit tier), and the rendered command line run for real: the chart
installed on the shared plane, then two `bindery rm serve` processes started with the installed
Deployment's own arguments and its password Secret's data, on the project's PostgreSQL, reserving
more than fits through both (plane tier; the plane runs no kube-controller-manager, so the
Deployment itself gets no pods).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import pathlib
import ssl
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane, free_ports
from bindery.devcluster.postgres import PostgresServer
from bindery.quantity import parse_quantity
from tests.chart import charttools as ct
from tests.chart.test_chart_e2e import BINDERY, _container, _eventually, _process, _relocate, _sa_kubeconfig

NAMESPACE = "bindery-system"
URL = "postgresql://bindery_rm@db.example.com:5432/bindery?sslmode=verify-full&sslrootcert=/etc/bindery-rm/db-tls/ca.crt"
POSTGRES: dict[str, Any] = {
    "referenceRM": {
        "replicas": 2,
        "database": {"url": URL, "passwordSecret": {"name": "rm-db", "key": "pw"}, "tlsSecret": "rm-db-ca"},
    }
}


def _rm_deployment(objects: list[dict[str, Any]]) -> Mapping[str, Any]:
    return ct.one(objects, "Deployment", "rel-bindery-rm")


@pytest.fixture(scope="module")
def postgres_render(
    helm: str, helm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    return ct.render(helm=helm, env=helm_env, tmp=tmp_path_factory.mktemp("pg"), values=POSTGRES)


def test_database_mode_passes_the_url_and_the_mounted_password_file(
    postgres_render: list[dict[str, Any]],
) -> None:
    pod = _rm_deployment(postgres_render)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    # The URL as given (libpq's TLS options included), the password as a file from the Secret.
    assert f"--db={URL}" in args
    assert "--db-password-file=/etc/bindery-rm/db/password" in args
    assert not [a for a in args if "sqlite" in a]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["db-password"] == {
        "name": "db-password",
        "mountPath": "/etc/bindery-rm/db",
        "readOnly": True,
    }
    assert volumes["db-password"]["secret"] == {
        "secretName": "rm-db",
        "defaultMode": 0o440,
        "items": [{"key": "pw", "path": "password"}],
    }
    # The files the URL's sslrootcert names.
    assert mounts["db-tls"]["mountPath"] == "/etc/bindery-rm/db-tls"
    assert volumes["db-tls"]["secret"]["secretName"] == "rm-db-ca"
    # No ReadWriteOnce volume: nothing of the reservations lives in the pod.
    assert "data" not in volumes
    assert not ct.by_kind(postgres_render, "PersistentVolumeClaim")
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_database_mode_rolls_spreads_and_keeps_one_replica_through_drains(
    postgres_render: list[dict[str, Any]],
) -> None:
    dep = _rm_deployment(postgres_render)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    selector = dep["spec"]["selector"]["matchLabels"]
    spread = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"]) for c in spread] == [
        ("kubernetes.io/hostname", "ScheduleAnyway", 1),
        ("topology.kubernetes.io/zone", "ScheduleAnyway", 1),
    ]
    assert all(c["labelSelector"] == {"matchLabels": selector} for c in spread)
    pdb = ct.one(postgres_render, "PodDisruptionBudget", "rel-bindery-rm")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == {"matchLabels": selector}
    # The operator's budget is still its own.
    assert (
        ct.one(postgres_render, "PodDisruptionBudget", "rel-bindery")["spec"]["selector"]
        != pdb["spec"]["selector"]
    )


def test_one_replica_on_postgres_rolls_without_a_budget(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    values = {"referenceRM": {"database": {"url": "postgresql://rm@db:5432/rm"}}}
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    dep = _rm_deployment(objects)
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    # A budget of one for one pod would hang every drain.
    assert [p["metadata"]["name"] for p in ct.by_kind(objects, "PodDisruptionBudget")] == ["rel-bindery"]
    # No passwordSecret: libpq's own sources, and no flag naming a file that is not there.
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if a.startswith("--db-password-file")]
    assert "--db=postgresql://rm@db:5432/rm" in container["args"]


def test_default_render_is_sqlite_on_its_volume_as_before(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path)
    dep = _rm_deployment(objects)
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in pod
    (container,) = pod["containers"]
    assert "--db=/var/lib/bindery-rm/rm.sqlite" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--db-password-file")]
    assert {"name": "data", "mountPath": "/var/lib/bindery-rm"} in container["volumeMounts"]
    assert ct.one(objects, "PersistentVolumeClaim", "rel-bindery-rm-data")
    assert [p["metadata"]["name"] for p in ct.by_kind(objects, "PodDisruptionBudget")] == ["rel-bindery"]


def test_sqlite_refuses_a_second_replica_and_says_what_to_set(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    error = ct.render_error(helm=helm, env=helm_env, tmp=tmp_path, values={"referenceRM": {"replicas": 2}})
    assert "referenceRM.replicas is 2" in error
    assert "two processes on one SQLite file overcommit" in error
    assert "Set referenceRM.replicas=1, or set referenceRM.database.url" in error


@pytest.mark.parametrize(
    "url",
    ["postgresql://rm:s3cret@db:5432/rm", "postgresql://rm@db:5432/rm?sslmode=require&password=s3cret"],
    ids=["userinfo", "query"],
)
def test_a_password_in_the_url_is_refused(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path, url: str
) -> None:
    error = ct.render_error(
        helm=helm, env=helm_env, tmp=tmp_path, values={"referenceRM": {"database": {"url": url}}}
    )
    assert "referenceRM.database.url carries a password" in error
    assert "s3cret" not in error
    assert "referenceRM.database.passwordSecret" in error


def test_the_schema_takes_only_postgresql_urls(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    values = {"referenceRM": {"database": {"url": "/var/lib/rm.sqlite"}}}
    error = ct.render_error(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    assert "/referenceRM/database/url" in error


# -- the rendered command line, run -----------------------------------------------------------------

#: The node's room: three reservations of one CPU; the test asks for twelve.
NODE_CPU = 3
KEYS = 12


def _reserve_body(key: str, scheduler: str) -> dict[str, Any]:
    return {
        "pod": {"uid": key, "namespace": "pg", "name": key, "schedulerName": scheduler, "priority": 0},
        "resources": {"cpu": "1"},
        "placement": {},
        "idempotencyKey": key,
        "ttlSeconds": 300,
    }


@dataclasses.dataclass(frozen=True)
class Release:
    plane: ControlPlane
    namespace: str
    full: str
    scheduler: str
    pool: str
    db: str
    password: str


@pytest.fixture
def pg_release(
    controlplane: ControlPlane, helm: str, namespace: str, postgres: PostgresServer, postgres_db: str
) -> Iterator[Release]:
    """The chart installed with two reference RM replicas on a fresh database of the project's
    PostgreSQL, the password in a Secret of the release namespace; uninstalled at the end."""
    tag = uuid.uuid4().hex[:6]
    release = Release(
        plane=controlplane,
        namespace=namespace,
        full=f"pg-{tag}-bindery",
        scheduler=f"chart-pg-{tag}",
        pool=f"pool-{tag}",
        db=postgres_db,
        password=postgres.password,
    )
    controlplane.kubectl(
        "create", "secret", "generic", "rm-db", "-n", namespace, f"--from-literal=pw={postgres.password}"
    )
    ct.run(
        [
            helm,
            "install",
            f"pg-{tag}",
            str(ct.CHART),
            "--namespace",
            namespace,
            "--set",
            f"referenceRM.schedulerNames={{{release.scheduler}}}",
            "--set",
            f"referenceRM.mirrorNodeSelector=bindery.dev/pool={release.pool}",
            "--set",
            "referenceRM.replicas=2",
            "--set-string",
            f"referenceRM.database.url={postgres_db}",
            "--set",
            "referenceRM.database.passwordSecret.name=rm-db",
            "--set",
            "referenceRM.database.passwordSecret.key=pw",
            "--set",
            "referenceRM.tls.extraDNSNames={localhost}",
        ],
        env=controlplane.env,
        timeout=180,
    )
    try:
        yield release
    finally:
        ct.run([helm, "uninstall", f"pg-{tag}", "--namespace", namespace], env=controlplane.env)


async def test_two_replicas_run_as_the_chart_renders_them_and_never_overcommit(
    pg_release: Release, kube_api: client.ApiClient, tmp_path: pathlib.Path
) -> None:
    """`helm install` with two replicas on the project's PostgreSQL, then both replicas run with the
    installed Deployment's arguments: only the listen address and the files of the mounted Secrets
    move to loopback and a temp dir; `--db` is the installed URL as is, and the password file holds
    the installed password Secret's key. Twelve keys, each sent to both replicas at once, for a node
    with room for three: three reservations, every key answered alike by both, and each replica
    reads the other's."""
    plane, namespace, full = pg_release.plane, pg_release.namespace, pg_release.full
    # What the apiserver stored: two replicas, rolling, a budget, no claim.
    dep = json.loads(plane.kubectl("get", "deployment", f"{full}-rm", "-n", namespace, "-o", "json").stdout)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    pdb = json.loads(plane.kubectl("get", "pdb", f"{full}-rm", "-n", namespace, "-o", "json").stdout)
    assert pdb["spec"]["minAvailable"] == 1
    assert json.loads(plane.kubectl("get", "pvc", "-n", namespace, "-o", "json").stdout)["items"] == []
    node = f"pg-node-{pg_release.pool}"
    await create_node(
        kube_api,
        name=node,
        capacity={"cpu": str(NODE_CPU), "memory": "8Gi", "pods": "110"},
        labels={"bindery.dev/pool": pg_release.pool},
    )
    try:
        await _run_two_replicas(pg_release, dep=dep, node=node, tmp=tmp_path)
    finally:
        await client.CoreV1Api(kube_api).delete_node(name=node)


def _secret_files(
    plane: ControlPlane, pod: Mapping[str, Any], namespace: str, volume: str, directory: pathlib.Path
) -> None:
    """Write a Secret volume's files as the kubelet would: each item's key under its path."""
    (source,) = [v["secret"] for v in pod["volumes"] if v["name"] == volume]
    data = json.loads(
        plane.kubectl("get", "secret", source["secretName"], "-n", namespace, "-o", "json").stdout
    )["data"]
    directory.mkdir()
    for item in source.get("items") or [{"key": k, "path": k} for k in data]:
        path = directory / item["path"]
        path.write_bytes(base64.b64decode(data[item["key"]]))
        path.chmod(0o600)


async def _run_two_replicas(
    release: Release, *, dep: Mapping[str, Any], node: str, tmp: pathlib.Path
) -> None:
    plane, namespace, full, scheduler = release.plane, release.namespace, release.full, release.scheduler
    pod = dep["spec"]["template"]["spec"]
    container = _container(plane, namespace=namespace, deployment=f"{full}-rm")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for volume in ("token", "tls", "db-password"):
        _secret_files(plane, pod, namespace, volume, tmp / volume)

    def moved(flag_value: str, volume: str) -> str:
        """A file the container reads under a Secret's mount, at the same place under tmp/volume."""
        return str(tmp / volume / pathlib.PurePosixPath(flag_value).relative_to(mounts[volume]))

    args = {a.partition("=")[0]: a.partition("=")[2] for a in container["args"]}
    assert args["--db"] == release.db, "the rendered URL is passed as given"
    rm_kubeconfig = _sa_kubeconfig(plane, namespace=namespace, sa=f"{full}-rm", path=tmp / "rm.kubeconfig")
    # Nothing from this test's environment: no PGPASSWORD (the rendered password file logs in) and
    # no KUBECONFIG (the chart's ServiceAccount reads the Nodes).
    env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "KUBECONFIG")}
    ports = free_ports(2)
    argvs = [
        [
            str(BINDERY),
            *_relocate(
                container["args"],
                {
                    "--listen": f"127.0.0.1:{port}",
                    "--token-file": moved(args["--token-file"], "token"),
                    "--tls-cert": moved(args["--tls-cert"], "tls"),
                    "--tls-key": moved(args["--tls-key"], "tls"),
                    "--db-password-file": moved(args["--db-password-file"], "db-password"),
                },
            ),
            f"--kubeconfig={rm_kubeconfig}",
        ]
        for port in ports
    ]
    logs = [tmp / "rm-0.log", tmp / "rm-1.log"]
    token = (tmp / "token" / "token").read_text()
    ca = json.loads(plane.kubectl("get", "secret", f"{full}-rm-ca", "-n", namespace, "-o", "json").stdout)
    (tmp / "ca.crt").write_bytes(base64.b64decode(ca["data"]["ca.crt"]))
    verify = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    urls = [f"https://localhost:{port}" for port in ports]
    with (
        _process(argvs[0], log=logs[0], env=env) as first,
        _process(argvs[1], log=logs[1], env=env) as second,
    ):
        procs = [first, second]
        async with httpx.AsyncClient(
            verify=verify, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as http:
            for url in urls:

                async def ready(url: str = url) -> bool:
                    try:
                        return (await http.get(f"{url}/readyz")).status_code == 200
                    except httpx.TransportError:
                        return False

                await _eventually(ready, what=f"{url}/readyz (the node mirrored)", logs=logs, procs=procs)

            async def send(key: str, url: str) -> str | None:
                response = await http.post(f"{url}/v1/reservations", json=_reserve_body(key, scheduler))
                if response.status_code in (200, 201):
                    assert response.json()["node"] == node
                    return str(response.json()["id"])
                assert response.status_code == 409, response.text  # unschedulable, nothing else
                return None

            keys = [f"k{n}" for n in range(KEYS)]
            answers = await asyncio.gather(*(send(key, url) for key in keys for url in urls))
            by_key = {key: answers[2 * n : 2 * n + 2] for n, key in enumerate(keys)}
            # Both replicas answered each key alike: the same reservation, or both refused.
            assert all(a == b for a, b in by_key.values()), by_key
            placed = {key: ids[0] for key, ids in by_key.items() if ids[0] is not None}
            assert len(placed) == NODE_CPU, by_key
            # Either replica reads what the other placed.
            for reservation in placed.values():
                for url in urls:
                    got = await http.get(f"{url}/v1/reservations/{reservation}")
                    assert got.status_code == 200, got.text
    # The database agrees: one active row per placed key, the node's three CPUs and no more.
    with psycopg.connect(release.db, password=release.password) as conn:
        rows = conn.execute(
            "SELECT idempotency_key, node, resources FROM reservations"
            " WHERE state IN ('reserved', 'committed')"
        ).fetchall()
    assert sorted(str(key) for key, _, _ in rows) == sorted(placed)
    assert sum(parse_quantity(json.loads(str(resources))["cpu"]) for _, _, resources in rows) == NODE_CPU
    for log in logs:
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, f"{log.name} shows an error:\n{text[-3000:]}"
        assert "forbidden" not in text.lower(), f"{log.name} shows a refused request:\n{text[-3000:]}"


def test_the_readmes_values_file_renders_two_replicas_on_postgres(
    helm: str, helm_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """The values file the chart README's section has users paste, rendered as pasted."""
    readme = (ct.CHART / "README.md").read_text()
    section = readme.split("## The reference RM on PostgreSQL", 1)[1]
    pasted = section.split("cat > rm-postgres.yaml <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    values = yaml.safe_load(pasted)
    objects = ct.render(helm=helm, env=helm_env, tmp=tmp_path, values=values)
    (container,) = _rm_deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert f"--db={values['referenceRM']['database']['url']}" in container["args"]
    assert "--db-password-file=/etc/bindery-rm/db/password" in container["args"]
    assert ct.one(objects, "PodDisruptionBudget", "rel-bindery-rm")["spec"]["minAvailable"] == 1
    # The Secrets it names are the ones its kubectl commands create.
    assert "create secret generic bindery-rm-db --from-literal=password=" in section
    assert "create secret generic bindery-rm-db-ca --from-file=ca.crt=" in section
