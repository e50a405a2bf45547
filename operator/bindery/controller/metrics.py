"""Prometheus metrics of one operator process, served at `/metrics` (`bindery run --metrics-addr`).

What an operator of a scheduler watches, in kube-scheduler's terms: how many scheduling attempts
end scheduled / unschedulable / error, how long a pod waits from first seen to bound, how long each
attempt and each resource-manager request takes (by verb and outcome), how deep each
ResourceManager's queue is, how many apiserver writes Bindery made (the two-writes-per-pod budget)
and how many reservations it gave back.

kube-scheduler's own names have a `bindery_` twin of the same shape where the meaning is the same:
`scheduler_schedule_attempts_total{result}` → `bindery_schedule_attempts_total`,
`scheduler_pending_pods{queue}` → `bindery_pending_pods`, `scheduler_scheduling_attempt_duration_seconds`
→ `bindery_scheduling_attempt_duration_seconds`, `scheduler_pod_scheduling_sli_duration_seconds` →
`bindery_pod_scheduling_duration_seconds`, `scheduler_pod_scheduling_attempts` →
`bindery_pod_scheduling_attempts`, `leader_election_master_status` → `bindery_leader_election_master_status`
(each with a `resource_manager` label where kube-scheduler has `profile`). The resource manager's side
has no kube-scheduler equivalent: request latency by verb and outcome, reservations by outcome, lease
renewals, the client's circuit breaker.

Cost on the per-pod path is a dict insert when a pod is first seen and a few counter increments
and histogram observations per attempt. Queue depths and write counts are not pushed at all: a
collector reads them from the queues and the `WriteCounter` when Prometheus scrapes.

Each `Metrics` has its own registry (not prometheus_client's global one), so several operators in
one process (tests, the demo) never share or collide on metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from bindery import tracing
from bindery.adapters.access import AccessReviewer
from bindery.adapters.counters import WriteCounter
from bindery.controller.queueview import QueueView
from bindery.rm.errors import (
    RMConflict,
    RMError,
    RMProtocolError,
    RMRejected,
    RMUnavailable,
    RMUnschedulable,
)
from bindery.rm.models import Reservation, ReservationRequest
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.framework import ReservationClient
from bindery.scheduling.queue import QueueStats

T = TypeVar("T")

#: kube-scheduler's result label values; a pod found gone or bound elsewhere is "dropped".
RESULTS: Mapping[Outcome, str] = {
    Outcome.BOUND: "scheduled",
    Outcome.UNSCHEDULABLE: "unschedulable",
    Outcome.ERROR: "error",
    Outcome.DROPPED: "dropped",
}
#: Why a reservation was released: a failed cycle, a departed bound pod, a Binding that got no
#: answer and turned out not to have bound the pod, a reconcile pass (leftovers at start included).
RELEASE_REASONS = ("cycle_failure", "pod_departed", "unconfirmed_binding", "reconcile")
#: What a reconcile pass did (bindery.controller.reservations.reconcile): committed or released a reservation,
#: failed to, or found a bound pod without any active reservation.
RECONCILE_ACTIONS = ("commit", "release", "failed", "missing_reservation")
#: 5 ms … ~82 s: an RM round trip at the low end, a pod parked through several backoffs at the top.
LATENCY_BUCKETS = tuple(0.005 * 2**i for i in range(15))
#: kube-scheduler's `scheduler_pod_scheduling_attempts` buckets: 1, 2, 4, 8, 16 attempts.
ATTEMPT_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0)
#: The pending queues of kube-scheduler's `scheduler_pending_pods` (in flight is not pending).
PENDING_QUEUES = ("active", "backoff", "unschedulable")
#: What became of the reservation an RM request was about, by verb and request outcome label; an
#: outcome not listed for its verb counts as `<verb>_failed`. Nested, so a lookup builds no tuple.
RESERVATION_OUTCOMES: Mapping[str, Mapping[str, str]] = {
    "reserve": {"ok": "reserved", "unschedulable": "unschedulable", "": "reserve_failed"},
    "commit": {"ok": "committed", "": "commit_failed"},
    "release": {"ok": "released", "": "release_failed"},
}
#: The client's circuit-breaker states (bindery.rm.client.CircuitBreaker), as label values.
BREAKER_STATES = ("closed", "open", "half-open")


@dataclasses.dataclass(frozen=True)
class LeaderState:
    """What the collector reports about leader election: leading now, Lease renewals by outcome."""

    leading: bool
    renewals: Mapping[str, int]
    #: with a Lease per ResourceManager, the profiles this replica leads; None with one Lease
    profiles: int | None = None


def result_label(outcome: Outcome) -> str:
    return RESULTS[outcome]


def rm_outcome_label(error: BaseException | None) -> str:
    """Pure: the `outcome` label of one RM request (most specific error class first)."""
    if error is None:
        return "ok"
    for kind, label in (
        (RMUnschedulable, "unschedulable"),
        (RMConflict, "conflict"),
        (RMRejected, "rejected"),
        (RMUnavailable, "unavailable"),
        (RMProtocolError, "protocol_error"),
        (RMError, "error"),
    ):
        if isinstance(error, kind):
            return label
    return "error"


class Metrics:
    """The operator's metrics and the bookkeeping behind the end-to-end latency."""

    def __init__(
        self,
        *,
        writes: WriteCounter | None = None,
        queues: Callable[[], Mapping[str, QueueStats]] = dict,
        per_pod: Callable[[], Mapping[str, int]] = dict,
        breakers: Callable[[], Mapping[str, str]] = dict,
        leader: Callable[[], LeaderState | None] = lambda: None,
        clocks: Callable[[], Mapping[str, float | None]] = dict,
        devices: Callable[[], Mapping[tuple[str, str], int]] = dict,
    ) -> None:
        self.registry = CollectorRegistry()
        self.attempts = Counter(
            "bindery_schedule_attempts",
            "Scheduling attempts (binding cycles) by result: scheduled, unschedulable, error, dropped.",
            ["resource_manager", "result"],
            registry=self.registry,
        )
        self.attempt_duration = Histogram(
            "bindery_scheduling_attempt_duration_seconds",
            "Duration of one binding cycle (reserve, pre-bind, bind, post-bind) by result.",
            ["resource_manager", "result"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.pod_scheduling = Histogram(
            "bindery_pod_scheduling_duration_seconds",
            "From the operator first seeing a pod unbound to its successful bind, across retries.",
            ["resource_manager"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.pod_attempts = Histogram(
            "bindery_pod_scheduling_attempts",
            "Attempts it took to schedule a pod (kube-scheduler's scheduler_pod_scheduling_attempts).",
            ["resource_manager"],
            buckets=ATTEMPT_BUCKETS,
            registry=self.registry,
        )
        self.reservations = Counter(
            "bindery_reservations",
            "Reservations by outcome: reserved, unschedulable (the RM had no room), reserve_failed, "
            "committed, commit_failed, released, release_failed.",
            ["resource_manager", "outcome"],
            registry=self.registry,
        )
        self.renewals = Counter(
            "bindery_reservation_renewals",
            "Reservation lease renewals (contract v1.1) by outcome, as bindery_rm_request_duration_seconds.",
            ["resource_manager", "outcome"],
            registry=self.registry,
        )
        self.rm_requests = Histogram(
            "bindery_rm_request_duration_seconds",
            "Resource-manager requests by verb (reserve, renew, commit, release, ready) and outcome.",
            ["resource_manager", "verb", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.released = Counter(
            "bindery_reservations_released",
            "Reservations released, by reason: cycle_failure, pod_departed, unconfirmed_binding, reconcile.",
            ["resource_manager", "reason"],
            registry=self.registry,
        )
        self.preemptions = Counter(
            "bindery_preemptions",
            "Preemption plans (RM contract v1.2) by outcome: proposed (an answer carried one), refused "
            "(vetted out: victims gone or changed, policy Never), confirmed, cancelled (after a PDB's "
            "429 or a failure), and victim_evicted (one per victim).",
            ["resource_manager", "outcome"],
            registry=self.registry,
        )
        self.plans_refused = Counter(
            "bindery_preemption_plans_refused",
            "Preemption plans refused before any eviction, by reason (bindery.scheduling.preemption."
            "REFUSAL_REASONS): unasked, preemptor, node, victim_gone, victim_node, victim_priority, "
            "victim_scope, frees, gang, budget, rules. A rising unasked, node, victim_scope or frees "
            "means the resource manager proposes plans it should not.",
            ["resource_manager", "reason"],
            registry=self.registry,
        )
        self.reconcile_actions = Counter(
            "bindery_reconcile_actions",
            "What reconcile passes did, by action: commit, release, failed (the RM refused or did not "
            "answer), missing_reservation (a bound pod of a served name with no active reservation), "
            "foreign (another cluster's reservation listed and left alone).",
            ["resource_manager", "action"],
            registry=self.registry,
        )
        self.revocations = Counter(
            "bindery_revocations",
            "Reservations the RM revoked (contract v1.2), by what Bindery did: evict (the pod's eviction "
            "was accepted), warn (spec.onRevoked: Warn), acknowledge (no running pod used it), "
            "eviction_blocked (a PodDisruptionBudget refused; retried), failed (retried).",
            ["resource_manager", "action"],
            registry=self.registry,
        )
        self.reconcile_passes = Counter(
            "bindery_reconcile_passes",
            "Reconcile passes by outcome: ok, error (the RM or the apiserver could not be read), or "
            "contract_unknown (the RM's contract is not settled yet: nothing listed, nothing decided).",
            ["resource_manager", "outcome"],
            registry=self.registry,
        )
        self.registry.register(
            _StateCollector(
                writes=writes or WriteCounter(),
                queues=queues,
                per_pod=per_pod,
                breakers=breakers,
                leader=leader,
                clocks=clocks,
                devices=devices,
            )
        )
        self._first_seen: dict[str, float] = {}
        self._reservation_children: dict[str, dict[str, Any]] = {}

    # -- per pod ---------------------------------------------------------------------------------

    def pod_seen(self, uid: str) -> None:
        self._first_seen.setdefault(uid, time.monotonic())

    def pod_forgotten(self, uid: str) -> None:
        self._first_seen.pop(uid, None)

    def pods_seen(self) -> int:
        """Pods whose first sighting is remembered (for the time to their first attempt)."""
        return len(self._first_seen)

    def attempt(
        self, *, resource_manager: str, uid: str, outcome: Outcome, seconds: float, attempts: int = 1
    ) -> None:
        """One cycle ended; `attempts` counts it and the pod's failed ones before it."""
        result = result_label(outcome)
        self.attempts.labels(resource_manager, result).inc()
        self.attempt_duration.labels(resource_manager, result).observe(seconds)
        if outcome in (Outcome.BOUND, Outcome.DROPPED):
            seen = self._first_seen.pop(uid, None)
            if outcome is Outcome.BOUND:
                self.pod_attempts.labels(resource_manager).observe(attempts)
                if seen is not None:
                    self.pod_scheduling.labels(resource_manager).observe(time.monotonic() - seen)

    def rm_request(self, *, resource_manager: str, verb: str, outcome: str, seconds: float) -> None:
        """One RM request: its latency, and what it did to a reservation (reserve, commit, release, renew)."""
        self.rm_requests.labels(resource_manager, verb, outcome).observe(seconds)
        fates = RESERVATION_OUTCOMES.get(verb)
        if fates is not None:
            fate = fates.get(outcome) or fates[""]
            children = self._reservation_children.setdefault(resource_manager, {})
            child = children.get(fate)
            if child is None:  # once per (RM, fate): labels() is not free on the per-pod path
                child = children[fate] = self.reservations.labels(resource_manager, fate)
            child.inc()
        elif verb == "renew":
            self.renewals.labels(resource_manager, outcome).inc()

    def release(self, *, resource_manager: str, reason: str, count: int = 1) -> None:
        self.released.labels(resource_manager, reason).inc(count)

    def reconcile_action(self, *, resource_manager: str, action: str, count: int = 1) -> None:
        self.reconcile_actions.labels(resource_manager, action).inc(count)

    def revocation(self, *, resource_manager: str, action: str) -> None:
        self.revocations.labels(resource_manager, action).inc()

    def reconcile_pass(self, *, resource_manager: str, outcome: str) -> None:
        self.reconcile_passes.labels(resource_manager, outcome).inc()

    # -- exposition ------------------------------------------------------------------------------

    def exposition(self, *, accept: str = "") -> tuple[bytes, str]:
        """The body and its content type, negotiated as prometheus_client's own handler does:
        the classic text format (version 0.0.4), or OpenMetrics when the scraper asks for it."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


class MeasuredRM:
    """A ReservationClient that times every request into `bindery_rm_request_duration_seconds`."""

    def __init__(self, *, inner: ReservationClient, metrics: Metrics, resource_manager: str) -> None:
        self.inner = inner
        self._metrics = metrics
        self._name = resource_manager

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        return await self.measure("reserve", lambda: self.inner.reserve(request))

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation:
        return await self.measure("commit", lambda: self.inner.commit(reservation_id, pod_uid=pod_uid))

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None:
        await self.measure("release", lambda: self.inner.release(reservation_id, pod_uid=pod_uid))

    async def renew(self, reservation_id: str, /, *, pod_uid: str, ttl_seconds: int) -> Reservation:
        return await self.measure(
            "renew", lambda: self.inner.renew(reservation_id, pod_uid=pod_uid, ttl_seconds=ttl_seconds)
        )

    async def list_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None, pod_uid: str | None = None
    ) -> list[Reservation]:
        return await self.measure(
            "list",
            lambda: self.inner.list_reservations(scheduler_name=scheduler_name, state=state, pod_uid=pod_uid),
        )

    async def measure(self, verb: str, call: Callable[[], Awaitable[T]]) -> T:
        # With tracing on, a client span, whose context the RM client sends as traceparent; off, the
        # shared no-op (nothing allocated).
        scope = (
            tracing.span(f"RM {verb}", {"bindery.resource_manager": self._name}, kind="client")
            if tracing.state.on
            else tracing.NO_SPAN
        )
        with scope:
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                return await call()
            except Exception as exc:
                error = exc
                raise
            finally:
                self._metrics.rm_request(
                    resource_manager=self._name,
                    verb=verb,
                    outcome=rm_outcome_label(error),
                    seconds=time.perf_counter() - started,
                )


class _StateCollector(Collector):
    """Read at scrape time: queue depths per ResourceManager, apiserver writes by kind, and (for
    soaks and leak hunts) the entries held per pod by structure and the event loop's task count."""

    def __init__(
        self,
        *,
        writes: WriteCounter,
        queues: Callable[[], Mapping[str, QueueStats]],
        per_pod: Callable[[], Mapping[str, int]] = dict,
        breakers: Callable[[], Mapping[str, str]] = dict,
        leader: Callable[[], LeaderState | None] = lambda: None,
        clocks: Callable[[], Mapping[str, float | None]] = dict,
        devices: Callable[[], Mapping[tuple[str, str], int]] = dict,
    ) -> None:
        self._devices = devices
        self._clocks = clocks
        self._writes = writes
        self._queues = queues
        self._per_pod = per_pod
        self._breakers = breakers
        self._leader = leader

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "bindery_queue_pods",
            "Pods in each ResourceManager's scheduling queue, by queue: active, backoff, "
            "unschedulable, in_flight, binding (waiting in PreBind outside maxInFlight: in the "
            "binding pool or its queue).",
            labels=["resource_manager", "queue"],
        )
        pending = GaugeMetricFamily(
            "bindery_pending_pods",
            "Pending pods by queue: active, backoff, unschedulable (kube-scheduler's "
            "scheduler_pending_pods).",
            labels=["resource_manager", "queue"],
        )
        moved = CounterMetricFamily(
            "bindery_queue_moved_pods",
            "Pods moved out of the unschedulable pool by an event that could make them fit, by event: "
            "placed-pod (a pod on a node added, changed or removed, for pods the placement rules "
            "refused), node, node-deleted (pods a topology spread refused), released (a "
            "reservation), namespace (relabelled), other (kube-scheduler's "
            'scheduler_queue_incoming_pods_total{queue="active"|"backoff"}, by event).',
            labels=["resource_manager", "event"],
        )
        for name, stats in sorted(self._queues().items()):
            for queue in ("active", "backoff", "unschedulable", "in_flight", "binding"):
                depth.add_metric([name, queue], getattr(stats, queue))
            for queue in PENDING_QUEUES:
                pending.add_metric([name, queue], getattr(stats, queue))
            for event, count in stats.moved:
                moved.add_metric([name, event], count)
        claims = CounterMetricFamily(
            "bindery_device_claims",
            "DRA ResourceClaims the DynamicResources plugin handled, by outcome: allocated (the RM's "
            "devices written), reused (already allocated, the pod added to reservedFor), waiting (by "
            "reason: claim_not_created, claim_missing, claim_deleting, not_owner, in_use, in_flight, "
            "class_missing, too_many_claims), failed (not_reserved: the RM refused or found no "
            "devices; rm_answer_missing, write_failed, undone).",
            labels=["outcome", "reason"],
        )
        for (outcome, reason), count in sorted(self._devices().items()):
            claims.add_metric([outcome, reason], count)
        yield claims
        yield depth
        yield pending
        yield moved
        breaker = GaugeMetricFamily(
            "bindery_rm_circuit_breaker_state",
            "1 for the state the RM client's circuit breaker is in (closed, open, half-open), "
            "0 for the others.",
            labels=["resource_manager", "state"],
        )
        for name, current in sorted(self._breakers().items()):
            for state in BREAKER_STATES:
                breaker.add_metric([name, state], 1.0 if state == current else 0.0)
        yield breaker
        clocks = GaugeMetricFamily(
            "bindery_clock_skew_seconds",
            "The peer's clock minus this host's, from its HTTP Date header (±1 s): apiserver, or "
            "rm/<ResourceManager>. Leases stamped by a peer whose clock is off look expired or long.",
            labels=["peer"],
        )
        for peer, seconds in sorted(self._clocks().items()):
            if seconds is not None:
                clocks.add_metric([peer], seconds)
        yield clocks
        leader = self._leader()
        yield GaugeMetricFamily(
            "bindery_leader_election_master_status",
            "1 while this replica leads (or runs without leader election), 0 while it stands by.",
            value=1.0 if leader is None or leader.leading else 0.0,
        )
        renewals = CounterMetricFamily(
            "bindery_leader_lease_renewals",
            "Renewals of the leader's Lease by outcome (ok, failed); none without leader election.",
            labels=["outcome"],
        )
        for outcome, count in sorted((leader.renewals if leader is not None else {}).items()):
            renewals.add_metric([outcome], count)
        yield renewals
        if leader is not None and leader.profiles is not None:
            yield GaugeMetricFamily(
                "bindery_leader_profiles",
                "ResourceManagers whose profile this replica leads (a Lease per ResourceManager).",
                value=float(leader.profiles),
            )
        writes = CounterMetricFamily(
            "bindery_apiserver_writes",
            "Writes Bindery made to the apiserver, by kind (binding, event, condition, ...).",
            labels=["kind"],
        )
        for kind, count in sorted(self._writes.snapshot().items()):
            writes.add_metric([kind], count)
        yield writes
        entries = GaugeMetricFamily(
            "bindery_per_pod_entries",
            "Entries the operator holds per pod, by structure (0 once every pod left; flat in a soak).",
            labels=["structure"],
        )
        for structure, size in sorted(self._per_pod().items()):
            entries.add_metric([structure], size)
        yield entries
        try:  # scraped on the operator's own loop (MetricsServer); elsewhere there is no loop to count
            tasks = len(asyncio.all_tasks())
        except RuntimeError:
            return
        yield GaugeMetricFamily(
            "bindery_asyncio_tasks", "Tasks alive on the operator's event loop.", value=tasks
        )


class MetricsServer:
    """`GET /metrics` in the Prometheus text format, on the operator's event loop (aiohttp); with a
    `queue`, also its read-only JSON views (`/debug/queue`, bindery.controller.queueview).

    The queue views name every pending pod of every tenant, so they answer only a caller whose
    bearer token the apiserver accepts and whose user may `get` the URL (`access`, TokenReview and
    SubjectAccessReview, as kube-scheduler serves its /debug paths); without `access` they are not
    served at all. /metrics is open unless `protect_metrics` (`bindery run --metrics-auth`).

    `serve_metrics=False` makes it the queue views' own listener (`bindery run --debug-addr`): the
    runtime puts the views beside /metrics only when that listens on loopback, since anyone who
    reaches the port may ask them (see :func:`debug_queue_placement`).
    """

    def __init__(
        self,
        *,
        metrics: Metrics,
        host: str,
        port: int,
        queue: QueueView | None = None,
        serve_metrics: bool = True,
        access: AccessReviewer | None = None,
        protect_metrics: bool = False,
    ) -> None:
        self._metrics = metrics
        self._queue = queue if access is not None else None
        self._host = host
        self._port = port
        self._serve_metrics = serve_metrics
        self._access = access
        self._protect_metrics = protect_metrics and access is not None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        if self._serve_metrics:
            app.router.add_get(
                "/metrics", self._guarded(self._serve) if self._protect_metrics else self._serve
            )
        if self._queue is not None:
            app.router.add_get("/debug/queue", self._guarded(self._serve_queue))
            app.router.add_get("/debug/queue/{namespace}/{name}", self._guarded(self._serve_pod))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=self._host, port=self._port)
        await site.start()
        addresses = self._runner.addresses  # the bound (host, port, ...) of each listening socket
        if addresses:
            self._port = int(addresses[0][1])

    def _guarded(
        self, handler: Callable[[web.Request], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """`handler`, answered only once the apiserver authenticated the caller's bearer token and
        authorized a `get` of the request's path; else 401/403/503 with what to do, as plain text."""

        async def guarded(request: web.Request) -> web.Response:
            assert self._access is not None
            decision = await self._access.check(
                authorization=request.headers.get("Authorization"), path=request.path
            )
            if decision.status != 200:
                headers = {"WWW-Authenticate": 'Bearer realm="bindery"'} if decision.status == 401 else {}
                return web.Response(status=decision.status, text=decision.message + "\n", headers=headers)
            return await handler(request)

        return guarded

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        return self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: web.Request) -> web.Response:
        body, content_type = self._metrics.exposition(accept=request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _serve_queue(self, request: web.Request) -> web.Response:
        assert self._queue is not None
        return web.json_response(self._queue.summary())

    async def _serve_pod(self, request: web.Request) -> web.Response:
        assert self._queue is not None
        status, body = self._queue.pod(
            namespace=request.match_info["namespace"],
            name=request.match_info["name"],
            uid=request.query.get("uid") or None,
        )
        return web.json_response(body, status=status)


def is_loopback(host: str) -> bool:
    """Pure: whether `host` (an address to listen on) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def debug_queue_placement(*, metrics_address: str | None, debug_address: str | None) -> str:
    """Pure: where `/debug/queue` is served: "own" (its explicit `--debug-addr`), "metrics" (beside
    /metrics, which listens on loopback), or "none" (the metrics port is reachable from elsewhere).

    The view tells whoever asks which pods wait and when they are tried next: never on an address
    reachable from other hosts unless the operator asked for it by name; wherever served, it
    answers only callers the apiserver authenticates and authorizes (MetricsServer's `access`).
    """
    if debug_address is not None:
        return "own"
    if metrics_address is not None and is_loopback(parse_address(metrics_address)[0]):
        return "metrics"
    return "none"


def parse_address(address: str, *, what: str = "metrics address") -> tuple[str, int]:
    """`HOST:PORT` (or `:PORT`, `[::]:PORT`) → (host, port); raises ValueError with what is expected."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{what} {address!r} is not HOST:PORT (e.g. 0.0.0.0:9090)")
    return host.strip("[]") or "0.0.0.0", int(port)
