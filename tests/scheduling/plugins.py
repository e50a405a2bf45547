"""Test plugins, one per extension point, registered programmatically (not via entry points).

Each records its calls into a shared :class:`~tests.scheduling.fakes.Calls` log so a test can see
where in the cycle it ran.
"""

from __future__ import annotations

from bindery.scheduling.framework import CycleContext, Status
from tests.scheduling.fakes import Calls


class RecordingReserve:
    """A Reserve plugin: succeeds (or returns ``status``) and records reserve/unreserve."""

    def __init__(
        self, calls: Calls, *, name: str = "recording-reserve", status: Status | None = None
    ) -> None:
        self.name = name
        self.calls = calls
        self.status = status or Status.success()

    async def reserve(self, *, ctx: CycleContext) -> Status:
        self.calls.record(f"{self.name}.reserve", node=ctx.node)
        return self.status

    async def unreserve(self, *, ctx: CycleContext) -> None:
        self.calls.record(f"{self.name}.unreserve")


class GateKeeper:
    """A PreBind plugin that returns a fixed status (or raises ``error``)."""

    def __init__(
        self,
        calls: Calls,
        *,
        name: str = "gatekeeper",
        status: Status | None = None,
        error: Exception | None = None,
    ) -> None:
        self.name = name
        self.calls = calls
        self.status = status or Status.success()
        self.error = error

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        self.calls.record(f"{self.name}.pre_bind", node=ctx.node)
        if self.error is not None:
            raise self.error
        return self.status


class CustomBinder:
    """A Bind plugin that replaces the default binder (or skips, or fails)."""

    def __init__(self, calls: Calls, *, name: str = "custom-binder", status: Status | None = None) -> None:
        self.name = name
        self.calls = calls
        self.status = status or Status.success()

    async def bind(self, *, ctx: CycleContext) -> Status:
        self.calls.record(
            f"{self.name}.bind", node=ctx.node, reservation=ctx.reservation.id if ctx.reservation else None
        )
        return self.status


class Announcer:
    """A PostBind plugin that records, or raises ``error`` (which must not change the outcome)."""

    def __init__(self, calls: Calls, *, name: str = "announcer", error: Exception | None = None) -> None:
        self.name = name
        self.calls = calls
        self.error = error

    async def post_bind(self, *, ctx: CycleContext) -> None:
        self.calls.record(f"{self.name}.post_bind", node=ctx.node)
        if self.error is not None:
            raise self.error


class EveryPoint:
    """One plugin implementing all four extension points, as kube-scheduler plugins may."""

    name = "every-point"

    async def reserve(self, *, ctx: CycleContext) -> Status:
        return Status.success()

    async def unreserve(self, *, ctx: CycleContext) -> None:
        return None

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        return Status.success()

    async def bind(self, *, ctx: CycleContext) -> Status:
        return Status.skip()

    async def post_bind(self, *, ctx: CycleContext) -> None:
        return None


class EntryPointPlugin:
    """Loaded through a (synthetic) entry point by class: instantiated without arguments."""

    name = "from-entry-point"
    instances = 0

    def __init__(self) -> None:
        type(self).instances += 1

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        return Status.success()
