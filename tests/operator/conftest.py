"""Fixtures for operator tests: the CRD, the operator's own least-privilege identity, an RM on
loopback, and the operator itself running in-process (Kopf embedded) against the test plane.

Cluster-scoped things (Nodes, ResourceManagers, scheduler names) are shared by every test of the
session, so each test gets unique names from `uniq` and cleans up its ResourceManager.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import pathlib
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.controller.metrics import RESULTS
from bindery.controller.secrets import CREDENTIALS_LABEL
from bindery.controller.startup.entry import EmbeddedOperator
from bindery.controller.startup.install import apply_crd, grant_operator
from bindery.controller.startup.options import OperatorOptions
from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from bindery.rm.models import Reservation
from tests.conftest import OPERATOR_USER, api_client_for
from tests.operator.fakerm import FakeRM, serve_fake_rm
from tests.realrm import RMProcess, settled_invariants


@pytest.fixture(scope="session")
async def crd(kube_api: client.ApiClient) -> None:
    await apply_crd(api=kube_api)


@pytest.fixture(scope="session")
async def operator_kubeconfig(
    controlplane: ControlPlane, kube_api: client.ApiClient, crd: None
) -> pathlib.Path:
    """A kubeconfig for a user that has exactly the operator's ClusterRole
    (bindery.controller.startup.rbac)."""
    await grant_operator(api=kube_api, user=OPERATOR_USER)
    return controlplane.mint_kubeconfig(user=OPERATOR_USER)


@pytest.fixture(scope="session")
async def operator_api(operator_kubeconfig: pathlib.Path) -> AsyncIterator[client.ApiClient]:
    api = await api_client_for(str(operator_kubeconfig))
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
def uniq() -> Callable[[str], str]:
    token = uuid.uuid4().hex[:6]
    return lambda prefix: f"{prefix}-{token}"


@pytest.fixture
async def fake_rm() -> AsyncIterator[FakeRM]:
    async with serve_fake_rm(FakeRM(slots={})) as rm:
        yield rm


class Bindery(EmbeddedOperator):
    """The operator in its own thread and loop, under the least-privilege identity."""

    def __init__(self, *, kubeconfig: pathlib.Path) -> None:
        super().__init__(options=OperatorOptions(kubeconfig=kubeconfig, probe_interval=2.0))


@pytest.fixture
async def bindery(operator_kubeconfig: pathlib.Path) -> AsyncIterator[Bindery]:
    operator = Bindery(kubeconfig=operator_kubeconfig)
    await operator.start()
    try:
        yield operator
    finally:
        await operator.stop()


@dataclasses.dataclass(frozen=True)
class Stage:
    """What most tests start from: a Node with room at the fake RM and a scheduler name of their own.

    `served(...)` creates the ResourceManager that serves the name (extra spec fields as keywords)
    for the duration of an `async with`; `create` and `node_of` act on pods of that name.
    """

    api: client.ApiClient
    namespace: str
    rm: FakeRM
    node: str
    scheduler: str
    rm_name: str

    def served(
        self, *, endpoint: str | None = None, **spec: Any
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        return resource_manager(
            self.api,
            name=self.rm_name,
            scheduler_names=[self.scheduler],
            endpoint=endpoint or self.rm.url,
            **spec,
        )

    async def create(self, name: str, **fields: Any) -> dict[str, Any]:
        body = pod_body(name=name, scheduler_name=self.scheduler, **fields)
        return await create_pod(self.api, namespace=self.namespace, body=body)

    async def node_of(self, name: str) -> str | None:
        return await node_of(self.api, namespace=self.namespace, name=name)


@pytest.fixture
async def stage(
    kube_api: client.ApiClient, crd: None, namespace: str, fake_rm: FakeRM, uniq: Callable[[str], str]
) -> Stage:
    """A fresh Node with five slots at `fake_rm` (tests change `fake_rm.slots[stage.node]`)."""
    node = uniq("n")
    await create_node(kube_api, name=node)
    fake_rm.slots[node] = 5
    return Stage(
        api=kube_api,
        namespace=namespace,
        rm=fake_rm,
        node=node,
        scheduler=uniq("sched"),
        rm_name=uniq("rm"),
    )


@dataclasses.dataclass(frozen=True)
class RealStage:
    """`Stage` with the reference RM as its own process (tests/realrm.py) instead of the fake.

    Why: a check that nothing leaked only means something when the RM really stores reservations,
    and capacity is what the RM derives from the Node and the pods bound there (`--mirror-nodes`),
    not a counter the test sets. The node is in a pool of its own (a label), so the RM sees no other
    test's node. Faults come from a proxy in front of the RM (`served(endpoint=proxy.url)`), never
    from the RM itself.
    """

    api: client.ApiClient
    namespace: str
    rm: RMProcess
    node: str
    scheduler: str
    rm_name: str
    secret: str

    def served(
        self, *, endpoint: str | None = None, **spec: Any
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        return resource_manager(
            self.api,
            name=self.rm_name,
            scheduler_names=[self.scheduler],
            endpoint=endpoint or self.rm.url,
            auth={"tokenSecretRef": {"namespace": self.namespace, "name": self.secret}},
            **spec,
        )

    async def create(self, name: str, **fields: Any) -> dict[str, Any]:
        body = pod_body(name=name, scheduler_name=self.scheduler, **fields)
        return await create_pod(self.api, namespace=self.namespace, body=body)

    async def node_of(self, name: str) -> str | None:
        return await node_of(self.api, namespace=self.namespace, name=name)

    async def reservations_of(self, uid: str) -> list[Reservation]:
        """Every reservation the RM has for the pod, released and expired ones included."""
        return [r for r in await self.rm.reservations(active=False) if r.pod_uid == uid]

    async def states_are(self, uid: str, *states: str) -> bool:
        """The pod's reservations at the RM are in exactly these states (one per reservation)."""
        return [r.state.value for r in await self.reservations_of(uid)] == list(states)

    async def active(self) -> list[Reservation]:
        """The reserved and committed reservations of this stage's scheduler name."""
        return [r for r in await self.rm.reservations() if r.scheduler_name == self.scheduler]

    async def settled(self, *, within: float = 60.0) -> None:
        """tests/realrm.py's invariants hold for this namespace: no leak, nothing unreserved."""
        await settled_invariants(
            api=self.api,
            rm=self.rm,
            namespace=self.namespace,
            scheduler_names=[self.scheduler],
            within=within,
        )


