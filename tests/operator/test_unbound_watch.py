"""The unbound-pod watch runs outside Kopf, and keeps the semantics Kopf's watch had.

Against a scripted apiserver (aiohttp): listed pods arrive with type None, watch events in order; a
watch the server ends in order, or whose stream breaks, is resumed from the last resourceVersion
seen (a bookmark's too) without a relist, which would offer every pending pod again; an ERROR event
(410 Gone) relists, and the relist is diffed: pods gone from it arrive as DELETED, unchanged ones not
at all (Kopf's relist offered them all again and never said which had vanished).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from aiohttp import web
from kubernetes_asyncio import client

from bindery.controller.startup.kopfwiring import register
from bindery.controller.watches.unbound import UnboundPodWatcher
from tests.operator.fakerm import serve_app


def pod(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version}, "spec": {}}


def test_kopf_watches_no_pods() -> None:
    """Every pod event through Kopf's per-object machinery was 19% of the operator's samples.

    Kopf follows ResourceManagers only; pods and Nodes are Bindery's own watches
    (controller/watches/unbound.py, controller/watches/nodes.py): Kopf's initial list of 5,000
    Nodes held every handler back for two minutes."""
    registry = kopf.OperatorRegistry()
    register(registry=registry)
    watched = {str(selector.any_name) for selector in registry._watching.get_all_selectors()}
    assert watched == {"resourcemanagers"}


async def test_a_finished_watch_is_resumed_and_an_expired_one_relisted() -> None:
    requests: list[Mapping[str, str]] = []
    watches = 0

    async def pods(request: web.Request) -> web.StreamResponse:
        nonlocal watches
        requests.append(dict(request.query))
        assert request.query["fieldSelector"] == "spec.nodeName=,spec.schedulerName=bindery-x"
        if request.query.get("watch") not in ("true", "1", "True"):
            listing = {"kind": "PodList", "metadata": {"resourceVersion": "5"}, "items": [pod("a", "5")]}
            return web.json_response(listing)
        watches += 1
        response = web.StreamResponse()
        await response.prepare(request)
        if watches == 1:  # two events, a bookmark, then the server ends the watch in order
            for event in (
                {"type": "ADDED", "object": pod("b", "6")},
                {"type": "MODIFIED", "object": pod("b", "7")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
            ):
                await response.write(json.dumps(event).encode() + b"\n")
        elif watches == 2:  # one event, then the connection breaks: resume from that event
            await response.write(json.dumps({"type": "ADDED", "object": pod("c", "10")}).encode() + b"\n")
            assert request.transport is not None
            request.transport.abort()
            return response
        elif watches == 3:  # the version is too old: relist
            gone = {"kind": "Status", "code": 410, "metadata": {}}
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
        else:
            await asyncio.sleep(30)
        return response

    seen: list[tuple[str | None, str]] = []

    async def on_event(event_type: str | None, body: Mapping[str, Any]) -> None:
        seen.append((event_type, body["metadata"]["name"]))

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    async with serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port:
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        async with client.ApiClient(configuration=configuration) as api:
            watcher = UnboundPodWatcher(
                api=api, namespaces=(), on_event=on_event, logger=logging.getLogger("test"), max_backoff=0.1
            )
            watcher.follow(["bindery-x"])
            task = asyncio.create_task(watcher.run())
            try:
                async with asyncio.timeout(30):
                    while watches < 4:
                        await asyncio.sleep(0.05)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert seen == [
        (None, "a"),
        ("ADDED", "b"),
        ("MODIFIED", "b"),
        ("ADDED", "c"),
        ("DELETED", "b"),  # absent from the relist: deleted while the watch was down
        ("DELETED", "c"),
    ]
    watch_versions = [q["resourceVersion"] for q in requests if q.get("watch")]
    # Resumed after the bookmark and after the broken stream; relisted after the 410.
    assert watch_versions == ["5", "9", "10", "5"]
    assert watcher.lists == 2
