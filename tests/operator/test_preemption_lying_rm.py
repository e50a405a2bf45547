"""A lying resource manager's preemption plans evict nothing (issue 35, finding 3).

The RM proposes, Bindery carries out: a buggy or hostile RM must not be able to evict pods it has
no business with. Here an RM answers every reserve of the preemptors with a plan that lies in one
way each: a victim out of its scope (kube-system, bound by another scheduler), a victim on
another node than the plan's, a node the preemptor's own nodeSelector excludes, victims that free
nothing, a plan to a pod whose policy is ``Never``, a plan to a reserve that asked for none (the
pod in its preemption back-off), and a plan from an RM that never offered the ``preemption``
feature. Every victim is a plain low-priority pod with ``terminationGracePeriodSeconds: 0``, so an
eviction on this kubelet-less plane deletes it at once. The fake RM (tests/operator/fakerm.py) is
used because the reference RM vets its own plans and cannot be made to lie.

Nothing may be evicted or marked ``DisruptionTarget``; each plan is cancelled at the RM, and the
independent checker (tests/placement/checker.py, which shares no code with Bindery) sees no
eviction kube-scheduler would not make.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from bindery.devcluster.nodes import create_node
from tests.operator.conftest import Bindery, create_pod, eventually, pod_body, resource_manager
from tests.operator.fakerm import FakeRM, serve_fake_rm
from tests.placement.checker import eviction_violations

POOL = "bindery.dev/lying-rm-pool"
SCOPE = "bindery.dev/lying-rm"


def _plan(
    plan_id: str, *, node: str, preemptor: dict[str, Any], victims: list[dict[str, Any]], frees: Any
) -> dict[str, Any]:
    return {
        "planId": plan_id,
        "node": node,
        "podUid": preemptor["metadata"]["uid"],
        "leaseSeconds": 60,
        "state": "proposed",
        "victims": [
            {
                "pod": {
                    "namespace": victim["metadata"]["namespace"],
                    "name": victim["metadata"]["name"],
                    "uid": victim["metadata"]["uid"],
                },
                "frees": frees,
            }
            for victim in victims
        ],
    }


@contextlib.asynccontextmanager
async def priority_classes(api: client.ApiClient, token: str) -> AsyncIterator[dict[str, str]]:
    scheduling = client.SchedulingV1Api(api)
    classes = {
        "low": (10, "PreemptLowerPriority"),
        "high": (1000, "PreemptLowerPriority"),
        "never": (1000, "Never"),
    }
    names = {key: f"lying-{token}-{key}" for key in classes}
    for key, (value, policy) in classes.items():
        await scheduling.create_priority_class(
            body={"metadata": {"name": names[key]}, "value": value, "preemptionPolicy": policy}
        )
    try:
        yield names
    finally:
        for name in names.values():
            with contextlib.suppress(client.ApiException):
                await scheduling.delete_priority_class(name=name)


async def _admitted(api: client.ApiClient, *, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create a pod; the priority admission plugin sees new PriorityClasses through a cache."""

    async def attempt() -> dict[str, Any] | None:
        try:
            return await create_pod(api, namespace=namespace, body=body)
        except client.ApiException as exc:
            if exc.status == 403 and "PriorityClass" in str(exc.body):
                return None
            raise

    created: dict[str, Any] = await eventually(attempt, what=f"pod {body['metadata']['name']} admitted")
    return created


async def test_a_lying_rms_plans_evict_nobody(
    *,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    bindery: Bindery,
    uniq: Callable[[str], str],
) -> None:
    nodes = {uniq("lie-a"): {POOL: uniq("lie-a")}, uniq("lie-b"): {POOL: uniq("lie-b")}}
    for node, labels in nodes.items():
        await create_node(kube_api, name=node, labels=labels)
    try:
        await lying_rm_evicts_nobody(api=kube_api, namespace=namespace, nodes=nodes, uniq=uniq)
    finally:
        for node in nodes:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(kube_api).delete_node(name=node)


