"""Volume binding on the real plane: Bindery and kube-scheduler, same cases, same outcomes.

A pod with PersistentVolumeClaims can only run where its volumes are. kube-scheduler's VolumeBinding
plugin knows that: a missing claim, or an unbound claim of an Immediate class, makes the pod
Unschedulable before any node is tried; a claim already bound restricts the pod to its volume's
nodes; for an unbound WaitForFirstConsumer claim it picks the node, then (PreBind) binds a matching
static PV or annotates the claim `volume.kubernetes.io/selected-node` for the provisioner, and binds
the pod only once the claim is bound. Bindery must do the same with the RM's choice of node, and
must release the reservation (and undo the annotation) when the volume never comes.

Every case runs twice on the cluster plane (kube-controller-manager's persistent-volume and
StatefulSet controllers, kwok nodes): once with Bindery's scheduler name (reference RM, operator
process), once with the default scheduler name (kube-scheduler). Dynamic volumes come from
`tests.volumes.provisioner`, which plays an external provisioner. The pool is three kwok nodes of
its own per test; StorageClasses and PVs are cluster-scoped, so they carry the test's label and are
deleted at the end.

Cases: `statefulset-wffc` (3 replicas, WaitForFirstConsumer claims, dynamic), `static-local`
(no-provisioner class, a fitting PV on one node only), `bound-claim` (claim bound to a PV of one
node), `unbound-immediate-class` and `unbound-no-class`, `missing-claim`, `never-provisioned`
(nobody serves the class's provisioner: Bindery's bind times out after the ResourceManager's
`volumeBindTimeoutSeconds`, then a provisioner appears and the retry succeeds; kube-scheduler waits
for 600 s, so for it the test records "pending, claim annotated" and then lets the provisioner
appear too). Each records its outcome (`tests.volumes.report`); the session ends with them side by
side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import pathlib
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client, watch

from bindery.devcluster.plane import ControlPlane
from bindery.rm.models import ReservationState
from tests.placement.checker import check
from tests.realrm import settled_invariants
from tests.volumes import report
from tests.volumes.provisioner import HOSTNAME, SELECTED_NODE, Provisioner
from tests.workloads import Bindery, Cluster, bindery_on, eventually, kwok_pool, template

pytestmark = pytest.mark.controlplane

NODES = 3
CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "20"}
TEST_LABEL = "bindery.dev/volume-test"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
WFFC, IMMEDIATE = "WaitForFirstConsumer", "Immediate"
#: Bindery's bind timeout in the never-provisioned case (ResourceManager `spec.volumeBindTimeoutSeconds`).
BIND_TIMEOUT = 10
SCHEDULERS = [pytest.param("bindery", id="bindery"), pytest.param("kube-scheduler", id="kube_scheduler")]


# -- the stage ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Env:
    cluster: ControlPlane
    api: client.ApiClient
    operator_kubeconfig: pathlib.Path
    namespace: str
    directory: pathlib.Path


@pytest.fixture
def env(
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
) -> Env:
    return Env(cluster, cluster_api, cluster_operator_kubeconfig, cluster_namespace, tmp_path)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One test's pool, namespace and scheduler; `bindery` is None for kube-scheduler."""

    scheduler: str
    env: Env
    pool: str
    nodes: list[str]
    token: str
    bindery: Bindery | None

    @property
    def scheduler_name(self) -> str | None:
        return self.bindery.scheduler if self.bindery else None

    @property
    def namespace(self) -> str:
        return self.env.namespace

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.env.api)

    @property
    def view(self) -> Cluster:
        return Cluster(api=self.env.api, namespace=self.env.namespace)

    def short(self, node: str | None) -> str:
        """`node` as its place in the pool (`n0`..), so both schedulers' outcomes read alike."""
        return f"n{self.nodes.index(node)}" if node in self.nodes else str(node)

    async def settle(self) -> None:
        """Bindery: every invariant holds (nothing leaked); kube-scheduler: nothing to check."""
        if self.bindery is not None:
            await settled_invariants(
                api=self.env.api,
                rm=self.bindery.rm,
                namespace=self.namespace,
                scheduler_names=[self.bindery.scheduler],
            )


