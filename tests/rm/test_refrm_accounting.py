"""The reference RM counts every pod on the nodes it mirrors, whoever bound it (issue 8, scenario 1).

All on the REAL dev control plane, with the reference RM as its own process (``bindery rm serve
--mirror-nodes``) and, for scenario 1, the real kube-scheduler binary binding the other pods.

Negative assertions ("nothing fits") are only made once the RM is known to have seen the pods: the
pods are bound before the RM process starts, and the RM is not ready until it has listed them (its
``/readyz`` answers 200 only when both the nodes and the pods are known).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.reference_rm.cli import serve_command, served_url
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnavailable, RMUnschedulable
from bindery.rm.models import Placement, PodIdentity, Reservation, ReservationRequest

pytestmark = pytest.mark.controlplane

ANNOTATION = "bindery.dev/reservation-id"
POOL_KEY = "bindery.dev/test-pool"
DEADLINE = 60.0


class Pool:
    """Nodes of one test: a label selects them for the RM, a taint keeps other tests' pods away."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex[:8]
        self.selector = f"{POOL_KEY}={self.id}"
        self.labels = {POOL_KEY: self.id}
        self.taint = {"key": POOL_KEY, "value": self.id, "effect": "NoSchedule"}
        self.toleration = {"key": POOL_KEY, "operator": "Equal", "value": self.id, "effect": "NoSchedule"}

    def node(self, index: int) -> str:
        return f"acct-{self.id}-{index}"


async def make_nodes(api: client.ApiClient, pool: Pool, count: int) -> list[str]:
    names = [pool.node(i) for i in range(1, count + 1)]
    for name in names:
        await create_node(
            api,
            name=name,
            capacity={"cpu": "4", "memory": "8Gi", "pods": "110"},
            labels=pool.labels,
            taints=[pool.taint],
        )
    return names


@contextlib.asynccontextmanager
async def rm_process(
    *,
    plane: ControlPlane,
    pool: Pool,
    directory: pathlib.Path,
    token_file: pathlib.Path,
    kubeconfig: pathlib.Path | None = None,
    wait_ready: bool = True,
    extra_options: Sequence[str] = (),
) -> AsyncIterator[ResourceManagerClient]:
    """``bindery rm serve --mirror-nodes`` for the pool, yielding a client (once it is ready)."""
    options = [
        "--mirror-nodes",
        "--node-selector",
        pool.selector,
        "--kubeconfig",
        str(kubeconfig or plane.kubeconfig),
        *extra_options,
    ]
    log_path = directory / "rm.log"
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *serve_command(db=directory / "rm.sqlite", token_file=token_file, options=options),
            stdout=subprocess.PIPE,
            stderr=log,
        )
    try:
        assert process.stdout is not None
        banner = await asyncio.wait_for(process.stdout.readline(), timeout=DEADLINE)
        assert banner, f"the reference RM did not start:\n{log_path.read_text()}"
        async with ResourceManagerClient(
            base_url=served_url(banner), token_file=token_file, allow_insecure_http=True, max_attempts=1
        ) as rm:
            if wait_ready:
                await eventually(rm.check_ready, f"the reference RM became ready (log: {log_path})")
            yield rm
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=30) == 0, log_path.read_text()


async def eventually(attempt: Callable[[], Awaitable[Any]], what: str) -> Any:
    """``attempt()``'s result once it stops raising RMUnavailable/RMUnschedulable/AssertionError."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return await attempt()
        except (RMUnavailable, RMUnschedulable, AssertionError) as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting until {what}; last: {error}") from None
            await asyncio.sleep(0.1)


def request(uid: str, *, pool: Pool, cpu: str, node: str | None = None) -> ReservationRequest:
    """A reservation for a pod that selects the pool (and tolerates its taint)."""
    selector = {"kubernetes.io/hostname": node} if node else dict(pool.labels)
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="acct", name=uid, scheduler_name="bindery"),
        resources={"cpu": cpu, "memory": "64Mi"},
        placement=Placement.model_validate({"nodeSelector": selector, "tolerations": [pool.toleration]}),
        idempotency_key=uid,
        ttl_seconds=300,
    )


def pod_body(
    name: str,
    *,
    pool: Pool,
    cpu: str,
    node: str | None = None,
    scheduler: str = "default-scheduler",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "nodeSelector": dict(pool.labels),
        "tolerations": [pool.toleration],
        "containers": [{"name": "app", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}


@contextlib.asynccontextmanager
async def kube_scheduler(plane: ControlPlane, directory: pathlib.Path) -> AsyncIterator[None]:
    """The kube-scheduler binary the plane was built with, as system:kube-scheduler; ready on /readyz."""
    kubeconfig = plane.mint_kubeconfig(user="system:kube-scheduler")
    log_path = directory / "kube-scheduler.log"
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            str(plane.bin_dir / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            "--authentication-skip-lookup=true",
            f"--cert-dir={directory / 'kube-scheduler-certs'}",
            "--v=1",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=15)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def wait_bound(core: client.CoreV1Api, namespace: str, names: list[str]) -> dict[str, str]:
    """Pod name → node once every pod in ``names`` is bound (polled with a deadline)."""

    async def bound() -> dict[str, str]:
        nodes = {}
        for name in names:
            pod = await core.read_namespaced_pod(name=name, namespace=namespace)
            assert pod.spec.node_name, f"pod {name} is not bound yet"
            nodes[name] = pod.spec.node_name
        return nodes

    result: dict[str, str] = await eventually(bound, f"kube-scheduler bound {names}")
    return result


async def refusal(rm: ResourceManagerClient, reservation_request: ReservationRequest) -> str:
    """The RM's reason for refusing ``reservation_request``; fails the test if it was placed."""
    try:
        placed = await rm.reserve(reservation_request)
    except RMUnschedulable as error:
        return error.reason
    raise AssertionError(
        f"reserved {reservation_request.resources} on {placed.node}, which has no room next to the "
        "pods already bound there"
    )