async def lying_rm_evicts_nobody(
    *,
    api: client.ApiClient,
    namespace: str,
    nodes: Mapping[str, Mapping[str, str]],
    uniq: Callable[[str], str],
) -> None:
    """The scenario, on two Nodes (``nodes``: name -> the labels a nodeSelector picks it by) and an
    operator already running; tests/cluster/test_hostile_tenants.py runs it on kwok nodes."""
    kube_api = api
    (node_a, labels_a), (node_b, _) = nodes.items()
    token = uniq("t")
    core = client.CoreV1Api(kube_api)
    await core.patch_namespace(name=namespace, body={"metadata": {"labels": {SCOPE: token}}})
    liar = FakeRM(slots={}, features=["cluster-id", "preemption"])
    old = FakeRM(slots={})  # no /v1/info: an RM of contract v1.1, which never negotiated preemption
    scheduler, old_scheduler = uniq("lying"), uniq("lying-v11")
    victims: list[dict[str, Any]] = []
    try:
        async with (
            priority_classes(kube_api, token) as classes,
            serve_fake_rm(liar),
            serve_fake_rm(old),
        ):

            async def victim(
                name: str, node: str, *, ns: str = namespace, by: str = scheduler
            ) -> dict[str, Any]:
                body = pod_body(
                    name=uniq(name),
                    scheduler_name=by,
                    nodeName=node,
                    priorityClassName=classes["low"],
                    terminationGracePeriodSeconds=0,
                )
                created = await _admitted(kube_api, namespace=ns, body=body)
                victims.append(created)
                return created

            async def preemptor(name: str, *, by: str = scheduler, cls: str = "high") -> dict[str, Any]:
                body = pod_body(
                    name=name, scheduler_name=by, priorityClassName=classes[cls], nodeSelector=dict(labels_a)
                )
                return await _admitted(kube_api, namespace=namespace, body=body)

            frees = {"cpu": "100m", "pods": "1"}
            system = await victim("system", node_a, ns="kube-system", by="default-scheduler")
            elsewhere = await victim("elsewhere", node_a, by="default-scheduler")
            moved = await victim("moved", node_b)
            excluded = await victim("excluded", node_b)
            idle = await victim("idle", node_a)
            never_victim = await victim("never", node_a)
            later = await victim("later", node_a)
            first = await victim("first", node_a)
            old_victim = await victim("old", node_a, by=old_scheduler)

            shapes = {
                "out-of-scope": ("p-scope", node_a, [system, elsewhere], frees, "high"),
                "wrong-node": ("p-moved", node_a, [moved], frees, "high"),
                "node-rules": ("p-excluded", node_b, [excluded], frees, "high"),
                "frees-nothing": ("p-idle", node_a, [idle], {}, "high"),
                "never": ("p-never", node_a, [never_victim], frees, "never"),
            }
            plan_ids: list[str] = []
            #: victim uid -> the preemptor and node of the plan that names it
            planned: dict[str, tuple[dict[str, Any], str]] = {}
            for shape, (name, node, named, freed, cls) in shapes.items():
                pod = await preemptor(name, cls=cls)
                planned.update({v["metadata"]["uid"]: (pod, node) for v in named})
                liar.plans[name] = _plan(f"pln-{shape}", node=node, preemptor=pod, victims=named, frees=freed)
                plan_ids.append(f"pln-{shape}")
            # Refused first (frees nothing), then, in its preemption back-off, offered a plan that
            # would pass every other check: its reserve says Never, so that plan was not asked for.
            backing = await preemptor("p-unasked")
            liar.plans["p-unasked"] = _plan(
                "pln-first", node=node_a, preemptor=backing, victims=[first], frees={}
            )
            liar.unasked_plans["p-unasked"] = _plan(
                "pln-unasked", node=node_a, preemptor=backing, victims=[later], frees=frees
            )
            plan_ids += ["pln-first", "pln-unasked"]
            planned.update({v["metadata"]["uid"]: (backing, node_a) for v in (first, later)})
            v11 = await preemptor("p-v11", by=old_scheduler)
            old.plans["p-v11"] = _plan(
                "pln-v11", node=node_a, preemptor=v11, victims=[old_victim], frees=frees
            )
            plan_ids.append("pln-v11")
            planned[old_victim["metadata"]["uid"]] = (v11, node_a)

            async with (
                resource_manager(
                    kube_api,
                    name=uniq("rm-lying"),
                    scheduler_names=[scheduler],
                    endpoint=liar.url,
                    namespaceSelector={"matchLabels": {SCOPE: token}},
                    backoff={"initialSeconds": 0.2, "maxSeconds": 1},
                ),
                resource_manager(
                    kube_api,
                    name=uniq("rm-v11"),
                    scheduler_names=[old_scheduler],
                    endpoint=old.url,
                    backoff={"initialSeconds": 0.2, "maxSeconds": 1},
                ),
            ):

                def settled(*ids: str) -> Callable[[], Any]:
                    """Every plan of ``ids`` cancelled, or some plan confirmed (a lie went through)."""

                    async def check() -> list[str]:
                        done = set(liar.confirmed + liar.cancelled + old.confirmed + old.cancelled)
                        return sorted(done) if liar.confirmed or old.confirmed or not set(ids) - done else []

                    return check

                await eventually(settled("pln-first"), within=60, what="the first plan of p-unasked settled")
                # A Node event wakes the parked pod well inside its 10 s preemption back-off.
                await client.CoreV1Api(kube_api).patch_node(
                    name=node_a, body={"metadata": {"labels": {"touched": "yes"}}}
                )
                await eventually(settled(*plan_ids), within=90, what=f"every plan of {plan_ids} settled")
                assert liar.confirmed + old.confirmed == [], "a lying plan was confirmed"
                assert set(plan_ids) <= set(liar.cancelled + old.cancelled)
                assert liar.reserve_bodies["p-unasked"].get("preemptionPolicy") == "Never"
                evicted: list[dict[str, Any]] = []
                for body in victims:
                    meta = body["metadata"]
                    try:
                        now = await core.read_namespaced_pod(name=meta["name"], namespace=meta["namespace"])
                    except client.ApiException as exc:
                        if exc.status != 404:
                            raise
                        evicted.append(body)
                        continue
                    conditions = {c.type: c.status for c in now.status.conditions or ()}
                    if now.metadata.deletion_timestamp or conditions.get("DisruptionTarget") == "True":
                        evicted.append(body)
                # The independent check first, so that a regression names the rule kube-scheduler keeps.
                nodes = {
                    name: kube_api.sanitize_for_serialization(await core.read_node(name=name))
                    for name in (node_a, node_b)
                }
                for body in evicted:
                    preemptor_of, node = planned[body["metadata"]["uid"]]
                    violations = eviction_violations(preemptor=preemptor_of, node=nodes[node], victims=[body])
                    assert violations == [], [str(v) for v in violations]
                assert [e["metadata"]["name"] for e in evicted] == [], "victims of a lying plan were evicted"
    finally:
        for body in victims:
            with contextlib.suppress(client.ApiException):
                await core.delete_namespaced_pod(
                    name=body["metadata"]["name"],
                    namespace=body["metadata"]["namespace"],
                    grace_period_seconds=0,
                )