@contextlib.asynccontextmanager
async def real_stage_of(
    *,
    controlplane: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    directory: pathlib.Path,
    capacity: Mapping[str, str] | None = None,
    rm_options: Sequence[str] = (),
) -> AsyncIterator[RealStage]:
    """A node of its own pool, the reference RM mirroring it, and the RM's token as a Secret.

    ``rm_options``: more `bindery rm serve` arguments (e.g. ``--no-cluster-id``, a v1.1 RM)."""
    token = uuid.uuid4().hex[:8]
    node = f"real-{token}"
    await create_node(
        api,
        name=node,
        capacity=dict(capacity or {"cpu": "4", "memory": "8Gi", "pods": "20"}),
        labels={"bindery.dev/test-pool": token},
    )
    try:
        async with RMProcess(
            kubeconfig=controlplane.kubeconfig,
            directory=directory,
            node_selector=f"bindery.dev/test-pool={token}",
            options=rm_options,
        ) as rm:
            secret = f"rm-token-{token}"
            await client.CoreV1Api(api).create_namespaced_secret(
                namespace=namespace,
                body={
                    "metadata": {"name": secret, "labels": {CREDENTIALS_LABEL: "true"}},
                    "stringData": {"token": rm.token},
                },
            )
            yield RealStage(
                api=api,
                namespace=namespace,
                rm=rm,
                node=node,
                scheduler=f"sched-{token}",
                rm_name=f"rm-{token}",
                secret=secret,
            )
    finally:
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(api).delete_node(name=node)


@pytest.fixture
async def real_stage(
    controlplane: ControlPlane, kube_api: client.ApiClient, crd: None, namespace: str, tmp_path: pathlib.Path
) -> AsyncIterator[RealStage]:
    """`real_stage_of` with a 4-CPU node (tests that need another capacity call it themselves)."""
    async with real_stage_of(
        controlplane=controlplane, api=kube_api, namespace=namespace, directory=tmp_path / "rm"
    ) as staged:
        yield staged


# -- helpers ------------------------------------------------------------------------------------


async def create_rm(
    api: client.ApiClient,
    *,
    name: str,
    scheduler_names: Sequence[str],
    endpoint: str,
    **spec: Any,
) -> dict[str, Any]:
    body = {
        "apiVersion": "bindery.dev/v1alpha1",
        "kind": "ResourceManager",
        "metadata": {"name": name},
        "spec": {
            "schedulerNames": list(scheduler_names),
            "endpoint": endpoint,
            "allowInsecureHTTP": endpoint.startswith("http://"),
            **spec,
        },
    }
    created: dict[str, Any] = await client.CustomObjectsApi(api).create_cluster_custom_object(
        group="bindery.dev", version="v1alpha1", plural="resourcemanagers", body=body
    )
    return created


