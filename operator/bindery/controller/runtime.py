"""Per-process operator state: the unbound pods seen, the ResourceManagers, their running profiles.

Pod events are handled without I/O except for contested scheduler names (a FailedScheduling event
and condition, aggregated): the handler only updates the in-memory map and offers the pod to the
right profile's queue. All unbound pods are remembered (cheap: they are pending by definition),
whatever their scheduler name, so a ResourceManager created later picks up pods that were already
waiting. Pods of names no ResourceManager claims are never written to.

ResourceManager events re-run one `_reconfigure` under a lock: parse every known object, decide
routing (contested names are served by nobody), stop/start/update profiles, re-offer pods whose
route changed, and write statuses that changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import pathlib
import tempfile
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
from bindery.controller.leader import LeaseTiming
from bindery.controller.leadership import FencedBinder, Leadership
from bindery.controller.metrics import Metrics, MetricsServer, parse_address
from bindery.controller.options import OperatorOptions
from bindery.controller.profiles import ProfileRunner, plugins_for
from bindery.controller.reconcile import Settle, reconcile_reservations
from bindery.controller.secrets import CredentialsError, RMCredentials, resolve_credentials
from bindery.controller.status import Observation, compute_status, status_changed
from bindery.kube import (
    IndexNodeLookup,
    KubeBinder,
    KubeConditionWriter,
    KubeEventSink,
    UnboundPods,
    WriteCounter,
)
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMError
from bindery.scheduling.decisions import REASON_SCHEDULER_ERROR
from bindery.scheduling.framework import Ports
from bindery.scheduling.podspec import PodInfo, PodSpecError
from bindery.scheduling.registry import PluginError
from bindery.scheduling.throttle import EventThrottle

GROUP, VERSION, PLURAL = "bindery.dev", "v1alpha1", "resourcemanagers"
USER_AGENT = "bindery"
Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


class Runtime:
    def __init__(self, *, options: OperatorOptions, logger: Logger) -> None:
        self.options = options
        self.logger = logger
        self.writes = WriteCounter()
        self.metrics = Metrics(
            writes=self.writes, queues=lambda: {name: r.queue.stats() for name, r in self.runners.items()}
        )
        self.metrics_server: MetricsServer | None = None
        self.pods = UnboundPods()
        self.bodies: dict[str, Mapping[str, Any]] = {}
        self.runners: dict[str, ProfileRunner] = {}
        self.routing = Routing(served={}, contested={})
        self._configuration: client.Configuration | None = None
        self._api: client.ApiClient | None = None
        self._ports: Ports | None = None
        self._events: KubeEventSink | None = None
        self._binder: KubeBinder | None = None
        self._conditions: KubeConditionWriter | None = None
        self._lock = asyncio.Lock()
        self._conflict_throttle = EventThrottle()
        self._errors: dict[str, str] = {}  # rm name -> config/credentials error
        self._credential_errors: dict[str, str] = {}
        self._reconciled: set[str] = set()
        self._leading = not options.leader_election  # without election this replica always leads
        self._leadership: Leadership | None = None
        if options.leader_election:  # leadership.py owns the Lease; _set_leading is all it calls
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
        self._statuses: dict[str, Mapping[str, Any]] = {}
        self._probe_task: asyncio.Task[None] | None = None
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
        )
        if self.options.metrics_address is not None:
            host, port = parse_address(self.options.metrics_address)
            self.metrics_server = MetricsServer(metrics=self.metrics, host=host, port=port)
            await self.metrics_server.start()
            self.logger.info(
                f"serving Prometheus metrics at http://{host}:{self.metrics_server.port}/metrics"
            )
        self._probe_task = asyncio.create_task(self._probe_forever(), name="bindery RM probes")
        if self._leadership is not None:
            self._leadership.start(api=self._api)

    async def connection_info(self) -> kopf.ConnectionInfo:
        # Reloaded on every login so rotated in-cluster tokens and kubeconfig edits are picked up.
        configuration = await load_configuration(kubeconfig=self.options.kubeconfig)
        return connection_info(configuration=configuration)

    async def close(self) -> None:
        if self._leadership is not None:
            await self._leadership.close()
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        for runner in list(self.runners.values()):
            await runner.stop()
        self.runners.clear()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self._api is not None:
            await self._api.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    @property
    def api(self) -> client.ApiClient:
        assert self._api is not None, "Runtime.start() was not called"
        return self._api

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
        if self._conditions is not None:
            self._conditions.forget(uid=pod.uid)
        for runner in self.runners.values():
            runner.withdraw(pod.uid)
        ours = self._binder is not None and self._binder.bound_recently(pod.uid)
        if not ours:  # a pod we bound is forgotten by its cycle, which observes its latency
            self.metrics.pod_forgotten(pod.uid)
        if pod.scheduler_name in self.routing.served and not ours:
            self._retry_parked()

    def _drop(self, uid: str) -> None:
        """A cycle found the pod gone or bound elsewhere: stop remembering it (a relist may miss it)."""
        self.pods.pop(uid)
        self.metrics.pod_forgotten(uid)
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

    # -- resource managers ----------------------------------------------------------------------

    async def on_resource_manager_event(self, *, event_type: str | None, body: Mapping[str, Any]) -> None:
        name = str((body.get("metadata") or {}).get("name") or "")
        if not name:
            return
        async with self._lock:
            if event_type == "DELETED":
                self.bodies.pop(name, None)
                self._statuses.pop(name, None)
            else:
                self.bodies[name] = body
                self._statuses[name] = body.get("status") or {}
            await self._reconfigure()

    async def _reconfigure(self) -> None:
        configs = self._parse_all()
        before = (dict(self.routing.served), {name: id(r) for name, r in self.runners.items()})
        self.routing = route_scheduler_names(configs=configs.values())
        for name in [n for n in self.runners if n not in configs]:
            await self.runners.pop(name).stop()
        for config in configs.values():
            await self._apply(config)
        if before != (dict(self.routing.served), {name: id(r) for name, r in self.runners.items()}):
            self._reoffer_all()
        for name in self.bodies:
            await self._write_status(name)

    def _parse_all(self) -> dict[str, ResourceManagerConfig]:
        configs: dict[str, ResourceManagerConfig] = {}
        self._errors.clear()
        for name, body in self.bodies.items():
            try:
                configs[name] = parse_resource_manager(body=body)
            except ConfigError as exc:
                self._errors[name] = str(exc)
        return configs

    async def _apply(self, config: ResourceManagerConfig) -> None:
        runner = self.runners.get(config.name)
        if runner is not None and runner.config == config:
            return
        self._credential_errors.pop(config.name, None)
        try:
            plugins_for(config=config)
        except PluginError as exc:
            self._credential_errors[config.name] = f"spec.plugins: {exc}"
            return
        needs_client = runner is None or runner.config.connection_key() != config.connection_key()
        built = await self._client_for(config) if needs_client else None
        if needs_client and built is None:
            return  # credentials unavailable: reported in status, old runner (if any) keeps going
        new_client, credentials = built if built is not None else (None, None)
        if runner is not None:
            runner.update(config=config, client=new_client, credentials=credentials)
            return
        assert new_client is not None
        assert credentials is not None
        assert self._ports is not None
        runner = ProfileRunner(
            config=config,
            client=new_client,
            credentials=credentials,
            ports=self._ports,
            api=self.api,
            logger=self.logger,
            on_released=lambda: self._retry_parked("a reservation was released"),
            on_dropped=self._drop,
            namespaces=self.options.namespaces,
            metrics=self.metrics,
        )
        self.runners[config.name] = runner
        await runner.probe()
        if self._leading:
            await self._activate(runner)

    async def _activate(self, runner: ProfileRunner) -> None:
        """The leader settles leftovers, then schedules; standbys only keep their queues warm."""
        await self._reconcile_once(runner)
        runner.start()

    async def _client_for(
        self, config: ResourceManagerConfig
    ) -> tuple[ResourceManagerClient, RMCredentials] | None:
        try:
            credentials = await resolve_credentials(api=self.api, config=config, directory=self._state_dir())
            rm_client = ResourceManagerClient(
                base_url=config.endpoint,
                token=credentials.token,
                ca_file=credentials.ca_file,
                client_cert=credentials.client_cert,
                connect_timeout=config.connect_timeout,
                read_timeout=config.read_timeout,
                allow_insecure_http=config.allow_insecure_http,
            )
        except (CredentialsError, ValueError, OSError) as exc:
            self._credential_errors[config.name] = str(exc)
            return None
        self._credential_errors.pop(config.name, None)
        return rm_client, credentials

    async def _refresh_credentials(self, runner: ProfileRunner) -> bool:
        """Re-read the referenced Secrets; a rotation gets a new client. Returns whether status changed."""
        config = runner.config
        if config.token_ref is None and config.ca_ref is None and config.client_cert_ref is None:
            return False
        before = self._credential_errors.get(config.name)
        try:
            fresh = await resolve_credentials(api=self.api, config=config, directory=self._state_dir())
        except CredentialsError as exc:
            self._credential_errors[config.name] = str(exc)
            return before != str(exc)
        self._credential_errors.pop(config.name, None)
        if fresh.digest != runner.credentials.digest:
            built = await self._client_for(config)
            if built is not None:
                self.logger.info(f"ResourceManager {config.name!r}: credentials rotated, new RM client")
                runner.update(config=config, client=built[0], credentials=built[1])
        return before is not None

    async def _reconcile_once(self, runner: ProfileRunner) -> None:
        if runner.config.name in self._reconciled:
            return
        try:
            settled = await reconcile_reservations(
                rm=runner.client,
                api=self.api,
                scheduler_names=frozenset(runner.config.scheduler_names),
                logger=self.logger,
                namespaces=self.options.namespaces,
            )
        except (RMError, client.ApiException) as exc:
            self.logger.warning(
                f"could not settle leftover reservations of ResourceManager {runner.config.name!r}: {exc}; "
                "they expire after their TTL"
            )
            return
        released = sum(1 for action in settled.values() if action is Settle.RELEASE)
        if released:
            self.metrics.release(resource_manager=runner.config.name, reason="leftover", count=released)
        self._reconciled.add(runner.config.name)

    def _reoffer_all(self) -> None:
        """Put every remembered pod where the current routing says it belongs."""
        for uid in self.pods.uids():
            pod = self.pods.get(uid)
            if pod is None:
                continue
            owner = self.routing.served.get(pod.scheduler_name)
            for name, runner in self.runners.items():
                if name == owner:
                    runner.offer(pod)
                else:
                    runner.withdraw(uid)

    async def _write_status(self, name: str) -> None:
        if not self._leading:
            return
        runner = self.runners.get(name)
        observation = Observation(
            generation=int((self.bodies[name].get("metadata") or {}).get("generation") or 0),
            config_error=self._errors.get(name),
            credentials_error=self._credential_errors.get(name),
            conflicts=self.routing.conflicts_of(rm_name=name),
            reachable=runner.reachable if runner is not None else None,
            reach_message=runner.reach_message if runner is not None else None,
        )
        previous = self._statuses.get(name)
        status = compute_status(
            observation=observation, previous=previous, now=datetime.datetime.now(datetime.UTC)
        )
        if not status_changed(new=status, previous=previous):
            return
        try:
            await client.CustomObjectsApi(self.api).patch_cluster_custom_object_status(
                group=GROUP,
                version=VERSION,
                plural=PLURAL,
                name=name,
                body={"status": status},
                _content_type="application/merge-patch+json",
            )
        except client.ApiException as exc:
            if exc.status != 404:
                self.logger.warning(f"could not write the status of ResourceManager {name!r}: {exc.reason}")
            return
        self._statuses[name] = status

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.probe_interval)
            async with self._lock:
                for name, runner in list(self.runners.items()):
                    changed = await self._refresh_credentials(runner)
                    changed = await runner.probe() or changed
                    if changed and name in self.bodies:
                        await self._write_status(name)

    def _fenced_binder(self, binder: KubeBinder) -> FencedBinder:
        assert self._leadership is not None
        return FencedBinder(binder=binder, holds=self._leadership.holds, logger=self.logger)

    async def _set_leading(self, leading: bool) -> None:
        async with self._lock:
            if self._leading == leading:
                return
            self._leading = leading
            if leading:
                for runner in self.runners.values():
                    await self._activate(runner)
                for name in self.bodies:
                    await self._write_status(name)
            else:
                self._reconciled.clear()  # the next leader term settles leftovers again
                for runner in self.runners.values():
                    await runner.pause()

    @property
    def leading(self) -> bool:
        return self._leading

    def _state_dir(self) -> pathlib.Path:
        if self.options.state_dir is not None:
            return self.options.state_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="bindery-")
        return pathlib.Path(self._tmp.name)
