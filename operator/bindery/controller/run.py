"""Run the operator in the current event loop (CLI, demo and tests all start it this way).

Kopf is embedded with `kopf.operator(...)` and a private registry, so several operators can run one
after another in one process (tests restart the operator to prove crash recovery) and the caller
controls stopping through `stop_flag`.
"""

from __future__ import annotations

import asyncio
import threading

import kopf

from bindery.controller.handlers import register
from bindery.controller.options import OperatorOptions
from bindery.controller.settings import configure


async def run_operator(
    *,
    options: OperatorOptions,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    memo: kopf.Memo | None = None,
) -> None:
    """Run until `stop_flag` is set (or the task is cancelled). `memo["runtime"]` exposes the state."""
    registry = kopf.OperatorRegistry()
    register(registry=registry, options=options)
    settings = kopf.OperatorSettings()
    configure(settings, watch_timeout=options.watch_timeout)
    memo = memo if memo is not None else kopf.Memo()
    memo["options"] = options
    await kopf.operator(
        registry=registry,
        settings=settings,
        memo=memo,
        standalone=True,
        liveness_endpoint=options.liveness_endpoint,
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
