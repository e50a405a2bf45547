"""Pod groups settle and fence their reservations exactly as single pods do ("one path for every pod").

Both tests pin a drift between the pod-group path (``controller/podgroups/``) and the pod path:

* a member whose Binding got no answer must be handed to the profile's unconfirmed Bindings, so
  it is committed the moment the bound-pod watch (or a read) sees it bound, not left reserved
  until a reconcile pass or its lease: the operator talks to the apiserver through a proxy that
  applies each Binding and cuts its answer (tests/operator/apiproxy.py), and the reconcile
  interval is set far beyond the test's wait;
* a replica past its renew deadline (``holds()`` False; its pause has not run yet) must neither
  renew nor release a reservation group: the next leader may be binding it. The profile runner
  is built as the supervisor builds it, on the real apiserver and the reference RM, with a fence
  that says the lease is lost.
"""

from __future__ import annotations

import logging
import pathlib
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.adapters import KubeBinder, KubeConditionWriter, KubeEventSink, KubeVolumes, UnboundPods
from bindery.config import parse_resource_manager
from bindery.controller.leadership.fence import FencedBinder
from bindery.controller.profile.runner import ProfileRunner
from bindery.controller.secrets import RMCredentials
from bindery.devcluster.plane import ControlPlane
from bindery.rm.models import Reservation
from bindery.scheduling.framework import Ports
from bindery.scheduling.podgroups import PodGroupInfo, group_request
from bindery.scheduling.podspec import PodInfo
from tests.conftest import OPERATOR_USER
from tests.gangs.scenarios import member, pod_group
from tests.operator.apiproxy import serve_api_proxy
from tests.operator.conftest import Bindery, RealStage, eventually

pytestmark = pytest.mark.controlplane

UNANSWERED = 3  # the default binder's attempts per member: the first and two retries


def _member(name: str, *, group: str, stage: RealStage) -> dict[str, Any]:
    body = member(name, group=group, scheduler=stage.scheduler, pool="")
    del body["spec"]["nodeSelector"]  # the reference RM of the stage mirrors its one node only
    return body


async def _create_group(stage: RealStage, name: str, members: int) -> list[dict[str, Any]]:
    custom = client.CustomObjectsApi(stage.api)
    await custom.create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", stage.namespace, "podgroups", pod_group(name, min_count=members)
    )
    core = client.CoreV1Api(stage.api)
    created = []
    for i in range(members):
        pod = await core.create_namespaced_pod(
            stage.namespace, _member(f"{name}-{i}", group=name, stage=stage), _preload_content=False
        )
        created.append(await pod.json())
    return created


async def _held(stage: RealStage) -> list[Reservation]:
    return [r for r in await stage.rm.reservations() if r.namespace == stage.namespace]


async def test_a_member_whose_binding_got_no_answer_is_committed_once_bound(
    *,
    controlplane: ControlPlane,
    operator_kubeconfig: pathlib.Path,
    real_stage: RealStage,
    tmp_path: pathlib.Path,
) -> None:
    """Both members' Bindings land and every answer is cut; both must be committed within seconds
    (the reconcile interval is 300 s, the lease 600 s): the unconfirmed Bindings settle them."""
    async with serve_api_proxy(plane=controlplane, user=OPERATOR_USER) as proxy:
        kubeconfig = controlplane.mint_kubeconfig(
            user=OPERATOR_USER, path=tmp_path / "proxied.kubeconfig", server=proxy.url
        )
        operator = Bindery(kubeconfig=kubeconfig)
        await operator.start()
        try:
            proxy.binding_faults = ["swallow"] * (2 * UNANSWERED)
            async with real_stage.served(reservationTTLSeconds=600, reconcileIntervalSeconds=300):
                await _create_group(real_stage, "lost", 2)

                async def committed() -> list[str] | None:
                    states = sorted(r.state.value for r in await _held(real_stage))
                    return states if states == ["committed", "committed"] else None

                await eventually(committed, within=30, what="both members committed without a reconcile pass")
                bound = [status for _, status in proxy.bindings if status is not None and status < 300]
                assert len(bound) == 2, proxy.bindings  # each member was bound by its first POST
                await real_stage.settled()
        finally:
            await operator.stop()


class _NoNodes:
    """The node lookup of a replica whose node cache is empty: every member fails PreBind."""

    def get(self, name: str) -> None:
        return None


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("leftover", [True, False], ids=["renew", "release"])
async def test_a_replica_that_lost_its_lease_renews_and_releases_no_group(
    *, real_stage: RealStage, leftover: bool
) -> None:
    """``renew``: a reservation group left by an earlier process (the recovery renews it);
    ``release``: a fresh group whose members fail PreBind (the group is released). Either way the
    RM must end as it was, and the fence must say why."""
    stage = real_stage
    async with stage.served():
        body = await client.CustomObjectsApi(stage.api).get_cluster_custom_object(
            "bindery.dev", "v1alpha1", "resourcemanagers", stage.rm_name
        )
    config = parse_resource_manager(body=body)
    pods = [PodInfo.from_body(p) for p in await _create_group(stage, "fenced", 2)]
    group = PodGroupInfo.from_body(
        await client.CustomObjectsApi(stage.api).get_namespaced_custom_object(
            "scheduling.k8s.io", "v1alpha2", stage.namespace, "podgroups", "fenced"
        )
    )
    if leftover:
        async with stage.rm.client() as rm:
            await rm.reserve_group(
                group_request(
                    group=group,
                    members=pods,
                    scheduler_name=stage.scheduler,
                    ttl_seconds=config.reservation_ttl_seconds,
                    attempt=0,
                )
            )
    before = {r.id: r.expires_at for r in await _held(stage)}
    logger = logging.getLogger(f"bindery.test.fence.{uuid.uuid4().hex[:6]}")
    records = _Records()
    logger.addHandler(records)
    unbound = UnboundPods()
    for pod in pods:
        unbound.put(pod)
    ports = Ports(
        nodes=_NoNodes(),
        pods=unbound,
        binder=FencedBinder(
            binder=KubeBinder(api=stage.api), holds=lambda: False, holds_for=lambda: 0.0, logger=logger
        ),
        events=KubeEventSink(api=stage.api),
        conditions=KubeConditionWriter(api=stage.api),
        volumes=KubeVolumes(api=stage.api),
    )
    runner = ProfileRunner(
        config=config,
        client=stage.rm.client(),
        credentials=RMCredentials(),
        ports=ports,
        api=stage.api,
        logger=logger,
        on_released=lambda: None,
        holds=lambda: False,
    )
    try:
        runner.start()
        for pod in pods:
            runner.offer(pod)

        async def acted() -> str | None:
            every = [r for r in await stage.rm.reservations(active=False) if r.namespace == stage.namespace]
            released = [r.id for r in every if r.state.value == "released"]
            renewed = [r.id for r in every if r.id in before and r.expires_at != before[r.id]]
            if released or renewed:
                return f"the RM changed: released {released}, renewed {renewed}"
            fenced = [m for m in records.messages if "leader lease" in m]
            return f"fenced: {fenced[0]}" if fenced else None

        what = await eventually(acted, within=30, what="the group's renewal or release, or the fence")
        assert what.startswith("fenced"), what
    finally:
        await runner.stop()
