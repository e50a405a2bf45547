"""CPU per bound-pod event and cursor memory per pod: two pod watches on nodes (before) vs one.

Run:  .venv/bin/python benchmarks/boundfeed_bench.py [--pods 5000] [--bindery 0.8] [--repeat 3]

Until the watches were merged, every event of a pod Bindery placed reached the operator twice: on
the placed-pod watch (``spec.nodeName!=``, the inter-pod rules' cache) and on its scheduler name's
bound-pod watch (``spec.schedulerName=<name>,spec.nodeName!=``, the releases). Each stream decoded
the event's JSON line, moved its cursor, and handed the object on. Now one stream does it once and
hands the events of Bindery pods to the profile's :class:`BoundPodReleases` through its queue.

No apiserver and no RM (a release returns at once): ``--pods`` pods, a ``--bindery`` share of them
Bindery's (scheduler name and reservation annotation), the rest another scheduler's; each pod goes
through ADDED (bound), MODIFIED (Running), MODIFIED (Succeeded) and DELETED, as JSON lines of the
size an apiserver sends (managedFields, a container, conditions). Both paths:

- before: per line, the placed stream (json.loads, its cursor with a UID per pod, the cache) and,
  for a Bindery pod, the bound stream (json.loads again, its cursor keeping identity, reservation
  id and node, then the release handling ``_handle`` awaited in the stream, as
  ``BoundPodWatcher._follow`` did);
- after: per line, one stream (json.loads, one cursor with :func:`remembered`, the cache, the
  dispatch to the subscriber: a slim projection into its queue), the subscriber's task handling it.

It checks that both released the same reservations and left the same cache, then prints process
CPU per event (best of ``--repeat``) and, measured apart (tracemalloc), the bytes the cursors keep
per pod once every pod was added.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any, cast

from bindery.adapters.placed import PlacedPodCache
from bindery.apiserver.watching import Cursor, identity
from bindery.controller.reservations.boundpods import remembered
from bindery.controller.reservations.releases import BoundPodReleases
from bindery.controller.watches.placed import PlacedPodWatcher
from bindery.scheduling.framework import RESERVATION_ANNOTATION

SCHEDULER = "bindery"


class NullRM:
    """Releases at once (the RM's latency is not what is measured)."""

    def __init__(self) -> None:
        self.released: list[str] = []

    async def release(self, reservation_id: str, *, pod_uid: str | None = None) -> None:
        self.released.append(reservation_id)


class NullLogger:
    def info(self, message: str) -> None:
        pass

    def warning(self, message: str) -> None:
        pass


def old_placed_remembered(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The placed-pod cursor's projection before the merge (a UID)."""
    return {"metadata": {"uid": (pod.get("metadata") or {}).get("uid")}}


def old_bound_remembered(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The bound-pod cursor's projection before the merge (identity, reservation id, node)."""
    kept = identity(pod)
    reservation_id = ((pod.get("metadata") or {}).get("annotations") or {}).get(RESERVATION_ANNOTATION)
    if not reservation_id:
        return kept
    metadata = {**kept["metadata"], "annotations": {RESERVATION_ANNOTATION: str(reservation_id)}}
    return {"metadata": metadata, "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")}}


def pod_body(i: int, *, ours: bool, version: int, phase: str) -> dict[str, Any]:
    name = f"web-{i}"
    annotations = {RESERVATION_ANNOTATION: f"r-{i}"} if ours else {}
    return {
        "metadata": {
            "name": name,
            "namespace": f"ns-{i % 20}",
            "uid": f"0d6f1c2a-{i:08d}-4b1e-9f3e-5a7c2d9e1b40",
            "resourceVersion": str(version),
            "creationTimestamp": "2026-12-05T04:00:00Z",
            "labels": {"app": f"app-{i % 50}", "pod-template-hash": "5d8f7c9b6d"},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"app-{i % 50}-5d8f7c9b6d",
                    "uid": "6b1f",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-12-05T04:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}}},
                        "f:spec": {
                            "f:containers": {
                                'k:{"name":"app"}': {
                                    ".": {},
                                    "f:image": {},
                                    "f:name": {},
                                    "f:resources": {".": {}, "f:requests": {}},
                                }
                            }
                        },
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "subresource": "status",
                    "time": "2026-12-05T04:00:01Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:phase": {}}},
                },
            ],
        },
        "spec": {
            "schedulerName": SCHEDULER if ours else "default-scheduler",
            "nodeName": f"node-{i % 500:04d}",
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1.2.3",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "priority": 0,
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        },
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-05T04:00:00Z"},
                {
                    "type": "Ready",
                    "status": "True" if phase == "Running" else "False",
                    "lastTransitionTime": "2026-12-05T04:00:01Z",
                },
            ],
            "hostIP": "10.0.0.1",
            "podIP": "10.1.0.1",
            "qosClass": "Burstable",
        },
    }