async def delete_rm(api: client.ApiClient, *, name: str) -> None:
    with contextlib.suppress(client.ApiException):
        await client.CustomObjectsApi(api).delete_cluster_custom_object(
            group="bindery.dev", version="v1alpha1", plural="resourcemanagers", name=name
        )


@contextlib.asynccontextmanager
async def resource_manager(
    api: client.ApiClient, *, name: str, scheduler_names: Sequence[str], endpoint: str, **spec: Any
) -> AsyncIterator[dict[str, Any]]:
    created = await create_rm(api, name=name, scheduler_names=scheduler_names, endpoint=endpoint, **spec)
    try:
        yield created
    finally:
        await delete_rm(api, name=name)


def pod_body(
    *,
    name: str,
    scheduler_name: str,
    cpu: str = "100m",
    priority: int | None = None,
    labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "schedulerName": scheduler_name,
            "containers": [
                {"name": "c", "image": "registry.invalid/pause", "resources": {"requests": {"cpu": cpu}}}
            ],
            **spec,
        },
    }
    if priority is not None:
        body["spec"]["priority"] = priority
    return body


async def create_pod(api: client.ApiClient, *, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
    created = await client.CoreV1Api(api).create_namespaced_pod(namespace=namespace, body=body)
    result: dict[str, Any] = api.sanitize_for_serialization(created)
    return result


async def read_pod(api: client.ApiClient, *, namespace: str, name: str) -> dict[str, Any]:
    pod = await client.CoreV1Api(api).read_namespaced_pod(name=name, namespace=namespace)
    result: dict[str, Any] = api.sanitize_for_serialization(pod)
    return result


async def bind_pod(
    api: client.ApiClient,
    *,
    namespace: str,
    name: str,
    node: str,
    annotations: Mapping[str, str] | None = None,
) -> None:
    """Bind a pod the way another scheduler (or an earlier Bindery) would: POST a Binding."""
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await client.CoreV1Api(api).create_namespaced_pod_binding(
        name=name, namespace=namespace, body=body, _preload_content=False
    )


async def node_of(api: client.ApiClient, *, namespace: str, name: str) -> str | None:
    """The node the pod is bound to, or None while it is pending."""
    pod = await read_pod(api, namespace=namespace, name=name)
    node: str | None = pod["spec"].get("nodeName")
    return node


async def now(value: Any) -> Any:
    """An already-known value as an awaitable, for `eventually(lambda: now(...))`."""
    return value


async def states_are(rm: FakeRM, uid: str, *states: str) -> bool:
    """The pod's reservations at `rm` are in exactly these states (one per reservation)."""
    return [r["state"] for r in rm.for_pod(uid)] == list(states)


def closed_port_url() -> str:
    """An http URL on loopback where nothing listens (a resource manager that is down)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def eventually(
    check: Callable[[], Awaitable[Any]], *, within: float = 20.0, interval: float = 0.1, what: str = ""
) -> Any:
    """Poll `check` until it returns a truthy value; fail with `what` and the last value otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: Any = None
    while loop.time() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {within:g}s waiting for {what or check}; last value: {last!r}")


def attempts(operator: EmbeddedOperator, *, resource_manager: str) -> int:
    """Binding cycles the operator has finished for `resource_manager`, whatever their result.

    A cycle is counted after everything it does (releases included), so a count that moved is the
    positive signal that a cycle had its chance to do something a test then asserts it did not do.
    """
    registry = operator.runtime.metrics.registry
    found = (
        registry.get_sample_value(
            "bindery_schedule_attempts_total", {"resource_manager": resource_manager, "result": result}
        )
        for result in RESULTS.values()
    )
    return int(sum(value or 0.0 for value in found))


async def events_of(api: client.ApiClient, *, namespace: str, pod_name: str) -> list[dict[str, Any]]:
    answer = await client.EventsV1Api(api).list_namespaced_event(namespace=namespace)
    events = [api.sanitize_for_serialization(e) for e in answer.items]
    return [e for e in events if e.get("regarding", {}).get("name") == pod_name]


def condition(pod: Mapping[str, Any], type_: str = "PodScheduled") -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == type_:
            return dict(cond)
    return None


def reservation_entry(
    *, rid: str, node: str, scheduler: str, namespace: str, name: str, uid: str, state: str = "reserved"
) -> dict[str, Any]:
    """A reservation as the fake RM stores it: leftovers planted before the operator starts."""
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
    return {
        "id": rid,
        "node": node,
        "state": state,
        "podUid": uid,
        "schedulerName": scheduler,
        "namespace": namespace,
        "name": name,
        "expiresAt": expires.isoformat().replace("+00:00", "Z"),
        "idempotencyKey": uid,
    }
