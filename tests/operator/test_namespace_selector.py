"""ResourceManager spec.namespaceSelector: only pods of the namespaces it selects use its pool.

Issue 20, scenario 4: without it, a pod in any namespace that names a served scheduler consumes
that ResourceManager's capacity (routing is by scheduler name only). A pod outside the selector
gets FailedScheduling and PodScheduled=False (Unschedulable) naming the ResourceManager and the
rule, and nothing is reserved; relabelling its namespace lets it in without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from tests.operator.conftest import Bindery, Stage, condition, events_of, eventually, read_pod


async def _label_namespace(api: client.ApiClient, *, name: str, labels: Mapping[str, str | None]) -> None:
    await client.CoreV1Api(api).patch_namespace(
        name=name,
        body={"metadata": {"labels": labels}},
        _content_type="application/merge-patch+json",
    )


async def test_a_pod_outside_the_namespace_selector_is_refused_and_reserves_nothing(
    *, kube_api: client.ApiClient, bindery: Bindery, stage: Stage
) -> None:
    tenant = {"bindery.dev/tenant": stage.rm_name}
    selector = {"matchLabels": tenant}
    async with stage.served(namespaceSelector=selector, backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
        created = await stage.create("outsider")
        uid = created["metadata"]["uid"]

        async def refused_or_bound() -> dict[str, Any] | None:
            pod = await read_pod(kube_api, namespace=stage.namespace, name="outsider")
            if pod["spec"].get("nodeName"):
                return pod
            scheduled = condition(pod)
            return pod if scheduled is not None and scheduled.get("status") == "False" else None

        pod = await eventually(refused_or_bound, what="the pod refused (or, before the fix, bound)")
        assert not pod["spec"].get("nodeName"), "a pod outside the namespaceSelector was bound"
        scheduled = condition(pod)
        assert scheduled is not None
        assert scheduled["reason"] == "Unschedulable"
        assert stage.rm_name in scheduled["message"]
        assert "namespaceSelector" in scheduled["message"]

        async def refusals() -> list[dict[str, Any]]:
            events = await events_of(kube_api, namespace=stage.namespace, pod_name="outsider")
            return [e for e in events if e["reason"] == "FailedScheduling"]

        (event,) = await eventually(refusals, what="a FailedScheduling event naming the rule")
        assert stage.rm_name in event["note"]
        assert "namespaceSelector" in event["note"]
        assert stage.rm.for_pod(uid) == []  # nothing reserved
        assert stage.rm.reserve_attempts == []  # nor even asked for

        # The namespace is labelled into the selector: the watch of namespaces lets the pod in.
        await _label_namespace(kube_api, name=stage.namespace, labels=tenant)
        assert (
            await eventually(lambda: stage.node_of("outsider"), what="the bind after the relabel")
            == stage.node
        )
        # And out again: once the operator has seen the relabel, a new pod of the namespace is refused.
        await _label_namespace(kube_api, name=stage.namespace, labels={"bindery.dev/tenant": None})
        watched = bindery.runtime.namespace_labels
        assert watched is not None

        async def relabel_seen() -> bool:
            labels = watched.labels(stage.namespace)
            return labels is not None and "bindery.dev/tenant" not in labels

        await eventually(relabel_seen, what="the operator seeing the namespace relabelled")
        await stage.create("late")

        async def late_refused() -> dict[str, Any] | None:
            pod = await read_pod(kube_api, namespace=stage.namespace, name="late")
            scheduled = condition(pod)
            return scheduled if scheduled is not None and scheduled.get("status") == "False" else None

        assert (await eventually(late_refused, what="the late pod refused"))["reason"] == "Unschedulable"
        assert stage.rm.reserve_attempts == ["outsider"]


async def test_a_pod_inside_the_namespace_selector_is_bound(
    *, kube_api: client.ApiClient, bindery: Bindery, stage: Stage
) -> None:
    await _label_namespace(kube_api, name=stage.namespace, labels={"team": "a"})
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}
    async with stage.served(namespaceSelector=selector):
        await stage.create("insider")
        assert await eventually(lambda: stage.node_of("insider"), what="the bind") == stage.node
