"""The two ways to start the operator: in the caller's event loop, or in a thread of its own.

- :func:`run_operator` runs it in the current loop (`bindery run`, and the thread below). Kopf is
  embedded with `kopf.operator(...)` and a private registry, so several operators can run one after
  another in one process (tests restart the operator to prove crash recovery) and the caller
  controls stopping through `stop_flag`.
- :class:`EmbeddedOperator` runs it in a thread with its own loop, for programs that embed it (the
  demo, tests, benchmarks). Kopf treats every task created in its event loop after it started as
  its own and cancels them when it stops (kopf.operator's "hung tasks"), so sharing a loop with
  other work (the demo's watchers, an RM server, test fixtures) would cancel that work. Kopf's
  documented way to embed an operator is a thread with a private loop; this class is that, with
  async start/stop for the caller's loop. The caller may read `runtime` (plain in-memory state)
  from its own thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

import kopf

from bindery.controller.startup.kopfwiring import configure, register
from bindery.controller.startup.options import OperatorOptions


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


if TYPE_CHECKING:
    from bindery.controller.startup.runtime import Runtime


class _HostHandlesSignals(logging.Filter):
    """Drop Kopf's warning that OS signals are ignored off the main thread: when embedded, the
    host program owns signals and stops the operator through `stop()`, so the warning only
    alarms the user (it showed up in the middle of `bindery demo`'s output)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("OS signals are ignored")


_KOPF_RUNNING_LOG = logging.getLogger("kopf._core.reactor.running")
_SIGNALS_FILTER = _HostHandlesSignals()


class EmbeddedOperator:
    def __init__(self, *, options: OperatorOptions) -> None:
        self.options = options
        self.memo = kopf.Memo()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.memo["runtime"]
        return runtime

    async def start(self, *, within: float = 60.0) -> None:
        """Start the operator and wait until Kopf reports it ready (or raise why it is not)."""
        self.memo = kopf.Memo()
        _KOPF_RUNNING_LOG.addFilter(_SIGNALS_FILTER)  # idempotent: a filter is added once
        self._stop, self._ready, self._error = threading.Event(), threading.Event(), None
        self._thread = threading.Thread(target=self._main, name="bindery-operator", daemon=True)
        self._thread.start()
        ready = await asyncio.to_thread(self._ready.wait, within)
        if self._error is not None:
            raise RuntimeError(f"the operator failed to start: {self._error}") from self._error
        if not ready:
            await self.stop()
            raise TimeoutError(f"the operator did not become ready within {within:g}s")

    async def stop(self, *, within: float = 30.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        await asyncio.to_thread(thread.join, within)
        if thread.is_alive():
            raise TimeoutError(f"the operator did not stop within {within:g}s")

    def _main(self) -> None:
        from bindery.controller.startup.entry import run_operator

        try:
            asyncio.run(
                run_operator(
                    options=self.options, stop_flag=self._stop, ready_flag=self._ready, memo=self.memo
                )
            )
        except BaseException as exc:  # reported to start() or lost with the thread
            self._error = exc
        finally:
            self._ready.set()  # unblock start() if the operator died before it was ready