async def reserve_all(rm: ResourceManagerClient, requests: list[ReservationRequest]) -> list[Reservation]:
    return [await rm.reserve(r) for r in requests]


async def test_scenario_1_pods_bound_by_kube_scheduler_fill_the_nodes(
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
) -> None:
    """Two 4-CPU nodes each run a 3-CPU pod that kube-scheduler placed: no 2-CPU reservation fits
    until those pods are gone; then four do (two per node)."""
    core = client.CoreV1Api(kube_api)
    pool = Pool()
    nodes = await make_nodes(kube_api, pool, 2)
    try:
        async with kube_scheduler(controlplane, tmp_path):
            for name in ("other-1", "other-2"):
                await core.create_namespaced_pod(namespace=namespace, body=pod_body(name, pool=pool, cpu="3"))
            placed = await wait_bound(core, namespace, ["other-1", "other-2"])
        assert sorted(placed.values()) == nodes, placed  # 3 + 3 > 4: one on each node

        async with rm_process(plane=controlplane, pool=pool, directory=tmp_path, token_file=token_file) as rm:
            for index in range(4):
                reason = await refusal(rm, request(f"b-{pool.id}-{index}", pool=pool, cpu="2"))
                assert reason == (
                    "0/2 nodes are available: 2 Insufficient cpu. Pods this RM did not place use "
                    f"node {nodes[0]}: 3 cpu (1 pod); node {nodes[1]}: 3 cpu (1 pod)."
                )

            for name in ("other-1", "other-2"):
                await core.delete_namespaced_pod(name=name, namespace=namespace, grace_period_seconds=0)
            first = await eventually(
                lambda: rm.reserve(request(f"a-{pool.id}-0", pool=pool, cpu="2")),
                "the deleted pods' capacity came back",
            )
            rest = await reserve_all(rm, [request(f"a-{pool.id}-{i}", pool=pool, cpu="2") for i in (1, 2, 3)])
            per_node = sorted(r.node for r in [first, *rest])
            assert per_node == [nodes[0], nodes[0], nodes[1], nodes[1]]
    finally:
        for node in nodes:
            await core.delete_node(name=node)


async def test_a_pod_with_its_own_reservation_counts_once_and_a_copied_claim_counts(
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
) -> None:
    """On a 4-CPU node: Bindery's pod P (2 cpu) bound with its committed reservation R, a tenant's
    pod Q (1 cpu) carrying a copy of P's annotation, and a finished pod T (1 cpu).  In use: R's 2
    (P counts once), Q's 1 (the copied claim names another UID), not T's: 1 cpu is free."""
    core = client.CoreV1Api(kube_api)
    pool = Pool()
    (node,) = await make_nodes(kube_api, pool, 1)
    try:
        pod_p = await core.create_namespaced_pod(
            namespace=namespace, body=pod_body("p", pool=pool, cpu="2", scheduler="bindery-acct")
        )
        async with rm_process(plane=controlplane, pool=pool, directory=tmp_path, token_file=token_file) as rm:
            claim = request(pod_p.metadata.uid, pool=pool, cpu="2")
            reservation = await rm.reserve(claim)
            assert reservation.node == node
            await rm.commit(reservation.id)

        # While the RM is down: P is bound with its reservation, Q copies the claim, T has finished.
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p", "annotations": {ANNOTATION: reservation.id}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await core.create_namespaced_binding(namespace=namespace, body=binding, _preload_content=False)
        copied = {ANNOTATION: reservation.id}
        await core.create_namespaced_pod(
            namespace=namespace, body=pod_body("q", pool=pool, cpu="1", node=node, annotations=copied)
        )
        await core.create_namespaced_pod(
            namespace=namespace, body=pod_body("t", pool=pool, cpu="1", node=node)
        )
        await core.patch_namespaced_pod_status(
            name="t", namespace=namespace, body={"status": {"phase": "Succeeded"}}
        )

        async with rm_process(plane=controlplane, pool=pool, directory=tmp_path, token_file=token_file) as rm:
            reason = await refusal(rm, request(f"two-{pool.id}", pool=pool, cpu="2"))
            assert reason == (
                f"0/1 nodes are available: 1 Insufficient cpu. Pods this RM did not place use node {node}: "
                "1 cpu (1 pod)."
            )
            one = await rm.reserve(request(f"one-{pool.id}", pool=pool, cpu="1"))  # P did not count twice
            assert one.node == node

            # Q finishes: its cpu comes back.
            await core.patch_namespaced_pod_status(
                name="q", namespace=namespace, body={"status": {"phase": "Failed"}}
            )
            freed = await eventually(
                lambda: rm.reserve(request(f"freed-{pool.id}", pool=pool, cpu="1")),
                "the finished pod's capacity came back",
            )
            assert freed.node == node
    finally:
        await core.delete_node(name=node)


