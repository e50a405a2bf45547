"""The bound-pod watch resumes a watch the server ended instead of relisting (it used to relist
after every end, each 300 s, and ask for a reconcile pass each time), and asks for a pass only
after a real relist (a 410), whose diff releases the reservation of a pod deleted in the gap."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from bindery.controller.watches.bound import BoundPodWatcher
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.operator.fakerm import serve_app
from tests.scheduling.fakes import Calls, FakeRM


def pod(name: str, version: str, *, reservation: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "annotations": {RESERVATION_ANNOTATION: reservation},
        },
        "spec": {"nodeName": "n1", "schedulerName": "bindery"},
        "status": {"phase": "Running"},
    }


async def test_watch_ends_resume_and_only_a_410_relists_and_reconciles() -> None:
    lists, watch_versions = 0, []

    async def pods(request: web.Request) -> web.StreamResponse:
        nonlocal lists
        if request.query.get("watch") != "true":
            lists += 1
            items = [pod("a", "5", reservation="r-a"), pod("b", "5", reservation="r-b")]
            if lists > 1:
                items = items[1:]  # a was deleted while the watch was down
            return web.json_response(
                {"metadata": {"resourceVersion": "5" if lists == 1 else "20"}, "items": items}
            )
        watch_versions.append(request.query["resourceVersion"])
        response = web.StreamResponse()
        await response.prepare(request)
        if len(watch_versions) == 1:  # a bookmark, then the server ends the watch
            bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}
            await response.write(json.dumps(bookmark).encode() + b"\n")
        elif len(watch_versions) == 2:  # ended at once, in order: resume again
            pass
        elif len(watch_versions) == 3:
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
        else:
            await asyncio.sleep(30)
        return response

    relists = 0

    def on_relist() -> None:
        nonlocal relists
        relists += 1

    calls = Calls()
    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    async with serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port:
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        async with client.ApiClient(configuration=configuration) as api:
            watcher = BoundPodWatcher(
                api=api,
                scheduler_name="bindery",
                rm=lambda: FakeRM(calls),
                logger=logging.getLogger("test"),
                on_relist=on_relist,
                max_backoff=0.1,
            )
            task = asyncio.create_task(watcher.run())
            try:
                async with asyncio.timeout(30):
                    while len(watch_versions) < 4:
                        await asyncio.sleep(0.05)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert watch_versions == ["5", "9", "9", "20"]  # resumed twice, relisted once (after the 410)
    assert (lists, relists) == (2, 1)
    assert calls.log == [("rm.release", {"id": "r-a"})]  # the pod deleted in the gap


async def test_a_release_the_rm_stack_kept_is_not_taken_for_done() -> None:
    """The RM stack may keep a release (the leader fence, or a reservation committed after an
    unanswered Binding whose pod could not be read): the watch must not then remember it as
    released, log it released, or count it, or the pod's next event (finished, then deleted)
    never releases it and the capacity leaks until a reconcile pass."""
    from bindery.controller.metrics import Metrics
    from bindery.controller.rmstack import RMStack

    calls = Calls()
    leading = False
    stack = RMStack(
        client=FakeRM(calls),  # type: ignore[arg-type]
        metrics=Metrics(),
        resource_manager="rm",
        holds=lambda: leading,
        logger=logging.getLogger("test"),
    )
    released = 0

    def on_released() -> None:
        nonlocal released
        released += 1

    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as api:
        watcher = BoundPodWatcher(
            api=api,
            scheduler_name="bindery",
            rm=lambda: stack,
            logger=logging.getLogger("test"),
            on_released=on_released,
        )
        finished = pod("a", "6", reservation="r-a")
        finished["status"]["phase"] = "Failed"
        await watcher._handle("MODIFIED", finished)  # the fence keeps it: nothing was released
        assert (calls.count("rm.release"), released) == (0, 0)
        leading = True
        await watcher._handle("DELETED", finished)
    assert calls.log == [("rm.release", {"id": "r-a"})]
    assert released == 1


async def test_a_failed_release_of_a_finished_pod_is_tried_again_without_another_event() -> None:
    """The watch used to relist every 300 s and so offer a finished pod again; now a finished pod
    whose release failed (the RM away, its breaker open) may send no event for hours."""
    from bindery.rm.errors import RMUnavailable

    calls = Calls()
    rm = FakeRM(calls)
    rm.release_error = RMUnavailable("the RM is away")
    released = asyncio.Event()
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as api:
        watcher = BoundPodWatcher(
            api=api,
            scheduler_name="bindery",
            rm=lambda: rm,
            logger=logging.getLogger("test"),
            release_retry_seconds=0.02,
            on_released=released.set,
        )
        finished = pod("a", "6", reservation="r-a")
        finished["status"]["phase"] = "Succeeded"
        await watcher._handle("MODIFIED", finished)
        rm.release_error = None
        retrying = asyncio.create_task(watcher._retry_releases())
        try:
            # Released means forgotten by the retries: no later round can release it again.
            async with asyncio.timeout(5):
                await released.wait()
        finally:
            retrying.cancel()
            await asyncio.gather(retrying, return_exceptions=True)
    assert calls.log == [("rm.release", {"id": "r-a"})] * 2
