"""The default plugins: Bindery's built-in binding cycle, expressed as framework plugins.

Making the built-in steps ordinary plugins keeps the cycle itself a short, generic loop over
extension points, and gives third-party plugins the same footing (and the same error handling).
Every default is always enabled; configuration only adds plugins (or replaces the binder).

* Reserve: :class:`ResourceManagerReservation`, the RM reservation (idempotency key = pod UID);
  its ``unreserve`` releases the reservation at most once per cycle.
* PreBind: :class:`PodStillPending` (the pod still exists with the same UID and is unbound, as the
  watch sees it) then :class:`NodeCheck` (the RM's node passes the checks of ``spec.nodeCheck``).
* Bind: :class:`DefaultBinder`, a Binding with the pod UID precondition and the reservation id
  annotation; a 409 that names the chosen node is a lost response, i.e. success.
* PostBind: :class:`ScheduledEvent` (kube-scheduler's ``Scheduled`` event) then
  :class:`CommitReservation`.

Only the Binding and the event write to the apiserver; the PreBind checks read the watch caches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import pydantic

from bindery.rm.errors import RMConflict
from bindery.scheduling.decisions import Failure, FailureKind, Stage, failure_from_exception
from bindery.scheduling.framework import RESERVATION_ANNOTATION, CycleContext, ReservationClient, Status
from bindery.scheduling.nodecheck import check_node
from bindery.scheduling.podspec import reservation_request
from bindery.scheduling.ports import BindConflict, BindError

__all__ = [
    "BUILTIN_NAMES",
    "COMMIT_FAILED",
    "CommitReservation",
    "DefaultBinder",
    "NodeCheck",
    "PodStillPending",
    "ResourceManagerReservation",
    "ScheduledEvent",
]

log = logging.getLogger(__name__)

#: ``ctx.state`` key set by :class:`CommitReservation` when the commit failed.
COMMIT_FAILED = "CommitReservation/failed"
_RELEASED = "ResourceManagerReservation/released"


def _failure(ctx: CycleContext, error: BaseException, stage: Stage, plugin: str) -> Status:
    return Status.failed(
        failure_from_exception(
            error=error, stage=stage, rm_name=ctx.profile.name, node=ctx.node, plugin=plugin
        )
    )


class ResourceManagerReservation:
    """Reserve: ask the RM for capacity and a node; Unreserve: release it (once)."""

    name = "ResourceManagerReservation"

    async def reserve(self, *, ctx: CycleContext) -> Status:
        try:
            request = reservation_request(pod=ctx.pod, ttl_seconds=ctx.profile.reservation_ttl_seconds)
        except (ValueError, pydantic.ValidationError) as error:
            return Status.failed(
                Failure(
                    kind=FailureKind.INVALID_REQUEST,
                    message=f"the pod cannot be expressed as a reservation request of contract v1: {error}",
                    stage=Stage.RESERVE,
                    plugin=self.name,
                )
            )
        try:
            ctx.reservation = await ctx.profile.client.reserve(request)
        except Exception as error:
            return _failure(ctx, error, Stage.RESERVE, self.name)
        return Status.success()

    async def unreserve(self, *, ctx: CycleContext) -> None:
        if ctx.reservation is None or ctx.state.get(_RELEASED):
            return
        ctx.state[_RELEASED] = True  # before awaiting: a second unreserve must not release again
        try:
            await ctx.profile.client.release(ctx.reservation.id, pod_uid=ctx.pod.uid)
        except Exception as error:
            log.warning(
                "could not release reservation %s of pod %s at resource manager %r: %s; "
                "it expires by itself after %d s",
                ctx.reservation.id,
                ctx.pod.key,
                ctx.profile.name,
                error,
                ctx.profile.reservation_ttl_seconds,
            )


class PodStillPending:
    """PreBind: the pod is still there, with the same UID, unbound, not terminating, not gated."""

    name = "PodStillPending"

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        current = ctx.ports.pods.get(ctx.pod.uid)
        if current is not None and current.schedulable:
            return Status.success()
        if current is None:
            why = "the pod was deleted or bound by someone else while its reservation was made"
        else:
            why = "the pod started terminating or got scheduling gates while its reservation was made"
        return Status.failed(
            Failure(kind=FailureKind.POD_GONE, message=why, stage=Stage.PRE_BIND, plugin=self.name)
        )


class NodeCheck:
    """PreBind: the RM's node passes the checks selected by the ResourceManager's ``nodeCheck``."""

    name = "NodeCheck"

    async def pre_bind(self, *, ctx: CycleContext) -> Status:
        node_name = ctx.node
        if node_name is None:
            return Status.error("no reservation was made before PreBind; is the Reserve chain intact?")
        problem = check_node(
            pod=ctx.pod,
            node_name=node_name,
            node=ctx.ports.nodes.get(node_name),
            rm_name=ctx.profile.name,
            mode=ctx.profile.node_check,
        )
        if problem is None:
            return Status.success()
        return Status.failed(
            Failure(kind=FailureKind.NODE_CHECK, message=problem, stage=Stage.PRE_BIND, plugin=self.name)
        )


class DefaultBinder:
    """Bind: POST a Binding with the UID precondition and the reservation id annotation.

    A Binding that got no answer (timeout, connection reset) may or may not have been applied.
    Retrying it is safe: the UID precondition keeps it from binding a replacement pod, and if the
    first attempt landed the retry gets a 409 naming our node, which is success.  If every attempt
    goes unanswered the outcome stays unknown, and the reservation is *kept* (see
    ``FailureKind.BIND_UNCONFIRMED``) until the pod is seen bound (commit), gone or bound elsewhere
    (release), or scheduled again (its next cycle reuses it): releasing the capacity of a pod that
    may be running there is worse than holding unused capacity a little longer.
    """

    name = "DefaultBinder"

    def __init__(
        self,
        *,
        retry_delays: Sequence[float] = (0.2, 1.0),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._retry_delays = tuple(retry_delays)
        self._sleep = sleep

    async def bind(self, *, ctx: CycleContext) -> Status:
        if ctx.reservation is None:
            return Status.error("no reservation was made before Bind; is the Reserve chain intact?")
        node = ctx.reservation.node
        annotations = {RESERVATION_ANNOTATION: ctx.reservation.id}
        for delay in (*self._retry_delays, None):
            try:
                await ctx.ports.binder.bind(pod=ctx.pod, node=node, annotations=annotations)
            except BindConflict as conflict:
                if conflict.current_node == node:
                    log.info("pod %s was already bound to %s (a lost response): success", ctx.pod.key, node)
                    return Status.success()
                return _failure(ctx, conflict, Stage.BIND, self.name)
            except BindError as error:
                if error.status is not None or delay is None:
                    return _failure(ctx, error, Stage.BIND, self.name)
                log.info("binding pod %s got no answer (%s); retrying in %g s", ctx.pod.key, error, delay)
                await self._sleep(delay)
            except Exception as error:
                return _failure(ctx, error, Stage.BIND, self.name)
            else:
                return Status.success()
        raise AssertionError("unreachable: the last attempt always returns")


class ScheduledEvent:
    """PostBind: the ``Scheduled`` event, exactly as kube-scheduler writes it."""

    name = "ScheduledEvent"

    async def post_bind(self, *, ctx: CycleContext) -> None:
        if ctx.node is not None:
            await ctx.ports.events.scheduled(pod=ctx.pod, node=ctx.node, scheduler_name=ctx.scheduler_name)


class CommitReservation:
    """PostBind: turn the reservation into an allocation so it no longer expires.

    The pod is bound by now, so a failed commit cannot fail the cycle; but an uncommitted
    reservation expires after its TTL and the RM would then hand the pod's capacity to another
    pod.  So a failed commit is retried in the background (by default after 1, 2, 4, 8 and 16 s,
    only while the reservation has not expired), and given up loudly.
    """

    name = "CommitReservation"

    def __init__(
        self,
        *,
        retry_delays: Sequence[float] = (1.0, 2.0, 4.0, 8.0, 16.0),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._retry_delays = tuple(retry_delays)
        self._sleep = sleep
        self._retries: set[asyncio.Task[bool]] = set()

    async def post_bind(self, *, ctx: CycleContext) -> None:
        if ctx.reservation is None:
            return
        try:
            await ctx.profile.client.commit(ctx.reservation.id, pod_uid=ctx.pod.uid)
        except Exception as error:
            ctx.state[COMMIT_FAILED] = True
            if isinstance(error, RMConflict):  # already released or expired: retrying cannot help
                raise
            retry = asyncio.create_task(
                self.retry_commit(
                    client=ctx.profile.client,
                    reservation_id=ctx.reservation.id,
                    pod=ctx.pod.key,
                    pod_uid=ctx.pod.uid,
                    ttl_seconds=ctx.profile.reservation_ttl_seconds,
                ),
                name=f"commit {ctx.reservation.id}",
            )
            self._retries.add(retry)
            retry.add_done_callback(self._retries.discard)
            raise

    async def retry_commit(
        self,
        *,
        client: ReservationClient,
        reservation_id: str,
        pod: str,
        ttl_seconds: float,
        pod_uid: str | None = None,
    ) -> bool:
        """Retry a failed commit while the reservation lives; returns whether it was committed."""
        waited = 0.0
        for delay in self._retry_delays:
            waited += delay
            if waited >= ttl_seconds:
                break
            await self._sleep(delay)
            try:
                await client.commit(reservation_id, pod_uid=pod_uid)
            except RMConflict as error:  # released or expired meanwhile: retrying cannot help
                log.error(
                    "reservation %s of bound pod %s can no longer be committed: %s",
                    reservation_id,
                    pod,
                    error,
                )
                return False
            except Exception as error:
                log.warning(
                    "committing reservation %s of bound pod %s failed again: %s", reservation_id, pod, error
                )
                continue
            log.info("committed reservation %s of bound pod %s after a retry", reservation_id, pod)
            return True
        log.error(
            "gave up committing reservation %s of bound pod %s: it expires after %g s and the resource "
            "manager may then place other pods on that pod's capacity; check the resource manager",
            reservation_id,
            pod,
            ttl_seconds,
        )
        return False


#: Names that cannot be used for third-party plugins (they are always enabled).
BUILTIN_NAMES: frozenset[str] = frozenset(
    {
        ResourceManagerReservation.name,
        PodStillPending.name,
        NodeCheck.name,
        DefaultBinder.name,
        ScheduledEvent.name,
        CommitReservation.name,
    }
)
