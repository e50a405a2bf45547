"""The extension points, run one way for every caller: a pod's cycle and a pod group's members.

kube-scheduler has one runtime (``framework.go``: ``RunPreBindPlugins``, ``RunReservePluginsUnreserve``
...) that every path calls; the pod-group path here once had its own loop, and it drifted (its own
error messages, no plugin named in a failure, PostBind logging of its own). So each point has one
runner in this module, and both :func:`bindery.scheduling.cycle.schedule_one` and
:mod:`bindery.controller.podgroups` call them:

* :func:`run_pre_filter`, :func:`run_reserve`, :func:`run_pre_bind`: plugins in order; the first
  status other than success or skip ends the point and is returned as a classified
  :class:`~bindery.scheduling.decisions.Failure` (``None``: every plugin passed);
* :func:`run_bind`: plugins in order until one does not skip; every one skipping is a failure;
* :func:`run_unreserve`: every Reserve plugin's ``unreserve`` in reverse order, including those
  whose ``reserve`` never ran; exceptions are logged, never raised;
* :func:`run_post_bind`: informational; exceptions are logged, never raised.

A plugin that raises is treated as if it returned an ``ERROR`` status naming it. What to do about a
failure (release, report, requeue) is :func:`bindery.scheduling.decisions.decide`'s, not the
caller's.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence

from bindery.scheduling.decisions import Failure, FailureKind, Stage, failure_from_exception
from bindery.scheduling.framework import (
    BindPlugin,
    Code,
    CycleContext,
    PostBindPlugin,
    PreBindPlugin,
    PreFilterPlugin,
    ReservePlugin,
    Status,
)

__all__ = [
    "run_bind",
    "run_post_bind",
    "run_pre_bind",
    "run_pre_filter",
    "run_reserve",
    "run_unreserve",
]

log = logging.getLogger(__name__)


async def run_pre_filter(*, ctx: CycleContext, plugins: Sequence[PreFilterPlugin]) -> Failure | None:
    for plugin in plugins:
        status = await _call(
            ctx, Stage.PRE_FILTER, plugin.name, functools.partial(plugin.pre_filter, ctx=ctx)
        )
        if status.code not in (Code.SUCCESS, Code.SKIP):
            return _as_failure(status, Stage.PRE_FILTER, plugin.name)
    return None


async def run_reserve(*, ctx: CycleContext, plugins: Sequence[ReservePlugin]) -> Failure | None:
    for plugin in plugins:
        status = await _call(ctx, Stage.RESERVE, plugin.name, functools.partial(plugin.reserve, ctx=ctx))
        if status.code not in (Code.SUCCESS, Code.SKIP):
            return _as_failure(status, Stage.RESERVE, plugin.name)
    return None


async def run_unreserve(*, ctx: CycleContext, plugins: Sequence[ReservePlugin]) -> None:
    """Every Reserve plugin's unreserve, in reverse order, including those whose reserve never ran."""
    for plugin in reversed(plugins):
        try:
            await plugin.unreserve(ctx=ctx)
        except Exception:
            log.exception("Reserve plugin %r failed to unreserve pod %s", plugin.name, ctx.pod.key)


async def run_pre_bind(*, ctx: CycleContext, plugins: Sequence[PreBindPlugin]) -> Failure | None:
    for plugin in plugins:
        status = await _call(ctx, Stage.PRE_BIND, plugin.name, functools.partial(plugin.pre_bind, ctx=ctx))
        if status.code not in (Code.SUCCESS, Code.SKIP):
            return _as_failure(status, Stage.PRE_BIND, plugin.name)
    return None


async def run_bind(*, ctx: CycleContext, plugins: Sequence[BindPlugin]) -> Failure | None:
    for plugin in plugins:
        status = await _call(ctx, Stage.BIND, plugin.name, functools.partial(plugin.bind, ctx=ctx))
        if status.code is Code.SKIP:
            continue
        return None if status.ok else _as_failure(status, Stage.BIND, plugin.name)
    names = ", ".join(plugin.name for plugin in plugins) or "none configured"
    return Failure(
        kind=FailureKind.PLUGIN_ERROR,
        message=f"every Bind plugin skipped the pod ({names}); configure a Bind plugin that binds it",
        stage=Stage.BIND,
    )


async def run_post_bind(*, ctx: CycleContext, plugins: Sequence[PostBindPlugin]) -> None:
    for plugin in plugins:
        try:
            await plugin.post_bind(ctx=ctx)
        except Exception as error:
            log.warning(
                "PostBind plugin %r failed for pod %s bound to %s (the pod stays bound): %s",
                plugin.name,
                ctx.pod.key,
                ctx.node,
                error,
            )


async def _call(
    ctx: CycleContext, stage: Stage, plugin: str, call: Callable[[], Awaitable[Status]]
) -> Status:
    """Run one plugin call; an exception becomes an ERROR status that names the plugin."""
    try:
        return await call()
    except Exception as error:
        log.exception("%s plugin %r raised for pod %s", stage, plugin, ctx.pod.key)
        return Status.failed(
            failure_from_exception(
                error=error, stage=stage, rm_name=ctx.profile.name, node=ctx.node, plugin=plugin
            )
        )


def _as_failure(status: Status, stage: Stage, plugin: str) -> Failure:
    if status.failure is not None:
        return status.failure
    unschedulable = status.code is Code.UNSCHEDULABLE
    what = "rejected the pod" if unschedulable else "failed"
    return Failure(
        kind=FailureKind.PLUGIN_UNSCHEDULABLE if unschedulable else FailureKind.PLUGIN_ERROR,
        message=f'{stage} plugin "{plugin}" {what}: {status.message or "(no message)"}',
        stage=stage,
        plugin=plugin,
    )
