"""One supervisor per ResourceManager object: it brings its profile up, keeps it up, and says how it is.

Why a loop per ResourceManager rather than handlers that act once: what a profile needs to run
arrives in any order and fails at any time. The token Secret may be created after the object, the
RM may be down while the operator starts (the chart starts both together), a 429/503, a dropped
connection or a bug may hit any step. A handler that tries once and returns leaves the profile
half-built for good; a loop retries. So the supervisor owns, for its object alone:

- the credentials: resolved from the referenced Secrets, re-read every `probe_interval` (a
  rotation gets a new RM client, a Secret that appears lets the profile start) and, for the token,
  at once when the RM answers 401 (the client asks `_reread_token`; the previous token stays its
  fallback, so a rotation fails no pod whichever side changes first);
- the RM client and the `ProfileRunner` (queue, workers, its subscription to the pods on nodes);
  every client built for one endpoint shares one `Negotiation`, so a rotation forgets nothing the
  RM offered in `GET /v1/info` (an error answer never takes a feature back, see `bindery.rm.client`);
- the readiness probe, every `probe_interval`;
- the reconciliation: at start (before the workers start, but a failed pass does not keep them
  waiting: they start and the pass is retried; so is a pass skipped while the RM's contract is
  not settled), on gaining leadership, when the watch of pods on
  nodes relists, and every `reconcile_interval_seconds`;
- the status of the object (Ready, Reachable), written whenever what it says changes;
- when the workers start: not before every Node is listed (`Environment.waiting_for`), since a
  decision on half the Nodes is a wrong one; everything above runs meanwhile.

Every failure while building or running the profile is retried with a capped backoff (1 s doubling
to 30 s) and shown in the status meanwhile; nothing escapes to the Kopf handler, which only hands
the new spec over (`update`). Pod routing stays with the runtime, which learns through `on_runner`
that a runner appeared or went away.

Leadership: `activate()` lets the loop reconcile and start the workers; `pause()` stops the workers
and any reconciliation in progress before it returns, so a replica that lost its lease stops acting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import pathlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from bindery.apiserver import ApiClient, ApiError, NotFound, patch, resources
from bindery.backoff import Backoff, BackoffPolicy
from bindery.config import ResourceManagerConfig
from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.watch import PodGroupWatch
from bindery.controller.profile.runner import ProfileRunner, plugins_for
from bindery.controller.secrets import (
    CredentialsError,
    RMCredentials,
    read_token,
    resolve_credentials,
    rm_client_for,
)
from bindery.controller.status import Observation, compute_status, status_changed
from bindery.controller.watches.bound import BoundPodFeed
from bindery.rm.client import Negotiation, ResourceManagerClient
from bindery.scheduling.framework import Ports
from bindery.scheduling.registry import PluginError
from bindery.typedefs import Logger

DEFAULT_RECONCILE_INTERVAL = 30.0
#: Bound of one status write: a hung apiserver connection must not freeze this loop.
STATUS_WRITE_SECONDS = 10.0


class Reconcile(Protocol):
    """One reconciliation pass of a profile's reservations against its pods; raises if it failed
    (`bindery.controller.reservations.reconcile.Reconciler`)."""

    async def run_once(self, *, reason: str) -> object: ...


async def _run_once(reconciler: Reconcile, *, reason: str) -> object:
    """A coroutine of the pass, so it runs as a task that `pause()` can cancel."""
    return await reconciler.run_once(reason=reason)


#: Retrying a build, a probe or a reconcile pass: 1 s doubling to 30 s, reset by a success.
SUPERVISOR_BACKOFF = BackoffPolicy(initial=1.0, maximum=30.0)


@dataclasses.dataclass(frozen=True)
class Environment:
    """What every supervisor of one operator shares (the runtime builds it once)."""

    api: ApiClient
    ports: Ports
    logger: Logger
    metrics: Metrics
    namespaces: tuple[str, ...]
    probe_interval: float
    state_dir: Callable[[], pathlib.Path]
    #: builds the reconciliation of a runner's reservations
    reconciler: Callable[[ProfileRunner], Reconcile]
    #: a reservation of the named ResourceManager was released: its pods refused for room may fit
    on_released: Callable[[str], None]
    #: a cycle found its pod gone or bound elsewhere
    on_dropped: Callable[[str], None]
    #: the supervisor's runner appeared, was replaced or went away: re-route the pods
    on_runner: Callable[[], None]
    #: the leader fence (always True without leader election): no release once it is False
    holds: Callable[[], bool] = lambda: True
    #: this cluster's id (contract v1.2 clusterId), sent to every RM that offers the feature
    cluster_id: str | None = None
    #: the one watch of pods on nodes, which each runner subscribes to for its releases
    bound_pods: BoundPodFeed | None = None
    #: the one watch of PodGroups, which every runner's pod groups read
    podgroups: PodGroupWatch | None = None
    #: what scheduling still waits for (the Nodes' first list), or None; the runtime pokes the
    #: supervisors once it is there
    waiting_for: Callable[[], str | None] = lambda: None


class ResourceManagerSupervisor:
    """The loop that owns one ResourceManager's profile (see the module docstring)."""

    def __init__(self, *, name: str, env: Environment, leading: bool) -> None:
        self.name = name
        self._env = env
        self._leading = leading
        self.config: ResourceManagerConfig | None = None
        self.runner: ProfileRunner | None = None
        self.reconciled = 0  #: successful reconciliation passes
        self._generation = 0
        self._config_error: str | None = None
        self._conflicts: Mapping[str, tuple[str, ...]] = {}
        self._credentials_error: str | None = None
        self._start_error: str | None = None
        self._status: Mapping[str, Any] | None = None  # as last written or read from the object
        self._wake = asyncio.Event()
        self._backoff = Backoff(SUPERVISOR_BACKOFF)
        self._probe_backoff = Backoff(SUPERVISOR_BACKOFF)
        self._reconcile_backoff = Backoff(SUPERVISOR_BACKOFF)
        self._reconcile_reason: str | None = None
        self._reconcile_requests = 0
        self._reconcile_at = 0.0
        self._credentials_at = 0.0
        self._probe_at = 0.0
        self._reconciling: asyncio.Task[object] | None = None
        self._reconciler: Reconcile | None = None  # one per runner: it may remember between passes
        #: what the RM at this endpoint said of its contract, handed to every client built for it (a
        #: rotated Secret's new client must not forget a feature the RM offered, see Negotiation)
        self._negotiation: tuple[str, Negotiation] | None = None
        self._task: asyncio.Task[None] | None = None
        #: what the workers wait for before they start (`Environment.waiting_for`), None once started
        self.waiting_for: str | None = None

    # -- what the runtime calls --------------------------------------------------------------------

    def poke(self) -> None:
        """Something the loop waits for arrived (the Nodes are listed): take a step now."""
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"bindery supervisor {self.name}")

    def update(
        self,
        *,
        config: ResourceManagerConfig | None,
        generation: int,
        config_error: str | None = None,
        conflicts: Mapping[str, tuple[str, ...]] | None = None,
        status: Mapping[str, Any] | None = None,
    ) -> None:
        """A new spec (None with `config_error` if it does not parse), its routing conflicts and
        the status the object carries now; the loop applies it."""
        self.config = config
        self._generation = generation
        self._config_error = config_error
        self._conflicts = dict(conflicts or {})
        if status is not None:
            self._status = status
        self._wake.set()

    async def activate(self) -> None:
        """This replica leads now: reconcile, then schedule (the loop does both)."""
        self._leading = True
        self._request_reconcile("leadership")

    async def pause(self) -> None:
        """This replica no longer leads: stop reconciling and scheduling before returning."""
        self._leading = False
        await self._cancel_reconcile()
        if self.runner is not None:
            await self.runner.pause()

    def relisted(self) -> None:
        """The watch of pods on nodes relisted: what happened in its gap is reconciled now."""
        self._request_reconcile("relist")

    def _request_reconcile(self, reason: str) -> None:
        """A pass as soon as possible; a pending reason (a failed start pass) is kept."""
        self._reconcile_reason = self._reconcile_reason or reason
        self._reconcile_requests += 1
        self._reconcile_at = 0.0
        self._reconcile_backoff.reset()
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._cancel_reconcile()
        await self._stop_runner()

    @property
    def leading(self) -> bool:
        return self._leading

    # -- the loop ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            try:
                delay = await self._step(now=loop.time())
                self._start_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a transport error, a 429/503 or a bug: retried, never lost
                delay = self._backoff.next()
                self._start_error = (
                    f"could not start the profile: {type(exc).__name__}: {exc}; retrying in {delay:g}s"
                )
                self._env.logger.warning(f"ResourceManager {self.name!r}: {self._start_error}")
            with contextlib.suppress(Exception):
                await self._write_status()
            if delay is None:
                await self._wake.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(delay, 0.0)):
                    await self._wake.wait()

    async def _step(self, *, now: float) -> float | None:
        """Bring the profile one step closer to running; returns seconds until the next step is due
        (None: nothing is due until the spec changes)."""
        config = self.config
        if config is None:
            await self._stop_runner()
            return None
        try:
            plugins_for(config=config)
        except PluginError as exc:
            self._credentials_error = f"spec.plugins: {exc}"
            return None  # only an edit of the spec helps; the old runner (if any) keeps going
        if not await self._ensure_runner(config=config, now=now):
            return self._backoff.next()
        runner = self.runner
        assert runner is not None
        self._backoff.reset()
        if now >= self._probe_at:
            await runner.probe()
            if runner.reachable:
                self._probe_backoff.reset()
                self._probe_at = now + self._env.probe_interval
            else:  # probed sooner while down, so Reachable turns True soon after the RM is back
                self._probe_at = now + min(self._probe_backoff.next(), self._env.probe_interval)
        if self._leading:
            await self._reconcile_if_due(runner=runner, config=config, now=now)
            if self._leading and not runner.active:
                self._start_scheduling(runner)
        due = [self._probe_at, self._credentials_at]
        if self._leading:
            due.append(self._reconcile_at)
        return max(min(due) - now, 0.05)

    def _start_scheduling(self, runner: ProfileRunner) -> None:
        """Start the workers (reconciled, or the first pass failed: schedule, keep retrying it),
        unless a cache a decision reads is not listed yet: the loop is poked when it is."""
        waiting = self._env.waiting_for()
        if waiting is not None:
            if self.waiting_for != waiting:
                self._env.logger.info(f"ResourceManager {self.name!r}: scheduling waits for {waiting}")
            self.waiting_for = waiting
            return
        if self.waiting_for is not None:
            done = self.waiting_for
            self._env.logger.info(f"ResourceManager {self.name!r}: {done} is complete: scheduling")
        self.waiting_for = None
        runner.start()

    async def _ensure_runner(self, *, config: ResourceManagerConfig, now: float) -> bool:
        """Credentials resolved and a runner for `config`; False (error recorded) if not possible yet."""
        runner = self.runner
        connection_changed = runner is None or runner.config.connection_key() != config.connection_key()
        if connection_changed or now >= self._credentials_at:
            built = await self._credentials(config=config, runner=runner, rebuild=connection_changed)
            if built is None and (runner is None or connection_changed):
                return False  # nothing to run with yet (an old runner keeps its old connection)
            self._credentials_at = now + self._env.probe_interval
            if runner is None and built is not None:
                self._create_runner(config=config, client=built[0], credentials=built[1])
                return True
            if runner is not None and (built is not None or runner.config != config):
                runner.update(
                    config=config,
                    client=built[0] if built is not None else None,
                    credentials=built[1] if built is not None else None,
                )
                if built is not None:
                    self._probe_at = 0.0  # a new client: probe it now
            return True
        if runner is not None and runner.config != config:
            runner.update(config=config, client=None)
        return True

    async def _credentials(
        self, *, config: ResourceManagerConfig, runner: ProfileRunner | None, rebuild: bool
    ) -> tuple[ResourceManagerClient, RMCredentials] | None:
        """A new client if there is none, the connection changed or the Secrets rotated; else None."""
        referenced = config.token_ref is not None or config.ca_ref is not None
        if runner is not None and not rebuild and not (referenced or config.client_cert_ref is not None):
            return None  # nothing to re-read
        try:
            credentials = await resolve_credentials(
                api=self._env.api, config=config, directory=self._env.state_dir()
            )
        except CredentialsError as exc:
            self._credentials_error = str(exc)
            return None
        self._credentials_error = None
        if runner is not None and not rebuild and credentials.digest == runner.credentials.digest:
            return None
        if self._negotiation is None or self._negotiation[0] != config.endpoint:
            self._negotiation = (config.endpoint, Negotiation())  # another RM: it negotiates afresh
        try:
            rm_client = rm_client_for(
                config=config,
                credentials=credentials,
                cluster_id=self._env.cluster_id,
                negotiation=self._negotiation[1],
                # a rotation: the old token stays a fallback while the RM may not know the new one yet
                previous_token=runner.credentials.token if runner is not None else None,
                on_unauthorized=functools.partial(self._reread_token, config=config),
            )
        except (ValueError, OSError) as exc:
            self._credentials_error = str(exc)
            return None
        if runner is not None and not rebuild:
            self._env.logger.info(f"ResourceManager {self.name!r}: credentials rotated, new RM client")
        return rm_client, credentials

    async def _reread_token(self, *, config: ResourceManagerConfig) -> str | None:
        """The token Secret's value now (the RM client asks after a 401); None if unreadable."""
        try:
            return await read_token(api=self._env.api, config=config)
        except CredentialsError as exc:
            self._env.logger.warning(
                f"ResourceManager {self.name!r}: re-reading the token after a 401: {exc}"
            )
            return None

    def _create_runner(
        self, *, config: ResourceManagerConfig, client: ResourceManagerClient, credentials: RMCredentials
    ) -> None:
        env = self._env
        self.runner = ProfileRunner(
            config=config,
            client=client,
            credentials=credentials,
            ports=env.ports,
            api=env.api,
            logger=env.logger,
            on_released=lambda: env.on_released(self.name),
            on_dropped=env.on_dropped,
            on_relist=self.relisted,
            holds=env.holds,
            namespaces=env.namespaces,
            metrics=env.metrics,
            bound_pods=env.bound_pods,
            podgroups=env.podgroups,
        )
        self._reconciler = env.reconciler(self.runner)
        self._probe_at = 0.0
        self._reconcile_reason = None
        self._request_reconcile("start")
        env.on_runner()

    async def _stop_runner(self) -> None:
        runner, self.runner = self.runner, None
        self._reconciler = None
        if runner is not None:
            await runner.stop()
            self._env.on_runner()

    # -- reconciliation ----------------------------------------------------------------------------

    async def _reconcile_if_due(
        self, *, runner: ProfileRunner, config: ResourceManagerConfig, now: float
    ) -> None:
        """Run the pass that is due (requested, being retried, or periodic); failures back off."""
        if now < self._reconcile_at:
            return
        reason = self._reconcile_reason or "periodic"
        requests = self._reconcile_requests
        reconciler = self._reconciler or self._env.reconciler(runner)
        task = asyncio.create_task(
            _run_once(reconciler, reason=reason), name=f"bindery reconcile {self.name}"
        )
        self._reconciling = task
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the supervisor itself is stopping
            return  # pause() cancelled the pass: leadership was lost
        except Exception as exc:
            delay = self._reconcile_backoff.next()
            self._reconcile_reason = reason
            self._reconcile_at = now + delay
            self._env.logger.warning(
                f"ResourceManager {self.name!r}: reconciliation ({reason}) failed: "
                f"{type(exc).__name__}: {exc}; retrying in {delay:g}s"
            )
            return
        finally:
            self._reconciling = None
        self.reconciled += 1
        self._reconcile_backoff.reset()
        if self._reconcile_requests == requests:  # else a relist came during the pass: run again
            self._reconcile_reason = None
            self._reconcile_at = now + config.reconcile_interval_seconds

    async def _cancel_reconcile(self) -> None:
        task, self._reconciling = self._reconciling, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- status ------------------------------------------------------------------------------------

    def observation(self) -> Observation:
        runner = self.runner
        reachable = runner.reachable if runner is not None else None
        reach_message = runner.reach_message if runner is not None else None
        if self._start_error is not None:
            reachable, reach_message = False, self._start_error
        return Observation(
            generation=self._generation,
            config_error=self._config_error,
            credentials_error=self._credentials_error,
            conflicts=self._conflicts,
            reachable=reachable,
            reach_message=reach_message,
            token_refused=runner is not None and runner.token_refused and self._start_error is None,
        )

    async def _write_status(self) -> None:
        """Write the status if it says something new (the leader only)."""
        if not self._leading:
            return
        previous = self._status
        status = compute_status(
            observation=self.observation(), previous=previous, now=datetime.datetime.now(datetime.UTC)
        )
        if not status_changed(new=status, previous=previous):
            return
        try:
            await patch(
                self._env.api,
                resources.RESOURCE_MANAGERS,
                name=self.name,
                subresource="status",
                body={"status": status},
                request_timeout=STATUS_WRITE_SECONDS,
            )
        except NotFound:  # deleted meanwhile: nothing to write to
            return
        except ApiError as exc:  # written again at the next change or probe
            self._env.logger.warning(f"could not write the status of ResourceManager {self.name!r}: {exc}")
            return
        self._status = status
