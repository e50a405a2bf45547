"""The releases of departed pods, fed by the one watch of pods on nodes.

That watch resumes a watch the server ended instead of relisting (it used to relist after every
end, each 300 s, and ask for a reconcile pass each time), and asks for a pass only after a real
relist (a 410), whose diff releases the reservation of a pod deleted in the gap. The placed-pod cache
and every profile's releases share it: one list/watch per scope, no second one per scheduler name.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

from aiohttp import web
from kubernetes_asyncio import client

from bindery.adapters.placed import PlacedPodCache
from bindery.controller.reservations.releases import BoundPodReleases
from bindery.controller.watches.placed import PlacedPodWatcher
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from tests.operator.fakerm import serve_app
from tests.scheduling.fakes import Calls, FakeRM


def pod(
    name: str,
    version: str,
    *,
    reservation: str | None,
    scheduler: str = "bindery",
    phase: str = "Running",
    namespace: str = "ns",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "annotations": {RESERVATION_ANNOTATION: reservation} if reservation else {},
        },
        "spec": {"nodeName": "n1", "schedulerName": scheduler, "containers": []},
        "status": {"phase": phase},
    }


async def test_watch_ends_resume_and_only_a_410_relists_and_reconciles() -> None:
    lists, watch_versions = 0, []

    selectors: set[str] = set()

    async def pods(request: web.Request) -> web.StreamResponse:
        nonlocal lists
        selectors.add(request.query.get("fieldSelector", ""))
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
            cache = PlacedPodCache()
            watcher = PlacedPodWatcher(
                api=api, cache=cache, logger=logging.getLogger("test"), max_backoff=0.1
            )
            releases = BoundPodReleases(
                scheduler_names={"bindery"},
                rm=lambda: FakeRM(calls),
                logger=logging.getLogger("test"),
                on_relist=on_relist,
            )
            watcher.subscribe(releases)
            tasks = [asyncio.create_task(watcher.run()), asyncio.create_task(releases.run())]
            try:
                async with asyncio.timeout(30):
                    while len(watch_versions) < 4:
                        await asyncio.sleep(0.05)
                    await releases.settled()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    assert watch_versions == ["5", "9", "9", "20"]  # resumed twice, relisted once (after the 410)
    assert (lists, relists) == (2, 1)
    assert calls.log == [("rm.release", {"id": "r-a"})]  # the pod deleted in the gap
    assert (cache.get("uid-a"), cache.get("uid-b") is not None) == (None, True)
    assert selectors == {"spec.nodeName!="}  # one list/watch of the pods on nodes, for both


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

    watcher = BoundPodReleases(
        scheduler_names={"bindery"},
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
    watcher = BoundPodReleases(
        scheduler_names={"bindery"},
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


class Recorder:
    """A subscriber that records what it is handed, and what the cache held at that moment."""

    def __init__(self, *, names: set[str], cache: PlacedPodCache, fail: bool = False) -> None:
        self.scheduler_names = frozenset(names)
        self.namespaces: frozenset[str] = frozenset()
        self.seen: list[tuple[str, str, bool]] = []  # (type, uid, in the cache then)
        self.relists = 0
        self._cache = cache
        self._fail = fail

    def deliver(self, event_type: str, pod: Any) -> None:
        if self._fail:
            raise RuntimeError("this profile is broken")
        uid = pod["metadata"]["uid"]
        self.seen.append((event_type, uid, self._cache.get(uid) is not None))

    def relisted(self) -> None:
        self.relists += 1


def scripted(items: list[Any], done: asyncio.Event) -> Any:
    """A stand-in for `list_watch` that yields `items`, then waits (as a quiet watch does)."""

    async def list_watch(*args: Any, **kwargs: Any) -> Any:
        from bindery.apiserver.watching import Event, Listed

        cursor = kwargs["cursor"]
        cursor.begin()
        for item in items:  # the cursor follows as list_watch keeps it (the first list, then events)
            if isinstance(item, Event):
                if item.type is None:
                    cursor.page([item.object])
                else:
                    cursor.observed(item.type, item.object)
            elif isinstance(item, Listed) and not item.relist:
                cursor.end(resource_version="5")
            yield item
        done.set()
        await asyncio.Event().wait()

    return list_watch


async def _stream(
    monkeypatch: Any, items: list[Any], *, subscribers: list[Any], cache: PlacedPodCache
) -> PlacedPodWatcher:
    from bindery.controller.watches import placed

    done = asyncio.Event()
    monkeypatch.setattr(placed, "list_watch", scripted(items, done))
    # The scripted stream never calls the apiserver.
    watcher = PlacedPodWatcher(api=None, cache=cache, logger=logging.getLogger("test"))
    for subscriber in subscribers:
        watcher.subscribe(subscriber)
    task = asyncio.create_task(watcher.run())
    try:
        async with asyncio.timeout(10):
            await done.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return watcher


async def test_each_event_reaches_the_cache_first_then_the_profiles_of_its_scheduler_name(
    monkeypatch: Any,
) -> None:
    """The cache is updated before a release can wake a pod (which must see the node freed), and a
    profile that fails does not stop the cache or the other profiles."""
    from bindery.apiserver.watching import Event, Listed

    cache = PlacedPodCache()
    broken = Recorder(names={"bindery"}, cache=cache, fail=True)
    ours = Recorder(names={"bindery"}, cache=cache)
    theirs = Recorder(names={"other"}, cache=cache)
    a, b = pod("a", "5", reservation="r-a"), pod("b", "5", reservation="r-b", scheduler="other")
    plain = pod("plain", "5", reservation=None, scheduler="default-scheduler")
    items = [
        Event(None, a),
        Event(None, b),
        Event(None, plain),
        Listed(relist=False, count=3),
        Event("DELETED", a),
        Event("MODIFIED", plain),
        Listed(relist=True, count=2),
    ]
    await _stream(monkeypatch, items, subscribers=[broken, ours, theirs], cache=cache)
    assert ours.seen == [("ADDED", "uid-a", True), ("DELETED", "uid-a", False)]
    assert theirs.seen == [("ADDED", "uid-b", True)]
    assert (ours.relists, theirs.relists) == (1, 1)
    assert cache.get("uid-plain") is not None
    assert cache.get("uid-a") is None


async def test_a_profile_that_subscribes_later_still_releases_a_pod_that_finished_before(
    monkeypatch: Any,
) -> None:
    """A watch of its own used to list the profile's bound pods when it started (leadership gained,
    a ResourceManager added) or gained a name: a finished pod was released from that list. The
    shared watch listed long before; what its cursor remembers is replayed instead."""
    from bindery.apiserver.watching import Event, Listed

    cache = PlacedPodCache()
    finished = pod("f", "5", reservation="r-f", phase="Succeeded")
    running = pod("r", "5", reservation="r-r")
    other = pod("o", "5", reservation="r-o", phase="Failed", scheduler="other")
    plain = pod("plain", "5", reservation=None, phase="Succeeded")
    later = pod("l", "6", reservation="r-l")
    watcher = await _stream(
        monkeypatch,
        [
            *(Event(None, p) for p in (finished, running, other, plain)),
            Listed(relist=False, count=4),
            Event("ADDED", later),
            Event("MODIFIED", {**later, "status": {"phase": "Failed"}}),
        ],
        subscribers=[],
        cache=cache,
    )
    calls = Calls()
    observed: list[tuple[str, str]] = []

    async def on_event(event_type: str, body: Any) -> None:
        observed.append((event_type, body["metadata"]["uid"]))

    relists = 0

    def on_relist() -> None:
        nonlocal relists
        relists += 1

    releases = BoundPodReleases(
        scheduler_names={"bindery"},
        rm=lambda: FakeRM(calls),
        logger=logging.getLogger("test"),
        on_event=on_event,
        on_relist=on_relist,
    )
    task = asyncio.create_task(releases.run())
    try:
        watcher.subscribe(releases)
        async with asyncio.timeout(10):
            await releases.settled()
        assert sorted(calls.log, key=str) == [("rm.release", {"id": "r-f"}), ("rm.release", {"id": "r-l"})]
        assert sorted(observed) == [("ADDED", "uid-f"), ("ADDED", "uid-l"), ("ADDED", "uid-r")]
        # A scheduler name added to the running profile: its pods are replayed, the others not again.
        releases.scheduler_names = frozenset({"bindery", "other"})
        watcher.replay(releases, scheduler_names={"other"})
        async with asyncio.timeout(10):
            await releases.settled()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [c for c in calls.log if c[1]["id"] == "r-o"] == [("rm.release", {"id": "r-o"})]
    assert len(calls.log) == 3
    assert relists == 0  # a replay is no relist: no reconcile pass for it


class RecordingFeed:
    """A BoundPodFeed that records what a runner asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, frozenset[str]]] = []

    def subscribe(self, subscriber: Any) -> None:
        self.calls.append(("subscribe", subscriber, frozenset(subscriber.scheduler_names)))

    def unsubscribe(self, subscriber: Any) -> None:
        self.calls.append(("unsubscribe", subscriber, frozenset()))

    def replay(self, subscriber: Any, *, scheduler_names: Any) -> None:
        self.calls.append(("replay", subscriber, frozenset(scheduler_names)))


