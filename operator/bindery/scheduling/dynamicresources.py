"""The DynamicResources plugin in Bindery's cycle: PreFilter, Reserve (its undo) and PreBind.

Upstream's extension points, with the allocator replaced by the RM:

* **PreFilter** (upstream ``PreEnqueue`` + ``PreFilter``): the pod's claims are read; a claim not
  created yet, being deleted, not the pod's, reserved for 256 pods, of a missing DeviceClass, or
  being allocated by another cycle makes the pod unschedulable with upstream's message. Claims
  already allocated narrow the pod to their ``nodeSelector``; the rest go to the RM as the
  request's ``devices`` (:data:`DEVICE_REQUESTS`), and are marked in flight so that no other cycle
  asks for them too (upstream's in-flight allocations of the claim tracker).
* **PreBind** (upstream ``bindClaim``): on the RM's node, each claim gets the finalizer, its
  allocation written from the RM's answer, and the pod appended to ``reservedFor``; a claim
  already allocated only gets the pod in ``reservedFor``.
* **Unreserve** (upstream ``Unreserve``): on any later failure the writes are undone, newest first,
  and the in-flight marks dropped; the reservation is then released, as for every other failure.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from bindery.rm.models import ClaimAllocation
from bindery.scheduling.decisions import Failure, FailureKind, Stage
from bindery.scheduling.devices.allocation import allocated_status
from bindery.scheduling.devices.claims import ClaimWait, PodClaim, claim_wait
from bindery.scheduling.devices.plan import DevicePlan, plan_devices
from bindery.scheduling.devicewrites import bind_claim, unbind_claim
from bindery.scheduling.framework import CycleContext, Status
from bindery.scheduling.ports import DeviceAccess, DeviceError

__all__ = ["DEVICE_REQUESTS", "DynamicResources"]

log = logging.getLogger(__name__)

#: ctx.state key: the request's ``devices`` (``list[ClaimDevices]``), read by the RM reservation.
DEVICE_REQUESTS = "DynamicResources.devices"
_STATE = "DynamicResources"
#: Bound on the undo: it also runs when a lost lease pauses the cycles.
UNDO_SECONDS = 2.0


@dataclasses.dataclass(slots=True)
class _CycleDevices:
    plan: DevicePlan
    bodies: dict[str, Mapping[str, Any]]
    classes: dict[str, Mapping[str, Any] | None]
    #: (claim name, allocated by this cycle) of every claim reserved for the pod, oldest first
    written: list[tuple[str, bool]] = dataclasses.field(default_factory=list)


class DynamicResources:
    """PreFilter, Reserve (unreserve only) and PreBind for pods with DRA ``spec.resourceClaims``."""

    name = "DynamicResources"

    def __init__(self) -> None:
        #: claim UID → (UID of the pod whose cycle is allocating it, since when on the profile's
        #: clock); across profiles, as claims are cluster objects. A mark older than the reservation
        #: TTL is ignored: a cycle that ended without PreBind or Unreserve (the pod bound elsewhere)
        #: cannot hold a claim for longer than its reservation could.
        self.in_flight: dict[str, tuple[str, float]] = {}
        #: claims by (outcome, reason): ("allocated", "") and ("reused", "") written at PreBind,
        #: ("waiting", <ClaimWait.reason>) at PreFilter, ("failed", <why>) after; read at scrape time
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    async def pre_filter(self, *, ctx: CycleContext) -> Status:
        claims = ctx.pod.device_claims
        if isinstance(claims, ClaimWait):
            self.counts["waiting", claims.reason] += 1
            return Status.unschedulable(claims.message)
        if not claims:
            return Status.skip()
        access = ctx.ports.devices
        if access is None:
            return Status.error("the pod has DRA resource claims, but no device adapter is configured")
        try:
            read = await self._read(ctx, access, claims)
        except DeviceError as error:
            return Status.error(error.message)
        if isinstance(read, ClaimWait):
            self.counts["waiting", read.reason] += 1
            return Status.unschedulable(read.message)
        bodies, classes = read
        now = ctx.profile.clock()
        others = {
            claim
            for claim, (pod, since) in self.in_flight.items()
            if pod != ctx.pod.uid and now - since < ctx.profile.reservation_ttl_seconds
        }
        plan = plan_devices(
            pod_uid=ctx.pod.uid,
            claims=[(claim, bodies[claim.name]) for claim in claims],
            classes=classes,
            in_flight=others,
        )
        if isinstance(plan, ClaimWait):
            self.counts["waiting", plan.reason] += 1
            return Status.unschedulable(plan.message)
        for terms in plan.node_terms:
            ctx.require_nodes(terms)
        for entry in plan.to_allocate:
            self.in_flight[entry.claim.uid] = (ctx.pod.uid, now)
        if plan.to_allocate:
            ctx.state[DEVICE_REQUESTS] = list(plan.to_allocate)
        ctx.state[_STATE] = _CycleDevices(plan=plan, bodies=bodies, classes=classes)
        return Status.success()

    async def _read(
        self, ctx: CycleContext, access: DeviceAccess, claims: tuple[PodClaim, ...]
    ) -> tuple[dict[str, Mapping[str, Any]], dict[str, Mapping[str, Any] | None]] | ClaimWait:
        bodies: dict[str, Mapping[str, Any]] = {}
        classes: dict[str, Mapping[str, Any] | None] = {}
        for claim in claims:
            body = await access.claim(namespace=ctx.pod.namespace, name=claim.name)
            if (
                wait := claim_wait(pod_uid=ctx.pod.uid, pod_key=ctx.pod.key, claim=claim, body=body)
            ) is not None:
                return wait
            assert body is not None
            bodies[claim.name] = body
            if (body.get("status") or {}).get("allocation"):
                continue
            for request in ((body.get("spec") or {}).get("devices") or {}).get("requests") or ():
                for sub in [request.get("exactly") or {}, *(request.get("firstAvailable") or ())]:
                    name = str(sub.get("deviceClassName") or "")
                    if name and name not in classes:
                        classes[name] = await access.device_class(name)
        return bodies, classes

    async def reserve(self, *, ctx: CycleContext) -> Status:
        return Status.success()

    async def unreserve(self, *, ctx: CycleContext) -> None:
        """Undo this cycle's claim writes, newest first, within UNDO_SECONDS; drop the in-flight marks."""
        state = ctx.state.get(_STATE)
        if not isinstance(state, _CycleDevices):
            return
        self._forget(ctx)
        if ctx.reservation is None:  # the RM found no devices (or no room), or was not asked
            self.counts["failed", "not_reserved"] += len(state.plan.to_allocate)
        elif state.written:
            self.counts["failed", "undone"] += len(state.written)
        access = ctx.ports.devices
        if access is None or not state.written:
            return
        try:
            async with asyncio.timeout(UNDO_SECONDS):
                while state.written:
                    name, allocated_here = state.written[-1]
                    await unbind_claim(
                        access=access,
                        namespace=ctx.pod.namespace,
                        name=name,
                        pod_uid=ctx.pod.uid,
                        allocated_here=allocated_here,
                    )
                    state.written.pop()
        except (DeviceError, TimeoutError) as error:
            log.warning(
                "could not take pod %s out of resource claim(s) %s: %s; the resourceclaim controller "
                "removes it from reservedFor once the pod is gone",
                ctx.pod.key,
                ", ".join(name for name, _ in state.written),
                getattr(error, "message", None) or "timed out",
            )

    def _forget(self, ctx: CycleContext) -> None:
        for claim in [claim for claim, (pod, _) in self.in_flight.items() if pod == ctx.pod.uid]:
            del self.in_flight[claim]

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        state = ctx.state.get(_STATE)
        access = ctx.ports.devices
        if not isinstance(state, _CycleDevices) or access is None:
            return Status.skip()  # no claims
        node = ctx.node
        reservation = ctx.reservation
        if node is None or reservation is None:
            return Status.error("PreBind of devices ran before the reservation")
        answers = {entry.claim.uid: entry for entry in reservation.devices or ()}
        try:
            return await self._write(ctx, access, state, answers, node)
        finally:
            # Written (or failed, and undone by Unreserve): other pods read the claims as they are.
            self._forget(ctx)

    async def _write(
        self,
        ctx: CycleContext,
        access: DeviceAccess,
        state: _CycleDevices,
        answers: Mapping[str, ClaimAllocation],
        node: str,
    ) -> Status:
        try:
            for entry in state.plan.to_allocate:
                answer = answers.get(entry.claim.uid)
                if answer is None:
                    self.counts["failed", "rm_answer_missing"] += 1
                    return Status.failed(
                        self._failure(
                            FailureKind.RM_PROTOCOL_ERROR,
                            f"the RM reserved node {node} without devices for claim "
                            f"{entry.claim.namespace}/{entry.claim.name}, which the request asked for; "
                            "an RM offering devices must answer every claim it was sent",
                        )
                    )
                allocation = allocated_status(
                    claim=state.bodies[entry.claim.name], answer=answer, classes=state.classes, node=node
                )
                state.written.append((entry.claim.name, True))
                await bind_claim(
                    access=access,
                    namespace=ctx.pod.namespace,
                    name=entry.claim.name,
                    pod_name=ctx.pod.name,
                    pod_uid=ctx.pod.uid,
                    allocation=allocation,
                )
                self.counts["allocated", ""] += 1
            for name in state.plan.reused:
                state.written.append((name, False))
                await bind_claim(
                    access=access,
                    namespace=ctx.pod.namespace,
                    name=name,
                    pod_name=ctx.pod.name,
                    pod_uid=ctx.pod.uid,
                    allocation=None,
                )
                self.counts["reused", ""] += 1
        except DeviceError as error:
            self.counts["failed", "write_failed"] += 1
            return Status.failed(self._failure(FailureKind.PLUGIN_ERROR, f"binding claims: {error.message}"))
        return Status.success()

    def _failure(self, kind: FailureKind, message: str) -> Failure:
        return Failure(kind=kind, message=message, stage=Stage.PRE_BIND, plugin=self.name)
