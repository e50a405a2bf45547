"""The raw layer against the real apiserver: paging, resuming a watch the server ended, and a 410
(etcd compacted) whose relist reports a deletion the watch never saw."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from bindery.apiserver import api as k8s
from bindery.apiserver import errors, resources
from bindery.apiserver.watching import Cursor, Event, Listed, list_watch
from bindery.devcluster.plane import ControlPlane
from tests.conftest import api_client_for
from tests.operator.conftest import pod_body

pytestmark = pytest.mark.controlplane


async def _pods(api: client.ApiClient, namespace: str, names: list[str]) -> None:
    for name in names:
        await k8s.create(
            api, resources.PODS, namespace=namespace, body=pod_body(name=name, scheduler_name="nobody")
        )


async def _next(stream: AsyncGenerator[Event | Listed, None]) -> Event | Listed:
    async with asyncio.timeout(30):
        return await anext(stream)


async def test_a_paged_list_returns_every_object_across_pages(
    kube_api: client.ApiClient, namespace: str
) -> None:
    names = [f"p{i}" for i in range(7)]
    await _pods(kube_api, namespace, names)
    pages = [
        page async for page in k8s.list_pages(kube_api, resources.PODS, namespace=namespace, page_size=2)
    ]
    assert [len(page["items"]) for page in pages] == [2, 2, 2, 1]
    listing = await k8s.list_all(kube_api, resources.PODS, namespace=namespace, page_size=3)
    assert sorted(item["metadata"]["name"] for item in listing.items) == names
    assert listing.resource_version
    meta = await k8s.list_all(kube_api, resources.PODS, namespace=namespace, page_size=3, metadata_only=True)
    assert sorted(item["metadata"]["name"] for item in meta.items) == names
    assert all("spec" not in item for item in meta.items)  # PartialObjectMetadata: metadata only


async def test_errors_of_the_real_apiserver(kube_api: client.ApiClient, namespace: str) -> None:
    with pytest.raises(errors.NotFound) as missing:
        await k8s.get(kube_api, resources.PODS, namespace=namespace, name="absent")
    assert (missing.value.status, missing.value.reason) == (404, "NotFound")
    await _pods(kube_api, namespace, ["twice"])
    with pytest.raises(errors.Conflict) as twice:
        await _pods(kube_api, namespace, ["twice"])
    assert twice.value.reason == "AlreadyExists"
    with pytest.raises(errors.Invalid):
        await k8s.create(kube_api, resources.PODS, namespace=namespace, body={"metadata": {"name": "x"}})


async def test_a_watch_the_server_ends_is_resumed_without_a_relist(
    kube_api: client.ApiClient, namespace: str
) -> None:
    await _pods(kube_api, namespace, ["before"])
    cursor = Cursor()
    stream = list_watch(kube_api, resources.PODS, namespace=namespace, watch_seconds=1, cursor=cursor)
    try:
        first, listed = await _next(stream), await _next(stream)
        assert isinstance(first, Event)
        assert (first.type, first.object["metadata"]["name"]) == (None, "before")
        assert listed == Listed(relist=False, count=1)
        seen: list[tuple[str | None, str]] = []

        async def follow() -> None:
            async for item in stream:
                if isinstance(item, Event):
                    seen.append((item.type, item.object["metadata"]["name"]))

        task = asyncio.create_task(follow())
        try:
            async with asyncio.timeout(30):
                while cursor.watches < 3:  # the server ended two 1-second watches
                    await asyncio.sleep(0.05)
            await _pods(kube_api, namespace, ["after"])
            async with asyncio.timeout(30):
                while ("ADDED", "after") not in seen:
                    await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await stream.aclose()
    assert cursor.lists == 1  # resumed each time from the last version: never relisted
    assert cursor.expired == 0
    assert seen == [("ADDED", "after")]  # and nothing was delivered twice


@pytest.fixture(scope="module")
def uncached_plane() -> Iterator[ControlPlane]:
    """A plane of its own whose apiserver watches etcd directly (``--watch-cache=false``): the
    shared plane's watch cache serves old versions long after etcd compacted them, so only here
    does a compaction make a watch answer 410 Gone, as a busy production apiserver's does."""
    with ControlPlane.start(extra_apiserver_args=["--watch-cache=false"]) as plane:
        yield plane


async def _compact(plane: ControlPlane) -> None:
    """Compact etcd up to its current revision: every older resourceVersion is gone."""
    etcd = next(arg.split("=", 1)[1] for arg in plane._apiserver_argv if arg.startswith("--etcd-servers="))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{etcd}/v3/kv/range", json={"key": base64.b64encode(b"/").decode()}
        ) as answer:
            revision = (await answer.json())["header"]["revision"]
        async with session.post(
            f"{etcd}/v3/kv/compaction", json={"revision": revision, "physical": True}
        ) as answer:
            assert answer.status == 200, await answer.text()


async def test_a_410_relists_and_reports_what_was_deleted_while_not_watching(
    uncached_plane: ControlPlane,
) -> None:
    api = await api_client_for(str(uncached_plane.kubeconfig))
    try:
        namespace = "watched"
        await k8s.create(api, resources.NAMESPACES, body={"metadata": {"name": namespace}})
        await _pods(api, namespace, ["stays", "goes"])
        cursor = Cursor()
        stream = list_watch(api, resources.PODS, namespace=namespace, watch_seconds=5, cursor=cursor)
        items = [await _next(stream) for _ in range(3)]
        assert items[-1] == Listed(relist=False, count=2)
        await stream.aclose()  # not watching any more
        gone = await _read(api, namespace, "goes")
        await k8s.delete(
            api, resources.PODS, namespace=namespace, name="goes", body={"gracePeriodSeconds": 0}
        )
        await _pods(api, namespace, ["new"])
        await _compact(uncached_plane)  # the version the cursor resumes from is compacted away
        stream = list_watch(api, resources.PODS, namespace=namespace, watch_seconds=5, cursor=cursor)
        try:
            after = [await _next(stream) for _ in range(3)]
        finally:
            await stream.aclose()
    finally:
        await api.close()
    assert cursor.expired == 1  # the watch answered 410 ...
    assert after[-1] == Listed(relist=True, count=2)  # ... and the loop relisted
    changes = {(e.type, e.object["metadata"]["name"]) for e in after[:-1] if isinstance(e, Event)}
    assert changes == {("DELETED", "goes"), ("ADDED", "new")}  # "stays" is unchanged: not again
    deleted = next(e for e in after if isinstance(e, Event) and e.type == "DELETED")
    assert deleted.object["metadata"]["uid"] == gone["metadata"]["uid"]


async def _read(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return await k8s.get(api, resources.PODS, namespace=namespace, name=name)