async def test_a_runner_subscribes_while_it_schedules_and_is_replayed_the_names_it_gains() -> None:
    """As its watches were started with its workers and cancelled on pause: a runner subscribes on
    start (replayed by the feed), unsubscribes on pause (leadership lost), subscribes afresh when it
    leads again; a scheduler name added meanwhile is replayed, a removed one is simply no longer its."""
    from bindery.config import ResourceManagerConfig
    from bindery.controller.profile.runner import ProfileRunner
    from bindery.controller.secrets import RMCredentials
    from bindery.scheduling.framework import Ports
    from tests.scheduling.fakes import FakeBinder, FakeConditions, FakeEvents, FakeNodes, FakePods

    def config(*names: str) -> ResourceManagerConfig:
        return ResourceManagerConfig(
            name="rm", uid="u", generation=1, scheduler_names=names, endpoint="https://rm.invalid"
        )

    class ClosingRM(FakeRM):
        async def aclose(self) -> None:
            pass

    calls = Calls()
    feed = RecordingFeed()
    ports = Ports(
        nodes=FakeNodes(calls),
        pods=FakePods(calls),
        binder=FakeBinder(calls),
        events=FakeEvents(calls),
        conditions=FakeConditions(calls),
    )
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as api:
        runner = ProfileRunner(
            config=config("a"),
            client=cast(Any, ClosingRM(calls)),
            credentials=RMCredentials(),
            ports=ports,
            api=api,
            logger=logging.getLogger("test"),
            on_released=lambda: None,
            bound_pods=feed,
        )
        try:
            runner.start()
            runner.update(config=config("a", "b"), client=None)
            runner.update(config=config("b"), client=None)
            await runner.pause()
            runner.update(config=config("b", "c"), client=None)  # not leading: nothing to follow
            runner.start()
        finally:
            await runner.stop()
    first, second = feed.calls[0][1], feed.calls[3][1]
    assert first is not second
    assert feed.calls == [
        ("subscribe", first, frozenset({"a"})),
        ("replay", first, frozenset({"b"})),
        ("unsubscribe", first, frozenset()),
        ("subscribe", second, frozenset({"b", "c"})),
        ("unsubscribe", second, frozenset()),
    ]
    assert cast(Any, first).scheduler_names == frozenset({"b"})
