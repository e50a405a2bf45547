"""The async client Bindery uses to talk to a resource manager (contract v1).

Why it is careful: the RM sits on the scheduling path of every pod, so the client must neither hang
(explicit connect/read timeouts, a per-attempt deadline, and an overall deadline per call across all
retries and back-off: an RM that trickles one byte per second never trips a read timeout, and must
not hold a pod's cycle for minutes), nor hammer a dead RM (a circuit breaker whose error says when
calls resume), nor retry anything unsafe (every v1 call is idempotent: reserve by its idempotency
key, commit, release and renew by definition), nor let a misbehaving server crash the pipeline (every
response is size-capped while streaming and validated; any contract violation becomes
``RMProtocolError``).

Reserve, commit and release calls that many pods' cycles make at about the same moment are sent
together as one ``POST /v1/batch`` (contract v1.1; :mod:`bindery.rm.batching` decides when), and
each caller gets exactly the value or error its single call would have given: one function per
operation maps an answer to it, whether the answer came alone or inside a batch
(:mod:`bindery.rm.answers`). A lone call is sent as itself, and a v1.0 RM (404/405 on the path)
gets single calls only. The breaker, the token source, the retry rule and what the RM said of its
contract are modules of their own beside this one.

The bearer token is re-read when its file changes, so a rotated Secret is picked up without a
restart; TLS verification is always on for https and plain http must be allowed explicitly.
Requests are built by httpx and sent by aiohttp (:mod:`bindery.rm.transport`), which costs the
operator a fraction of httpx's own connection pool per call.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import pathlib
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
)
from tenacity.wait import wait_exponential_jitter

from bindery import tracing
from bindery.clock import ClockWatch
from bindery.rm.answers import (
    Answer,
    BatchedOutcome,
    Outcome,
    Oversized,
    SingleOutcome,
    commit_result,
    decode,
    error_of,
    parse_retry_after,
    pod_name,
    pod_query,
    problem_or_none,
    quote,
    reference,
    release_result,
    reserve_result,
    without_nodes,
)
from bindery.rm.batching import URGENT_RESERVE, Coalescer
from bindery.rm.breaker import CircuitBreaker
from bindery.rm.errors import (
    RMError,
    RMFeatureMissing,
    RMGroupsUnsupported,
    RMProtocolError,
    RMRejected,
    RMUnauthorized,
    RMUnavailable,
    RMUnschedulable,
    RMUnsupported,
)
from bindery.rm.models import (
    FEATURES_HEADER,
    MAX_BATCH_OPERATIONS,
    BatchResult,
    ClaimDevices,
    ContractInfo,
    Feature,
    GroupMemberRequest,
    Placement,
    PlanState,
    PreemptionPlan,
    Reservation,
    ReservationGroup,
    ReservationGroupRequest,
    ReservationList,
    ReservationRequest,
    ReservationState,
)
from bindery.rm.negotiation import Negotiation, contract_version
from bindery.rm.retry import Retryable, log_retry
from bindery.rm.tokens import TokenSource
from bindery.rm.transport import AiohttpTransport

__all__ = ["CircuitBreaker", "Negotiation", "ResourceManagerClient", "TokenSource"]

log = logging.getLogger(__name__)

#: Largest response body accepted; a page of 500 reservations is far below this.
MAX_RESPONSE_BYTES = 1024 * 1024
_MAX_PAGES = 10_000
#: How long a "this RM has no renew" verdict holds before the client asks again (an RM may be upgraded).
_UNSUPPORTED_FOR = 300.0
#: How long a first "no GET /v1/info" answer stands before the client asks again: only a second one,
#: this much later, makes the RM one of contract v1.1 (the first may be one stray answer: an old
#: replica, a proxy). A lasting v1.1 answer looks like a v1.1 RM whatever the wait, which is why
#: reconciliation also never settles another cluster's reservation; so the wait stays short (a v1.1
#: RM's first reconcile pass comes this much later).
LEGACY_CONFIRM_SECONDS = 1.0
#: How soon the client asks ``GET /v1/info`` again after an error answer, keeping the known contract.
_REASK_AFTER_ERROR = 10.0
#: Answers to ``GET /v1/info`` that mean "no such path": an RM of contract v1.1 or older.
_NO_INFO = (400, 404, 405, 501)
#: Batch requests in flight at once before further calls wait for one of them to finish. One makes
#: the largest batches but holds every call behind a whole round trip; more than two cost CPU for
#: nothing (benchmarks/rm_client_batch_cpu.py, figures in benchmarks/PROFILE.md).
BATCHES_IN_FLIGHT = 2
#: Single reserve, commit and release calls in flight at once when the RM cannot batch (v1.0, or
#: batching off). maxInFlight (256 by default) is sized for batches; 256 concurrent single calls
#: queue behind an RM's writes until they time out and open the breaker. 16 was maxInFlight's
#: default before batches.
SINGLE_CALLS_IN_FLIGHT = 16
#: RM URLs already warned about in this process: a cluster id but an RM without the feature.
_WARNED_UNSCOPED: set[str] = set()
#: RM URLs already warned about in this process: node preferences dropped for an RM without the feature.
_WARNED_UNPREFERRED: set[str] = set()


class _Waiter:
    """A reserve, commit or release call queued for the next batch."""

    __slots__ = ("context", "future", "operation", "queued_at")

    def __init__(self, *, operation: dict[str, Any], queued_at: float) -> None:
        self.operation = operation
        self.queued_at = queued_at
        self.future: asyncio.Future[Outcome | _Verdict] = asyncio.get_running_loop().create_future()
        self.context = contextvars.copy_context()  # the caller's span, for the batch's traceparent

    def live(self) -> bool:
        return not self.future.done()

    def urgent(self) -> bool:
        """A reserve later cycles may wait for (its caller's :data:`URGENT_RESERVE`)."""
        return "reserve" in self.operation and self.context.get(URGENT_RESERVE, True)

    def told(self) -> Outcome | _Verdict | None:
        """What the waiter was handed, if anything (no error, not cancelled)."""
        future = self.future
        if not future.done() or future.cancelled() or future.exception() is not None:
            return None
        return future.result()

    def settle(self, value: Outcome | _Verdict | BaseException) -> None:
        if self.future.done():  # the caller was cancelled: nobody wants the result
            return
        if isinstance(value, BaseException):
            self.future.set_exception(value)
        else:
            self.future.set_result(value)


@dataclass(frozen=True)
class _Verdict:
    """The waiter sends its call alone after all; ``slot``: it holds the in-flight slot of its take."""

    slot: bool


#: Alone in the queue: send the ordinary single call (it occupies the batch's in-flight slot).
_ALONE: Final = _Verdict(slot=True)
#: The batch could not carry the call (v1.0 RM, body too large, per-operation 5xx): send it alone.
_BY_ITSELF: Final = _Verdict(slot=False)


class ResourceManagerClient:
    """Async client for one RM.  Use ``async with`` or call :meth:`aclose`."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str | None = None,
        token_file: pathlib.Path | None = None,
        previous_token: str | None = None,
        on_unauthorized: Callable[[], Awaitable[str | None]] | None = None,
        ca_file: pathlib.Path | None = None,
        client_cert: tuple[pathlib.Path, pathlib.Path] | None = None,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        max_attempts: int = 3,
        allow_insecure_http: bool = False,
        backoff_initial: float = 0.2,
        backoff_max: float = 2.0,
        max_retry_after: float = 10.0,
        failure_threshold: int = 5,
        circuit_cool_down: float = 10.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        call_deadline: float | None = None,
        batching: bool = True,
        batches_in_flight: int = BATCHES_IN_FLIGHT,
        max_batch_operations: int = MAX_BATCH_OPERATIONS,
        single_calls_in_flight: int = SINGLE_CALLS_IN_FLIGHT,
        cluster_id: str | None = None,
        negotiation: Negotiation | None = None,
        legacy_confirm_after: float = LEGACY_CONFIRM_SECONDS,
    ) -> None:
        """``call_deadline`` bounds one logical call (every attempt, back-off and ``Retry-After``
        wait included); it defaults to two attempts' worth, ``2 * (connect_timeout + read_timeout)``.
        For a batched call it counts from the moment the call was queued.

        ``batching`` coalesces concurrent reserve, commit and release calls into ``POST /v1/batch``
        requests of at most ``max_batch_operations``, ``batches_in_flight`` at a time (see
        :mod:`bindery.rm.batching`); off, every call is sent alone as with a v1.0 RM. Calls sent
        alone because the RM cannot batch go at most ``single_calls_in_flight`` at a time.

        ``on_unauthorized`` re-reads the current token after a 401 (the operator's Secret read), and
        ``previous_token`` is tried when the RM refuses the current one: see :class:`TokenSource`.

        ``cluster_id`` (contract v1.2) names the Kubernetes cluster this client acts for. When the RM
        lists the ``cluster-id`` feature in ``GET /v1/info``, every reserve carries it and every list
        asks only for this cluster's reservations, so clusters sharing one RM and one scheduler
        name never see, judge or release each other's. An RM without the feature gets neither (it
        would refuse the field), and lists stay unscoped as in v1.1.

        ``negotiation`` is what the RM said of its contract so far (see :class:`Negotiation` and
        :meth:`contract_info`); ``legacy_confirm_after`` how long after a first 404 on
        ``GET /v1/info`` a second one must come to make the RM one of v1.1.
        """
        url = httpx.URL(base_url)
        if url.scheme not in ("https", "http") or not url.host:
            raise ValueError(f"RM base URL {base_url!r} must be an absolute https:// URL")
        if url.scheme == "http" and not allow_insecure_http:
            raise ValueError(
                f"RM base URL {base_url!r} uses plain http, which would send the bearer token unencrypted; "
                "use https, or set allow_insecure_http for loopback testing"
            )
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._deadline = connect_timeout + read_timeout
        self._call_deadline = 2 * self._deadline if call_deadline is None else call_deadline
        if not self._call_deadline > 0:
            raise ValueError("call_deadline must be positive")
        self.base_url = str(url).rstrip("/")
        self._tokens = TokenSource(
            token=token, token_file=token_file, previous=previous_token, reread=on_unauthorized
        )
        self._max_attempts = max_attempts
        self._backoff = wait_exponential_jitter(
            multiplier=backoff_initial, max=backoff_max, jitter=backoff_initial
        )
        self._max_retry_after = max_retry_after
        self._max_bytes = max_response_bytes
        self._renew_unsupported_until = float("-inf")
        self.cluster_id = cluster_id
        #: the RM's clock against this host's, from the Date header of each readiness probe
        self.clock = ClockWatch(
            peer=f"the RM at {self.base_url}",
            consequence=(
                "The RM stamps reservation leases (expiresAt) with its own clock, so here they look "
                "shorter or longer than the TTL asked for, and renewals come too late or too early."
            ),
            logger=log,
        )
        self._negotiation = negotiation or Negotiation()
        self._legacy_confirm_after = legacy_confirm_after
        self._info: ContractInfo | None = self._negotiation.info
        self._info_until = float("-inf")
        self._info_lock = asyncio.Lock()
        self._batching = batching
        self._batch_unsupported_until = float("-inf")
        self._coalescer: Coalescer[_Waiter] = Coalescer(
            max_in_flight=batches_in_flight,
            max_operations=min(max_batch_operations, MAX_BATCH_OPERATIONS),
            live=_Waiter.live,
            urgent=_Waiter.urgent,
        )
        self._batches: set[asyncio.Task[None]] = set()
        if single_calls_in_flight < 1:
            raise ValueError("single_calls_in_flight must be at least 1")
        self._singles = asyncio.Semaphore(single_calls_in_flight)
        self.breaker = CircuitBreaker(
            failure_threshold=failure_threshold,
            cool_down=circuit_cool_down,
            probe_timeout=min(self._deadline, self._call_deadline),
        )
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(
                connect=connect_timeout, read=read_timeout, write=read_timeout, pool=read_timeout
            ),
            transport=AiohttpTransport(
                base_url=self.base_url,
                ssl_context=self._ssl_context(ca_file=ca_file, client_cert=client_cert)
                if url.scheme == "https"
                else None,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
            ),
            headers={
                "User-Agent": "bindery-rm-client/1",
                "Accept": "application/json, application/problem+json",
            },
            follow_redirects=False,
        )

    @staticmethod
    def _ssl_context(
        *, ca_file: pathlib.Path | None, client_cert: tuple[pathlib.Path, pathlib.Path] | None
    ) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if client_cert is not None:
            context.load_cert_chain(certfile=str(client_cert[0]), keyfile=str(client_cert[1]))
        return context

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for task in list(self._batches):
            task.cancel()  # its callers get RMUnavailable (see _send_batch)
        if self._batches:
            await asyncio.wait(self._batches)
        await self._http.aclose()

    # -- the contract's operations -------------------------------------------------------------

    async def contract_info(self) -> ContractInfo:
        """What the RM says of itself in ``GET /v1/info`` (contract v1.2), remembered for a while.

        Fails closed: once the RM answered 200, no error answer (4xx, 5xx, no answer, a body that
        does not parse) changes what it offered; the client keeps it, says so once, and asks again
        in ``_REASK_AFTER_ERROR`` seconds. A v1.1 replica behind the RM's Service mid-rollout, a
        rollback or a proxy answering 404 would otherwise make lists go out without ``clusterId``.
        Only a 200 answer that lists fewer features (or a lower version) withdraws them: that is the
        RM speaking for itself, followed and logged as an error.

        Before any 200, an RM without the path (400, 404, 405, 501) stands as
        :meth:`ContractInfo.legacy`: provisionally at first (asked again after
        ``legacy_confirm_after``; :meth:`negotiated` stays False), for ``_UNSUPPORTED_FOR`` seconds
        once a second such answer confirms it. Concurrent callers share one request. Before the
        contract is known, raises what any call raises when the RM fails.
        """
        clock = asyncio.get_running_loop().time
        async with self._info_lock:
            if self._info is not None and self._info_until > clock():
                return self._info
            known = self._negotiation.info
            try:
                answer = await self._call("GET", "/v1/info")
                if answer.status == 200:
                    return self._accept(decode(answer, ContractInfo, "read contract info"))
                if answer.status not in _NO_INFO:
                    raise error_of(answer, "read contract info")
            except RMError as error:
                if known is None:
                    raise
                return self._keep(known, why=str(error))
            if known is not None:
                return self._keep(known, why=f"HTTP {answer.status}")
            return self._legacy_answer()

    def _accept(self, info: ContractInfo) -> ContractInfo:
        """A 200 answer: what the RM offers from now on; a withdrawal is said loudly."""
        negotiation, previous = self._negotiation, self._negotiation.info
        if previous is not None:
            withdrawn = sorted(previous.features - info.features)
            lower = contract_version(info.contract_version) < contract_version(previous.contract_version)
            if withdrawn or lower:
                log.error(
                    "the RM at %s withdrew features %s of its contract (its GET /v1/info answered 200 "
                    "with contract %s, after %s): Bindery follows it. Without cluster-id its lists name "
                    "no cluster and every cluster sharing it sees the others' reservations; without "
                    "preemption or revocation no plan or revocation is taken from it. If this RM is "
                    "shared between clusters, stop the other clusters' operators or restore the RM's "
                    "version",
                    self.base_url,
                    withdrawn,
                    info.contract_version,
                    previous.contract_version,
                )
        elif negotiation.legacy_since is not None:
            log.info(
                "the RM at %s answered GET /v1/info: it speaks contract %s",
                self.base_url,
                info.contract_version,
            )
        negotiation.info, negotiation.legacy_since, negotiation.legacy = info, None, False
        negotiation.doubted = False
        self._info, self._info_until = info, asyncio.get_running_loop().time() + _UNSUPPORTED_FOR
        return info

    def _keep(self, known: ContractInfo, *, why: str) -> ContractInfo:
        """An error answer after a 200: keep what the RM offered, ask again soon."""
        if not self._negotiation.doubted:
            self._negotiation.doubted = True
            log.warning(
                "the RM at %s answered GET /v1/info with %s after it offered contract %s with %s: Bindery "
                "keeps that contract (an error never withdraws a feature: an older replica behind the "
                "RM's Service, a rollback or a proxy answers so) and asks again in %gs. To take a feature "
                "back, the RM answers 200 without it; an RM rolled back to v1.1 refuses the v1.2 fields "
                "until the operator restarts",
                self.base_url,
                why,
                known.contract_version,
                sorted(known.features),
                _REASK_AFTER_ERROR,
            )
        self._info, self._info_until = known, asyncio.get_running_loop().time() + _REASK_AFTER_ERROR
        return known

    def _legacy_answer(self) -> ContractInfo:
        """No such path, and no 200 ever: v1.1, provisionally until a later answer confirms it."""
        now, negotiation = asyncio.get_running_loop().time(), self._negotiation
        info = ContractInfo.legacy()
        if negotiation.legacy_since is None:
            negotiation.legacy_since = now
        elif now - negotiation.legacy_since >= self._legacy_confirm_after:
            negotiation.legacy = True
        until = _UNSUPPORTED_FOR if negotiation.legacy else self._legacy_confirm_after
        self._info, self._info_until = info, now + until
        return info

    @property
    def contract_known(self) -> bool:
        """Whether the RM's contract is settled (see :class:`Negotiation`), without a call."""
        return self._negotiation.known

    async def negotiated(self) -> bool:
        """Whether the RM's contract is settled, asking ``GET /v1/info`` if its answer is due.

        A caller that decides from a list which reservations are not its cluster's (reconciliation)
        decides nothing while this is False: a first 404 may come from one old replica, and lists
        without ``clusterId`` show every cluster's reservations.
        """
        await self.contract_info()
        return self._negotiation.known

    async def scoped_cluster(self) -> str | None:
        """The cluster id to send, or None: no cluster id configured, or an RM without ``cluster-id``.

        The first time an RM without the feature meets a client with a cluster id, the process logs
        a warning: such an RM cannot tell clusters apart, so sharing it between clusters is unsafe.
        """
        if self.cluster_id is None:
            return None
        info = await self.contract_info()
        if info.offers(Feature.CLUSTER_ID):
            return self.cluster_id
        if self.base_url not in _WARNED_UNSCOPED:
            _WARNED_UNSCOPED.add(self.base_url)
            log.warning(
                "the RM at %s speaks contract %s without the cluster-id feature: its reservations carry "
                "no cluster, so if another cluster uses it with the same scheduler name, each cluster's "
                "reconciliation releases the other's reservations. Use one RM per cluster until the RM "
                "speaks contract v1.2 (GET /v1/info lists cluster-id)",
                self.base_url,
                info.contract_version,
            )
        return None

    def _doubt_info(self, error: RMRejected, *, sent_cluster: bool) -> None:
        """A 400 to a request that carried a v1.2 field (the cluster id, node preferences, a ``Gt``
        or ``Lt`` toleration): the RM may no longer be the one whose ``GET /v1/info`` offered its
        feature (rolled back to v1.1, or a v1.1 replica answering mid-upgrade). Forget that answer,
        so the next call asks again instead of sending a field the RM refuses for the rest of the
        period."""
        if sent_cluster and error.status == 400:
            self._info_until = float("-inf")

    def takes_node_preferences(self) -> bool:
        """Whether node preferences reach this RM, as far as known without a call: False once
        ``GET /v1/info`` said it lacks ``node-preferences`` (the last answer, which
        :meth:`negotiated_placement` refreshes), True while unknown. PodPlacementRules reads it to
        skip scoring soft rules, and waiting for them, that the RM would never receive."""
        info = self._info or self._negotiation.info
        return info is None or info.offers(Feature.NODE_PREFERENCES)

    def takes_rule_preemption(self) -> bool:
        """Whether ``rulePreemption`` may reach this RM, as far as known without a call (True while
        unknown; the reserve checks ``GET /v1/info``). PodPlacementRules reads it to skip choosing
        victims for the rules that the RM would never receive."""
        info = self._info or self._negotiation.info
        return info is None or (info.offers(Feature.PREEMPTION) and info.offers(Feature.RULE_PREEMPTION))

    async def _takes_rule_preemption(self, request: ReservationRequest) -> bool:
        """``rulePreemption`` goes only with ``PreemptLowerPriority``, to an RM listing both features."""
        if request.preemption_policy != "PreemptLowerPriority":
            return False
        info = await self.contract_info()
        return info.offers(Feature.PREEMPTION) and info.offers(Feature.RULE_PREEMPTION)

    async def negotiated_devices(self, devices: Sequence[ClaimDevices] | None, *, pod: str) -> None:
        """Refuse (``RMFeatureMissing``, no call made) claims for an RM not listing ``devices``.

        Dropping the field would reserve room without devices, and a pod bound with unallocated
        claims never starts; refused as unschedulable, the pod waits for an upgraded RM instead.
        ``GET /v1/info`` is read only when the request has claims to allocate.
        """
        if not devices:
            return
        info = await self.contract_info()
        if info.offers(Feature.DEVICES):
            return
        names = ", ".join(f"{entry.claim.namespace}/{entry.claim.name}" for entry in devices[:5])
        reason = (
            f"pod {pod} has DRA resource claims to allocate ({names}), and the resource manager at "
            f"{self.base_url} (contract {info.contract_version}) does not offer the devices feature "
            "of contract v1.3 (GET /v1/info does not list devices), so Bindery cannot have them "
            "allocated; upgrade the RM to one that lists devices, or give the pod schedulerName "
            "default-scheduler"
        )
        raise RMFeatureMissing(reason, reason=reason)

    async def negotiated_placement(self, placement: Placement, *, pod: str) -> tuple[Placement, bool]:
        """``placement`` as this RM may receive it, and whether it still carries a v1.2 field.

        Node preferences (feature ``node-preferences``) are soft: an RM without the feature gets the
        request without them, and the process warns once per RM that they are ignored. Tolerations
        with ``Gt`` or ``Lt`` (feature ``toleration-comparisons``) are not: dropping one would keep
        the pod off the nodes it tolerates, and sending it gets a ``400`` that retrying cannot
        cure. Such a pod is refused as unschedulable (``RMFeatureMissing``, no call made), with a
        reason that names the field. ``GET /v1/info`` is read only when the placement has either.
        """
        preferences = placement.preferred_node_affinity is not None
        comparisons = placement.compares_tolerations()
        if not preferences and not comparisons:
            return placement, False
        info = await self.contract_info()
        if comparisons and not info.offers(Feature.TOLERATION_COMPARISONS):
            reason = (
                f"pod {pod} has a toleration with operator Gt or Lt (spec.tolerations), which the "
                f"resource manager at {self.base_url} (contract {info.contract_version}) cannot take: "
                "it does not list the toleration-comparisons feature of contract v1.2. Upgrade the "
                "RM, or use Equal or Exists tolerations"
            )
            raise RMFeatureMissing(reason, reason=reason)
        if preferences and not info.offers(Feature.NODE_PREFERENCES):
            placement = placement.model_copy(update={"preferred_node_affinity": None})
            preferences = False
            if self.base_url not in _WARNED_UNPREFERRED:
                _WARNED_UNPREFERRED.add(self.base_url)
                log.warning(
                    "the RM at %s speaks contract %s without the node-preferences feature: pods' "
                    "preferred node affinity, soft inter-pod rules (preferred pod affinity, ScheduleAnyway "
                    "and default spreading) and PreferNoSchedule taints are not sent to it and do not "
                    "shape placement. Upgrade the RM to contract v1.2 (GET /v1/info lists "
                    "node-preferences) for kube-scheduler's soft placement",
                    self.base_url,
                    info.contract_version,
                )
        return placement, preferences or comparisons

    async def reserve(self, request: ReservationRequest) -> Reservation:
        """Reserve capacity; safe to retry because the RM deduplicates by the idempotency key.

        The request gets this client's cluster id when the RM offers the ``cluster-id`` feature.
        """
        cluster = await self.scoped_cluster()
        if cluster is not None and request.cluster_id is None:
            request = request.model_copy(update={"cluster_id": cluster})
        await self.negotiated_devices(request.devices, pod=pod_name(request.pod))
        placement, newer = await self.negotiated_placement(request.placement, pod=pod_name(request.pod))
        if placement is not request.placement:
            request = request.model_copy(update={"placement": placement})
        if request.preemption_policy is not None:
            if (await self.contract_info()).offers(Feature.PREEMPTION):
                newer = True
            else:  # a v1.1 RM never sees the field: it proposes no plan, as before v1.2
                request = request.model_copy(update={"preemption_policy": None})
        if request.rule_preemption is not None and not await self._takes_rule_preemption(request):
            # The listed nodes stay out of reach: the caller's rules accept the pod there only once
            # the named pods are gone, and without the field the RM would place it there.
            nodes = [entry.node for entry in request.rule_preemption]
            request = request.model_copy(
                update={"rule_preemption": None, "placement": without_nodes(request.placement, nodes)}
            )
        body = request.model_dump(by_alias=True, exclude_none=True, mode="json")
        outcome = await self._coalesced(
            {"reserve": body},
            lambda started_at: self._call("POST", "/v1/reservations", json_body=body, started_at=started_at),
        )
        try:
            return reserve_result(request, outcome)
        except RMRejected as error:
            self._doubt_info(error, sent_cluster=cluster is not None or newer)
            raise

    async def confirm_preemption(self, plan_id: str, /) -> PreemptionPlan:
        """Confirm a plan (contract v1.2, feature ``preemption``): from now until the answer's
        ``expiresAt`` the RM holds the capacity the victims free for the preemptor alone.

        Idempotent (confirming a confirmed plan answers it again), so retried. Raises ``RMConflict``
        when the plan was used, cancelled or lapsed (ask for a new one by reserving again) and
        ``RMRejected`` (404) when the RM does not know it.
        """
        answer = await self._call("POST", f"/v1/preemptions/{quote(plan_id)}:confirm", json_body={})
        if answer.status == 200:
            plan = decode(answer, PreemptionPlan, "confirm preemption")
            if plan.plan_id != plan_id or plan.state is not PlanState.CONFIRMED:
                raise RMProtocolError(
                    f"the RM answered confirm of preemption plan {plan_id} with plan {plan.plan_id} in "
                    f"state {plan.state.value}; expected that plan, confirmed"
                )
            return plan
        raise error_of(answer, "confirm preemption")

    async def cancel_preemption(self, plan_id: str, /) -> None:
        """Cancel a plan (contract v1.2): the RM stops holding its capacity. Idempotent; a plan the
        RM does not know (never made, or forgotten after it lapsed) is not an error."""
        answer = await self._call("POST", f"/v1/preemptions/{quote(plan_id)}:cancel", json_body={})
        if answer.status in (200, 404):
            return
        raise error_of(answer, "cancel preemption")

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation:
        """Commit after binding; committing twice is fine.

        With ``pod_uid`` (contract v1.1) the RM refuses to commit another pod's reservation
        (``RMPodMismatch``, nothing changed); a v1.0 RM ignores the parameter, so the answer's
        ``podUid`` is checked here as well.
        """
        outcome = await self._coalesced(
            {"commit": reference(reservation_id, pod_uid)},
            lambda started_at: self._call(
                "POST",
                f"/v1/reservations/{quote(reservation_id)}/commit",
                json_body={},
                params=pod_query(pod_uid),
                started_at=started_at,
            ),
        )
        return commit_result(reservation_id, pod_uid, outcome)

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None:
        """Release; an unknown or already released reservation is not an error.

        With ``pod_uid`` (contract v1.1) the RM refuses to release another pod's reservation
        (``RMPodMismatch``, nothing changed); a v1.0 RM ignores the parameter.
        """
        outcome = await self._coalesced(
            {"release": reference(reservation_id, pod_uid)},
            lambda started_at: self._call(
                "DELETE",
                f"/v1/reservations/{quote(reservation_id)}",
                params=pod_query(pod_uid),
                started_at=started_at,
            ),
        )
        release_result(outcome)

    async def renew(self, reservation_id: str, /, *, pod_uid: str, ttl_seconds: int) -> Reservation:
        """Extend a reserved lease to now + ``ttl_seconds`` (contract v1.1); idempotent, so retried.

        A committed reservation holds no lease and comes back unchanged.  Raises ``RMConflict`` when
        the reservation was released or expired (reserve again), ``RMPodMismatch`` when it belongs to
        another pod, ``RMRejected`` (404) when the RM does not know it, and ``RMUnsupported`` when the
        RM speaks v1.0: a v1.0 RM answers 404 or 405 for the unknown path, which is told apart from an
        unknown reservation by reading the reservation.  That verdict is remembered for a while, so
        a v1.0 RM costs one round trip per ``_UNSUPPORTED_FOR`` seconds, not one per call.
        """
        clock = asyncio.get_running_loop().time
        if self._renew_unsupported_until > clock():
            raise self._renew_unsupported()
        path = f"/v1/reservations/{quote(reservation_id)}/renew"
        answer = await self._call("POST", path, json_body={"podUid": pod_uid, "ttlSeconds": ttl_seconds})
        if answer.status == 200:
            reservation = decode(answer, Reservation, "renew")
            if (
                reservation.id != reservation_id
                or reservation.pod_uid != pod_uid
                or not reservation.state.active
            ):
                raise RMProtocolError(
                    f"the RM answered renew of {reservation_id} for pod {pod_uid} with reservation "
                    f"{reservation.id} of pod {reservation.pod_uid} in state {reservation.state.value}; "
                    "expected that reservation, still active"
                )
            return reservation
        if answer.status == 405 or (answer.status == 404 and await self._exists(reservation_id)):
            self._renew_unsupported_until = clock() + _UNSUPPORTED_FOR
            raise self._renew_unsupported()
        raise error_of(answer, "renew")

    async def _exists(self, reservation_id: str) -> bool:
        """Whether the RM knows the reservation (``GET`` is 200): tells a missing path from a missing id."""
        answer = await self._call("GET", f"/v1/reservations/{quote(reservation_id)}")
        if answer.status == 200:
            return True
        if answer.status in (404, 410):
            return False
        raise error_of(answer, f"read reservation {reservation_id}")

    def _renew_unsupported(self) -> RMUnsupported:
        return RMUnsupported(
            f"the RM at {self.base_url} has no renew operation (it speaks contract v1.0, renew came with "
            "v1.1): leases cannot be extended; upgrade the RM, or keep cycles shorter than the lease"
        )

    # -- reservation groups (contract v1.1) -----------------------------------------------------

    async def reserve_group(self, request: ReservationGroupRequest) -> ReservationGroup:
        """Reserve for every member of a group or for none (contract v1.1); safe to retry, because
        the RM deduplicates by the group's idempotency key and answers a replay with the same group.

        Raises ``RMUnschedulable`` when the group does not fit (its ``reason`` says why the GROUP
        does not), ``RMConflict`` when the key belongs to a different request, and
        ``RMGroupsUnsupported`` when the RM answers 404 (or 405) on the path: it has no groups. On a
        replay the members may have moved on since (committed, or released one by one): their
        states are the RM's current ones. The request gets this client's cluster id when the RM
        offers the ``cluster-id`` feature.
        """
        cluster = await self.scoped_cluster()
        if cluster is not None and request.cluster_id is None:
            request = request.model_copy(update={"cluster_id": cluster})
        members: list[GroupMemberRequest] = []
        newer = False
        for member in request.members:
            await self.negotiated_devices(member.devices, pod=pod_name(member.pod))
            placement, member_newer = await self.negotiated_placement(
                member.placement, pod=pod_name(member.pod)
            )
            newer = newer or member_newer
            same = placement is member.placement
            members.append(member if same else member.model_copy(update={"placement": placement}))
        if any(new is not old for new, old in zip(members, request.members, strict=True)):
            request = request.model_copy(update={"members": members})
        if request.preemption_policy is not None:
            if (await self.contract_info()).offers(Feature.GROUP_PREEMPTION):
                newer = True
            else:  # an RM without group preemption never sees the field: no plan, as before
                request = request.model_copy(update={"preemption_policy": None})
        body = request.model_dump(by_alias=True, exclude_none=True, mode="json")
        answer = await self._call("POST", "/v1/reservation-groups", json_body=body)
        if answer.status in (200, 201):
            group = decode(answer, ReservationGroup, "reserve group")
            asked = [member.pod.uid for member in request.members]
            answered = [member.pod_uid for member in group.members]
            strays = [member.id for member in group.members if member.group_id != group.id]
            if answered != asked or strays:
                raise RMProtocolError(
                    f"the RM answered the group reservation of {request.group.namespace}/"
                    f"{request.group.name} with group {group.id} whose members are pods {answered} "
                    f"(asked for {asked}, in that order), members not in the group: {strays}; an RM must "
                    "return one reservation per member, in the order asked, each with the group's id"
                )
            return group
        if answer.status in (404, 405):
            raise self._groups_unsupported(answer.status)
        error = error_of(answer, "reserve group")
        if isinstance(error, RMRejected):
            self._doubt_info(error, sent_cluster=cluster is not None or newer)
        if isinstance(error, RMUnschedulable):
            error.asked = request.preemption_policy  # as sent, after negotiation
        raise error

    async def get_group(self, group_id: str, /) -> ReservationGroup:
        """The group with its members' current states; ``RMRejected`` (404) when the RM does not
        know it (never made, or gone after its members ended and were cleaned up)."""
        answer = await self._call("GET", f"/v1/reservation-groups/{quote(group_id)}")
        if answer.status == 200:
            group = decode(answer, ReservationGroup, "read group")
            if group.id != group_id:
                raise RMProtocolError(f"the RM answered a read of group {group_id} with group {group.id}")
            return group
        raise error_of(answer, f"read group {group_id}")

    async def release_group(self, group_id: str, /) -> None:
        """Release every member still ``reserved``; committed members stay (they belong to bound
        pods, released one by one with :meth:`release`).  An unknown group is not an error."""
        answer = await self._call("DELETE", f"/v1/reservation-groups/{quote(group_id)}")
        if answer.status in (200, 202, 204, 404, 410):
            return
        raise error_of(answer, f"release group {group_id}")

    async def renew_group(self, group_id: str, /, *, ttl_seconds: int) -> ReservationGroup:
        """Move the group's one lease to now + ``ttl_seconds``: every ``reserved`` member's.

        Raises ``RMConflict`` when no member is active any more (reserve again) and ``RMRejected``
        (404) when the RM does not know the group.
        """
        answer = await self._call(
            "POST", f"/v1/reservation-groups/{quote(group_id)}/renew", json_body={"ttlSeconds": ttl_seconds}
        )
        if answer.status == 200:
            group = decode(answer, ReservationGroup, "renew group")
            if group.id != group_id:
                raise RMProtocolError(
                    f"the RM answered the renewal of group {group_id} with group {group.id}"
                )
            return group
        if answer.status == 405:
            raise self._groups_unsupported(answer.status)
        raise error_of(answer, f"renew group {group_id}")

    def _groups_unsupported(self, status: int) -> RMGroupsUnsupported:
        return RMGroupsUnsupported(
            f"the RM at {self.base_url} has no reservation groups (it answered HTTP {status} on "
            "/v1/reservation-groups: it speaks contract v1.0, or v1.1 without groups), so a pod group "
            "cannot be reserved all-or-nothing there; upgrade the RM to one that offers groups, or "
            "serve the group's scheduler name with such an RM"
        )

    async def list_reservations(
        self,
        *,
        scheduler_name: str | None = None,
        state: str | None = None,
        pod_uid: str | None = None,
        group_id: str | None = None,
        all_clusters: bool = False,
        features: str | None = None,
    ) -> list[Reservation]:
        """Every matching reservation, following pagination to the end.

        ``group_id`` (v1.1) keeps the members of one reservation group; a v1.0 RM rejects the
        parameter (400). A client with a cluster id lists only that cluster's reservations when the
        RM offers the ``cluster-id`` feature (v1.2), unless ``all_clusters``; reservations made
        without a cluster id are then not listed.
        """
        cluster = None if all_clusters else await self.scoped_cluster()
        params = {
            "schedulerName": scheduler_name,
            "state": state,
            "podUid": pod_uid,
            "groupId": group_id,
            "clusterId": cluster,
        }
        query = {key: value for key, value in params.items() if value is not None}
        items: list[Reservation] = []
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            answer = await self._call("GET", "/v1/reservations", params=query, features=features)
            if answer.status != 200:
                error = error_of(answer, "list reservations")
                if isinstance(error, RMRejected):
                    self._doubt_info(error, sent_cluster=cluster is not None)
                raise error
            page = decode(answer, ReservationList, "list reservations")
            items.extend(page.items)
            if not page.next_cursor:
                return items
            if page.next_cursor in seen:
                raise RMProtocolError(
                    f"the RM returned the cursor {page.next_cursor!r} twice while listing reservations; "
                    "its pagination loops, which is a bug in the RM"
                )
            seen.add(page.next_cursor)
            query["cursor"] = page.next_cursor
        raise RMProtocolError(f"the RM returned more than {_MAX_PAGES} pages of reservations; giving up")

    async def list_revoked_reservations(self, *, scheduler_name: str | None = None) -> list[Reservation]:
        """The reservations the RM took back and nobody acknowledged yet (contract v1.2 feature
        ``revocation``), this cluster's and those made without a cluster id; ``[]`` from an RM
        without the feature (it never revokes, as far as the contract can tell).

        Acknowledge one by releasing it (with its pod's UID) once its pod was dealt with.
        """
        if not (await self.contract_info()).offers(Feature.REVOCATION):
            return []
        found = await self.list_reservations(
            scheduler_name=scheduler_name,
            state=ReservationState.REVOKED.value,
            features=Feature.REVOCATION.value,
        )
        if await self.scoped_cluster() is not None:
            found += [
                reservation
                for reservation in await self.list_reservations(
                    scheduler_name=scheduler_name,
                    state=ReservationState.REVOKED.value,
                    all_clusters=True,
                    features=Feature.REVOCATION.value,
                )
                if reservation.cluster_id is None
            ]
        return found

    async def list_unscoped_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None
    ) -> list[Reservation]:
        """The reservations made without a cluster id (before an upgrade to contract v1.2), which
        this client's filtered lists leave out; ``[]`` when its lists are not filtered (no cluster
        id, or an RM without ``cluster-id``), since they are then in every list already.

        It lists every cluster's reservations of the name and keeps those of no cluster: the
        contract has no filter for "no cluster id".
        """
        if await self.scoped_cluster() is None:
            return []
        every = await self.list_reservations(scheduler_name=scheduler_name, state=state, all_clusters=True)
        return [reservation for reservation in every if reservation.cluster_id is None]

    async def serves(self) -> bool:
        """Whether ``/readyz`` answers 200 now: one GET, no retry, past the circuit breaker.

        Asked while pods wait for an RM that refused them as unavailable (starting, its mirrors
        still listing). Those refusals open the breaker, which would hold every call for its
        cool-down after the RM turned ready; a 200 here closes it, so the pods go through at once.
        """
        ends_at = asyncio.get_running_loop().time() + self._deadline
        try:
            answer = await self._send(
                "GET", "/readyz", json_body=None, params=None, authenticated=False, ends_at=ends_at
            )
        except Retryable:
            return False
        if answer.status != 200:
            return False
        self.breaker.record_success()
        return True

    async def check_ready(self) -> None:
        """Raise RMUnavailable unless ``/readyz`` answers 200 and the RM accepts the token.

        ``/readyz`` is public (contract v1), so a wrong token would pass it and fail every pod
        instead: the probe also lists one reservation, which needs the token, and raises
        :class:`RMUnauthorized` when the RM refuses it.
        """
        sent_at = time.time()
        answer = await self._call("GET", "/readyz", authenticated=False)
        self.clock.observe(answer.headers.get("date"), sent_at=sent_at, received_at=time.time())
        if answer.status != 200:
            raise RMUnavailable(f"the RM at {self.base_url} is not ready: /readyz answered {answer.status}")
        answer = await self._call("GET", "/v1/reservations", params={"limit": "1"})
        if answer.status == 401:
            raise RMUnauthorized(
                f"the RM at {self.base_url} refused the bearer token (401) after it was re-read: the "
                "token Bindery sends is not one the RM accepts; put the RM's current token in the "
                "ResourceManager's token Secret"
            )
        if answer.status != 200:
            raise error_of(answer, "the readiness probe's authenticated list")

    # -- coalescing reserve, commit and release into POST /v1/batch (contract v1.1) ------------

    async def _coalesced(
        self, operation: dict[str, Any], single: Callable[[float | None], Awaitable[Answer]]
    ) -> Outcome:
        """The answer to one reserve, commit or release: from a batch, or from ``single``, its
        ordinary call, when it is alone in the queue or the RM cannot batch (given when the call
        was queued: its deadline counts from then, as a batch's does).

        The caller's cancellation cancels only its own wait (or its own single call): a batch
        already on its way is carried on for the others, and its answer for this one is dropped.
        """
        loop = asyncio.get_running_loop()
        if not self._batching or self._batch_unsupported_until > loop.time():
            async with self._singles:
                return SingleOutcome(await single(None))
        waiter = _Waiter(operation=operation, queued_at=loop.time())
        if self._coalescer.add(waiter):
            loop.call_soon(self._flush)
        try:
            verdict = await waiter.future
        except asyncio.CancelledError:
            # Cancelled after being told to go alone (result set, not yet resumed): free the slot.
            if waiter.told() is _ALONE:
                self._finish_batch()
            raise
        if not isinstance(verdict, _Verdict):
            return verdict
        try:
            if verdict.slot:  # alone in the queue: bounded by the batches' slots already
                return SingleOutcome(await single(waiter.queued_at))
            async with self._singles:
                return SingleOutcome(await single(waiter.queued_at))
        finally:
            if verdict.slot:
                self._finish_batch()

    def _flush(self) -> None:
        """The scheduled send: what is queued leaves now, alone or as one batch."""
        waiters, again = self._coalescer.take()
        if again:
            asyncio.get_running_loop().call_soon(self._flush)
        if not waiters:
            return
        if len(waiters) == 1 or self._batch_unsupported_until > asyncio.get_running_loop().time():
            if len(waiters) > 1:
                self._finish_batch()  # learnt meanwhile that the RM cannot batch: nobody holds a slot
                for waiter in waiters:
                    waiter.settle(_BY_ITSELF)
                return
            waiters[0].settle(_ALONE)
            return
        # The batch is sent in the first operation's context, so it carries that caller's
        # traceparent (tracing.inject in _send): one request can continue only one trace.
        task = asyncio.create_task(self._send_batch(waiters), context=waiters[0].context)
        self._batches.add(task)
        task.add_done_callback(functools.partial(self._batch_done, waiters))

    def _batch_done(self, waiters: list[_Waiter], task: asyncio.Task[None]) -> None:
        self._batches.discard(task)
        if task.cancelled():
            # Cancelled before its first step (aclose() in the iteration that created it), its body
            # never ran to answer the callers: they would wait for ever.  Those it answered ignore this.
            for waiter in waiters:
                waiter.settle(RMUnavailable(f"the client of the RM at {self.base_url} was closed"))

    def _finish_batch(self) -> None:
        if self._coalescer.finish():
            asyncio.get_running_loop().call_soon(self._flush)

    async def _send_batch(self, waiters: list[_Waiter]) -> None:
        """Send one batch and hand each waiter its result; never leaves a waiter hanging."""
        try:
            answer = await self._call(
                "POST",
                "/v1/batch",
                json_body={"operations": [waiter.operation for waiter in waiters]},
                started_at=min(waiter.queued_at for waiter in waiters),
            )
            outcomes = self._batch_outcomes(answer, len(waiters))
        except Oversized:
            # Each result may be as large as its single call's answer, so the answer to many
            # operations can pass the cap one answer fits in.  The RM has carried them out; each
            # replayed alone (safe: every operation is idempotent) gets its own answer within it.
            log.warning(
                "The RM at %s answered a batch of %d operations with more than %d bytes; sending them "
                "as single calls",
                self.base_url,
                len(waiters),
                self._max_bytes,
            )
            for waiter in waiters:
                waiter.settle(_BY_ITSELF)
        except RMError as error:
            for waiter in waiters:
                waiter.settle(error)
        except asyncio.CancelledError:
            for waiter in waiters:
                waiter.settle(RMUnavailable(f"the client of the RM at {self.base_url} was closed"))
            raise
        except Exception as error:  # a bug here must not leave the cycles waiting forever
            for waiter in waiters:
                waiter.settle(error)
            raise
        else:
            for waiter, outcome in zip(waiters, outcomes, strict=True):
                waiter.settle(outcome)
        finally:
            self._finish_batch()

    def _batch_outcomes(self, answer: Answer, count: int) -> list[Outcome | _Verdict]:
        """Each operation's outcome from the batch's answer (or that it must go alone)."""
        if answer.status in (404, 405):
            # A v1.0 RM: single calls for a while (an RM may be upgraded, so ask again later).
            self._batch_unsupported_until = asyncio.get_running_loop().time() + _UNSUPPORTED_FOR
            log.info(
                "The RM at %s has no POST /v1/batch (HTTP %d: contract v1.0); sending single calls",
                self.base_url,
                answer.status,
            )
            return [_BY_ITSELF] * count
        if answer.status == 413:
            return [_BY_ITSELF] * count  # larger than the RM accepts: each fits alone
        if answer.status != 200:
            raise error_of(answer, f"a batch of {count} operations")
        batch = decode(answer, BatchResult, f"a batch of {count} operations")
        if len(batch.results) != count:
            raise RMProtocolError(
                f"the RM answered a batch of {count} operations with {len(batch.results)} results; the "
                "contract requires one result per operation, in order"
            )
        return [
            # A 5xx or 429 for one operation: its single call retries it as any other call would.
            _BY_ITSELF if result.status >= 500 or result.status == 429 else BatchedOutcome(result)
            for result in batch.results
        ]

    # -- transport, retries, circuit breaker ---------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        authenticated: bool = True,
        started_at: float | None = None,
        features: str | None = None,
    ) -> Answer:
        """One logical call with retries; returns the final non-retryable answer.

        Everything, waits included, fits in ``call_deadline`` from ``started_at`` (loop time;
        default now: a batch passes when its oldest operation was queued): no retry starts whose
        back-off would end past it, and each attempt gets at most what is left of it.
        """
        clock = asyncio.get_running_loop().time
        now = clock()
        ends_at = (now if started_at is None else min(now, started_at)) + self._call_deadline
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._max_attempts) | stop_before_delay(ends_at - now),
            wait=self._wait,
            retry=retry_if_exception_type(Retryable),
            before_sleep=log_retry,
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    return await self._attempt(
                        method,
                        path,
                        json_body=json_body,
                        params=params,
                        authenticated=authenticated,
                        ends_at=ends_at,
                        features=features,
                    )
        except Retryable as final:
            if attempts < self._max_attempts:
                final.error.message += (
                    f" (gave up after {attempts} of {self._max_attempts} attempts: another would not fit "
                    f"in the call's deadline of {self._call_deadline:.1f}s)"
                )
                final.error.args = (final.error.message,)
            raise final.error from None
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    def _wait(self, state: RetryCallState) -> float:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        if isinstance(error, Retryable) and error.error.retry_after is not None:
            return min(error.error.retry_after, self._max_retry_after)
        return float(self._backoff(state))

    async def _attempt(
        self,
        method: str,
        path: str,
        *,
        json_body: Mapping[str, Any] | None,
        params: Mapping[str, str] | None,
        authenticated: bool,
        ends_at: float,
        features: str | None = None,
    ) -> Answer:
        probe = self.breaker.before_call()
        send = functools.partial(
            self._send,
            method,
            path,
            json_body=json_body,
            params=params,
            authenticated=authenticated,
            ends_at=ends_at,
            features=features,
        )
        try:
            sent = self._tokens.current() if authenticated else None  # what send() puts in the header
            answer = await send()
            if answer.status == 401 and authenticated and await self._tokens.after_refusal(sent):
                answer = await send()
        except BaseException:
            if probe:
                self.breaker.abandon_probe()  # a verdict (if any) was recorded already
            raise
        if answer.status == 429:
            self.breaker.record_success()  # alive, just busy
            raise Retryable(self._unavailable(answer, f"{method} {path} was rate-limited (429)"))
        if answer.status >= 500:
            self.breaker.record_failure()
            raise Retryable(self._unavailable(answer, f"{method} {path} failed with HTTP {answer.status}"))
        self.breaker.record_success()
        return answer

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json_body: Mapping[str, Any] | None,
        params: Mapping[str, str] | None,
        authenticated: bool,
        ends_at: float,
        features: str | None = None,
    ) -> Answer:
        headers: dict[str, str] = {}
        if features:
            headers[FEATURES_HEADER] = features  # v1.2: answers the caller reads (revocation)
        token = self._tokens.current() if authenticated else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if tracing.state.on:
            tracing.inject(headers)  # W3C traceparent: the RM may continue the attempt's trace
        content: bytes | None = None
        if json_body is not None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        left = ends_at - asyncio.get_running_loop().time()
        limit = min(self._deadline, left)
        try:
            if limit <= 0:
                raise TimeoutError
            async with asyncio.timeout(limit):
                async with self._http.stream(
                    method, path, content=content, params=params, headers=headers
                ) as response:
                    body = await self._read_capped(response, method, path)
                    return Answer(response.status_code, response.headers, body)
        except (httpx.TimeoutException, TimeoutError) as error:
            self.breaker.record_failure()
            if isinstance(error, httpx.TimeoutException):
                why = f"{type(error).__name__}: no progress within the connect/read timeout"
            elif limit < self._deadline:
                why = f"the call's overall deadline of {self._call_deadline:.1f}s ran out"
            else:
                why = f"the answer did not complete within {self._deadline:.1f}s"
            raise Retryable(
                RMUnavailable(
                    f"{method} {path} to the RM at {self.base_url} timed out ({why}); "
                    "the RM is slow, unreachable or sending its answer too slowly"
                )
            ) from None
        except httpx.TransportError as error:
            self.breaker.record_failure()
            raise Retryable(
                RMUnavailable(
                    f"{method} {path} to the RM at {self.base_url} failed: {type(error).__name__}: {error}; "
                    "check that the RM is running and the URL, port and TLS settings are right"
                )
            ) from None

    async def _read_capped(self, response: httpx.Response, method: str, path: str) -> bytes:
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_bytes:
            raise self._oversized(method, path)
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self._max_bytes:
                    raise self._oversized(method, path)
                chunks.append(chunk)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.DecodingError) as error:
            self.breaker.record_failure()
            raise RMProtocolError(
                f"the RM's answer to {method} {path} was cut off or corrupt ({type(error).__name__}: {error})"
            ) from None
        return b"".join(chunks)

    def _oversized(self, method: str, path: str) -> RMProtocolError:
        return Oversized(
            f"the RM's answer to {method} {path} is larger than {self._max_bytes} bytes; "
            "the contract's responses are small, so the RM is misbehaving"
        )

    def _unavailable(self, answer: Answer, what: str) -> RMUnavailable:
        retry_after = parse_retry_after(answer.headers.get("retry-after"))
        detail = problem_or_none(answer)
        suffix = f": {detail.detail}" if detail is not None and detail.detail else ""
        return RMUnavailable(f"{what} at the RM {self.base_url}{suffix}", retry_after=retry_after)