@contextlib.asynccontextmanager
async def staged(scheduler: str, env: Env, **rm_spec: Any) -> AsyncIterator[Stage]:
    """A pool of kwok nodes, and Bindery on it when `scheduler` is "bindery"; afterwards the nodes
    and every StorageClass and PV labelled with the stage's token are deleted."""
    token = uuid.uuid4().hex[:6]
    nodes = [f"kwok-{token}-{i}" for i in range(NODES)]  # kwok_pool's names, for the cleanup
    try:
        assert await kwok_pool(env.api, pool=token, count=NODES, capacity=CAPACITY) == nodes
        if scheduler == "bindery":
            async with bindery_on(
                api=env.api,
                cluster=env.cluster,
                operator_kubeconfig=env.operator_kubeconfig,
                namespace=env.namespace,
                pool=token,
                directory=env.directory,
                **rm_spec,
            ) as bindery:
                yield Stage(scheduler, env, token, nodes, token, bindery)
        else:
            yield Stage(scheduler, env, token, nodes, token, None)
    finally:
        core = client.CoreV1Api(env.api)
        storage = client.StorageV1Api(env.api)
        selector = f"{TEST_LABEL}={token}"
        with contextlib.suppress(client.ApiException):
            await storage.delete_collection_storage_class(label_selector=selector)
        with contextlib.suppress(client.ApiException):
            await core.delete_collection_persistent_volume(label_selector=selector)
        for node in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(node)


# -- objects --------------------------------------------------------------------------------------


async def storage_class(stage: Stage, kind: str, *, binding: str, provisioner: str) -> str:
    name = f"{kind}-{stage.token}"
    body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "labels": {TEST_LABEL: stage.token}},
        "provisioner": provisioner,
        "volumeBindingMode": binding,
        "reclaimPolicy": "Delete",
    }
    await client.StorageV1Api(stage.env.api).create_storage_class(body=body)
    return name


def node_affinity(node: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]}
    return {"required": {"nodeSelectorTerms": [term]}}


async def static_volume(
    stage: Stage,
    name: str,
    *,
    node: str,
    size: str,
    storage_class: str,
    claim: str | None = None,
) -> str:
    """A `local` PV on `node` (pre-bound to `claim` of the stage's namespace when given)."""
    full = f"{name}-{stage.token}"
    spec: dict[str, Any] = {
        "capacity": {"storage": size},
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
        "storageClassName": storage_class,
        "persistentVolumeReclaimPolicy": "Retain",
        "local": {"path": f"/mnt/bindery-test/{full}"},
        "nodeAffinity": node_affinity(node),
    }
    if claim is not None:
        spec["claimRef"] = {"namespace": stage.namespace, "name": claim}
    body = {"metadata": {"name": full, "labels": {TEST_LABEL: stage.token}}, "spec": spec}
    await stage.core.create_persistent_volume(body=body)
    return full


async def claim(
    stage: Stage, name: str, *, storage_class: str, size: str = "1Gi", volume: str | None = None
) -> None:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": storage_class,
        "resources": {"requests": {"storage": size}},
    }
    if volume is not None:
        spec["volumeName"] = volume
    await stage.core.create_namespaced_persistent_volume_claim(
        stage.namespace, body={"metadata": {"name": name}, "spec": spec}
    )


