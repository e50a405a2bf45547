"""A watch whose connection goes silent (half-open TCP: the apiserver's host vanished, a load
balancer dropped the flow) must end and be resumed; otherwise departed pods are never released. It is
resumed from its resourceVersion, not relisted: nothing was lost, so a relist would only cost.

The server here answers the list, then holds every watch open without sending a byte, which is
what a half-open connection looks like from the client.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from bindery.adapters.placed import PlacedPodCache
from bindery.config import ResourceManagerConfig, SecretKeyRef
from bindery.controller import secrets
from bindery.controller.watches.placed import PlacedPodWatcher
from bindery.reference_rm.mirror import NodeMirror
from tests.operator.fakerm import serve_app


async def test_a_silent_watch_of_pods_on_nodes_is_given_up_and_resumed() -> None:
    """The one watch of bound pods: the inter-pod rules' cache and every profile's releases."""
    lists = 0
    watches: list[str] = []
    silence = asyncio.Event()

    async def pods(request: web.Request) -> web.StreamResponse:
        nonlocal lists
        if request.query.get("watch") != "true":
            lists += 1
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []})
        watches.append(request.query["resourceVersion"])
        response = web.StreamResponse()
        await response.prepare(request)
        await silence.wait()  # never set: the stream stays open and silent
        return response

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    async with serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port:
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        async with client.ApiClient(configuration=configuration) as api:
            watcher = PlacedPodWatcher(
                api=api,
                cache=PlacedPodCache(),
                logger=logging.getLogger("test"),
                watch_seconds=1,
                max_backoff=0.1,
            )
            task = asyncio.create_task(watcher.run())
            try:
                async with asyncio.timeout(30):
                    while len(watches) < 2:
                        await asyncio.sleep(0.05)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert watches[:2] == ["1", "1"]  # the second resumed from the list's version
    assert lists == 1


async def test_a_silent_node_mirror_watch_is_given_up_and_resumed() -> None:
    """The reference RM's mirror: a stale snapshot would let it place pods on capacity in use."""
    lists = 0
    watches: list[str] = []
    silence = asyncio.Event()

    async def nodes(request: web.Request) -> web.StreamResponse:
        nonlocal lists
        if request.query.get("watch") != "true":
            lists += 1
            return web.json_response({"kind": "NodeList", "metadata": {"resourceVersion": "1"}, "items": []})
        watches.append(request.query["resourceVersion"])
        response = web.StreamResponse()
        await response.prepare(request)
        await silence.wait()
        return response

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    async with serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port:
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        async with client.ApiClient(configuration=configuration) as api:
            mirror = NodeMirror(
                api=api, on_change=lambda nodes: None, watch_timeout_seconds=1, max_backoff=0.1
            )
            task = asyncio.create_task(mirror.run())
            try:
                async with asyncio.timeout(30):
                    while len(watches) < 2:
                        await asyncio.sleep(0.05)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert watches[:2] == ["1", "1"]  # the second resumed from the list's version
    assert lists == 1


async def test_a_secret_read_that_gets_no_answer_is_a_credentials_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ResourceManager's loop reads its Secrets every probe: a hung read would freeze it for ever."""
    monkeypatch.setattr(secrets, "READ_TIMEOUT_SECONDS", 1.0)
    silence = asyncio.Event()

    async def secret(request: web.Request) -> web.StreamResponse:
        await silence.wait()
        return web.Response()

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/secrets/token", secret)
    config = ResourceManagerConfig(
        name="rm",
        uid="u",
        generation=1,
        scheduler_names=("bindery",),
        endpoint="https://rm.invalid",
        token_ref=SecretKeyRef(namespace="ns", name="token", key="token"),
    )
    async with serve_app(app, shutdown_timeout=0.1, handler_cancellation=True) as port:
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        async with client.ApiClient(configuration=configuration) as api, asyncio.timeout(30):
            with pytest.raises(secrets.CredentialsError, match="did not answer within 1 s"):
                await secrets.resolve_credentials(api=api, config=config, directory=tmp_path)
