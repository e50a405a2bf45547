"""Kopf handlers, registered onto a given registry so one process can run several operators (tests).

Only handlers that write nothing onto the watched objects are used: `on.event` and `index`. No
on.create/update/delete (they add `kopf.zalando.org/*` annotations), no daemons or timers (they add
finalizers). All per-run state lives in the `Runtime` object stored in Kopf's memo, created at
startup and closed at cleanup, so handlers are plain functions of (event, runtime).

Pods are not watched through Kopf: the runtime follows the unbound pods itself
(`bindery.controller.watches.unbound`), since Kopf's per-event machinery cost far more than Bindery's own
handling on that hot watch.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from bindery.controller.options import OperatorOptions
from bindery.controller.runtime import Runtime
from bindery.controller.settings import configure
from bindery.k8s.resources import RESOURCE_MANAGERS
from bindery.kube import project_node
from bindery.scheduling.ports import NodeProjection

GROUP = RESOURCE_MANAGERS.group
VERSION = RESOURCE_MANAGERS.version
PLURAL = RESOURCE_MANAGERS.plural
NODE_INDEX = "bindery_nodes"


def register(*, registry: kopf.OperatorRegistry, options: OperatorOptions | None = None) -> None:
    """Attach Bindery's handlers to `registry`; `options` apply when the memo brings none."""

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
        chosen = memo.get("options") or options or OperatorOptions()
        configure(settings, watch_timeout=chosen.watch_timeout)
        runtime = Runtime(options=chosen, logger=logging.getLogger("bindery.controller"))
        await runtime.start(node_index=kwargs[NODE_INDEX])
        memo["runtime"] = runtime

    @kopf.on.login(registry=registry)
    async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        runtime: Runtime = memo["runtime"]
        return await runtime.connection_info()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime | None = memo.get("runtime")
        if runtime is not None:
            await runtime.close()

    @kopf.index("", "v1", "nodes", id=NODE_INDEX, registry=registry)
    def bindery_nodes(body: kopf.Body, **_: Any) -> dict[str, NodeProjection]:
        return project_node(body=body)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def resource_manager_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime = memo["runtime"]
        await runtime.on_resource_manager_event(event_type=event.get("type"), body=event["object"])
