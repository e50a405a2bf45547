"""One running profile per ResourceManager: its RM client, its queue, its workers, its probe.

A profile is rebuilt in place when its ResourceManager changes: settings that do not touch the
connection (TTL, backoff, in-flight budget, node check, plugins) swap the frozen `Profile` the
workers read on their next pod; a changed endpoint, token or TLS setting builds a new RM client and
closes the old one once no cycle uses it any more. The queue survives both, so no pod is lost.

A pod can vanish without the watch saying so (Kopf emits no DELETED for a pod deleted while its
watch was down). Like kube-scheduler, which looks the pod up before reporting a failure, a cycle
checks with one GET that its pod still exists before it writes a FailedScheduling event (the
failure path only: the success path still reads nothing); a pod found gone or replaced is dropped
instead of requeued. The runtime's periodic sweep of unbound pods catches the rest.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client as kube

from bindery import tracing
from bindery.config import ResourceManagerConfig
from bindery.controller.gangs import GangCoordinator
from bindery.controller.metrics import Metrics, result_label
from bindery.controller.rmstack import RMStack
from bindery.controller.secrets import RMCredentials
from bindery.controller.unconfirmed import UnconfirmedBind, UnconfirmedBinds
from bindery.controller.watches.bound import BoundPodWatcher
from bindery.kube.reads import read_pod
from bindery.logcontext import log_context
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMError
from bindery.rm.models import Reservation
from bindery.scheduling.cycle import CycleOutcome, schedule_one
from bindery.scheduling.decisions import FailureKind, Outcome
from bindery.scheduling.framework import PluginSet, Ports, Profile, ReservationClient
from bindery.scheduling.nodecheck import NodeCheckMode
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import ConditionWriter, EventSink, PodGone
from bindery.scheduling.queue import BackoffPolicy, QueueClosed, SchedulingQueue
from bindery.scheduling.registry import default_registry
from bindery.scheduling.throttle import EventThrottle
from bindery.typedefs import Logger

#: Pods whose Scheduled event was written, remembered so that it is written once (see _CheckedEvents).
REMEMBERED_SCHEDULED = 10_000
#: how long the existence check before a FailedScheduling event may take
EXISTENCE_CHECK_SECONDS = 5.0


def build_profile(*, config: ResourceManagerConfig, client: ReservationClient) -> Profile:
    """Raises bindery.scheduling.registry.PluginError if a configured plugin cannot be used."""
    return Profile(
        name=config.name,
        scheduler_names=frozenset(config.scheduler_names),
        client=client,
        reservation_ttl_seconds=config.reservation_ttl_seconds,
        node_check=NodeCheckMode(config.node_check),
        backoff_initial_seconds=config.backoff_initial_seconds,
        backoff_max_seconds=config.backoff_max_seconds,
        max_in_flight=config.max_in_flight,
        plugins=plugins_for(config=config),
        volume_bind_timeout_seconds=config.volume_bind_timeout_seconds,
    )


def _backoff(config: ResourceManagerConfig) -> BackoffPolicy:
    return BackoffPolicy(initial=config.backoff_initial_seconds, maximum=config.backoff_max_seconds)


def plugins_for(*, config: ResourceManagerConfig) -> PluginSet:
    if not (config.pre_bind or config.post_bind or config.bind):
        return PluginSet()
    return default_registry.plugin_set(pre_bind=config.pre_bind, post_bind=config.post_bind, bind=config.bind)


class ProfileRunner:
    """Workers that pop pods from the profile's queue and run one scheduling cycle each."""

    def __init__(
        self,
        *,
        config: ResourceManagerConfig,
        client: ResourceManagerClient,
        credentials: RMCredentials,
        ports: Ports,
        api: kube.ApiClient,
        logger: Logger,
        on_released: Callable[[], None],
        on_dropped: Callable[[str], None] = lambda uid: None,
        on_relist: Callable[[], None] = lambda: None,
        holds: Callable[[], bool] = lambda: True,
        namespaces: tuple[str, ...] = (),
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.namespaces = namespaces
        self.metrics = metrics or Metrics()
        self._logger = logger
        self.credentials = credentials
        #: The one RM handle of this profile (measured, fenced by `holds`, releases settled): every
        #: caller gets it, none gets the client inside.
        self.rm = RMStack(
            client=client, metrics=self.metrics, resource_manager=config.name, holds=holds, logger=logger
        )
        self.unconfirmed = UnconfirmedBinds(
            api=api,
            rm=lambda: self.rm,
            logger=logger,
            on_released=self._released_unconfirmed,
            on_committed=self._bound_after_all,
        )
        self.rm.settle_through(self.unconfirmed)
        self.profile = build_profile(config=config, client=self.rm)
        self.queue = SchedulingQueue(max_in_flight=config.max_in_flight, backoff=_backoff(config))
        self.active = False
        self.reachable: bool | None = None
        self.reach_message: str | None = None
        self._gone: set[str] = set()  # pods a failed cycle found gone: dropped when the cycle ends
        self._cycling: set[str] = set()  # UIDs of the pods whose cycle runs now
        #: uid → reservation id: the pod finished or left while its cycle ran; released when it ends
        self._departed: dict[str, str] = {}
        self._ports = dataclasses.replace(
            ports,
            events=_CheckedEvents(inner=ports.events, api=api, gone=self._gone),
            conditions=_NoticedConditions(inner=ports.conditions, gone=self._gone),
        )
        self._api = api
        self._watchers: dict[tuple[str, str | None], asyncio.Task[None]] = {}
        self._logger = logger
        self._on_released = on_released
        self._on_dropped = on_dropped
        self._on_relist = on_relist
        self._throttle = EventThrottle()
        #: Pods of a PodGroup are placed with their group, never through the queue.
        self.gangs = GangCoordinator(
            profile=lambda: self.profile,
            ports=lambda: self._ports,
            rm=lambda: self.rm,
            api=api,
            logger=logger,
            metrics=self.metrics,
            on_released=on_released,
            on_outcome=self._follow_up,
        )

        self._workers: list[asyncio.Task[None]] = []
        self._busy: set[asyncio.Task[Any]] = set()  # workers inside a cycle
        self._retiring = 0  # busy workers to stop once their cycle ends (the budget shrank)
        self._retired_clients: set[ResourceManagerClient] = set()
        self._closing: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start scheduling (workers) and following bound pods; the queue may already hold pods."""
        self.active = True
        self._resize_workers(self.config.max_in_flight)
        self._follow_bound_pods()
        self.gangs.start()

    async def pause(self) -> None:
        """Stop scheduling but keep the queue (leadership lost); in-flight cycles unreserve."""
        self.active = False
        await self.gangs.pause()
        for name in list(self._watchers):
            self._watchers.pop(name).cancel()
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        self._retiring = 0

    async def stop(self) -> None:
        self.queue.close()
        await self.pause()
        await self.unconfirmed.close()
        await self.rm.aclose()
        for task in self._closing:
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        for old in self._retired_clients:
            await old.aclose()
        self._retired_clients.clear()

    def update(
        self,
        *,
        config: ResourceManagerConfig,
        client: ResourceManagerClient | None,
        credentials: RMCredentials | None = None,
    ) -> None:
        """Apply a changed spec; `client` is a new RM client if the connection or credentials changed."""
        if credentials is not None:
            self.credentials = credentials
        if client is not None:
            self._retire(self.rm.use(client), after=2.0 * self.config.reservation_ttl_seconds + 30.0)
            self.reachable, self.reach_message = None, None
        self.config = config
        self.profile = build_profile(config=config, client=self.rm)
        self.queue.reconfigure(max_in_flight=config.max_in_flight, backoff=_backoff(config))
        if self.active:
            self._resize_workers(config.max_in_flight)
            self._follow_bound_pods()

    def _retire(self, old: ResourceManagerClient, *, after: float) -> None:
        """Close a replaced RM client once no cycle can still use it, and not before.

        Cycles already running hold the old client until they end, and no cycle outlives its
        reservation's lease; two leases and a margin later it is closed, so each credential rotation
        does not keep one more connection pool open for the life of the process.
        """
        self._retired_clients.add(old)

        async def close_later() -> None:
            await asyncio.sleep(after)
            self._retired_clients.discard(old)
            await old.aclose()

        task = asyncio.create_task(close_later(), name=f"bindery retired RM client {self.config.name}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _follow_bound_pods(self) -> None:
        """One bound-pod watch per scheduler name (and namespace, if the operator is namespaced)."""
        scopes: tuple[str | None, ...] = self.namespaces or (None,)
        wanted = {(name, namespace) for name in self.config.scheduler_names for namespace in scopes}
        for key in [k for k in self._watchers if k not in wanted]:
            self._watchers.pop(key).cancel()
        for name, namespace in sorted(wanted - set(self._watchers), key=str):
            watcher = BoundPodWatcher(
                api=self._api,
                scheduler_name=name,
                rm=lambda: self.rm,
                logger=self._logger,
                namespace=namespace,
                on_released=self._released_by_departure,
                on_event=self._bound_pod_event,
                on_relist=self._on_relist,
                defer_release=self._defer_departed,
            )
            self._watchers[name, namespace] = asyncio.create_task(
                watcher.run(), name=f"bindery bound pods {name} in {namespace or 'all namespaces'}"
            )

    async def _bound_pod_event(self, event_type: str, pod: Mapping[str, Any]) -> None:
        await self.unconfirmed.observe(event_type=event_type, pod=pod)

    async def _bound_after_all(self, bind: UnconfirmedBind) -> None:
        """An unanswered Binding did bind the pod: report it as the cycle would have (best effort)."""
        pod = bind.pod
        try:
            await self._ports.events.scheduled(pod=pod, node=bind.node, scheduler_name=pod.scheduler_name)
            await self._ports.conditions.pod_scheduled_true(pod=pod)
        except Exception as exc:
            self._logger.warning(f"could not report pod {pod.key} as scheduled to {bind.node}: {exc}")

    async def report_bound(self, reservation: Reservation, pod: Mapping[str, Any]) -> None:
        """Reconciliation committed a reservation the pod's failed cycle had reported as unscheduled."""
        await self._bound_after_all(
            UnconfirmedBind(
                reservation_id=reservation.id, pod=PodInfo.from_body(pod), node=reservation.node, deadline=0.0
            )
        )

    def _released_unconfirmed(self) -> None:
        self.metrics.release(resource_manager=self.config.name, reason="unconfirmed_binding")
        self._on_released()

    def _released_by_departure(self) -> None:
        self.metrics.release(resource_manager=self.config.name, reason="pod_departed")
        self._on_released()

    # -- pods -----------------------------------------------------------------------------------

    def offer(self, pod: PodInfo) -> None:
        if pod.scheduling_group is not None:
            self.gangs.offer(pod)
            return
        self.queue.add(pod)

    def withdraw(self, uid: str) -> None:
        """The pod left (deleted, bound, gated, routed elsewhere): forget everything about it."""
        self.queue.forget(uid)
        self.gangs.withdraw(uid)
        self._throttle.forget(uid)
        self._gone.discard(uid)  # a gang member found gone has no cycle to drop it

    def per_pod_sizes(self) -> dict[str, int]:
        """Entries held per pod, by structure (empty once every pod left; tests and soaks read it)."""
        return {
            "queue": self.queue.footprint(),
            "event_throttle": len(self._throttle),
            "unconfirmed": len(self.unconfirmed),
            "gone": len(self._gone),
            **self.gangs.sizes(),
        }

    # -- readiness ------------------------------------------------------------------------------

    async def probe(self) -> bool:
        """Probe the RM's readiness; returns whether the Reachable state changed."""
        before = (self.reachable, self.reach_message)
        try:
            await self.rm.check_ready()
        except RMError as exc:
            self.reachable, self.reach_message = False, exc.message
        else:
            self.reachable, self.reach_message = True, None
        return before != (self.reachable, self.reach_message)

    # -- workers --------------------------------------------------------------------------------

    def _resize_workers(self, count: int) -> None:
        """Grow, or shrink without cancelling a cycle: idle workers stop now, busy ones after their pod.

        Cancelling a cycle in the middle of its Binding would leave a reservation that may belong to
        a bound pod with nobody to settle it.
        """
        self._workers = [task for task in self._workers if not task.done()]
        staying = len(self._workers) - self._retiring
        if count >= staying:
            kept = min(self._retiring, count - staying)  # un-retire before starting new workers
            self._retiring -= kept
            for _ in range(count - staying - kept):
                self._workers.append(
                    asyncio.create_task(
                        self._work(), name=f"bindery worker {self.config.name}/{len(self._workers)}"
                    )
                )
            return
        surplus = staying - count
        for task in [t for t in self._workers if t not in self._busy][:surplus]:
            task.cancel()
            self._workers.remove(task)
            surplus -= 1
        self._retiring += surplus

    async def _work(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        while True:
            if self._retiring > 0:
                self._retiring -= 1
                return
            try:
                pod = await self.queue.pop()
            except QueueClosed:
                return
            self._busy.add(me)
            try:
                await self._cycle(pod)
            finally:
                self._busy.discard(me)

    async def _cycle(self, pod: PodInfo) -> None:
        """One pod: the scheduling cycle, then its outcome to the queue, the metrics and the settling."""
        with log_context(pod=pod.key, pod_uid=pod.uid, resource_manager=self.config.name):
            if tracing.state.on:
                await self._traced_cycle(pod)
            else:
                await self._cycle_in_context(pod)

    async def _traced_cycle(self, pod: PodInfo) -> None:
        """The cycle as one trace: its root span, the time the pod waited in the queue before it."""
        attempt = self.queue.attempts(pod.uid) + 1
        attributes: dict[str, str | int] = {
            "k8s.namespace.name": pod.namespace,
            "k8s.pod.name": pod.name,
            "k8s.pod.uid": pod.uid,
            "bindery.resource_manager": self.config.name,
            "bindery.scheduler_name": pod.scheduler_name,
            "bindery.attempt": attempt,
        }
        now_ns = time.time_ns()
        ready = self.queue.ready_since(pod.uid)  # the end of its backoff; None on a first attempt
        if ready is not None:
            waited_ns = int(max(self.queue.now() - ready, 0.0) * 1e9)
        else:
            waited_ns = max(now_ns - int(pod.created.timestamp() * 1e9), 0)
        # The attempt's span starts when the pod was due, so the trace shows its wait before it too.
        with tracing.span("Schedule pod", attributes, start_ns=now_ns - waited_ns):
            tracing.record_span(
                "Queue wait", start_ns=now_ns - waited_ns, end_ns=now_ns, attributes=attributes
            )
            await self._cycle_in_context(pod)

    async def _cycle_in_context(self, pod: PodInfo) -> None:
        started = time.perf_counter()
        self._cycling.add(pod.uid)
        try:
            result = await schedule_one(
                pod=pod, profile=self.profile, ports=self._ports, throttle=self._throttle
            )
        except asyncio.CancelledError:  # paused or stopped: the cycle has unreserved; requeue
            self.queue.done(pod.uid, outcome=Outcome.ERROR)
            self._departed.pop(pod.uid, None)  # left to reconciliation: the lease may be lost
            raise
        except Exception:  # a bug in the cycle must not kill the worker
            self._logger.exception(f"scheduling cycle of pod {pod.key} crashed; retrying after backoff")
            self.queue.done(pod.uid, outcome=Outcome.ERROR)
            self._record(pod, Outcome.ERROR, started)
            await self._release_departed(pod)
            return
        finally:
            self._cycling.discard(pod.uid)
        if pod.uid in self._gone and result.outcome is not Outcome.BOUND:
            result = dataclasses.replace(result, outcome=Outcome.DROPPED)  # a ghost: do not requeue
        self._gone.discard(pod.uid)
        self._record(pod, result.outcome, started)
        if tracing.state.on:
            tracing.set_attributes(
                {
                    "bindery.result": result_label(result.outcome),
                    "k8s.node.name": result.node,
                    "bindery.reservation": result.reservation_id,
                }
            )
        self._follow_up(pod, result)
        if result.released:
            self.metrics.release(resource_manager=self.config.name, reason="cycle_failure")
        self.queue.done(pod.uid, outcome=result.outcome, retry_after=result.retry_after)
        if result.outcome is Outcome.DROPPED:
            self._throttle.forget(pod.uid)
            self._on_dropped(pod.uid)  # gone or bound elsewhere, even if the watch missed it
        if result.released:
            self._on_released()
        # After `_follow_up`: an unanswered Binding's reservation is tracked by now, and the release
        # goes through the RM stack, which reads the pod first (finished: released, not committed).
        await self._release_departed(pod)

    def _defer_departed(self, uid: str, reservation_id: str) -> bool:
        """The bound-pod watch saw this pod finish or go: while its cycle runs, the cycle releases.

        Its PostBind commit may not have been sent yet; a release before it would make the commit
        fail (409) and report a failure for a pod that did nothing wrong.
        """
        if uid not in self._cycling:
            return False
        self._departed[uid] = reservation_id
        return True

    async def _release_departed(self, pod: PodInfo) -> None:
        """Release what the bound-pod watch left to this pod's cycle (see `_defer_departed`)."""
        reservation_id = self._departed.pop(pod.uid, None)
        if reservation_id is None:
            return
        try:
            await self.profile.client.release(reservation_id, pod_uid=pod.uid)
        except RMError as exc:
            self._logger.warning(
                f"could not release reservation {reservation_id} of pod {pod.key}, which finished or was "
                f"deleted while it was being scheduled: {exc}; reconciliation releases it"
            )
            return
        self._logger.info(
            f"released reservation {reservation_id}: pod {pod.key} finished or was deleted while it was "
            "being scheduled"
        )
        self._released_by_departure()

    def _follow_up(self, pod: PodInfo, result: CycleOutcome) -> None:
        """A Binding that got no answer leaves a reservation to settle; a bind with it settles it.

        Only the reservation this cycle bound with is forgotten: a cycle that failed before getting
        an earlier unanswered Binding's reservation back did not settle it (its releases go through
        the RM stack), and that Binding may still land.
        """
        unconfirmed = result.failure is not None and result.failure.kind is FailureKind.BIND_UNCONFIRMED
        if unconfirmed and result.reservation_id is not None and result.node is not None:
            self.unconfirmed.track(
                reservation_id=result.reservation_id,
                pod=pod,
                node=result.node,
                ttl_seconds=self.profile.reservation_ttl_seconds,
                expires=result.lease_expires,
            )
        elif result.bound and result.reservation_id is not None:
            self.unconfirmed.forget(result.reservation_id)

    def _record(self, pod: PodInfo, outcome: Outcome, started: float) -> None:
        self.metrics.attempt(
            resource_manager=self.config.name,
            uid=pod.uid,
            outcome=outcome,
            seconds=time.perf_counter() - started,
            attempts=self.queue.attempts(pod.uid) + 1,  # before `done` counts this one
        )


class _CheckedEvents:
    """The event sink of the cycles: a FailedScheduling event is written only for a pod that exists,
    and a Scheduled event once per pod.

    One GET (failure path only; the throttle already let the event through), as kube-scheduler
    looks the pod up in its informer before deciding whether to requeue. A pod gone, or replaced
    under its name, raises PodGone (the cycle treats that as harmless: nobody reads events of a
    pod that does not exist) and is marked for dropping. A failed read does not hold the report back.

    Scheduled: a Binding that got no answer can land while the pod's next cycle runs; then the
    tracker (reading the pod) and the cycle (meeting a 409 naming our node with our reservation)
    both see it bound, in the same instant. The first to report wins; the UIDs reported are
    remembered, bounded (the race is over within a cycle).
    """

    def __init__(self, *, inner: EventSink, api: kube.ApiClient, gone: set[str]) -> None:
        self._inner = inner
        self._core = kube.CoreV1Api(api)
        self._gone = gone
        self._scheduled: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def scheduled(
        self,
        *,
        pod: PodInfo,
        node: str,
        scheduler_name: str,
        timeout: float | None = None,  # noqa: ASYNC109 (the EventSink protocol's bound on the request)
    ) -> None:
        if pod.uid in self._scheduled:
            return  # the other path reported this pod's bind already
        self._scheduled[pod.uid] = None  # before awaiting: the other path may run meanwhile
        while len(self._scheduled) > REMEMBERED_SCHEDULED:
            self._scheduled.popitem(last=False)
        await self._inner.scheduled(pod=pod, node=node, scheduler_name=scheduler_name, timeout=timeout)

    async def failed_scheduling(self, *, pod: PodInfo, message: str, scheduler_name: str) -> None:
        with tracing.span("Event FailedScheduling"):  # a shared no-op unless tracing is on
            try:
                async with asyncio.timeout(EXISTENCE_CHECK_SECONDS):
                    body = await read_pod(core=self._core, namespace=pod.namespace, name=pod.name)
            except Exception:
                body = {"metadata": {"uid": pod.uid}}  # unknown: report as before
            if not _exists(body, uid=pod.uid):
                self._gone.add(pod.uid)
                raise PodGone(f"pod {pod.key} no longer exists (or another pod took its name)")
            await self._inner.failed_scheduling(pod=pod, message=message, scheduler_name=scheduler_name)


class _NoticedConditions:
    """The condition writer of the cycles: a 404 on the PodScheduled patch marks the pod for dropping."""

    def __init__(self, *, inner: ConditionWriter, gone: set[str]) -> None:
        self._inner = inner
        self._gone = gone

    async def pod_scheduled_false(self, *, pod: PodInfo, reason: str, message: str) -> None:
        try:
            await self._inner.pod_scheduled_false(pod=pod, reason=reason, message=message)
        except PodGone:
            self._gone.add(pod.uid)
            raise

    async def pod_scheduled_true(self, *, pod: PodInfo) -> None:
        await self._inner.pod_scheduled_true(pod=pod)


def _exists(body: Mapping[str, Any] | None, *, uid: str) -> bool:
    """Pure: the pod body read (None = not found) is still the pod with this UID.

    A pod bound meanwhile still exists: its failure is reported as usual (a Binding that got no
    answer is one), and the watch reports it leaving.
    """
    return body is not None and (body.get("metadata") or {}).get("uid") == uid
