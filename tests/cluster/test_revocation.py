"""Issue 23 item 2 on the cluster plane: the RM takes a running pod's reservation back.

kwok nodes, kube-controller-manager, the reference RM and the operator as their own processes; the
RM's operator revokes one pod's committed reservation with ``bindery rm revoke`` (as Slurm's
administrator would ``scancel`` its job). With ``spec.onRevoked: Evict`` the pod is evicted through
the Eviction API: kwok then deletes it, the user finds a Warning event ``Revoked`` with the RM's
reason on it, the ReplicaSet makes a new pod that Bindery binds with a new reservation, and
afterwards every running pod has exactly one active reservation and none is held without its pod
(``bindery audit`` agrees). With ``Warn`` the pod keeps running and gets the event.
"""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from tests.realrm import audit_findings, invariant_violations
from tests.workloads import Cluster, bindery_on, deployment, eventually, kwok_pool

pytestmark = pytest.mark.controlplane
REASON = "cancelled by the site administrator: node maintenance"


async def _revoked_events(api: client.ApiClient, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The pod's Revoked events (read raw: core events of other controllers lack eventTime)."""
    answer = await client.EventsV1Api(api).list_namespaced_event(namespace, _preload_content=False)
    items: list[dict[str, Any]] = (await answer.json())["items"]
    return [
        e for e in items if (e.get("regarding") or {}).get("name") == pod and e.get("reason") == "Revoked"
    ]


@pytest.mark.parametrize("policy", ["Evict", "Warn"])
async def test_a_revoked_reservation_evicts_its_pod_with_the_reason_or_warns(
    *,
    cluster: ControlPlane,
    cluster_api: client.ApiClient,
    cluster_operator_kubeconfig: pathlib.Path,
    cluster_namespace: str,
    tmp_path: pathlib.Path,
    policy: str,
) -> None:
    namespace = cluster_namespace
    pool = uuid.uuid4().hex[:6]
    nodes = await kwok_pool(
        cluster_api, pool=pool, count=1, capacity={"cpu": "4", "memory": "8Gi", "pods": "20"}
    )
    view = Cluster(api=cluster_api, namespace=namespace)
    async with bindery_on(
        api=cluster_api,
        cluster=cluster,
        operator_kubeconfig=cluster_operator_kubeconfig,
        namespace=namespace,
        pool=pool,
        directory=tmp_path,
        reconcileIntervalSeconds=5,
        onRevoked=policy,
    ) as stage:
        await view.apps.create_namespaced_deployment(
            namespace, deployment("web", replicas=2, cpu="1", scheduler=stage.scheduler, pool=pool)
        )
        await eventually(lambda: view.running("app=web", 2), within=90, what="the Deployment Running")
        victim = (await view.pods("app=web"))[0]
        name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
        held = [r for r in await stage.rm.reservations() if r.pod_uid == uid]
        assert [r.state.value for r in held] == ["committed"]
        await stage.rm.revoke(held[0].id, reason=REASON)

        events = await eventually(
            lambda: _revoked_events(cluster_api, namespace, name),
            within=60,
            what=f"a Revoked event on {name}",
        )
        assert len(events) == 1, events
        assert events[0]["type"] == "Warning"
        assert REASON in events[0]["note"]
        assert stage.rm_name in events[0]["note"]

        async def released() -> bool:
            return all(
                not r.state.active for r in await stage.rm.reservations(active=False) if r.pod_uid == uid
            )

        if policy == "Evict":

            async def gone() -> bool:
                try:
                    await view.core.read_namespaced_pod(name=name, namespace=namespace)
                except client.ApiException as error:
                    return bool(error.status == 404)
                return False

            # The Eviction API sets deletionTimestamp; kwok then deletes the pod.
            await eventually(gone, within=60, what=f"{name} evicted and deleted")
            await eventually(lambda: view.running("app=web", 2), within=90, what="a replacement Running")
            assert uid not in {p["metadata"]["uid"] for p in await view.pods("app=web")}

            async def clean() -> list[str]:
                lines = await invariant_violations(
                    api=cluster_api, rm=stage.rm, namespace=namespace, scheduler_names=[stage.scheduler]
                )
                return lines + await audit_findings(
                    kubeconfig=cluster.kubeconfig, namespace=namespace, rm_name=stage.rm_name, nodes=nodes
                )

            async def settled() -> bool:
                return not await clean()

            await eventually(settled, within=60, what="one active reservation per running pod, none leaked")
            assert await released()
        else:
            await eventually(released, within=30, what="the revocation acknowledged")
            pod = await view.core.read_namespaced_pod(name=name, namespace=namespace)
            assert pod.metadata.deletion_timestamp is None
            assert pod.status.phase == "Running"
            assert "keeps running" in events[0]["note"]