def with_claims(body: dict[str, Any], claims: Sequence[str]) -> dict[str, Any]:
    """A pod template (or pod) whose container mounts each claim at /<claim>."""
    spec = body["spec"]
    spec["containers"][0]["volumeMounts"] = [{"name": c, "mountPath": f"/{c}"} for c in claims]
    spec["volumes"] = [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
    return body


async def create_pod(stage: Stage, name: str, *, claims: Sequence[str]) -> str:
    """A pod of the stage's scheduler using `claims`; returns its UID."""
    body = template(labels={"app": name}, cpu="100m", scheduler=stage.scheduler_name, pool=stage.pool)
    body["metadata"]["name"] = name
    created = await stage.core.create_namespaced_pod(stage.namespace, body=with_claims(body, claims))
    return str(created.metadata.uid)


# -- reads ----------------------------------------------------------------------------------------


async def read(stage: Stage, kind: str, name: str) -> dict[str, Any]:
    """The pod, claim (namespaced) or persistentvolume as the API stores it, as a plain dict."""
    if kind == "pod":
        response = await stage.core.read_namespaced_pod(name, stage.namespace, _preload_content=False)
    elif kind == "claim":
        response = await stage.core.read_namespaced_persistent_volume_claim(
            name, stage.namespace, _preload_content=False
        )
    else:
        response = await stage.core.read_persistent_volume(name, _preload_content=False)
    document: dict[str, Any] = await response.json()
    return document


def condition(pod: Mapping[str, Any], kind: str = "PodScheduled") -> dict[str, Any]:
    for item in (pod.get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return dict(item)
    return {}


def volume_node(volume: Mapping[str, Any]) -> str | None:
    """The single node a PV's `kubernetes.io/hostname In [...]` affinity names."""
    terms = ((volume["spec"].get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms") or []
    values = [
        value
        for term in terms
        for expression in term.get("matchExpressions") or []
        if expression["key"] == HOSTNAME and expression["operator"] == "In"
        for value in expression["values"]
    ]
    return values[0] if len(values) == 1 else None


async def read_node(stage: Stage, name: str) -> dict[str, Any]:
    response = await stage.core.read_node(name, _preload_content=False)
    document: dict[str, Any] = await response.json()
    return document


async def unschedulable(stage: Stage, pod: str) -> str | None:
    """The PodScheduled=False message once the pod is reported Unschedulable (and unbound)."""
    body = await read(stage, "pod", pod)
    scheduled = condition(body)
    failed = scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
    return str(scheduled.get("message")) if failed and not body["spec"].get("nodeName") else None


async def placed(stage: Stage, pod: str, claim_name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(pod, volume) once the pod runs on a node and its claim is Bound to a volume."""
    body = await read(stage, "pod", pod)
    pvc = await read(stage, "claim", claim_name)
    name = pvc["spec"].get("volumeName")
    if (body.get("status") or {}).get("phase") != "Running" or (pvc.get("status") or {}).get(
        "phase"
    ) != "Bound":
        return None
    return body, await read(stage, "pv", name)


async def pod_reservations(stage: Stage, uid: str) -> list[Any]:
    """Every reservation the RM reports (released ones too) for the pod with `uid`."""
    assert stage.bindery is not None
    return [r for r in await stage.bindery.rm.reservations(active=False) if r.pod_uid == uid]


async def annotated(stage: Stage, claim_name: str) -> str | None:
    """The claim's selected-node annotation, if set."""
    pvc = await read(stage, "claim", claim_name)
    return (pvc["metadata"].get("annotations") or {}).get(SELECTED_NODE)


async def reserved_only_on(stage: Stage, pod: Mapping[str, Any], node: str) -> None:
    """Bindery: the RM was told the volume's topology, so it never reserved the pod elsewhere."""
    if stage.bindery is not None:
        nodes = {r.node for r in await pod_reservations(stage, pod["metadata"]["uid"])}
        assert nodes == {node}, f"the pod was reserved on {sorted(nodes)}, only {node} has its volume"


def describe_placement(stage: Stage, pod: Mapping[str, Any], volume: Mapping[str, Any]) -> str:
    node = pod["spec"]["nodeName"]
    return f"bound to {stage.short(node)}; claim Bound to a PV on {stage.short(volume_node(volume))}"


class ClaimHistory:
    """Every value the claim's selected-node annotation took (None when absent), from a watch, so a
    short-lived removal is not missed between two reads."""

    def __init__(self, stage: Stage, name: str) -> None:
        self.values: list[str | None] = []
        self._stage, self._name = stage, name
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        core = self._stage.core
        while True:
            with contextlib.suppress(Exception):
                async with watch.Watch() as stream:
                    async for event in stream.stream(
                        core.list_namespaced_persistent_volume_claim,
                        self._stage.namespace,
                        field_selector=f"metadata.name={self._name}",
                        timeout_seconds=60,
                    ):
                        raw = event["raw_object"]
                        if event["type"] in ("ADDED", "MODIFIED"):
                            value = (raw["metadata"].get("annotations") or {}).get(SELECTED_NODE)
                            if not self.values or self.values[-1] != value:
                                self.values.append(value)
            await asyncio.sleep(0.2)

    def cleared_after_set(self) -> bool:
        first = next((i for i, v in enumerate(self.values) if v), None)
        return first is not None and None in self.values[first:]

    async def __aenter__(self) -> ClaimHistory:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def timestamp(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


# -- the cases ------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_missing_claim_is_unschedulable_before_any_reservation(scheduler: str, env: Env) -> None:
    async with staged(scheduler, env) as stage:
        uid = await create_pod(stage, "app", claims=["data"])
        message = await eventually(
            lambda: unschedulable(stage, "app"), within=60, what="the pod reported Unschedulable"
        )
        assert 'persistentvolumeclaim "data" not found' in message, message
        if stage.bindery is not None:
            assert await pod_reservations(stage, uid) == [], "no reservation for a pod whose claim is missing"
        report.record("missing-claim", scheduler, f"Unschedulable: {message}")
        await stage.settle()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("variant", ["immediate-class", "no-class"])
async def test_unbound_immediate_claim_is_unschedulable_before_any_reservation(
    scheduler: str, variant: str, env: Env
) -> None:
    """A claim of an Immediate class nobody provisions, or a claim of no class (`""`: binds only to
    class-less PVs, and is never delayed); it asks for more than any PV on the plane holds."""
    async with staged(scheduler, env) as stage:
        if variant == "immediate-class":
            nobody = f"bindery.test/nobody-{stage.token}"
            class_name = await storage_class(stage, "immediate", binding=IMMEDIATE, provisioner=nobody)
        else:
            class_name = ""
        await claim(stage, "data", storage_class=class_name, size="999Ti")
        uid = await create_pod(stage, "app", claims=["data"])
        message = await eventually(
            lambda: unschedulable(stage, "app"), within=60, what="the pod reported Unschedulable"
        )
        assert "pod has unbound immediate PersistentVolumeClaims" in message, message
        assert (await read(stage, "claim", "data"))["status"].get("phase") == "Pending"
        if stage.bindery is not None:
            assert await pod_reservations(stage, uid) == [], "no reservation for an unbound Immediate claim"
        report.record(f"unbound-{variant}", scheduler, f"Unschedulable: {message}")
        await stage.settle()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_static_local_volume_puts_the_pod_on_the_node_of_a_fitting_volume(
    scheduler: str, env: Env
) -> None:
    async with staged(scheduler, env) as stage:
        local = await storage_class(stage, "local", binding=WFFC, provisioner=NO_PROVISIONER)
        # One PV that fits (on n1) and one too small for the claim (on n2); none on n0.
        fits = await static_volume(stage, "fits", node=stage.nodes[1], size="2Gi", storage_class=local)
        await static_volume(stage, "small", node=stage.nodes[2], size="100Mi", storage_class=local)
        await claim(stage, "data", storage_class=local, size="1Gi")
        await create_pod(stage, "app", claims=["data"])
        pod, volume = await eventually(
            lambda: placed(stage, "app", "data"), within=90, what="the pod Running, its claim Bound"
        )
        assert pod["spec"]["nodeName"] == stage.nodes[1]
        assert volume["metadata"]["name"] == fits
        await reserved_only_on(stage, pod, stage.nodes[1])
        assert volume_node(volume) == pod["spec"]["nodeName"]
        report.record("static-local", scheduler, describe_placement(stage, pod, volume))
        await stage.settle()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_claim_bound_to_a_node_local_volume_puts_the_pod_on_that_node(scheduler: str, env: Env) -> None:
    async with staged(scheduler, env) as stage:
        local = await storage_class(stage, "bound", binding=WFFC, provisioner=NO_PROVISIONER)
        target = stage.nodes[2]
        volume_name = await static_volume(
            stage, "pinned", node=target, size="1Gi", storage_class=local, claim="data"
        )
        await claim(stage, "data", storage_class=local, volume=volume_name)

        async def claim_bound() -> bool:
            return bool((await read(stage, "claim", "data")).get("status", {}).get("phase") == "Bound")

        await eventually(claim_bound, within=60, what="the pre-bound claim Bound")
        await create_pod(stage, "app", claims=["data"])
        pod, volume = await eventually(
            lambda: placed(stage, "app", "data"), within=90, what="the pod Running on its volume's node"
        )
        assert pod["spec"]["nodeName"] == target
        assert volume["metadata"]["name"] == volume_name
        await reserved_only_on(stage, pod, target)
        report.record("bound-claim", scheduler, describe_placement(stage, pod, volume))
        await stage.settle()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_statefulset_with_wait_for_first_consumer_claims_gets_volumes_on_the_pods_nodes(
    scheduler: str, env: Env
) -> None:
    async with staged(scheduler, env) as stage:
        provisioner_name = f"bindery.test/local-{stage.token}"
        dynamic = await storage_class(stage, "dynamic", binding=WFFC, provisioner=provisioner_name)
        labels = {"app": "web"}
        pod_template = with_claims(
            template(labels=labels, cpu="100m", scheduler=stage.scheduler_name, pool=stage.pool), ["data"]
        )
        del pod_template["spec"]["volumes"]  # the StatefulSet controller adds the template's claims
        body = {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 3,
                "serviceName": "web",
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": pod_template,
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": dynamic,
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                ],
            },
        }
        async with Provisioner(stage.env.api, name=provisioner_name, labels={TEST_LABEL: stage.token}):
            await stage.view.apps.create_namespaced_stateful_set(stage.namespace, body=body)
            await eventually(
                lambda: stage.view.running("app=web", 3), within=120, what="the StatefulSet's 3 pods Running"
            )
            rows = [("pod", "node", "claim", "volume", "volume's node")]
            for ordinal in range(3):
                pod_name, claim_name = f"web-{ordinal}", f"data-web-{ordinal}"
                pod, volume = await eventually(
                    functools.partial(placed, stage, pod_name, claim_name),
                    within=60,
                    what=f"{claim_name} Bound",
                )
                node = pod["spec"]["nodeName"]
                pvc = await read(stage, "claim", claim_name)
                assert (pvc["metadata"].get("annotations") or {}).get(SELECTED_NODE) == node
                assert volume_node(volume) == node
                assert volume["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
                assert volume["spec"]["storageClassName"] == dynamic
                assert volume["spec"]["capacity"]["storage"] == "1Gi"
                # Bound only once its volume existed (PreBind waits for the claim).
                bound_at = timestamp(condition(pod)["lastTransitionTime"])
                assert bound_at >= timestamp(volume["metadata"]["creationTimestamp"])
                rows.append(
                    (pod_name, node, claim_name, volume["metadata"]["name"], str(volume_node(volume)))
                )
            widths = [max(len(row[i]) for row in rows) for i in range(5)]
            lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
            report.block(f"StatefulSet web, scheduler={scheduler}:\n" + "\n".join(lines))
            spread = len({row[1] for row in rows[1:]})
            report.record(
                "statefulset-wffc",
                scheduler,
                f"3/3 pods Running, 3/3 claims Bound to a PV on the pod's node ({spread} node(s) used)",
            )
            await stage.settle()


def says_bind_timed_out(message: str) -> bool:
    text = message.lower()
    about_volumes = "volume" in text or "claim" in text
    return about_volumes and any(word in text for word in ("timed out", "timeout", "deadline"))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_provisioning_that_never_happens_times_out_releases_and_explains(
    scheduler: str, env: Env
) -> None:
    async with staged(scheduler, env, volumeBindTimeoutSeconds=BIND_TIMEOUT) as stage:
        provisioner_name = f"bindery.test/late-{stage.token}"
        late = await storage_class(stage, "late", binding=WFFC, provisioner=provisioner_name)
        await claim(stage, "data", storage_class=late)
        async with ClaimHistory(stage, "data") as history:
            uid = await create_pod(stage, "app", claims=["data"])
            chosen = await eventually(
                lambda: annotated(stage, "data"), within=60, what="the claim annotated with a selected node"
            )
            assert chosen in stage.nodes
            if stage.bindery is None:
                # kube-scheduler waits up to its bindTimeoutSeconds (600 s) in PreBind.
                assert not (await read(stage, "pod", "app"))["spec"].get("nodeName")
                outcome = f"pending, claim annotated selected-node={stage.short(chosen)} (waits 600 s)"
            else:

                async def explained() -> str | None:
                    pod = await read(stage, "pod", "app")
                    scheduled = condition(pod)
                    message = str(scheduled.get("message") or "")
                    failed = scheduled.get("status") == "False" and says_bind_timed_out(message)
                    return message if failed and not pod["spec"].get("nodeName") else None

                message = await eventually(
                    explained, within=BIND_TIMEOUT + 60, what="PodScheduled=False explaining the timeout"
                )

                async def released() -> bool:
                    states = {r.state for r in await pod_reservations(stage, uid)}
                    return ReservationState.RELEASED in states

                await eventually(released, within=30, what="the pod's reservation released")

                async def cleared() -> bool:
                    return history.cleared_after_set()

                await eventually(
                    cleared, within=30, what=f"the selected-node annotation removed ({history.values})"
                )
                assert await failed_scheduling_event(stage, "app"), "a FailedScheduling event for the pod"
                outcome = (
                    f"annotated selected-node={stage.short(chosen)}, timed out after {BIND_TIMEOUT} s: "
                    f"reservation released, annotation removed; PodScheduled=False: {message}"
                )

        # A provisioner for the class appears: the pod ends bound with its volume on its node.
        async with Provisioner(stage.env.api, name=provisioner_name, labels={TEST_LABEL: stage.token}):
            pod, volume = await eventually(
                lambda: placed(stage, "app", "data"), within=120, what="the pod Running once provisioned"
            )
            assert volume_node(volume) == pod["spec"]["nodeName"]
            placement = describe_placement(stage, pod, volume)
            report.record(
                "never-provisioned", scheduler, f"{outcome}; once a provisioner appears: {placement}"
            )
            await stage.settle()


async def failed_scheduling_event(stage: Stage, pod: str) -> list[str]:
    """The messages of the FailedScheduling events (events.k8s.io) about `pod`."""
    response = await client.EventsV1Api(stage.env.api).list_namespaced_event(
        stage.namespace, _preload_content=False
    )
    events = (await response.json())["items"]
    return [
        str(e.get("note"))
        for e in events
        if e.get("reason") == "FailedScheduling" and (e.get("regarding") or {}).get("name") == pod
    ]


ZONE = "topology.kubernetes.io/zone"


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_a_volume_labelled_with_a_zone_keeps_its_pods_in_that_zone(scheduler: str, env: Env) -> None:
    """VolumeZone: a bound PV labelled zone-a (no node affinity, as in-tree cloud disks were) may only
    be used by pods on zone-a nodes. Three pods share its claim and repel each other by hostname; the
    pool has one zone-a node and two zone-b ones: one pod runs, on the zone-a node, the other two stay
    Unschedulable. A scheduler that drops the rule spreads the three over the three nodes."""
    async with staged(scheduler, env) as stage:
        zones = ["zone-a", "zone-b", "zone-b"]
        for node, zone in zip(stage.nodes, zones, strict=True):
            await stage.core.patch_node(node, {"metadata": {"labels": {ZONE: zone}}})
        disk = f"disk-{stage.token}"
        spec: dict[str, Any] = {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": f"/mnt/bindery-test/{disk}"},
            "claimRef": {"namespace": stage.namespace, "name": "data"},
        }
        labels = {TEST_LABEL: stage.token, ZONE: "zone-a"}
        await stage.core.create_persistent_volume(
            body={"metadata": {"name": disk, "labels": labels}, "spec": spec}
        )
        await claim(stage, "data", storage_class="", volume=disk)

        async def claim_bound() -> bool:
            return bool((await read(stage, "claim", "data")).get("status", {}).get("phase") == "Bound")

        await eventually(claim_bound, within=60, what="the pre-bound claim Bound")
        repel = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "zoned"}}, "topologyKey": HOSTNAME}
                ]
            }
        }
        names = [f"zoned-{i}" for i in range(3)]
        for name in names:
            body = template(
                labels={"app": "zoned"}, cpu="100m", scheduler=stage.scheduler_name, pool=stage.pool
            )
            body["metadata"]["name"] = name
            body["spec"]["affinity"] = repel
            await stage.core.create_namespaced_pod(stage.namespace, body=with_claims(body, ["data"]))

        async def decided() -> dict[str, str] | None:
            outcome: dict[str, str] = {}
            for name in names:
                pod = await read(stage, "pod", name)
                if pod["spec"].get("nodeName"):
                    outcome[name] = pod["spec"]["nodeName"]
                elif await unschedulable(stage, name) is not None:
                    outcome[name] = "Unschedulable"
            return outcome if len(outcome) == len(names) else None

        outcome = await eventually(decided, within=90, what="every pod bound or reported Unschedulable")
        placed_on = sorted(node for node in outcome.values() if node != "Unschedulable")
        shown = ", ".join(f"{name}: {stage.short(node)}" for name, node in sorted(outcome.items()))
        assert placed_on == [stage.nodes[0]], (
            f"only the zone-a node may hold a pod of the zone-a disk: {shown}"
        )
        # The independent checker (no code shared with Bindery) agrees: no pod breaks VolumeZone.
        pods = (await (await stage.core.list_namespaced_pod(stage.namespace, _preload_content=False)).json())[
            "items"
        ]
        nodes = [await read_node(stage, node) for node in stage.nodes]
        violations = check(
            pods=pods,
            nodes=nodes,
            claims=[await read(stage, "claim", "data")],
            volumes=[await read(stage, "pv", disk)],
        )
        assert violations == [], "\n".join(map(str, violations))
        report.record("volume-zone", scheduler, f"1 pod on the zone-a node, 2 Unschedulable ({shown})")
        await stage.settle()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_a_read_write_once_pod_claim_in_use_leaves_a_second_pod_unschedulable(
    scheduler: str, env: Env
) -> None:
    """VolumeRestrictions: a claim with access mode ReadWriteOncePod is one pod's. A second pod of the
    claim stays Unschedulable, naming the access mode, and gets no reservation; the kubelet would
    refuse to mount it."""
    async with staged(scheduler, env) as stage:
        disk = f"single-{stage.token}"
        spec: dict[str, Any] = {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOncePod"],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": f"/mnt/bindery-test/{disk}"},
            "claimRef": {"namespace": stage.namespace, "name": "data"},
        }
        await stage.core.create_persistent_volume(
            body={"metadata": {"name": disk, "labels": {TEST_LABEL: stage.token}}, "spec": spec}
        )
        await stage.core.create_namespaced_persistent_volume_claim(
            stage.namespace,
            body={
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOncePod"],
                    "storageClassName": "",
                    "volumeName": disk,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )

        async def claim_bound() -> bool:
            return bool((await read(stage, "claim", "data")).get("status", {}).get("phase") == "Bound")

        await eventually(claim_bound, within=60, what="the pre-bound claim Bound")
        await create_pod(stage, "first", claims=["data"])

        async def first_bound() -> str | None:
            node = (await read(stage, "pod", "first"))["spec"].get("nodeName")
            return str(node) if node else None

        node = await eventually(first_bound, within=60, what="the first pod of the claim bound")
        uid = await create_pod(stage, "second", claims=["data"])
        message = await eventually(
            lambda: unschedulable(stage, "second"), within=60, what="the second pod reported Unschedulable"
        )
        assert "ReadWriteOncePod" in message, message
        if stage.bindery is not None:
            assert await pod_reservations(stage, uid) == [], "no reservation for a pod whose claim is taken"
        report.record(
            "read-write-once-pod", scheduler, f"first on {stage.short(node)}; second Unschedulable: {message}"
        )
        await stage.settle()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
async def test_a_csi_attach_limit_of_one_volume_per_node_leaves_the_fourth_pod_unschedulable(
    scheduler: str, env: Env
) -> None:
    """NodeVolumeLimits: each node's CSINode lets the driver attach one volume. Four pods, each with
    a volume of its own of that driver, come one after the other: three run, one per node, and the
    fourth is Unschedulable. A scheduler that ignores the limit puts two volumes on one node."""
    async with staged(scheduler, env) as stage:
        driver = f"csi.bindery.test-{stage.token}"
        storage = client.StorageV1Api(stage.env.api)
        for node in stage.nodes:
            await storage.create_csi_node(
                body={
                    "metadata": {"name": node, "labels": {TEST_LABEL: stage.token}},
                    "spec": {"drivers": [{"name": driver, "nodeID": node, "allocatable": {"count": 1}}]},
                }
            )
        try:
            names = [f"attach-{i}" for i in range(4)]
            outcome: dict[str, str] = {}
            for i, name in enumerate(names):
                disk = f"{name}-{stage.token}"
                spec: dict[str, Any] = {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "csi": {"driver": driver, "volumeHandle": f"handle-{i}"},
                    "claimRef": {"namespace": stage.namespace, "name": name},
                }
                await stage.core.create_persistent_volume(
                    body={"metadata": {"name": disk, "labels": {TEST_LABEL: stage.token}}, "spec": spec}
                )
                await claim(stage, name, storage_class="", volume=disk)

                async def claim_bound(claim_name: str = name) -> bool:
                    status = (await read(stage, "claim", claim_name)).get("status") or {}
                    return bool(status.get("phase") == "Bound")

                await eventually(claim_bound, within=60, what=f"claim {name} Bound")
                await create_pod(stage, name, claims=[name])

                async def decided(pod_name: str = name) -> str | None:
                    node = (await read(stage, "pod", pod_name))["spec"].get("nodeName")
                    if node:
                        return str(node)
                    message = await unschedulable(stage, pod_name)
                    return f"Unschedulable ({message})" if message is not None else None

                outcome[name] = await eventually(decided, within=60, what=f"{name} bound or Unschedulable")
            shown = ", ".join(f"{n}: {stage.short(v)}" for n, v in outcome.items())
            placed_on = [v for v in outcome.values() if not v.startswith("Unschedulable")]
            assert sorted(placed_on) == sorted(stage.nodes), f"one volume per node: {shown}"
            assert outcome[names[-1]].startswith("Unschedulable"), shown
            message = str(await unschedulable(stage, names[-1]))
            assert "volume count" in message, message
            # The independent checker agrees: no node holds more of the driver's volumes than it attaches.
            pods = (
                await (await stage.core.list_namespaced_pod(stage.namespace, _preload_content=False)).json()
            )["items"]
            listed_csi = await storage.list_csi_node(
                label_selector=f"{TEST_LABEL}={stage.token}", _preload_content=False
            )
            violations = check(
                pods=pods,
                nodes=[await read_node(stage, node) for node in stage.nodes],
                claims=[await read(stage, "claim", name) for name in names],
                volumes=[await read(stage, "pv", f"{name}-{stage.token}") for name in names],
                csi_nodes=(await listed_csi.json())["items"],
            )
            assert violations == [], "\n".join(map(str, violations))
            report.record("csi-attach-limit", scheduler, f"{shown}; the fourth: {message}")
            await stage.settle()
        finally:
            with contextlib.suppress(client.ApiException):
                await storage.delete_collection_csi_node(label_selector=f"{TEST_LABEL}={stage.token}")
