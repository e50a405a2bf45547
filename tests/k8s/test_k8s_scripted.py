"""The list-then-watch loop and the paged LIST against a scripted apiserver (aiohttp), for the
answers a real one gives only by accident: a broken stream, a 429, an ERROR event in a stream."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from bindery.apiserver import api as k8s
from bindery.apiserver import errors, resources
from bindery.apiserver.watching import Cursor, Event, Listed, list_watch
from bindery.backoff import Backoff, BackoffPolicy
from tests.operator.fakerm import serve_app


def pod(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": version}}


@contextlib.asynccontextmanager
async def _client(app: web.Application) -> AsyncIterator[client.ApiClient]:
    async with serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port:
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        async with client.ApiClient(configuration=configuration) as api:
            yield api


async def test_a_list_follows_continue_to_the_last_page() -> None:
    queries: list[dict[str, str]] = []

    async def pods(request: web.Request) -> web.Response:
        queries.append(dict(request.query))
        page = int(request.query.get("continue") or 0)
        metadata = {"resourceVersion": "7" if page == 0 else "999"}
        if page < 2:
            metadata["continue"] = str(page + 1)
        return web.json_response({"metadata": metadata, "items": [pod(f"p{page}", "1")]})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods", pods)
    async with _client(app) as api:
        listing = await k8s.list_all(api, resources.PODS, namespace="ns", label_selector="a=b", page_size=1)
    assert [item["metadata"]["name"] for item in listing.items] == ["p0", "p1", "p2"]
    assert listing.resource_version == "7"  # the snapshot's, from the first page
    assert [q.get("continue") for q in queries] == [None, "1", "2"]
    assert all(q["limit"] == "1" and q["labelSelector"] == "a=b" for q in queries)


async def test_answers_are_translated() -> None:
    async def busy(request: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "slow down"},
            status=429,
            headers={"Retry-After": "2"},
        )

    async def missing(request: web.Request) -> web.Response:
        status = {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'pods "p" not found'}
        return web.json_response(status, status=404)

    app = web.Application()
    app.router.add_get("/api/v1/nodes", busy)
    app.router.add_get("/api/v1/namespaces/ns/pods/p", missing)
    async with _client(app) as api:
        with pytest.raises(errors.Unavailable) as busy_error:
            await k8s.list_all(api, resources.NODES)
        with pytest.raises(errors.NotFound, match='pods "p" not found'):
            await k8s.get(api, resources.PODS, namespace="ns", name="p")
    assert busy_error.value.retry_after == 2.0


async def test_the_loop_resumes_after_every_end_and_diffs_a_relist_after_410() -> None:
    watch_versions: list[str] = []
    lists = 0

    async def pods(request: web.Request) -> web.StreamResponse:
        nonlocal lists
        if request.query.get("watch") != "true":
            lists += 1
            items = [pod("a", "5"), pod("b", "5")] if lists == 1 else [pod("b", "5"), pod("c", "20")]
            return web.json_response(
                {"metadata": {"resourceVersion": "5" if lists == 1 else "20"}, "items": items}
            )
        assert request.query["allowWatchBookmarks"] == "true"
        watch_versions.append(request.query["resourceVersion"])
        response = web.StreamResponse()
        await response.prepare(request)
        watch = len(watch_versions)
        if watch == 1:  # an event and a bookmark, then the server ends the watch in order
            for event in (
                {"type": "MODIFIED", "object": pod("a", "6")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
            ):
                await response.write(json.dumps(event).encode() + b"\n")
        elif watch == 2:  # one event, then the connection breaks: resume from that event
            await response.write(json.dumps({"type": "ADDED", "object": pod("x", "10")}).encode() + b"\n")
            assert request.transport is not None
            request.transport.abort()
        elif watch == 3:  # too old: relist, and diff
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
        else:
            await asyncio.sleep(30)
        return response

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    seen: list[tuple[str | None, str] | str] = []
    cursor = Cursor()
    async with _client(app) as api:
        stream = list_watch(
            api, resources.PODS, cursor=cursor, backoff=Backoff(BackoffPolicy(initial=0.01, maximum=0.05))
        )
        async with asyncio.timeout(30):
            async for item in stream:
                if isinstance(item, Listed):
                    seen.append(f"listed relist={item.relist}")
                    if item.relist:
                        break
                else:
                    assert isinstance(item, Event)
                    seen.append((item.type, item.object["metadata"].get("name", "")))
        await stream.aclose()
    assert seen == [
        (None, "a"),
        (None, "b"),
        "listed relist=False",
        ("MODIFIED", "a"),
        ("ADDED", "x"),
        ("ADDED", "c"),  # b is unchanged: not delivered again
        ("DELETED", "a"),  # gone from the relist (said after its last page): deleted meanwhile
        ("DELETED", "x"),
        "listed relist=True",
    ]
    assert watch_versions == ["5", "9", "10"]  # resumed after the bookmark and after the break
    assert (lists, cursor.expired) == (2, 1)


async def test_a_silent_watch_is_given_up_and_resumed() -> None:
    """Half-open: the server answered, then never sends a byte. The read timeout ends it."""
    watch_versions: list[str] = []
    silence = asyncio.Event()

    async def nodes(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "3"}, "items": []})
        watch_versions.append(request.query["resourceVersion"])
        response = web.StreamResponse()
        await response.prepare(request)
        await silence.wait()  # never set
        return response

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    cursor = Cursor()
    async with _client(app) as api:
        task = asyncio.create_task(_drain(list_watch(api, resources.NODES, watch_seconds=0, cursor=cursor)))
        try:
            async with asyncio.timeout(30):
                while len(watch_versions) < 2:
                    await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert watch_versions[:2] == ["3", "3"]
    assert cursor.lists == 1


async def _drain(stream: AsyncIterator[object]) -> None:
    async for _ in stream:
        pass


async def test_a_watch_expiring_straight_after_every_list_backs_off_more_each_time() -> None:
    """A 410 straight after a list is not progress: the wait before each full relist must grow
    (it stayed at the initial wait for ever, the list's success resetting the backoff each time)."""
    listed_at: list[float] = []
    loop = asyncio.get_running_loop()

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            listed_at.append(loop.time())
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": [pod("a", "5")]})
        response = web.StreamResponse()
        await response.prepare(request)
        gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
        await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
        return response

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    async with _client(app) as api:
        stream = list_watch(api, resources.PODS, backoff=Backoff(BackoffPolicy(initial=0.05, maximum=0.4)))
        async with asyncio.timeout(10):
            async for _ in stream:
                if len(listed_at) >= 5:
                    break
        await stream.aclose()
    waits = [later - earlier for earlier, later in itertools.pairwise(listed_at)]
    assert waits[-1] >= 0.3, waits  # 0.05, 0.1, 0.2, 0.4: doubled per expiry, not 0.05 each time


async def test_a_list_is_delivered_page_by_page() -> None:
    """Each page's objects reach the consumer before the next page is asked for: the loop used to
    read every page of the list first, so a list of large objects was held whole (issue 20)."""
    delivered: list[str] = []
    delivered_before_page: list[int] = []

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            await asyncio.sleep(30)
            return web.Response()
        page = int(request.query.get("continue") or 0)
        delivered_before_page.append(len(delivered))
        metadata = {"resourceVersion": "7"}
        if page < 2:
            metadata["continue"] = str(page + 1)
        items = [pod(f"p{page}-{i}", "1") for i in range(2)]
        return web.json_response({"metadata": metadata, "items": items})

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    async with _client(app) as api:
        stream = list_watch(api, resources.PODS, page_size=2)
        async for item in stream:
            if isinstance(item, Listed):
                assert item.count == 6
                break
            assert isinstance(item, Event)
            assert item.type is None
            delivered.append(item.object["metadata"]["name"])
        await stream.aclose()
    assert delivered == ["p0-0", "p0-1", "p1-0", "p1-1", "p2-0", "p2-1"]
    assert delivered_before_page == [0, 2, 4]
