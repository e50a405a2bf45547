"""A mirror outlives one event it cannot apply.

Before the list-then-watch loop moved to :mod:`bindery.apiserver.watching`, the mirror's own loop caught
whatever applying an event raised, logged it and relisted. Applying now happens in the consumer of
the generator, outside its error handling: one bad event ended the mirror's task for good, and the
reference RM went on placing with a frozen snapshot of the nodes (and of the pods on them), still
ready.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from bindery.reference_rm.mirror import NodeMirror
from bindery.reference_rm.placement import InventoryNode
from tests.operator.fakerm import serve_app


def node(name: str, version: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


async def test_the_node_mirror_survives_an_event_it_cannot_apply() -> None:
    async def nodes(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response(
                {"metadata": {"resourceVersion": "5"}, "items": [node("n1", "5"), node("n2", "5")]}
            )
        response = web.StreamResponse()
        await response.prepare(request)
        if request.query["resourceVersion"] == "5":
            for event in (
                {"type": "DELETED", "object": node("n1", "6")},  # on_change raises for this one
                {"type": "DELETED", "object": node("n2", "7")},
            ):
                await response.write(json.dumps(event).encode() + b"\n")
        else:
            await asyncio.sleep(30)
        return response

    published: list[list[str]] = []

    def on_change(inventory: Sequence[InventoryNode]) -> None:
        names = sorted(n.name for n in inventory)
        published.append(names)
        if names == ["n2"]:
            raise RuntimeError("the store refused this inventory")

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    async with (
        serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port,
        client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api,
    ):
        mirror = NodeMirror(api=api, on_change=on_change, max_backoff=0.1)
        task = asyncio.create_task(mirror.run())
        try:
            async with asyncio.timeout(5):
                while [] not in published and not task.done():
                    await asyncio.sleep(0.02)
        finally:
            task.cancel()
            results = await asyncio.gather(task, return_exceptions=True)
    assert not isinstance(results[0], RuntimeError), "the mirror's task ended on one event"
    assert published == [["n1", "n2"], ["n2"], []]