async def test_not_ready_until_the_pods_are_known_too(
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
) -> None:
    """An RM that may read nodes but not pods stays 503 (its log says which permission is missing);
    granted pods, it becomes ready."""
    core = client.CoreV1Api(kube_api)
    rbac = client.RbacAuthorizationV1Api(kube_api)
    pool = Pool()
    user = f"acct-rm-{pool.id}"
    role = f"acct-rm-{pool.id}"
    nodes_only = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    await rbac.create_cluster_role(body={"metadata": {"name": role}, "rules": nodes_only})
    await rbac.create_cluster_role_binding(
        body={
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )
    (node,) = await make_nodes(kube_api, pool, 1)
    log_path = tmp_path / "rm.log"
    try:
        async with rm_process(
            plane=controlplane,
            pool=pool,
            directory=tmp_path,
            token_file=token_file,
            kubeconfig=controlplane.mint_kubeconfig(user=user),
            wait_ready=False,
        ) as rm:

            async def logged(text: str) -> None:
                assert text in log_path.read_text(), f"{text!r} not in the RM's log yet"

            # The node list arrived (the RM had every chance to turn ready on nodes alone) ...
            await eventually(lambda: logged("node mirror: 1 node(s) match"), "the RM listed the node")
            # ... yet it is not ready: it does not know what else runs on that node.
            with pytest.raises(RMUnavailable, match="inventory is not loaded"):
                await rm.check_ready()
            with pytest.raises(RMUnavailable, match="HTTP 503"):
                await rm.reserve(request(f"early-{pool.id}", pool=pool, cpu="1"))
            await eventually(
                lambda: logged("grant the RM's service account get, list and watch on pods"),
                "the RM said which permission it lacks",
            )

            reads = [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}]
            await rbac.patch_cluster_role(name=role, body={"rules": reads})
            await eventually(rm.check_ready, "the RM became ready once it could list pods")
            assert (await rm.reserve(request(f"late-{pool.id}", pool=pool, cpu="1"))).node == node
    finally:
        await core.delete_node(name=node)
        await rbac.delete_cluster_role_binding(name=role)
        await rbac.delete_cluster_role(name=role)


async def test_pod_mirror_follows_binds_deletions_and_a_relist_after_a_gap(
    kube_api: client.ApiClient, namespace: str
) -> None:
    """The pod mirror on its own (in this process, 1-second watches so that resuming a watch the
    server ended is exercised): a bound pod appears, a finished one disappears, and a pod deleted
    while the mirror was down is gone after its relist."""
    from bindery.reference_rm.accounting import ClusterPods
    from bindery.reference_rm.mirror import PodMirror

    core = client.CoreV1Api(kube_api)
    pool = Pool()
    node = pool.node(1)  # no Node object is needed: the pod mirror follows pods by spec.nodeName
    snapshots: list[ClusterPods] = []
    mirror = PodMirror(api=kube_api, on_change=snapshots.append, watch_timeout_seconds=1)

    async def on_node() -> int:
        assert snapshots, "no snapshot yet"
        entry = snapshots[-1].nodes.get(node)
        return 0 if entry is None else entry.count

    async def count_is(expected: int) -> None:
        assert await on_node() == expected, f"{await on_node()} pod(s) on {node}, want {expected}"

    task = asyncio.create_task(mirror.run())
    try:
        await eventually(lambda: count_is(0), "the first list")
        await asyncio.sleep(2.5)  # two 1-second watches end and resume: the events below must still arrive
        for name in ("a", "b", "c"):
            await core.create_namespaced_pod(
                namespace=namespace, body=pod_body(name, pool=pool, cpu="1", node=node)
            )
        await eventually(lambda: count_is(3), "three bound pods mirrored")
        await core.patch_namespaced_pod_status(
            name="a", namespace=namespace, body={"status": {"phase": "Succeeded"}}
        )
        await eventually(lambda: count_is(2), "the finished pod no longer counted")
        await core.delete_namespaced_pod(name="b", namespace=namespace, grace_period_seconds=0)
        await eventually(lambda: count_is(1), "the deleted pod gone")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    # Down: a deletion nobody watches.  The relist of the next run replaces the whole set.
    await core.delete_namespaced_pod(name="c", namespace=namespace, grace_period_seconds=0)
    before = len(snapshots)
    task = asyncio.create_task(mirror.run())
    try:

        async def relisted_without_c() -> None:
            assert len(snapshots) > before, "not relisted yet"
            await count_is(0)

        await eventually(relisted_without_c, "the relist dropped the pod deleted during the gap")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
