"""Per-process operator state: the clients and ports every part shares, and what starts and stops.

The runtime builds the apiserver client, the ports the scheduling cycles write through (Binding,
events, conditions, volumes; the Binding fenced by the leader Lease under leader election), the
metrics server, and starts the watches (Nodes, unbound pods, pods on nodes, namespaces, Services),
the sweep and the election; `close` stops them in turn. No ResourceManager's profile waits for a
watch to list before it starts (credentials, RM client, probe, status); it schedules once the
Nodes are listed (`Environment.waiting_for`). The pods themselves (the map of unbound pods, their
routing, the sweep) are :class:`bindery.controller.profile.pending.PendingPods`'.

ResourceManager events re-run one `_reconfigure` under a lock: parse every known object, decide
routing (contested names are served by nobody), and hand each object's spec to its own
`ResourceManagerSupervisor` (bindery.controller.profile.supervisor), which builds, runs, retries and
reports its profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import tempfile
import time
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from bindery.adapters import (
    KubeBinder,
    KubeConditionWriter,
    KubeDevices,
    KubeEventSink,
    KubeVolumes,
    NodeCache,
    PlacedPodCache,
    UnboundPods,
    WriteCounter,
)
from bindery.adapters.access import AccessReviewer
from bindery.adapters.identity import cluster_identity
from bindery.apiserver import ApiClient, ApiError, client_for
from bindery.apiserver.api import response as k8s_response
from bindery.apiserver.pool import ConnectionPool
from bindery.clock import ClockWatch
from bindery.config import (
    ConfigError,
    ResourceManagerConfig,
    parse_resource_manager,
    route_scheduler_names,
)
from bindery.controller.leadership.fence import FencedBinder
from bindery.controller.leadership.rules import LeaseTiming, hold_back_seconds, lease_name_for
from bindery.controller.leadership.term import Leadership
from bindery.controller.metrics import (
    LeaderState,
    Metrics,
    MetricsServer,
    debug_queue_placement,
    is_loopback,
    parse_address,
)
from bindery.controller.podgroups.watch import PodGroupWatch
from bindery.controller.profile.pending import PendingPods
from bindery.controller.profile.runner import ProfileRunner
from bindery.controller.profile.supervisor import (
    DEFAULT_RECONCILE_INTERVAL,
    Environment,
    Reconcile,
    ResourceManagerSupervisor,
)
from bindery.controller.queueview import QueueView
from bindery.controller.reservations.reconcile import Reconciler
from bindery.controller.startup.connection import (
    connection_info,
    load_configuration,
    resolve_environment_once,
)
from bindery.controller.startup.options import OperatorOptions
from bindery.controller.watches.namespaces import NamespaceLabels
from bindery.controller.watches.nodes import NodeWatcher
from bindery.controller.watches.placed import PlacedPodWatcher
from bindery.controller.watches.services import ServiceSelectors
from bindery.controller.watches.unbound import UnboundPodWatcher
from bindery.scheduling.cycle import DEVICES
from bindery.scheduling.framework import Ports
from bindery.typedefs import Logger

USER_AGENT = "bindery"
#: How often the apiserver's clock is compared with this host's (one GET /version), and its bound.
APISERVER_CLOCK_SECONDS = 60.0
CLOCK_PROBE_TIMEOUT_SECONDS = 10.0


class Runtime:
    def __init__(self, *, options: OperatorOptions, logger: Logger) -> None:
        self.options = options
        self.logger = logger
        self.cluster_id: str | None = None  #: read once at start (bindery.adapters.identity)
        self.writes = WriteCounter()
        self.metrics = Metrics(
            writes=self.writes,
            queues=lambda: {name: r.queue.stats() for name, r in self.runners.items()},
            per_pod=self.per_pod_sizes,
            breakers=lambda: {name: r.rm.breaker_state for name, r in self.runners.items()},
            leader=self._leader_state,
            clocks=self._clock_skews,
            devices=lambda: DEVICES.counts,
        )
        #: the apiserver's clock against this host's (bindery.clock), probed every APISERVER_CLOCK_SECONDS
        self.apiserver_clock = ClockWatch(
            peer="the apiserver",
            consequence=(
                "Bindery writes event and condition times with this host's clock and compares pod "
                "creation times (the apiserver's) with it: `bindery audit` misjudges how long pods "
                "have been pending, and events look out of order beside the cluster's."
            ),
            logger=logger,
        )
        self._clock_task: asyncio.Task[None] | None = None
        self.metrics_server: MetricsServer | None = None
        self.debug_server: MetricsServer | None = None  # /debug/queue on its own (options.debug_address)
        #: Who may read /debug/queue (and /metrics with options.metrics_auth): the apiserver decides.
        self.access = AccessReviewer(api=lambda: self._api)
        self._pending: PendingPods | None = None
        self.bodies: dict[str, Mapping[str, Any]] = {}
        self.supervisors: dict[str, ResourceManagerSupervisor] = {}
        self._api: ApiClient | None = None
        self._ports: Ports | None = None
        self._events: KubeEventSink | None = None
        self._binder: KubeBinder | None = None
        self._conditions: KubeConditionWriter | None = None
        self._lock = asyncio.Lock()
        self._leading = not options.leader_election  # without election this replica always leads
        self._leadership: Leadership | None = None
        self._lease_timing = LeaseTiming(
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
        )
        #: a Lease per ResourceManager (`--lease-per-resource-manager`): each profile is led by the
        #: replica holding its Lease, fenced by it alone (`_lease_for`)
        self._per_rm_leases = options.leader_election and options.lease_per_resource_manager
        self._leases: dict[str, Leadership] = {}
        self._lease_claims = asyncio.Lock()  # created in the loop's thread before it runs: fine on 3.10+
        if options.leader_election and not self._per_rm_leases:
            # controller/leadership/ owns the Lease; _set_leading is all it calls
            self._leadership = Leadership(
                namespace=options.lease_namespace,
                name=options.lease_name,
                hostname=options.hostname,
                timing=self._lease_timing,
                logger=logger,
                on_started=lambda: self._set_leading(True),
                on_stopped=lambda: self._set_leading(False),
            )
        self._env: Environment | None = None
        self._sweep_task: asyncio.Task[None] | None = None
        self._unbound_task: asyncio.Task[None] | None = None
        self.unbound: UnboundPodWatcher | None = None
        #: namespace labels, watched once a ResourceManager has a spec.namespaceSelector
        self.namespace_labels: NamespaceLabels | None = None
        self._namespaces_task: asyncio.Task[None] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        #: pods on nodes, for the inter-pod rules (bindery.scheduling.placementrules)
        self.placed: PlacedPodCache | None = None
        #: every Node, from the node watch (profiles schedule once it listed them all)
        self.nodes: NodeCache | None = None
        self.node_watch: NodeWatcher | None = None
        self._nodes_task: asyncio.Task[None] | None = None
        self._placed_task: asyncio.Task[None] | None = None
        self.placed_watch: PlacedPodWatcher | None = None
        self.podgroup_watch: PodGroupWatch | None = None
        self._services_task: asyncio.Task[None] | None = None
        self.services: ServiceSelectors | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        configuration = await load_configuration(kubeconfig=self.options.kubeconfig)
        # Sized again whenever the ResourceManagers change (_size_pool): watches + maxInFlight.
        configuration.connection_pool_maxsize = ConnectionPool().size
        self._api = client_for(configuration)
        self._api.user_agent = USER_AGENT  # names Bindery in managedFields and audit logs
        resolve_environment_once(api=self._api)
        # Once: reservations carry it, so it must not change while this process runs.
        self.cluster_id = await cluster_identity(self._api, configured=self.options.cluster_id)
        self.logger.info(f"cluster id {self.cluster_id!r} (sent to resource managers of contract v1.2)")
        self._events = KubeEventSink(api=self._api, counter=self.writes, hostname=self.options.hostname)
        self._conditions = KubeConditionWriter(api=self._api, counter=self.writes)
        self._binder = KubeBinder(api=self._api, counter=self.writes)
        self._pending = PendingPods(
            api=self._api,
            binder=self._binder,
            events=self._events,
            conditions=self._conditions,
            runners=lambda: self.runners,
            leading=lambda: self.leading,
            sweep_interval=self._sweep_interval,
            metrics=self.metrics,
            logger=self.logger,
            namespaces=self.options.namespaces,
        )
        nodes = self.nodes = NodeCache()
        self.node_watch = NodeWatcher(
            api=self._api,
            cache=nodes,
            on_event=lambda event_type, body: self.pending.on_node_event(event_type=event_type, body=body),
            on_synced=self._nodes_synced,
            logger=self.logger,
            watch_seconds=self.options.watch_timeout,
        )
        self._nodes_task = asyncio.create_task(self.node_watch.run(), name="bindery node watch")
        self.services = ServiceSelectors(
            api=self._api,
            logger=self.logger,
            namespaces=self.options.namespaces,
            watch_seconds=self.options.watch_timeout,
        )
        self._services_task = asyncio.create_task(self.services.run(), name="bindery service selectors")
        self.placed = PlacedPodCache(
            nodes=nodes.all,
            namespace_labels=self._namespace_labels,
            service_selectors=self.services.selectors,
            synced=False,
            namespaces_synced=False,
        )
        self.placed.on_change = self._pending.on_placed_change
        self._watch_namespaces()  # cycles wait for its first list too (wait_synced)
        self._pending.forget_placed = self.placed.forget
        # The one watch of pods on nodes: the cache's, and the runners' (releases) while they lead.
        self.placed_watch = PlacedPodWatcher(
            api=self._api,
            cache=self.placed,
            logger=self.logger,
            namespaces=self.options.namespaces,
            watch_seconds=self.options.watch_timeout,
        )
        self._placed_task = asyncio.create_task(self.placed_watch.run(), name="bindery placed-pod watch")
        # Started by the first pod group a profile sees (a cluster without any is never asked).
        self.podgroup_watch = PodGroupWatch(
            api=self._api,
            logger=self.logger,
            namespaces=self.options.namespaces,
            watch_seconds=self.options.watch_timeout,
            on_change=self._podgroup_changed,
        )
        self._ports = Ports(
            nodes=nodes,
            pods=self.pods,
            # fenced per profile with a Lease per ResourceManager (_supervisor_with_lease)
            binder=self._binder if self._leadership is None else self._fenced_binder(self._binder),
            events=self._events,
            conditions=self._conditions,
            volumes=KubeVolumes(api=self._api, counter=self.writes),
            devices=KubeDevices(api=self._api, counter=self.writes),
            placed=self.placed,
        )
        await self._serve_metrics()
        self._env = Environment(
            api=self._api,
            ports=self._ports,
            logger=self.logger,
            metrics=self.metrics,
            namespaces=self.options.namespaces,
            probe_interval=self.options.probe_interval,
            state_dir=self._state_dir,
            reconciler=self._reconciler,
            on_released=self.pending.released,
            on_dropped=self.pending.drop,
            on_runner=self.pending.reoffer_all,
            holds=self._leadership.holds if self._leadership is not None else lambda: True,
            cluster_id=self.cluster_id,
            bound_pods=self.placed_watch,
            podgroups=self.podgroup_watch,
            waiting_for=lambda: None if nodes.synced else "the list of Nodes",
        )
        self._sweep_task = asyncio.create_task(self.pending.sweep_forever(), name="bindery unbound-pod sweep")
        self._clock_task = asyncio.create_task(self._follow_apiserver_clock(), name="bindery apiserver clock")
        self.unbound = UnboundPodWatcher(
            api=self._api,
            namespaces=self.options.namespaces,
            on_event=lambda event_type, body: self.pending.on_pod_event(event_type=event_type, body=body),
            logger=self.logger,
            watch_seconds=self.options.watch_timeout,
        )
        self.unbound.follow(self.pending.claimed())
        self._unbound_task = asyncio.create_task(self.unbound.run(), name="bindery unbound-pod watch")
        if self._leadership is not None:
            self._leadership.start(api=self._api)

    async def _serve_metrics(self) -> None:
        """/metrics, and the queue views where `debug_queue_placement` allows them (never on an
        address reachable from other hosts unless given explicitly for them)."""
        options = self.options
        placement = debug_queue_placement(
            metrics_address=options.metrics_address, debug_address=options.debug_address
        )
        queue = QueueView(
            runners=lambda: self.runners,
            pods=self.pods,
            leading=lambda: self.leading,
            served=lambda name: name in self.pending.routing.served,
        )
        if options.metrics_address is not None:
            host, port = parse_address(options.metrics_address)
            self.metrics_server = MetricsServer(
                metrics=self.metrics,
                host=host,
                port=port,
                queue=queue if placement == "metrics" else None,
                access=self.access,
                protect_metrics=options.metrics_auth,
            )
            await self.metrics_server.start()
            where = {
                "metrics": "; the scheduling queues, read-only, at /debug/queue (bearer token required)",
                "own": "",
                "none": (
                    "; the scheduling queues (/debug/queue) are not served on this non-loopback address: "
                    "pass --debug-addr 127.0.0.1:PORT to read them locally or by kubectl port-forward"
                ),
            }[placement]
            guarded = " (bearer token required)" if options.metrics_auth else ""
            self.logger.info(
                f"serving Prometheus metrics at http://{host}:{self.metrics_server.port}/metrics{guarded}{where}"
            )
        if options.debug_address is not None:
            host, port = parse_address(options.debug_address, what="debug address")
            self.debug_server = MetricsServer(
                metrics=self.metrics,
                host=host,
                port=port,
                queue=queue,
                serve_metrics=False,
                access=self.access,
            )
            await self.debug_server.start()
            exposed = "" if is_loopback(host) else " (reachable from other hosts)"
            self.logger.info(
                f"serving the scheduling queues, read-only, at http://{host}:{self.debug_server.port}"
                f"/debug/queue{exposed}, to bearer tokens allowed get on it (TokenReview, "
                "SubjectAccessReview)"
            )

    async def connection_info(self) -> kopf.ConnectionInfo:
        # Reloaded on every login so rotated in-cluster tokens and kubeconfig edits are picked up.
        configuration = await load_configuration(kubeconfig=self.options.kubeconfig)
        return connection_info(configuration=configuration)

    async def close(self) -> None:
        if self._leadership is not None:
            await self._leadership.close()
        for name in list(self._leases):  # each pauses its profile and hands its Lease over at once
            await self._leases.pop(name).close()
        for task in (
            self._nodes_task,
            self._unbound_task,
            self._sweep_task,
            self._namespaces_task,
            self._placed_task,
            self._services_task,
            self._clock_task,
        ):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.podgroup_watch is not None:
            await self.podgroup_watch.close()
        for supervisor in list(self.supervisors.values()):
            await supervisor.close()
        self.supervisors.clear()
        for server in (self.metrics_server, self.debug_server):
            if server is not None:
                await server.stop()
        if self._api is not None:
            await self._api.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _leader_state(self) -> LeaderState | None:
        if self._per_rm_leases:
            renewals: dict[str, int] = {}
            for lease in list(self._leases.values()):
                for outcome, count in lease.renewals.items():
                    renewals[outcome] = renewals.get(outcome, 0) + count
            return LeaderState(leading=self.leading, renewals=renewals, profiles=self._profiles_led())
        if self._leadership is None:
            return None
        return LeaderState(leading=self._leading, renewals=dict(self._leadership.renewals))

    def _profiles_led(self) -> int:
        """How many ResourceManagers' profiles this replica leads now (a Lease per ResourceManager)."""
        return sum(1 for lease in list(self._leases.values()) if lease.holds())

    @property
    def api(self) -> ApiClient:
        assert self._api is not None, "Runtime.start() was not called"
        return self._api

    @property
    def pending(self) -> PendingPods:
        """The unbound pods, their routing and the sweep (built by `start`)."""
        assert self._pending is not None, "Runtime.start() was not called"
        return self._pending

    @property
    def pods(self) -> UnboundPods:
        """The remembered unbound pods (the scheduling ports' PodLookup; tests read it)."""
        return self.pending.pods

    @property
    def runners(self) -> dict[str, ProfileRunner]:
        """The running profiles by ResourceManager name (a supervisor may have none yet)."""
        return {name: s.runner for name, s in list(self.supervisors.items()) if s.runner is not None}

    def per_pod_sizes(self) -> dict[str, int]:
        """Entries held per pod, by structure: all 0 once every pod left (tests and soaks read it).

        Read-only; safe to call from another thread (it only takes sizes).
        """
        sizes = self._pending.sizes() if self._pending is not None else {}
        for name, runner in sorted(self.runners.items()):
            for structure, size in runner.per_pod_sizes().items():
                sizes[f"{name}/{structure}"] = size
        return sizes

    def _sweep_interval(self) -> float:
        """How often the pending pods are swept: the shortest reconcile interval of the ResourceManagers."""
        configs = [s.config for s in self.supervisors.values() if s.config is not None]
        return min((c.reconcile_interval_seconds for c in configs), default=DEFAULT_RECONCILE_INTERVAL)

    # -- resource managers ----------------------------------------------------------------------

    async def on_resource_manager_event(self, *, event_type: str | None, body: Mapping[str, Any]) -> None:
        name = str((body.get("metadata") or {}).get("name") or "")
        if not name:
            return
        async with self._lock:
            if event_type == "DELETED":
                self.bodies.pop(name, None)
            else:
                self.bodies[name] = body
            await self._reconfigure()

    async def _reconfigure(self) -> None:
        """Route the scheduler names anew and hand each supervisor its object's spec and conflicts."""
        configs, errors = self._parse_all()
        pending = self.pending
        before = pending.routing
        pending.routing = route_scheduler_names(configs=configs.values())
        if pending.routing.selectors:
            self._watch_namespaces()
        if self.unbound is not None:
            self.unbound.follow(pending.claimed())
        for name in [n for n in self.supervisors if n not in self.bodies]:
            try:
                lease = self._leases.pop(name, None)
                if lease is not None:  # pauses the profile, then hands the Lease over
                    await lease.close()
                await self.supervisors.pop(name).close()
            except Exception as exc:  # never into the Kopf handler: the object is gone either way
                self.logger.warning(f"stopping the profile of deleted ResourceManager {name!r} failed: {exc}")
        assert self._env is not None, "Runtime.start() was not called"
        for name, body in self.bodies.items():
            supervisor = self.supervisors.get(name)
            if supervisor is None:
                if self._per_rm_leases:
                    supervisor = self._supervisor_with_lease(name=name, env=self._env)
                else:
                    supervisor = ResourceManagerSupervisor(name=name, env=self._env, leading=self._leading)
                self.supervisors[name] = supervisor
                supervisor.start()
                if name in self._leases:
                    self._leases[name].start(api=self.api)
            supervisor.update(
                config=configs.get(name),
                generation=int((body.get("metadata") or {}).get("generation") or 0),
                config_error=errors.get(name),
                conflicts=pending.routing.conflicts_of(rm_name=name),
                status=body.get("status") or {},
            )
        if (
            dict(before.served) != dict(pending.routing.served)
            or set(before.contested) != set(pending.routing.contested)
            or dict(before.selectors) != dict(pending.routing.selectors)
        ):
            pending.reoffer_all()
        self._size_pool(configs.values())

    def _nodes_synced(self) -> None:
        """Every Node is known: the profiles waiting for them start scheduling."""
        for supervisor in self.supervisors.values():
            supervisor.poke()

    def _podgroup_changed(self, namespace: str, name: str) -> None:
        for runner in self.runners.values():
            runner.podgroups.changed(namespace=namespace, name=name)

    def _clock_skews(self) -> dict[str, float | None]:
        last = self.apiserver_clock.last
        skews: dict[str, float | None] = {"apiserver": last.seconds if last is not None else None}
        return skews | {f"rm/{name}": runner.rm.clock_skew for name, runner in self.runners.items()}

    async def _follow_apiserver_clock(self) -> None:
        """Every APISERVER_CLOCK_SECONDS, one `GET /version` (readable by any identity) for its Date."""
        while True:
            sent_at = time.time()
            try:
                async with k8s_response(
                    self.api, "GET", "/version", request_timeout=CLOCK_PROBE_TIMEOUT_SECONDS
                ) as answer:
                    self.apiserver_clock.observe(
                        answer.headers.get("Date"), sent_at=sent_at, received_at=time.time()
                    )
            except ApiError as exc:  # the watches say loudly when the apiserver is unreachable
                self.logger.debug(f"could not read the apiserver's clock: {exc}")
            await asyncio.sleep(APISERVER_CLOCK_SECONDS)

    def connection_pool(self, configs: Iterable[ResourceManagerConfig]) -> ConnectionPool:
        """What the apiserver connection pool is for now: per scope (all namespaces, or each of
        the operator's), a watch of unbound pods per claimed name, the namespace-label watch, the
        node watch, the watch of pods on nodes (inter-pod rules, and every profile's releases), the Service
        watch and the PodGroup watch (counted before it starts: it starts with the first pod
        group), and the cycles every ResourceManager may have in flight."""
        pending = self.pending
        scopes = max(len(self.options.namespaces), 1)
        return ConnectionPool(
            watches=scopes * len(pending.claimed())
            + (1 if self._namespaces_task is not None else 0)
            + (scopes if self._placed_task is not None else 0)
            + (scopes if self._services_task is not None else 0)
            + (1 if self._nodes_task is not None else 0)
            + (scopes if self.podgroup_watch is not None else 0),
            in_flight=sum(config.max_in_flight for config in configs),
        )

    def _size_pool(self, configs: Iterable[ResourceManagerConfig]) -> None:
        pool = self.connection_pool(configs)
        before = pool.apply(self.api)
        if before != pool.size:
            self.logger.info(
                f"apiserver connection pool: {before} -> {pool.size} ({pool.watches} watches, "
                f"{pool.in_flight} cycles in flight, {pool.headroom} for other requests)"
            )

    def _namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """For pod affinity terms with a namespaceSelector: the namespace watch, started on first use."""
        if self.namespace_labels is None and self._env is not None:
            self._watch_namespaces()
        return self.namespace_labels.labels(namespace) if self.namespace_labels is not None else None

    def _watch_namespaces(self) -> None:
        """Start following namespace labels (once): from start, for the inter-pod rules' namespaceSelector
        terms (placed pods count as synced once it listed), and for ResourceManagers' selectors."""
        if self._namespaces_task is not None:
            return
        pending = self.pending
        placed = self.placed

        def synced() -> None:
            if placed is not None:
                placed.mark_namespaces_synced()
            pending.reoffer_all()

        def relabelled(name: str) -> None:
            pending.reoffer_all(name)
            pending.on_namespace_relabelled(name)

        labels = NamespaceLabels(
            api=self.api,
            on_change=relabelled,
            on_synced=synced,
            logger=self.logger,
            watch_seconds=self.options.watch_timeout,
        )
        self.namespace_labels = labels
        pending.namespace_labels = labels.labels
        self._namespaces_task = asyncio.create_task(labels.run(), name="bindery namespace labels")

    def _parse_all(self) -> tuple[dict[str, ResourceManagerConfig], dict[str, str]]:
        configs: dict[str, ResourceManagerConfig] = {}
        errors: dict[str, str] = {}
        for name, body in self.bodies.items():
            try:
                configs[name] = parse_resource_manager(body=body)
            except ConfigError as exc:
                errors[name] = str(exc)
        return configs, errors

    def _reconciler(self, runner: ProfileRunner) -> Reconcile:
        """The reconciliation of one runner's reservations (its supervisor decides when it runs)."""
        return Reconciler(
            resource_manager=runner.config.name,
            rm=lambda: runner.rm,
            api=self.api,
            scheduler_names=lambda: runner.config.scheduler_names,
            logger=self.logger,
            namespaces=self.options.namespaces,
            metrics=self.metrics,
            on_released=lambda: self.pending.released(runner.config.name),
            on_reported_unbound=runner.report_bound,
            events=self._events,  # counted with the operator's other writes
            on_revoked=lambda: runner.config.on_revoked,
            cluster_id=self.cluster_id,
        )

    def _fenced_binder(self, binder: KubeBinder, *, leadership: Leadership | None = None) -> FencedBinder:
        leadership = leadership or self._leadership
        assert leadership is not None
        return FencedBinder(
            binder=binder,
            holds=leadership.holds,
            holds_for=leadership.holds_for,
            logger=self.logger,
        )

    def _supervisor_with_lease(self, *, name: str, env: Environment) -> ResourceManagerSupervisor:
        """A profile led under its own Lease: its Bindings and releases fenced by that Lease alone.

        The supervisor already pauses and activates on its own (the single Lease calls the same two
        methods for every profile), so a Lease per ResourceManager only gives each its own term. The
        runtime lock is not taken: `_reconfigure` holds it while it closes a deleted object's Lease,
        and that close waits for the pause.
        """
        options = self.options
        holder: list[ResourceManagerSupervisor] = []  # the supervisor needs the Lease's fence first

        async def started() -> None:
            await holder[0].activate()

        async def stopped() -> None:
            await holder[0].pause()

        lease = Leadership(
            namespace=options.lease_namespace,
            name=lease_name_for(base=options.lease_name, resource_manager=name),
            hostname=options.hostname,
            timing=self._lease_timing,
            logger=self.logger,
            on_started=started,
            on_stopped=stopped,
            hold_back=lambda: hold_back_seconds(
                leading=sum(1 for other, held in self._leases.items() if other != name and held.holds()),
                timing=self._lease_timing,
            ),
            claims=self._lease_claims,
        )
        assert self._binder is not None, "Runtime.start() was not called"
        fenced = dataclasses.replace(
            env,
            ports=dataclasses.replace(env.ports, binder=self._fenced_binder(self._binder, leadership=lease)),
            holds=lease.holds,
        )
        supervisor = ResourceManagerSupervisor(name=name, env=fenced, leading=False)
        holder.append(supervisor)
        self._leases[name] = lease
        return supervisor

    async def _set_leading(self, leading: bool) -> None:
        async with self._lock:
            if self._leading == leading:
                return
            self._leading = leading
            for supervisor in self.supervisors.values():
                if leading:
                    await supervisor.activate()  # reconciles, then schedules, then writes its status
                else:
                    await supervisor.pause()  # workers and any reconciliation stopped on return

    @property
    def leading(self) -> bool:
        """This replica leads (with a Lease per ResourceManager: at least one profile)."""
        if self._per_rm_leases:
            return self._profiles_led() > 0
        return self._leading

    def _state_dir(self) -> pathlib.Path:
        if self.options.state_dir is not None:
            return self.options.state_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="bindery-")
        return pathlib.Path(self._tmp.name)
