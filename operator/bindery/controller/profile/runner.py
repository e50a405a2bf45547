"""One running profile per ResourceManager: its RM client, its queue, its workers, its probe.

A profile is rebuilt in place when its ResourceManager changes: settings that do not touch the
connection (TTL, backoff, in-flight budget, node check, plugins) swap the frozen `Profile` the
workers read on their next pod; a changed endpoint, token or TLS setting builds a new RM client and
closes the old one once no cycle uses it any more. The queue survives both, so no pod is lost.

The runner owns what outlives one pod: the queue, the workers (grown and shrunk without cancelling
a cycle), the RM stack, the releases of its departed pods (a subscription to the operator's one
watch of pods on nodes, while it schedules), the unconfirmed Bindings and the readiness probe.
What one pod's attempt does, from its trace span to the settling of its outcome, is
:mod:`bindery.controller.attempt`'s: a worker pops a pod and hands it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from bindery.apiserver import ApiClient
from bindery.config import ResourceManagerConfig
from bindery.controller.attempt import Attempts
from bindery.controller.metrics import Metrics
from bindery.controller.podgroups import PodGroupCoordinator
from bindery.controller.podgroups.watch import PodGroupWatch
from bindery.controller.preemption import PendingPlan, Preemptions, plan_scope
from bindery.controller.reservations.releases import BoundPodReleases
from bindery.controller.reservations.unconfirmed import UnconfirmedBind, UnconfirmedBinds
from bindery.controller.rmstack import RMStack
from bindery.controller.secrets import RMCredentials
from bindery.controller.watches.bound import BoundPodFeed
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMError, RMUnauthorized
from bindery.rm.models import Reservation
from bindery.scheduling.binding import BindingPool, admit
from bindery.scheduling.events import WakeWindow
from bindery.scheduling.framework import CycleContext, PluginSet, Ports, Profile, ReservationClient, Status
from bindery.scheduling.nodecheck import NodeCheckMode
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.queue import BackoffPolicy, QueueClosed, SchedulingQueue
from bindery.scheduling.registry import default_registry
from bindery.typedefs import Logger

#: How often a profile whose pods wait for the RM to serve asks its ``/readyz``. Contract v1 has
#: no push for readiness: one cheap GET this often stands for every waiting pod's reserve.
READY_POLL_SECONDS = 0.2


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
        api: ApiClient,
        logger: Logger,
        on_released: Callable[[], None],
        on_dropped: Callable[[str], None] = lambda uid: None,
        on_relist: Callable[[], None] = lambda: None,
        holds: Callable[[], bool] = lambda: True,
        namespaces: tuple[str, ...] = (),
        metrics: Metrics | None = None,
        bound_pods: BoundPodFeed | None = None,
        podgroups: PodGroupWatch | None = None,
    ) -> None:
        """`bound_pods`: the watch of pods on nodes this runner subscribes to while it schedules,
        for the releases of its departed pods (None: no releases by watch, only by reconciliation);
        `podgroups`: the watch of PodGroups its pod groups read (None: each look GETs one)."""
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
            on_not_bound=self._forget_assumed,
        )
        self.rm.settle_through(self.unconfirmed)
        self.profile = build_profile(config=config, client=self.rm)
        self.queue = SchedulingQueue(
            max_in_flight=config.max_in_flight,
            max_in_flight_per_namespace=config.max_in_flight_per_namespace,
            backoff=_backoff(config),
        )
        #: The PreBind waits, apart from the queue's in-flight budget (see `enter`).
        self.binding = BindingPool(
            size=config.max_binding_waits, per_namespace=config.max_binding_waits_per_namespace
        )
        self.active = False
        self.reachable: bool | None = None
        self.reach_message: str | None = None
        #: the last probe failed because the RM refused the token (status reason TokenRefused)
        self.token_refused = False
        #: One preemption step for pods and pod groups alike (plans, back-offs, carried-out plans).
        preemptions = Preemptions(
            api=api,
            rm=self.rm,
            logger=logger,
            count=lambda outcome: self.metrics.preemptions.labels(
                resource_manager=config.name, outcome=outcome
            ).inc(),
            placed=ports.placed,
            scope=lambda: plan_scope(
                config=self.config,
                namespace_labels=ports.placed.namespace_labels if ports.placed is not None else None,
            ),
            nodes=ports.nodes.get,
            refused=lambda reason: self.metrics.plans_refused.labels(
                resource_manager=config.name, reason=reason
            ).inc(),
        )
        self.attempts = Attempts(
            profile=lambda: self.profile,
            queue=self.queue,
            ports=ports,
            api=api,
            unconfirmed=self.unconfirmed,
            metrics=self.metrics,
            logger=logger,
            on_released=on_released,
            on_released_departed=self._released_by_departure,
            on_dropped=on_dropped,
            preemptions=preemptions,
            gate=self,
        )
        self._ports = self.attempts.ports
        self._api = api
        self._bound_pods = bound_pods
        #: the subscription while scheduling, and the task handling its events
        self._releases: tuple[BoundPodReleases, asyncio.Task[None]] | None = None
        self._logger = logger
        self._on_released = on_released
        self._on_relist = on_relist
        #: Pods of a PodGroup are placed with their group, never through the queue.
        self.podgroups = PodGroupCoordinator(
            profile=lambda: self.profile,
            ports=lambda: self._ports,
            rm=lambda: self.rm,
            api=api,
            logger=logger,
            metrics=self.metrics,
            on_released=on_released,
            on_outcome=self.attempts.follow_up,
            preemptions=preemptions,
            podgroups=podgroups,
        )

        self._workers: list[asyncio.Task[None]] = []
        self._busy: set[asyncio.Task[Any]] = set()  # workers inside a cycle
        #: former workers whose cycle waits apart (see `enter`); they end with their cycle
        self._binders: set[asyncio.Task[Any]] = set()
        self._retiring = 0  # busy workers to stop once their cycle ends (the budget shrank)
        self._retired_clients: set[ResourceManagerClient] = set()
        self._closing: set[asyncio.Task[None]] = set()
        #: releases at this RM coalesced into wakes (see `capacity_freed`), and the owed one's timer
        self._release_wakes = WakeWindow()
        self._owed_wake: asyncio.TimerHandle | None = None
        #: asks the RM's readiness while pods wait for it to serve (see `_await_rm_serving`)
        self._ready_watch: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start scheduling (workers) and following bound pods; the queue may already hold pods."""
        self.active = True
        self._resize_workers(self.config.max_in_flight)
        self._follow_bound_pods()
        self.podgroups.start()

    async def pause(self) -> None:
        """Stop scheduling but keep the queue (leadership lost); in-flight cycles unreserve."""
        self.active = False
        await self.podgroups.pause()
        self._unfollow_bound_pods()
        tasks = [*self._workers, *self._binders]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        self._binders.clear()
        self._retiring = 0
        await self._stop_ready_watch()

    async def stop(self) -> None:
        self.queue.close()
        await self.pause()
        # After the pause: a cycle unreserving while it drained may have owed a wake.
        if self._owed_wake is not None:
            self._owed_wake.cancel()
            self._owed_wake = None
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
        if client is not None or config != self.config:
            # Another RM, credentials or settings (plugins, node check): a refusal may not hold.
            self.queue.move_all_to_active(reason=f"ResourceManager {config.name} changed")
        if client is not None:
            self._retire(self.rm.use(client), after=2.0 * self.config.reservation_ttl_seconds + 30.0)
            self.reachable, self.reach_message, self.token_refused = None, None, False
        self.config = config
        self.profile = build_profile(config=config, client=self.rm)
        self.queue.reconfigure(
            max_in_flight=config.max_in_flight,
            max_in_flight_per_namespace=config.max_in_flight_per_namespace,
            backoff=_backoff(config),
        )
        self.binding.reconfigure(
            size=config.max_binding_waits, per_namespace=config.max_binding_waits_per_namespace
        )
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
        """Subscribe to the bound pods of the profile's scheduler names, or follow a change of them.

        A new subscription is replayed what the watch knows of those pods, and so is a name added
        to a running one: as the first list of a watch of their own would give them, so that a pod
        that finished meanwhile is released.
        """
        feed = self._bound_pods
        if feed is None:
            return
        names = frozenset(self.config.scheduler_names)
        if self._releases is not None:
            releases = self._releases[0]
            added = names - releases.scheduler_names
            releases.scheduler_names = names
            if added:
                feed.replay(releases, scheduler_names=added)
            return
        releases = BoundPodReleases(
            scheduler_names=names,
            namespaces=self.namespaces,
            rm=lambda: self.rm,
            logger=self._logger,
            on_released=self._released_by_departure,
            on_event=self._bound_pod_event,
            on_relist=self._on_relist,
            defer_release=self.attempts.defer_departed,
        )
        task = asyncio.create_task(releases.run(), name=f"bindery bound pods {self.config.name}")
        self._releases = releases, task
        feed.subscribe(releases)

    def _unfollow_bound_pods(self) -> None:
        """Leadership lost or the profile stopped: no more releases by this runner (a reconcile
        pass runs before it schedules again)."""
        if self._releases is None:
            return
        (releases, task), self._releases = self._releases, None
        if self._bound_pods is not None:
            self._bound_pods.unsubscribe(releases)
        task.cancel()

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

    def _forget_assumed(self, uid: str) -> None:
        """An unconfirmed Binding did not bind the pod: drop the copy its cycle assumed on the node."""
        if self._ports.placed is not None:
            self._ports.placed.forget(uid)

    def _released_by_departure(self) -> None:
        self.metrics.release(resource_manager=self.config.name, reason="pod_departed")
        self._on_released()

    # -- wakes ----------------------------------------------------------------------------------

    def capacity_freed(self) -> None:
        """A reservation at this profile's RM was released: wake its pods refused for room, and its
        pod groups. Releases in a burst wake them once at once, then at most once per window
        (`WakeWindow`): each wake costs a reserve per parked pod, and a tenant releasing in a loop
        would otherwise set every parked pod asking the RM again per release."""
        delay = self._release_wakes.request(now=time.monotonic())
        if delay is None:
            return
        if delay <= 0.0:
            self._wake_refused_for_room()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to wait in (a caller outside one): wake now rather than never
            self._release_wakes.fired(now=time.monotonic())
            self._wake_refused_for_room()
            return
        self._owed_wake = loop.call_later(delay, self._owed_wake_due)

    def _owed_wake_due(self) -> None:
        self._owed_wake = None
        self._release_wakes.fired(now=time.monotonic())
        self._wake_refused_for_room()

    def _wake_refused_for_room(self) -> None:
        self.queue.released(reason="a reservation was released")
        self.podgroups.retry()

    # -- pods -----------------------------------------------------------------------------------

    def offer(self, pod: PodInfo) -> None:
        if pod.scheduling_group is not None:
            self.podgroups.offer(pod)
            return
        self.queue.add(pod)

    def withdraw(self, uid: str) -> None:
        """The pod left (deleted, bound, gated, routed elsewhere): forget everything about it."""
        self.queue.forget(uid)
        self.podgroups.withdraw(uid)
        self.attempts.forget(uid)

    def preemption_backoff(self, uid: str) -> tuple[float, str] | None:
        """For the queue view: the pod's preemption back-off (seconds left, why), or None."""
        return self.attempts.preemption_backoff(uid)

    def preemption_plan(self, uid: str) -> PendingPlan | None:
        """For the queue view: the pod's confirmed preemption plan, or None."""
        return self.attempts.preemption_plan(uid)

    def per_pod_sizes(self) -> dict[str, int]:
        """Entries held per pod, by structure (empty once every pod left; tests and soaks read it)."""
        return {
            "queue": self.queue.footprint(),
            "unconfirmed": len(self.unconfirmed),
            **self.attempts.sizes(),
            **self.podgroups.sizes(),
        }

    # -- readiness ------------------------------------------------------------------------------

    async def probe(self) -> bool:
        """Probe the RM's readiness; returns whether the Reachable state changed."""
        before = (self.reachable, self.reach_message)
        try:
            await self.rm.check_ready()
        except RMError as exc:
            self.reachable, self.reach_message = False, exc.message
            self.token_refused = isinstance(exc, RMUnauthorized)
        else:
            self.reachable, self.reach_message = True, None
            self.token_refused = False
            self.queue.rm_ready()
        return before != (self.reachable, self.reach_message)

    def _watch_rm_readiness(self) -> None:
        """Pods wait for the RM to serve: ask its readiness until it does (one task per profile)."""
        if self._ready_watch is None and self.active and self.queue.waiting_for_rm():
            self._ready_watch = asyncio.create_task(self._await_rm_serving())

    async def _await_rm_serving(self) -> None:
        """Wake the pods the RM refused as unavailable the moment its ``/readyz`` answers 200: an RM
        that starts (its mirrors listing) answers 503 for seconds, and the pods tried meanwhile would
        otherwise wait out their backoff (up to its cap) after it served."""
        try:
            while self.queue.waiting_for_rm():
                if await self.rm.serves():
                    moved = self.queue.rm_ready()
                    self._logger.info(
                        f"ResourceManager {self.config.name!r} serves: {moved} pod(s) tried now"
                    )
                    return
                await asyncio.sleep(READY_POLL_SECONDS)
        finally:
            self._ready_watch = None

    async def _stop_ready_watch(self) -> None:
        task, self._ready_watch = self._ready_watch, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- binding apart (the cycles' BindingGate) --------------------------------------------------

    async def enter(self, *, ctx: CycleContext) -> Status:
        """A cycle's PreBind is about to wait: its slot and its worker go to the next pod.

        The queue stops counting the pod in flight; the worker running the cycle leaves the
        workers (a new one takes its place) and ends with the cycle; the pod then waits for its
        place in the binding pool, queued while the pool is full.
        """
        self.queue.binding(ctx.pod.uid)
        me = asyncio.current_task()
        if me is not None and me in self._workers:
            self._workers.remove(me)
            self._busy.discard(me)
            self._binders.add(me)
            if self.active:
                self._resize_workers(self.config.max_in_flight)
        return await admit(ctx=ctx, pool=self.binding)

    def leave(self, *, ctx: CycleContext) -> None:
        self.binding.release(ctx.pod.uid)

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
                await self.attempts.run(pod)
            finally:
                self._busy.discard(me)
            self._watch_rm_readiness()
            if me in self._binders:  # its cycle waited apart: a new worker took its place
                self._binders.discard(me)
                return
