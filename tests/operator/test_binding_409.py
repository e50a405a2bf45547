"""A 409 "already assigned" naming our node is ours only if the pod carries our reservation; and
PodScheduled carries observedGeneration, as kube-scheduler 1.36 writes it.

The 409 is the real apiserver's own: another scheduler binds the pod to the very node the RM chose
while the operator's first Binding hangs in the apiserver proxy (tests/operator/apiproxy.py), so
the operator's retry meets `pod p is already assigned to node "n"`; or the operator's own first
Binding lands and loses its answer, and the retry meets the same words about our own write. The
reference RM runs as its own process (see tests/operator/test_lease_renewal.py for the world these
tests share).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from bindery.adapters import KubeBinder
from bindery.adapters.binder import assigned_node
from bindery.adapters.conditions import KubeConditionWriter
from bindery.devcluster.nodes import create_node
from bindery.rm.models import ReservationState
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import BindConflict
from tests.operator.conftest import (
    bind_pod,
    condition,
    create_pod,
    events_of,
    eventually,
    pod_body,
    read_pod,
)
from tests.operator.test_lease_renewal import World, world  # noqa: F401 (the fixture)

pytestmark = pytest.mark.controlplane


@pytest.mark.parametrize("their_annotation", [None, "rsv-of-a-stale-cycle"], ids=["foreign", "stale"])
async def test_a_pod_bound_to_our_node_by_someone_else_is_not_taken_as_ours(
    world: World,  # noqa: F811
    their_annotation: str | None,
) -> None:
    world.api_proxy.binding_faults = ["hang"]  # our first attempt hangs; the retry meets the 409
    # The short lease (TTL, 6 s) bounds the hung attempt to about 5 s instead of the binder's 30 s;
    # the retry renews the lease first (tests/operator/test_lease_renewal.py), so the reservation is
    # still active when the 409 comes. The periodic reconcile pass would release it too (the pod does
    # not carry it), rightly: it comes after the hung attempt here, so that the cycle's own handling
    # of the 409 is what is tested.
    async with world.served(reconcileIntervalSeconds=45, backoff={"initialSeconds": 0.5, "maxSeconds": 1}):
        uid = await world.create("p")
        await eventually(
            lambda: _has(world.api_proxy.bindings, ("hang", None)), within=30, what="our Binding hanging"
        )
        (ours,) = await world.reservations_of(uid)
        annotations = {RESERVATION_ANNOTATION: their_annotation} if their_annotation else {}
        await bind_pod(
            world.api, namespace=world.namespace, name="p", node=world.node, annotations=annotations
        )
        await eventually(
            lambda: _states(world, uid, ReservationState.RELEASED),
            within=60,
            what="our reservation released (someone else's Binding)",
        )
        assert ("", 409) in world.api_proxy.bindings  # the apiserver's own "already assigned"
    pod = await read_pod(world.api, namespace=world.namespace, name="p")
    assert pod["spec"]["nodeName"] == world.node
    assert (pod["metadata"].get("annotations") or {}).get(RESERVATION_ANNOTATION) == their_annotation
    (reservation,) = await world.reservations_of(uid)
    assert reservation.id == ours.id
    reasons = [e["reason"] for e in await events_of(world.api, namespace=world.namespace, pod_name="p")]
    assert "Scheduled" not in reasons  # the cycle ended (it released) without claiming the bind
    assert "FailedScheduling" not in reasons  # nor reporting a failure: the pod is bound


async def test_a_retry_that_meets_our_own_landed_binding_succeeds_on_the_apiservers_own_409(
    world: World,  # noqa: F811
) -> None:
    """The first Binding lands but its answer is lost (the proxy applies it, then cuts the
    connection); the binder's retry gets the apiserver's own `409 ... is already assigned to node`,
    `assigned_node` finds our node in it, the pod there carries our reservation and UID: success, so
    the cycle itself commits and reports `Scheduled`, and nothing reports a failure.

    Only the first attempt is swallowed, so it is the cycle's 409 path that settles the pod, not the
    unconfirmed-Binding tracker of tests/operator/test_unconfirmed_bind.py. Were the apiserver's
    words not what `assigned_node` parses, the cycle would take the 409 as someone else's bind and
    release the reservation under the bound pod: no `Scheduled` event, and the invariants would
    report a bound pod without a reservation.
    """
    world.api_proxy.binding_faults = ["swallow"]
    async with world.served(ttl=60, backoff={"initialSeconds": 0.5, "maxSeconds": 1}):
        uid = await world.create("p")
        pod = await eventually(lambda: world.bound("p"), within=60, what="the pod bound")
        rid = (pod["metadata"].get("annotations") or {}).get(RESERVATION_ANNOTATION)
        await eventually(
            lambda: _states(world, uid, ReservationState.COMMITTED), within=30, what="the commit"
        )
        await eventually(
            lambda: _reasons(world, "p", "Scheduled"), within=30, what="the cycle's Scheduled event"
        )
        await world.settled()
    # Our Binding, applied unanswered; then our retry, refused by the apiserver naming our node.
    assert world.api_proxy.bindings == [("swallow", 201), ("", 409)]
    (landed, _), (refused, answer) = world.api_proxy.binding_answers
    assert (landed, refused) == (201, 409)
    status = json.loads(answer)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Conflict", 409)
    assert assigned_node(status["message"]) == world.node, status["message"]
    (reservation,) = await world.reservations_of(uid)
    assert reservation.id == rid
    assert pod["metadata"]["uid"] == uid
    reasons = [e["reason"] for e in await events_of(world.api, namespace=world.namespace, pod_name="p")]
    assert reasons == ["Scheduled"]  # the retry's success reported once; no unanswered-Binding report


async def test_the_binder_names_who_holds_the_pod_after_the_apiservers_409(
    *, kube_api: client.ApiClient, namespace: str, uniq: Callable[[str], str]
) -> None:
    """On the 409 path only, the binder reads the pod: its UID and reservation annotation."""
    node = uniq("n409")
    await create_node(kube_api, name=node)
    try:
        for name, holder in (("mine", "rsv-ours"), ("theirs", "rsv-theirs")):
            pod = PodInfo.from_body(
                await create_pod(kube_api, namespace=namespace, body=pod_body(name=name, scheduler_name="x"))
            )
            await bind_pod(
                kube_api,
                namespace=namespace,
                name=name,
                node=node,
                annotations={RESERVATION_ANNOTATION: holder},
            )
            with pytest.raises(BindConflict) as raised:
                await KubeBinder(api=kube_api).bind(
                    pod=pod, node=node, annotations={RESERVATION_ANNOTATION: "rsv-ours"}, timeout=10
                )
            conflict = raised.value
            assert f'is already assigned to node "{node}"' in conflict.message
            assert conflict.current_node == node
            assert conflict.pod_uid == pod.uid
            assert conflict.reservation_id == holder
    finally:
        await client.CoreV1Api(kube_api).delete_node(name=node)


async def test_pod_scheduled_carries_the_observed_generation_false_and_true(
    *, kube_api: client.ApiClient, namespace: str, operator_kubeconfig: pathlib.Path
) -> None:
    """As kube-scheduler 1.36 does (metadata.generation of the pod the decision was made on); the
    generation is 2 here, after a spec change, so a constant 1 would not pass."""
    await create_pod(kube_api, namespace=namespace, body=pod_body(name="g", scheduler_name="x"))
    core = client.CoreV1Api(kube_api)
    await core.patch_namespaced_pod(
        name="g",
        namespace=namespace,
        body={"spec": {"containers": [{"name": "c", "image": "registry.invalid/pause:2"}]}},
    )
    body = await read_pod(kube_api, namespace=namespace, name="g")
    assert body["metadata"]["generation"] == 2
    pod = PodInfo.from_body(body)
    writer = KubeConditionWriter(api=kube_api)
    await writer.pod_scheduled_false(pod=pod, reason="Unschedulable", message="no room")
    written = await _condition(kube_api, namespace)
    assert (written["status"], written["reason"], written.get("observedGeneration")) == (
        "False",
        "Unschedulable",
        2,
    )
    await writer.pod_scheduled_true(pod=pod)
    written = await _condition(kube_api, namespace)
    assert (written["status"], written.get("observedGeneration")) == ("True", 2)


async def test_the_operator_writes_the_observed_generation_on_an_unschedulable_pod(world: World) -> None:  # noqa: F811
    """End to end: the reference RM has no room for the pod; the operator's PodScheduled=False
    names the generation of the pod it tried."""
    async with world.served(backoff={"initialSeconds": 1, "maxSeconds": 1}):
        await create_pod(
            world.api,
            namespace=world.namespace,
            body=pod_body(name="big", scheduler_name=world.scheduler, cpu="64"),
        )
        written = await eventually(
            lambda: _unschedulable(world.api, world.namespace), within=60, what="PodScheduled=False"
        )
    body = await read_pod(world.api, namespace=world.namespace, name="big")
    assert written.get("observedGeneration") == body["metadata"]["generation"] == 1


async def _condition(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    written = condition(await read_pod(api, namespace=namespace, name="g"))
    assert written is not None
    return written


async def _unschedulable(api: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    written = condition(await read_pod(api, namespace=namespace, name="big"))
    return written if written is not None and written["status"] == "False" else None


async def _has(items: list[tuple[str, int | None]], item: tuple[str, int | None]) -> bool:
    return item in items


async def _reasons(served: World, name: str, reason: str) -> bool:
    events = await events_of(served.api, namespace=served.namespace, pod_name=name)
    return any(e["reason"] == reason for e in events)


async def _states(served: World, uid: str, *states: ReservationState) -> bool:
    return [r.state for r in await served.reservations_of(uid)] == list(states)
