"""Per-process operator state: the unbound pods seen, the ResourceManagers, their running profiles.

Pod events are handled without I/O except for contested scheduler names (a FailedScheduling event
and condition, aggregated): the handler only updates the in-memory map and offers the pod to the
right profile's queue. All unbound pods are remembered (cheap: they are pending by definition),
whatever their scheduler name, so a ResourceManager created later picks up pods that were already
waiting. Pods of names no ResourceManager claims are never written to.

ResourceManager events re-run one `_reconfigure` under a lock: parse every known object, decide
routing (contested names are served by nobody), and hand each object's spec to its own
`ResourceManagerSupervisor` (bindery.controller.supervisor), which builds, runs, retries and
reports its profile. The runtime keeps the pods: the map, the routing, and a periodic sweep that
forgets remembered unbound pods a fresh list no longer has (Kopf sends no DELETED for a pod that
vanished while its watch was down).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes_asyncio import client

from bindery.config import (
    ConfigError,
    ResourceManagerConfig,
    Routing,
    parse_resource_manager,
    route_scheduler_names,
)
from bindery.controller.connection import connection_info, load_configuration, resolve_environment_once
from bindery.controller.leadership.fence import FencedBinder
from bindery.controller.leadership.rules import LeaseTiming
from bindery.controller.leadership.term import Leadership
from bindery.controller.metrics import LeaderState, Metrics, MetricsServer, parse_address
from bindery.controller.options import OperatorOptions
from bindery.controller.queueview import QueueView
from bindery.controller.reconcile import Reconciler
from bindery.controller.runner import ProfileRunner
from bindery.controller.supervisor import (
    DEFAULT_RECONCILE_INTERVAL,
    Environment,
    Reconcile,
    ResourceManagerSupervisor,
    reconcile_interval,
)
from bindery.controller.watches.unbound import UNBOUND_PODS, UnboundPodWatcher
from bindery.kube import (
    IndexNodeLookup,
    KubeBinder,
    KubeConditionWriter,
    KubeEventSink,
    KubeVolumes,
    UnboundPods,
    WriteCounter,
)
from bindery.scheduling.decisions import REASON_SCHEDULER_ERROR
from bindery.scheduling.framework import Ports
from bindery.scheduling.podspec import PodInfo, PodSpecError
from bindery.scheduling.throttle import EventThrottle
from bindery.typedefs import Logger

GROUP, VERSION, PLURAL = "bindery.dev", "v1alpha1", "resourcemanagers"
USER_AGENT = "bindery"


class Runtime:
    def __init__(self, *, options: OperatorOptions, logger: Logger) -> None:
        self.options = options
        self.logger = logger
        self.writes = WriteCounter()
        self.metrics = Metrics(
            writes=self.writes,
            queues=lambda: {name: r.queue.stats() for name, r in self.runners.items()},
            per_pod=self.per_pod_sizes,
            breakers=lambda: {name: r.rm.breaker_state for name, r in self.runners.items()},
            leader=self._leader_state,
        )
        self.metrics_server: MetricsServer | None = None
        self.pods = UnboundPods()
        self.bodies: dict[str, Mapping[str, Any]] = {}
        self.supervisors: dict[str, ResourceManagerSupervisor] = {}
        self.routing = Routing(served={}, contested={})
        self._configuration: client.Configuration | None = None
        self._api: client.ApiClient | None = None
        self._ports: Ports | None = None
        self._events: KubeEventSink | None = None
        self._binder: KubeBinder | None = None
        self._conditions: KubeConditionWriter | None = None
        self._lock = asyncio.Lock()
        self._conflict_throttle = EventThrottle()
        self._leading = not options.leader_election  # without election this replica always leads
        self._leadership: Leadership | None = None
        if options.leader_election:  # controller/leadership/ owns the Lease; _set_leading is all it calls
            self._leadership = Leadership(
                namespace=options.lease_namespace,
                name=options.lease_name,
                hostname=options.hostname,
                timing=LeaseTiming(
                    lease_duration=options.lease_duration,
                    renew_deadline=options.renew_deadline,
                    retry_period=options.retry_period,
                ),
                logger=logger,
                on_started=lambda: self._set_leading(True),
                on_stopped=lambda: self._set_leading(False),
            )
        self._env: Environment | None = None
        self._sweep_task: asyncio.Task[None] | None = None
        self._unbound_task: asyncio.Task[None] | None = None
        self.unbound: UnboundPodWatcher | None = None
        self.sweeps = 0  #: passes of the unbound-pod sweep (tests wait on it)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, *, node_index: Any) -> None:
        self._configuration = await load_configuration(kubeconfig=self.options.kubeconfig)
        self._api = client.ApiClient(configuration=self._configuration)
        self._api.user_agent = USER_AGENT  # names Bindery in managedFields and audit logs
        resolve_environment_once(api=self._api)
        self._events = KubeEventSink(api=self._api, counter=self.writes, hostname=self.options.hostname)
        self._conditions = KubeConditionWriter(api=self._api, counter=self.writes)
        self._binder = KubeBinder(api=self._api, counter=self.writes)
        self._ports = Ports(
            nodes=IndexNodeLookup(index=node_index),
            pods=self.pods,
            binder=self._binder if self._leadership is None else self._fenced_binder(self._binder),
            events=self._events,
            conditions=self._conditions,
            volumes=KubeVolumes(api=self._api, counter=self.writes),
        )
        if self.options.metrics_address is not None:
            host, port = parse_address(self.options.metrics_address)
            queue = QueueView(runners=lambda: self.runners, pods=self.pods, leading=lambda: self._leading)
            self.metrics_server = MetricsServer(metrics=self.metrics, host=host, port=port, queue=queue)
            await self.metrics_server.start()
            self.logger.info(
                f"serving Prometheus metrics at http://{host}:{self.metrics_server.port}/metrics "
                "(and the scheduling queues, read-only, at /debug/queue)"
            )
        self._env = Environment(
            api=self._api,
            ports=self._ports,
            logger=self.logger,
            metrics=self.metrics,
            namespaces=self.options.namespaces,
            probe_interval=self.options.probe_interval,
            state_dir=self._state_dir,
            reconciler=self._reconciler,
            on_released=lambda: self._retry_parked("a reservation was released"),
            on_dropped=self._drop,
            on_runner=self._reoffer_all,
            holds=self._leadership.holds if self._leadership is not None else lambda: True,
        )
        self._sweep_task = asyncio.create_task(self._sweep_forever(), name="bindery unbound-pod sweep")
        self.unbound = UnboundPodWatcher(
            api=self._api,
            namespaces=self.options.namespaces,
            on_event=lambda event_type, body: self.on_pod_event(event_type=event_type, body=body),
            logger=self.logger,
            watch_seconds=self.options.watch_timeout,
        )
        self._unbound_task = asyncio.create_task(self.unbound.run(), name="bindery unbound-pod watch")
        if self._leadership is not None:
            self._leadership.start(api=self._api)

    async def connection_info(self) -> kopf.ConnectionInfo:
        # Reloaded on every login so rotated in-cluster tokens and kubeconfig edits are picked up.
        configuration = await load_configuration(kubeconfig=self.options.kubeconfig)
        return connection_info(configuration=configuration)

    async def close(self) -> None:
        if self._leadership is not None:
            await self._leadership.close()
        for task in (self._unbound_task, self._sweep_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for supervisor in list(self.supervisors.values()):
            await supervisor.close()
        self.supervisors.clear()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self._api is not None:
            await self._api.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _leader_state(self) -> LeaderState | None:
        if self._leadership is None:
            return None
        return LeaderState(leading=self._leading, renewals=dict(self._leadership.renewals))

    @property
    def api(self) -> client.ApiClient:
        assert self._api is not None, "Runtime.start() was not called"
        return self._api

    @property
    def runners(self) -> dict[str, ProfileRunner]:
        """The running profiles by ResourceManager name (a supervisor may have none yet)."""
        return {name: s.runner for name, s in list(self.supervisors.items()) if s.runner is not None}

    def per_pod_sizes(self) -> dict[str, int]:
        """Entries held per pod, by structure: all 0 once every pod left (tests and soaks read it).

        Read-only; safe to call from another thread (it only takes sizes).
        """
        sizes = {
            "pods": len(self.pods),
            "first_seen": self.metrics.pods_seen(),
            "conflict_throttle": len(self._conflict_throttle),
            "conditions_written": len(self._conditions._written) if self._conditions is not None else 0,
            "recently_bound": self._binder.remembered() if self._binder is not None else 0,
        }
        for name, runner in sorted(self.runners.items()):
            for structure, size in runner.per_pod_sizes().items():
                sizes[f"{name}/{structure}"] = size
        return sizes

    # -- pods -----------------------------------------------------------------------------------

    async def on_pod_event(self, *, event_type: str | None, body: Mapping[str, Any]) -> None:
        try:
            pod = PodInfo.from_body(body)
        except PodSpecError as exc:
            self.logger.warning(f"ignoring a pod event that does not parse: {exc}")
            return
        if event_type == "DELETED" or not pod.schedulable:
            self._forget(pod)
            return
        if self._binder is not None and self._binder.bound_recently(pod.uid):
            # An event older than our Binding (it is on the wire, or landed and the DELETED that says
            # so is next): the pod is not pending. Taking it as pending would requeue it, and mark
            # it seen after its cycle forgot it, with nothing left to forget it again.
            return
        self.pods.put(pod)
        self.metrics.pod_seen(pod.uid)
        await self._route(pod)

    def _forget(self, pod: PodInfo) -> None:
        """Deleted, bound (left the `spec.nodeName=` selector), terminating or gated.

        An in-flight cycle notices through PodLookup (or a 404/409 on bind) and releases its
        reservation. A pod we bound ourselves merely left the selector: nothing was freed. Any other
        departure of a served pod (deleted, bound by someone else) may have freed capacity, so parked
        pods are retried; pods of other schedulers (default-scheduler binds all day) are not a signal.
        """
        known = self.pods.pop(pod.uid)
        if known is None:
            return
        self._conflict_throttle.forget(pod.uid)
        if self._conditions is not None:
            self._conditions.forget(uid=pod.uid)
        for runner in self.runners.values():
            runner.withdraw(pod.uid)
        ours = self._binder is not None and self._binder.bound_recently(pod.uid)
        if self._binder is not None:
            self._binder.forget(pod.uid)
        if not ours:  # a pod we bound is forgotten by its cycle, which observes its latency
            self.metrics.pod_forgotten(pod.uid)
        if pod.scheduler_name in self.routing.served and not ours:
            self._retry_parked()

    def _drop(self, uid: str) -> None:
        """A cycle found the pod gone or bound elsewhere: stop remembering it (a relist may miss it)."""
        self.pods.pop(uid)
        self.metrics.pod_forgotten(uid)
        self._conflict_throttle.forget(uid)
        if self._conditions is not None:
            self._conditions.forget(uid=uid)

    async def _route(self, pod: PodInfo) -> None:
        rm_name = self.routing.served.get(pod.scheduler_name)
        if rm_name is not None and rm_name in self.runners:
            self.runners[rm_name].offer(pod)
            return
        conflict = self.routing.conflict_message(scheduler_name=pod.scheduler_name)
        if conflict is not None:
            await self._report_conflict(pod=pod, message=conflict)

    async def _report_conflict(self, *, pod: PodInfo, message: str) -> None:
        if not self._leading:
            return
        assert self._events is not None
        assert self._conditions is not None
        note = self._conflict_throttle.admit(uid=pod.uid, key="SchedulerNameConflict", message=message)
        try:
            if note is not None:
                await self._events.failed_scheduling(pod=pod, message=note, scheduler_name=pod.scheduler_name)
            await self._conditions.pod_scheduled_false(
                pod=pod, reason=REASON_SCHEDULER_ERROR, message=message
            )
        except Exception as exc:  # reporting is best effort; the pod stays pending anyway
            self.logger.warning(f"could not report the scheduler-name conflict on pod {pod.key}: {exc}")

    def _retry_parked(self, reason: str = "a pending pod went away") -> None:
        for runner in self.runners.values():
            runner.queue.move_all_to_active(reason=reason)
            runner.gangs.retry()

    # -- unbound-pod sweep -----------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        """Every reconcile interval (the shortest of the ResourceManagers'), forget vanished pods."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            if time.monotonic() - last < self._sweep_interval():
                continue
            last = time.monotonic()
            try:
                await self.sweep_unbound()
            except Exception as exc:  # the next sweep tries again
                self.logger.warning(f"could not list unbound pods to forget vanished ones: {exc}")

    def _sweep_interval(self) -> float:
        configs = [s.config for s in self.supervisors.values() if s.config is not None]
        return min((reconcile_interval(c) for c in configs), default=DEFAULT_RECONCILE_INTERVAL)

    async def sweep_unbound(self) -> int:
        """Forget remembered unbound pods that a fresh list does not have; returns how many.

        Only pods remembered before the list began are judged, so one added meanwhile is kept.
        """
        known = self.pods.uids()
        listed = await self._unbound_uids() if known else set()
        gone = known - listed
        for uid in gone:
            pod = self.pods.get(uid)
            if pod is not None:
                self._forget(pod)
        if gone:
            self.logger.info(f"forgot {len(gone)} unbound pods that no longer exist or were bound")
        if self._conditions is not None:
            self._conditions.retain(uids=self.pods.uids())
        self.sweeps += 1
        return len(gone)

    async def _unbound_uids(self) -> set[str]:
        """UIDs of every unbound pod in scope (paged LIST of `spec.nodeName=`, metadata only read)."""
        core = client.CoreV1Api(self.api)
        uids: set[str] = set()
        for namespace in self.options.namespaces or (None,):
            token = ""
            while True:
                options: dict[str, Any] = {
                    "field_selector": UNBOUND_PODS,
                    "limit": 500,
                    "_preload_content": False,
                    "_request_timeout": 60,
                }
                if token:
                    options["_continue"] = token
                if namespace is None:
                    response = await core.list_pod_for_all_namespaces(**options)
                else:
                    response = await core.list_namespaced_pod(namespace, **options)
                try:
                    if response.status != 200:
                        raise RuntimeError(f"listing unbound pods answered HTTP {response.status}")
                    document = json.loads(await response.read())
                finally:
                    response.release()
                uids.update(str(item["metadata"]["uid"]) for item in document.get("items") or ())
                token = str((document.get("metadata") or {}).get("continue") or "")
                if not token:
                    break
        return uids

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
        before = dict(self.routing.served)
        self.routing = route_scheduler_names(configs=configs.values())
        for name in [n for n in self.supervisors if n not in self.bodies]:
            try:
                await self.supervisors.pop(name).close()
            except Exception as exc:  # never into the Kopf handler: the object is gone either way
                self.logger.warning(f"stopping the profile of deleted ResourceManager {name!r} failed: {exc}")
        assert self._env is not None, "Runtime.start() was not called"
        for name, body in self.bodies.items():
            supervisor = self.supervisors.get(name)
            if supervisor is None:
                supervisor = ResourceManagerSupervisor(name=name, env=self._env, leading=self._leading)
                self.supervisors[name] = supervisor
                supervisor.start()
            supervisor.update(
                config=configs.get(name),
                generation=int((body.get("metadata") or {}).get("generation") or 0),
                config_error=errors.get(name),
                conflicts=self.routing.conflicts_of(rm_name=name),
                status=body.get("status") or {},
            )
        if before != dict(self.routing.served):
            self._reoffer_all()

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
            on_released=lambda: self._retry_parked("a reservation was released"),
            on_reported_unbound=runner.report_bound,
            events=self._events,  # counted with the operator's other writes
        )

    def _reoffer_all(self) -> None:
        """Put every remembered pod where the current routing says it belongs."""
        runners = self.runners
        for uid in self.pods.uids():
            pod = self.pods.get(uid)
            if pod is None:
                continue
            owner = self.routing.served.get(pod.scheduler_name)
            for name, runner in runners.items():
                if name == owner:
                    runner.offer(pod)
                else:
                    runner.withdraw(uid)

    def _fenced_binder(self, binder: KubeBinder) -> FencedBinder:
        assert self._leadership is not None
        return FencedBinder(
            binder=binder,
            holds=self._leadership.holds,
            holds_for=self._leadership.holds_for,
            logger=self.logger,
        )

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
        return self._leading

    def _state_dir(self) -> pathlib.Path:
        if self.options.state_dir is not None:
            return self.options.state_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="bindery-")
        return pathlib.Path(self._tmp.name)
