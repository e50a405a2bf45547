"""A span around every plugin call of a scheduling cycle, when tracing is on (bindery.tracing).

The cycle itself knows nothing of tracing: `schedule_one` passes its plugin chain through
:func:`traced`, which returns the same chain untouched when tracing is off (one attribute read, no
allocation) and otherwise the same plugins, each behind a proxy that opens a span named after the
extension point and the plugin: "Reserve ResourceManagerReservation" (the RM's reservation),
"PreBind NodeCheck", "Bind DefaultBinder", "PostBind ScheduledEvent" (the event), "PostBind
CommitReservation" (the commit), "Unreserve ResourceManagerReservation" (the release). They are
children of the attempt's span, which the caller opens (bindery.controller.attempt).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bindery import tracing
from bindery.scheduling.framework import CycleContext, PluginChain, Status

__all__ = ["traced"]


def traced(chain: PluginChain) -> PluginChain:
    """`chain` with a span around each plugin call when tracing is on; `chain` itself when it is off."""
    if not tracing.state.on:
        return chain
    return dataclasses.replace(
        chain,
        pre_filter=tuple(_Traced(p) for p in chain.pre_filter),
        reserve=tuple(_Traced(p) for p in chain.reserve),
        pre_bind=tuple(_Traced(p) for p in chain.pre_bind),
        bind=tuple(_Traced(p) for p in chain.bind),
        post_bind=tuple(_Traced(p) for p in chain.post_bind),
    )


class _Traced:
    """One plugin behind spans; it answers to every extension point its plugin has."""

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin
        self.name: str = plugin.name

    async def pre_filter(self, *, ctx: CycleContext) -> Status:
        with tracing.span(f"PreFilter {self.name}", _attributes(ctx)):
            return _noted(await self.plugin.pre_filter(ctx=ctx))

    async def reserve(self, *, ctx: CycleContext) -> Status:
        with tracing.span(f"Reserve {self.name}", _attributes(ctx)):
            status = _noted(await self.plugin.reserve(ctx=ctx))
            if ctx.reservation is not None:
                tracing.set_attributes({"bindery.reservation": ctx.reservation.id, "k8s.node.name": ctx.node})
            return status

    async def unreserve(self, *, ctx: CycleContext) -> None:
        with tracing.span(f"Unreserve {self.name}", _attributes(ctx)):
            await self.plugin.unreserve(ctx=ctx)

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        with tracing.span(f"PreBind {self.name}", _attributes(ctx)):
            return _noted(await self.plugin.pre_bind(ctx=ctx))

    async def bind(self, *, ctx: CycleContext) -> Status:
        with tracing.span(f"Bind {self.name}", _attributes(ctx)):
            return _noted(await self.plugin.bind(ctx=ctx))

    async def post_bind(self, *, ctx: CycleContext) -> None:
        with tracing.span(f"PostBind {self.name}", _attributes(ctx)):
            await self.plugin.post_bind(ctx=ctx)


def _attributes(ctx: CycleContext) -> dict[str, str]:
    attributes = {"k8s.pod.uid": ctx.pod.uid, "bindery.resource_manager": ctx.profile.name}
    if ctx.node is not None:
        attributes["k8s.node.name"] = ctx.node
    return attributes


def _noted(status: Status) -> Status:
    """The plugin's verdict on its span (success, unschedulable, error, skip)."""
    tracing.set_attributes({"bindery.status": status.code.name.lower()})
    return status
