"""A reconcile pass's list of bound pods keeps what the pass reads, not the pods (issue 20).

Every pass lists the bound pods of its scheduler names (pods created with `spec.nodeName` preset
count too, and anyone may create those). It held each listed body whole for the pass, so its
memory grew with the largest pods a tenant cared to create. Against a scripted apiserver that
answers in pages: what comes back has no spec beyond node and scheduler name, and the pass's
decisions on it are those on the whole pod.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from bindery.controller.reservations import boundpods as bound_watch
from bindery.controller.reservations.fate import pod_fate
from bindery.controller.reservations.reconcile import missing_reservations, reported_unscheduled
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.operator.fakerm import serve_app

TOLERATIONS = [{"key": f"k{i}", "operator": "Exists"} for i in range(2_000)]


def bound(name: str, *, phase: str = "Running", reservation: str | None = "r-1") -> dict[str, Any]:
    annotations = {"other": "x" * 1000} | ({RESERVATION_ANNOTATION: reservation} if reservation else {})
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "5",
            "generation": 2,
            "annotations": annotations,
            "labels": {"app": "x"},
        },
        "spec": {"nodeName": "n1", "schedulerName": "bindery", "tolerations": TOLERATIONS},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
                {"type": "Ready", "status": "True"},
            ],
        },
    }


async def test_the_list_of_bound_pods_keeps_what_a_pass_reads() -> None:
    async def pods(request: web.Request) -> web.Response:
        assert request.query["fieldSelector"] == "spec.schedulerName=bindery,spec.nodeName!="
        page = int(request.query.get("continue") or 0)
        metadata = {"resourceVersion": "9"} | ({"continue": "1"} if page == 0 else {})
        return web.json_response({"metadata": metadata, "items": [bound(f"p{page}")]})

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    async with (
        serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port,
        client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api,
    ):
        items, version = await bound_watch.list_bound_pods(api=api, scheduler_name="bindery", namespace=None)
    assert version == "9"
    assert [item["metadata"]["name"] for item in items] == ["p0", "p1"]
    for item in items:
        assert set(item["spec"]) == {"nodeName", "schedulerName"}, "the pod's spec was kept whole"
        assert item["metadata"]["annotations"] == {RESERVATION_ANNOTATION: "r-1"}
        assert "labels" not in item["metadata"]


def test_a_pass_decides_the_same_on_what_it_keeps() -> None:
    for pod in (
        bound("a"),
        bound("b", phase="Succeeded"),
        bound("c", reservation=None),
        bound("d") | {"metadata": bound("d")["metadata"] | {"deletionTimestamp": "2026-01-01T00:00:00Z"}},
    ):
        kept = bound_watch.listed_bound_pod(pod)
        for node in ("n1", "n2"):
            uid = pod["metadata"]["uid"]
            assert pod_fate(pod=kept, pod_uid=uid, node=node) == pod_fate(pod=pod, pod_uid=uid, node=node)
        assert reported_unscheduled(kept) == reported_unscheduled(pod)
        decided = missing_reservations(bound_pods=[kept], active_pod_uids=(), warned=())
        assert len(decided) == len(missing_reservations(bound_pods=[pod], active_pod_uids=(), warned=()))