def event_lines(pods: int, share: float) -> tuple[list[bytes], list[bytes]]:
    """(the ADDED lines, the rest), each a watch event's JSON line as the apiserver sends it."""
    added, rest = [], []
    every = max(1, round(1 / (1 - share))) if share < 1 else 0
    version = 100
    for i in range(pods):
        ours = not (every and i % every == 0)
        for event_type, phase in (("ADDED", "Pending"), ("MODIFIED", "Running"), ("MODIFIED", "Succeeded")):
            version += 1
            line = json.dumps(
                {"type": event_type, "object": pod_body(i, ours=ours, version=version, phase=phase)}
            )
            (added if event_type == "ADDED" else rest).append(line.encode())
        version += 1
        body = pod_body(i, ours=ours, version=version, phase="Succeeded")
        rest.append(json.dumps({"type": "DELETED", "object": body}).encode())
    return added, rest


def releases_for(rm: NullRM) -> BoundPodReleases:
    return BoundPodReleases(scheduler_names={SCHEDULER}, rm=lambda: cast(Any, rm), logger=NullLogger())


async def before(lines: list[bytes], *, state: dict[str, Any]) -> None:
    """The placed-pod stream, then (a Bindery pod) the bound-pod stream, per line."""
    cache, placed, bound, releases = state["cache"], state["placed"], state["bound"], state["releases"]
    for line in lines:
        event = json.loads(line)
        kind, obj = event["type"], event["object"]
        if placed.observed(kind, obj):
            cache.on_event(kind, obj)
        spec = obj.get("spec") or {}
        if spec.get("schedulerName") == SCHEDULER and spec.get("nodeName"):  # the server's selector
            event = json.loads(line)
            kind, obj = event["type"], event["object"]
            if bound.observed(kind, obj):
                await releases._handle(kind, obj)
        await asyncio.sleep(0)  # the next event is read from the network: the loop runs meanwhile


async def after(lines: list[bytes], *, state: dict[str, Any]) -> None:
    """One stream per line: cursor, cache, dispatch; the subscriber's task handles its queue."""
    cache, cursor, watcher, releases = state["cache"], state["cursor"], state["watcher"], state["releases"]
    for line in lines:
        event = json.loads(line)
        kind, obj = event["type"], event["object"]
        if cursor.observed(kind, obj):
            cache.on_event(kind, obj)
            watcher._dispatch(kind, obj)
        await asyncio.sleep(0)  # the next event is read from the network: the subscriber runs meanwhile
    await releases.settled()


def new_state(path: str) -> dict[str, Any]:
    rm = NullRM()
    cache = PlacedPodCache()
    releases = releases_for(rm)
    if path == "before":
        return {
            "rm": rm,
            "cache": cache,
            "releases": releases,
            "placed": Cursor(remember=old_placed_remembered),
            "bound": Cursor(remember=old_bound_remembered),
        }
    watcher = PlacedPodWatcher(api=cast(Any, None), cache=cache, logger=NullLogger())
    watcher.subscribe(releases)
    return {
        "rm": rm,
        "cache": cache,
        "releases": releases,
        "cursor": watcher.cursors[None],
        "watcher": watcher,
    }


async def run(path: str, lines: list[bytes]) -> tuple[float, dict[str, Any]]:
    """(CPU seconds of all the events, the final state)."""
    state = new_state(path)
    task = asyncio.create_task(state["releases"].run())
    feed = before if path == "before" else after
    await asyncio.sleep(0)
    started = time.process_time()
    await feed(lines, state=state)
    cpu = time.process_time() - started
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return cpu, state


def cursor_bytes(path: str, added: list[bytes]) -> float:
    """Bytes the cursors keep per pod once every pod was added (each body freed once fed)."""
    cursors = (
        [Cursor(remember=old_placed_remembered), Cursor(remember=old_bound_remembered)]
        if path == "before"
        else [Cursor(remember=remembered)]
    )
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for line in added:
        obj = json.loads(line)["object"]
        cursors[0].observed("ADDED", obj)
        if len(cursors) > 1 and (obj.get("spec") or {}).get("schedulerName") == SCHEDULER:
            cursors[1].observed("ADDED", obj)
        del obj
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return kept / len(added)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--bindery", type=float, default=0.8, help="the share of Bindery's pods")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    added, rest = event_lines(args.pods, args.bindery)
    events = len(added) + len(rest)
    results: dict[str, list[float]] = {"before": [], "after": []}
    finals: dict[str, dict[str, Any]] = {}
    for _ in range(args.repeat):
        for path in ("before", "after"):
            cpu, state = await run(path, added + rest)
            results[path].append(cpu)
            finals[path] = state
    # Equivalent: the same releases, the same (empty) cache, every cursor emptied by the DELETEDs.
    assert sorted(finals["before"]["rm"].released) == sorted(finals["after"]["rm"].released)
    assert len(finals["before"]["rm"].released) == round(args.pods * args.bindery)
    assert len(finals["before"]["cache"]) == len(finals["after"]["cache"]) == 0
    print(f"{args.pods} pods ({args.bindery:.0%} Bindery's), {events} events, {len(added[0])} bytes per line")
    for path in ("before", "after"):
        cpu = min(results[path])
        kept = cursor_bytes(path, added)
        print(f"  {path:6}: {cpu / events * 1e6:6.1f} µs CPU per event, cursors keep {kept:5.0f} B/pod")
    ratio = min(results["after"]) / min(results["before"])
    print(f"  after/before CPU: {ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
