"""The reference RM's pod mirror keeps projections, never pages of raw pods (issue 20, scenario 2).

It follows every bound pod of the cluster. Its first list used to be gathered whole, raw, and
projected only once complete: every bound pod's full body at once, against the RM's 256 Mi limit.
Against a scripted apiserver that answers the list in pages, the number of raw pod bodies still
alive is counted when each page is asked for (the objects themselves, found by a marker, not
anything the mirror reports): at most the page being handled may be.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from bindery.reference_rm.accounting import ClusterPods
from bindery.reference_rm.mirror import PodMirror
from tests.operator.fakerm import serve_app

PAGES = 4
PER_PAGE = 3
MARKER = "mirror-page-test"


def bound(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "5"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
            "marker": MARKER,
        },
        "status": {"phase": "Running"},
    }


def raw_bodies_alive() -> int:
    """Pod specs of this test alive in the process, wherever they are referred to from."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, dict) and obj.get("marker") == MARKER)


async def test_the_pod_mirror_keeps_no_raw_pages() -> None:
    alive_at_page: list[int] = []

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            await asyncio.sleep(30)
            return web.Response()
        page = int(request.query.get("continue") or 0)
        alive_at_page.append(raw_bodies_alive())
        metadata = {"resourceVersion": "5"}
        if page < PAGES - 1:
            metadata["continue"] = str(page + 1)
        items = [bound(f"p{page}-{i}") for i in range(PER_PAGE)]
        return web.json_response({"metadata": metadata, "items": items})

    published: list[ClusterPods] = []
    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    async with (
        serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port,
        client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api,
    ):
        mirror = PodMirror(api=api, on_change=published.append, max_backoff=0.1)
        task = asyncio.create_task(mirror.run())
        try:
            async with asyncio.timeout(10):
                while not published:
                    await asyncio.sleep(0.02)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert published[0].nodes["n1"].count == PAGES * PER_PAGE  # every pod projected and counted
    # Asked for page k, at most the previous page's bodies may still be alive (the one handled).
    assert max(alive_at_page) <= PER_PAGE, alive_at_page
