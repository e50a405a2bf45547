"""The reference resource manager's HTTP server (aiohttp), implementing contract v1.

This is the I/O edge: it authenticates, bounds and validates requests, and funnels every state
change through ONE worker thread that owns the SQLite store, so concurrent reserve calls are
serialized and can never overcommit a node.  Placement itself is the pure code in
:mod:`bindery.reference_rm.placement`.  Every error answer is RFC 9457 problem+json with a stable type.

Contract v1.1's ``POST /v1/batch`` carries many reserve, commit and release operations in one
request: the store carries them out in one transaction (:meth:`ReservationStore.batch`), and each
operation answers through the same function as its single call (:func:`reserve_answer`,
:func:`commit_answer`, :func:`release_answer`), so a batched operation cannot answer differently.

``/readyz`` answers 503 with the reason while the RM cannot place pods: before it has an inventory,
while the database refuses writes (a full disk, an I/O error: every reserve would answer 500), and
while a check added with :meth:`ReferenceRM.add_readiness_check` fails (a mirror gone stale).  A
failed write is remembered; each ``/readyz`` then tries a write of a request's size, and the first
that commits makes the RM ready again, with no restart and no need for other traffic.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import hmac
import json
import logging
import os
import pathlib
import sqlite3
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ParamSpec, TypeVar, cast

import pydantic
import yaml
from aiohttp import web

from bindery import tracing
from bindery.reference_rm.accounting import BoundPod, ClusterPods
from bindery.reference_rm.devices import DeviceAllocator, DeviceInUse
from bindery.reference_rm.groups import MemberAsk
from bindery.reference_rm.placement import InventoryNode, Policy, effective_usage
from bindery.reference_rm.preemption import (
    DEFAULT_LEASE_SECONDS,
    Budget,
    BudgetIndex,
    Plan,
    PlanMember,
    Proposal,
    choose_group_victims,
    choose_rule_victims,
    choose_victims,
    group_plan_key,
)
from bindery.reference_rm.store import (
    DEFAULT_MAX_RELEASED_ROWS,
    FOREIGN_RETRY_SECONDS,
    BatchOutcome,
    CommitOutcome,
    Conflict,
    GroupConflict,
    GroupPlaced,
    NotActive,
    NotFound,
    Placed,
    PodMismatch,
    ReleaseOutcome,
    ReservationStore,
    ReserveOutcome,
    StoredGroup,
    StoredReservation,
    Unschedulable,
    revocation_shown,
)
from bindery.reference_rm.stores import UNREACHABLE, Store, open_store
from bindery.rm.contract import openapi_text
from bindery.rm.errors import ProblemType
from bindery.rm.models import (
    CONTRACT_VERSION,
    FEATURES_HEADER,
    BatchOperation,
    ContractInfo,
    Feature,
    GroupRenewRequest,
    Placement,
    PlanState,
    RenewRequest,
    ReservationGroupRequest,
    ReservationRequest,
    ReservationState,
)
from bindery.rm.serving import (
    KINDS,
    ListQuery,
    batch_operations,
    is_json,
    list_query,
    problem,
    problem_body,
    read_capped,
    validation_errors,
)

__all__ = [
    "DEFAULT_MAX_BATCH_BODY_BYTES",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_GROUP_BODY_BYTES",
    "Answer",
    "ReferenceRM",
    "RunningServer",
    "TokenCheck",
    "commit_answer",
    "release_answer",
    "reserve_answer",
    "serve_reference_rm",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024
#: A group of up to 1000 members needs more than one pod's request: about 300 bytes per member.
DEFAULT_MAX_GROUP_BODY_BYTES = 2 * 1024 * 1024
#: A batch of up to 500 operations: a reserve is about 400 bytes, 8 KiB leaves room for labels.
DEFAULT_MAX_BATCH_BODY_BYTES = 4 * 1024 * 1024
_GROUPS = "/v1/reservation-groups"
_BATCH = "/v1/batch"
#: pydantic's message for an unknown field, which a v1.1 RM answers for each field of v1.2.
_EXTRA = "Extra inputs are not permitted"
#: Reservations whose pod and priority are remembered for preemption without the mirror.
_REMEMBERED_PLACED = 100_000
#: The operator's paths (reference RM only, not contract v1), guarded by their own token.
_ADMIN = "/admin/v1"
_PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.yaml", "/openapi.json"})
P = ParamSpec("P")
T = TypeVar("T")
#: Why the RM is not ready, or None when it is (a readiness check of :meth:`ReferenceRM.add_readiness_check`).
ReadinessCheck = Callable[[], str | None]


def _storage_failure(error: sqlite3.Error) -> bool:
    """Whether the database itself failed (full, I/O, unopenable), not a statement of the store's."""
    return type(error) in (sqlite3.OperationalError, sqlite3.DatabaseError)


@dataclass(frozen=True)
class Answer:
    """What a reserve, commit or release answers, whether it came as its own call or in a batch.

    The single handlers turn it into the HTTP response (:meth:`response`), the batch into one item
    of its ``results`` (:meth:`result_json`): one mapping from the store's outcome per operation,
    so the two can never drift apart.
    """

    status: int
    reservation: StoredReservation | None = None  # the body of a 200/201
    problem: dict[str, Any] | None = None  # the body of a 4xx
    location: bool = False  # a reserve's answer names the reservation's path

    @classmethod
    def refusal(
        cls, status: int, kind: str, detail: str, *, title: str | None = None, **extensions: Any
    ) -> Answer:
        return cls(status, problem=problem_body(status, kind, detail, title=title, **extensions))

    def response(self) -> web.Response:
        if self.problem is not None:
            return web.Response(
                status=self.status, text=json.dumps(self.problem), content_type="application/problem+json"
            )
        if self.reservation is None:
            return web.Response(status=self.status)
        return web.Response(
            status=self.status,
            text=self.reservation.to_model().model_dump_json(by_alias=True),
            content_type="application/json",
            headers={"Location": f"/v1/reservations/{self.reservation.id}"} if self.location else None,
        )

    def result_json(self) -> str:
        """This answer as one ``BatchOperationResult`` of a batch's ``results`` (JSON text)."""
        if self.problem is not None:
            return f'{{"status":{self.status},"problem":{json.dumps(self.problem)}}}'
        if self.reservation is None:
            return f'{{"status":{self.status}}}'
        reservation = self.reservation.to_model().model_dump_json(by_alias=True)
        return f'{{"status":{self.status},"reservation":{reservation}}}'


#: Seconds the previous token stays accepted after the token file changed (`--token-overlap`).
DEFAULT_TOKEN_OVERLAP = 300.0


class TokenCheck:
    """Bearer-token verification; a token file is re-read when it changes (rotation without restart).

    Why an overlap: a rotation writes the new token in two places, this file and the callers'
    Secret, and they change at different moments (the kubelet refreshes a mounted Secret about a
    minute after the operator has read it through the API). For `overlap` seconds after this RM saw
    the file change, the previous token is accepted as well, so a caller still on it is not refused
    (callers re-read their Secret after a 401 too, which covers an RM run with no overlap).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        token_file: pathlib.Path | None = None,
        overlap: float = DEFAULT_TOKEN_OVERLAP,
    ) -> None:
        if (token is None) == (token_file is None):
            raise ValueError("configure the RM bearer token either inline or as a file (exactly one)")
        if overlap < 0:
            raise ValueError(f"the token overlap must be zero or more seconds, not {overlap:g}")
        self._token = token.strip().encode() if token is not None else b""
        self._file = token_file
        self._stamp: tuple[int, int, int] | None = None
        self._overlap = overlap
        self._previous = b""
        self._previous_until = float("-inf")
        self._expected()

    def _expected(self) -> bytes:
        if self._file is not None:
            stat = os.stat(self._file)
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if stamp != self._stamp:
                token = self._file.read_bytes().strip()
                if token and self._token and token != self._token:
                    self._previous, self._previous_until = self._token, time.monotonic() + self._overlap
                    log.info(
                        "the RM bearer token changed; the previous one is accepted for %g s", self._overlap
                    )
                self._token = token
                self._stamp = stamp
        if not self._token:
            raise ValueError("the RM bearer token is empty; write a token to the token file or variable")
        return self._token

    def accepts(self, header: str | None) -> bool:
        if header is None or not header.startswith("Bearer "):
            return False
        try:
            expected = self._expected()
        except (OSError, ValueError):
            log.exception("cannot read the RM bearer token; rejecting the request")
            return False
        given = header.removeprefix("Bearer ").strip().encode()
        if hmac.compare_digest(given, expected):
            return True
        return time.monotonic() < self._previous_until and hmac.compare_digest(given, self._previous)


def _batch_operation(item: object, index: int) -> BatchOperation | Answer:
    """One operation of a batch, validated on its own: an invalid one is its own 400 result, with the
    problem its single call would answer (``errors`` located in the batch: ``operations/3/...``)."""
    try:
        return BatchOperation.model_validate(item)
    except pydantic.ValidationError as error:
        detail, errors = validation_errors(error, at=("operations", index))
        return Answer.refusal(400, ProblemType.INVALID_REQUEST, detail, errors=errors)


def _batched_answer(operation: BatchOperation, outcome: BatchOutcome) -> Answer:
    """The answer of a batched operation: that of its single call (the store answered each operation
    with the outcome of the method its single call uses, so the operation says which type it is)."""
    if operation.reserve is not None:
        return reserve_answer(operation.reserve, cast(ReserveOutcome, outcome))
    if operation.commit is not None:
        return commit_answer(operation.commit.reservation_id, cast(CommitOutcome, outcome))
    return release_answer(cast(ReleaseOutcome, outcome))


def _pod_uid_param(request: web.Request) -> str | web.Response | None:
    """The optional v1.1 ``podUid`` query parameter of commit and release, or a 400 problem."""
    uid = request.rel_url.query.get("podUid")
    if uid is not None and not 1 <= len(uid) <= 253:
        return problem(400, ProblemType.INVALID_REQUEST, "podUid must be 1 to 253 characters long")
    return uid


def _pod_mismatch(outcome: PodMismatch, what: str) -> Answer:
    return Answer.refusal(
        409,
        ProblemType.POD_MISMATCH,
        f"reservation {outcome.reservation.id} belongs to pod {outcome.reservation.pod_uid}, not to pod "
        f"{outcome.pod_uid}, so it was not {what}; nothing changed (a pod carrying another pod's "
        "reservation id cannot act on that reservation)",
        title="Pod mismatch",
        reservationId=outcome.reservation.id,
    )


def _not_active(reservation: StoredReservation, what: str) -> Answer:
    state = reservation.to_model().state.value  # a v1.1 caller reads a revoked one as released
    return Answer.refusal(
        409,
        ProblemType.RESERVATION_NOT_ACTIVE,
        f"reservation {reservation.id} is {state} and cannot be {what}; reserve again",
        title="Reservation not active",
        state=state,
    )


def reserve_answer(request: ReservationRequest, outcome: ReserveOutcome) -> Answer:
    """What ``POST /v1/reservations`` answers for this outcome of the store (also in a batch)."""
    pod = request.pod
    if isinstance(outcome, Placed):
        stored = outcome.reservation
        log.info(
            "%s %s for pod %s/%s (uid %s) on %s",
            "reserved" if outcome.created else "replayed",
            stored.id,
            pod.namespace,
            pod.name,
            pod.uid,
            stored.node,
        )
        return Answer(201 if outcome.created else 200, reservation=stored, location=True)
    if isinstance(outcome, Conflict):
        log.info("idempotency key %r reused for a different request", request.idempotency_key)
        return Answer.refusal(
            409,
            ProblemType.IDEMPOTENCY_KEY_REUSED,
            f"idempotency key {request.idempotency_key!r} already belongs to reservation "
            f"{outcome.existing.id} for a different request; release it first or use a new key",
            title="Idempotency key reused",
            reservationId=outcome.existing.id,
        )
    log.info("pod %s/%s (uid %s) unschedulable: %s", pod.namespace, pod.name, pod.uid, outcome.reason)
    return Answer.refusal(
        409,
        ProblemType.UNSCHEDULABLE,
        outcome.reason,
        title="Unschedulable",
        reason=outcome.reason,
        retryAfterSeconds=outcome.retry_after,
    )


def commit_answer(reservation_id: str, outcome: CommitOutcome) -> Answer:
    """What ``POST /v1/reservations/{id}/commit`` answers for this outcome (also in a batch)."""
    if isinstance(outcome, NotFound):
        return Answer.refusal(404, ProblemType.NOT_FOUND, f"no reservation {reservation_id!r}")
    if isinstance(outcome, PodMismatch):
        log.warning(
            "refused to commit %s of pod %s for pod %s",
            outcome.reservation.id,
            outcome.reservation.pod_uid,
            outcome.pod_uid,
        )
        return _pod_mismatch(outcome, "committed")
    if isinstance(outcome, NotActive):
        return _not_active(outcome.reservation, "committed")
    log.info("committed %s (pod uid %s) on %s", outcome.id, outcome.pod_uid, outcome.node)
    return Answer(200, reservation=outcome)


def release_answer(outcome: ReleaseOutcome) -> Answer:
    """What ``DELETE /v1/reservations/{id}`` answers for this outcome (also in a batch)."""
    if isinstance(outcome, PodMismatch):
        log.warning(
            "refused to release %s of pod %s for pod %s",
            outcome.reservation.id,
            outcome.reservation.pod_uid,
            outcome.pod_uid,
        )
        return _pod_mismatch(outcome, "released")
    if outcome is not None:
        log.info("released %s (pod uid %s) on %s", outcome.id, outcome.pod_uid, outcome.node)
    return Answer(204)


class ReferenceRM:
    """The application state: inventory snapshot, store, and the single writer thread."""

    def __init__(
        self,
        *,
        db_path: pathlib.Path | str,
        tokens: TokenCheck | None,
        policy: Policy = Policy.BINPACK,
        inventory: Sequence[InventoryNode] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_pending: int = 1024,
        clock: Callable[[], float] | None = None,
        groups: bool = True,
        max_group_body_bytes: int = DEFAULT_MAX_GROUP_BODY_BYTES,
        batch: bool = True,
        max_batch_body_bytes: int = DEFAULT_MAX_BATCH_BODY_BYTES,
        retention: float = 3600.0,
        max_released_rows: int = DEFAULT_MAX_RELEASED_ROWS,
        cluster_ids: bool = True,
        db_password_file: pathlib.Path | None = None,
        preemption: bool = True,
        plan_lease_seconds: int = DEFAULT_LEASE_SECONDS,
        admin_token: str | None = None,
        foreign_retry_seconds: float = FOREIGN_RETRY_SECONDS,
        percentage_of_nodes_to_score: int = 0,
        device_allocator: DeviceAllocator | None = None,
    ) -> None:
        """``db_path`` is a SQLite file or a ``postgresql://`` URL
        (:func:`~bindery.reference_rm.stores.open_store`; ``db_password_file`` goes with the URL).
        ``clock=None``: the database's clock judges leases.

        ``groups=False`` serves contract v1.1 without reservation groups: their paths answer 404,
        as a v1.0 RM's do, so a caller can be tested against an RM that lacks them.  ``batch=False``
        does the same for ``POST /v1/batch``.  ``cluster_ids=False`` serves as a v1.1 RM does: no
        ``GET /v1/info`` (404) and ``clusterId`` refused (400) in requests and in the list."""
        self.policy = policy
        self.max_body_bytes = max_body_bytes
        self.groups = groups
        self.max_group_body_bytes = max(max_group_body_bytes, max_body_bytes)
        self.batch = batch
        self.cluster_ids = cluster_ids
        self.preemption = preemption and cluster_ids
        #: The operator's token for ``POST /admin/v1/reservations/{id}/revoke`` (None: no admin path).
        #: Not the callers' token: whoever schedules pods must not be able to take capacity back.
        self.admin_token = admin_token
        #: How long a proposed plan waits for its confirm, and a confirmed one holds its room. Plans
        #: are in the store, so every replica on one database answers any plan's confirm or cancel.
        self._plan_lease_seconds = plan_lease_seconds
        #: Without the pod mirror: the pod and priority of each reservation this process placed, the
        #: candidates of a preemption plan (in memory: after a restart, the older ones are none).
        self._placed: collections.OrderedDict[str, BoundPod] = collections.OrderedDict()
        self.max_batch_body_bytes = max(max_batch_body_bytes, max_body_bytes)
        self._tokens = tokens
        self._max_pending = max_pending
        self._pending = 0
        self._inventory: tuple[InventoryNode, ...] | None = (
            tuple(inventory) if inventory is not None else None
        )
        # Mirror mode: the pods bound to nodes (reference_rm/accounting.py).
        self._pods: ClusterPods | None = None
        # Mirror mode: the PodDisruptionBudgets, which preemption spares where it can.
        self._budgets = BudgetIndex()
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="refrm-store")
        try:
            self._store: Store = self._writer.submit(
                open_store,
                db_path,
                clock=clock,
                retention=retention,
                max_released_rows=max_released_rows,
                password_file=db_password_file,
                foreign_retry_seconds=foreign_retry_seconds,
                percentage_of_nodes_to_score=percentage_of_nodes_to_score,
            ).result()
        except BaseException:  # e.g. another RM holds the database: no thread left behind
            self._writer.shutdown(wait=True)
            raise
        # The last database error of a write (a full disk, an I/O error) until a write commits again.
        self._storage_failure: str | None = None
        self._readiness_checks: list[ReadinessCheck] = []
        #: The device allocator (contract v1.3, feature ``devices``), on the SQLite store only for
        #: now. None: ``devices`` is refused as a v1.2 RM refuses an unknown field, and
        #: ``/v1/info`` does not list the feature.
        self.devices: DeviceAllocator | None = None
        if device_allocator is not None:
            if not isinstance(self._store, ReservationStore):
                self._writer.shutdown(wait=True)
                raise ValueError(
                    "device allocation is implemented on the SQLite store only; "
                    "run without devices or use a SQLite --db"
                )
            self.devices = device_allocator
            self._store.devices = device_allocator

    @property
    def inventory(self) -> tuple[InventoryNode, ...] | None:
        return self._inventory

    def set_inventory(self, nodes: Sequence[InventoryNode]) -> None:
        """Swap the inventory atomically (the mirror calls this on every Node change)."""
        self._inventory = tuple(sorted(nodes, key=lambda node: node.name))

    @property
    def bound_pods(self) -> ClusterPods | None:
        return self._pods

    def set_bound_pods(self, pods: ClusterPods) -> None:
        """Swap the snapshot of pods bound to nodes (the pod mirror calls this on every change).

        Placement counts those no reservation of this RM accounts for; see
        :mod:`bindery.reference_rm.accounting`.
        """
        self._pods = pods

    def set_budgets(self, budgets: BudgetIndex | Sequence[Budget]) -> None:
        """Swap the PodDisruptionBudgets known (the budget mirror calls this on every change with
        the index it keeps; a sequence is indexed here)."""
        self._budgets = budgets if isinstance(budgets, BudgetIndex) else BudgetIndex.of(budgets)

    def set_cluster_devices(self, devices: Sequence[DeviceInUse]) -> None:
        """The devices allocated in the cluster's ResourceClaims (the claim mirror calls this)."""
        if isinstance(self._store, ReservationStore):
            self._store.cluster_devices = tuple(devices)

    def add_readiness_check(self, check: ReadinessCheck) -> None:
        """``/readyz`` answers 503 with ``check()``'s reason whenever it returns one."""
        self._readiness_checks.append(check)

    async def close(self) -> None:
        await self._run(self._store.close)
        self._writer.shutdown(wait=True)

    async def _run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a store operation on the single writer thread (a span of its own when tracing is on)."""
        loop = asyncio.get_running_loop()
        call = functools.partial(function, *args, **kwargs)
        try:
            if not tracing.state.on:
                return await loop.run_in_executor(self._writer, call)
            with tracing.span(f"store {getattr(function, '__name__', 'operation')}"):
                return await loop.run_in_executor(self._writer, call)
        except sqlite3.Error as error:
            if _storage_failure(error):
                self._storage_failure = str(error)
            raise
        except UNREACHABLE as error:  # PostgreSQL down or restarting: not ready until a write commits
            self._storage_failure = str(error).strip() or type(error).__name__
            raise

    # -- middleware ------------------------------------------------------------------------------

    @web.middleware
    async def _problems(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            if error.status == 413:
                detail = f"the body exceeds the limit of {self.max_body_bytes} bytes"
            elif error.status == 405:
                detail = f"{request.method} is not allowed on {request.path}"
            elif error.status == 404:
                detail = f"there is no {request.path} in contract v1"
            else:
                detail = error.text or error.reason
            kind = KINDS.get(error.status, ProblemType.INTERNAL)
            allow = error.headers.get("Allow")
            return problem(error.status, kind, detail, headers={"Allow": allow} if allow else None)
        except UNREACHABLE as error:
            # Nothing was decided that the caller must know of: a transaction that did not commit
            # changed nothing, and one whose COMMIT answer was lost replays under the same key.
            log.warning("the database did not answer %s %s: %s", request.method, request.path, error)
            return problem(
                503,
                ProblemType.UNAVAILABLE,
                f"the reservation database did not answer ({str(error).strip()}); ask again: the same "
                "idempotency key replays whatever was decided",
                headers={"Retry-After": "1"},
            )
        except Exception:
            log.exception("unexpected error serving %s %s", request.method, request.path)
            return problem(500, ProblemType.INTERNAL, "the reference RM failed unexpectedly; see its log")

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith(_ADMIN):
            expected = f"Bearer {self.admin_token}".encode()
            given = (request.headers.get("Authorization") or "").encode()
            if self.admin_token is None or not hmac.compare_digest(given, expected):
                return problem(
                    401,
                    ProblemType.UNAUTHORIZED,
                    "the admin paths take the RM's admin token (bindery rm serve --admin-token-file), "
                    "not the callers' token",
                    headers={"WWW-Authenticate": 'Bearer realm="bindery-rm-admin"'},
                )
            return await handler(request)
        needs_token = self._tokens is not None and request.path not in _PUBLIC_PATHS
        if self.cluster_ids:
            # v1.2 revocation: a caller that names the feature sees state revoked; others see released.
            asked = request.headers.get(FEATURES_HEADER, "")
            revocation_shown.set(Feature.REVOCATION.value in {f.strip() for f in asked.split(",")})
        if needs_token and not (self._tokens and self._tokens.accepts(request.headers.get("Authorization"))):
            return problem(
                401,
                ProblemType.UNAUTHORIZED,
                "a valid bearer token for this resource manager is required "
                "(Authorization: Bearer <token>); check the token the client was given",
                headers={"WWW-Authenticate": 'Bearer realm="bindery-rm"'},
            )
        return await handler(request)

    def application(self) -> web.Application:
        # aiohttp's HTTP parser answers over-long request lines and headers (default 8 KiB) itself, in
        # text/plain; allow as much as a body may carry so the contract's validation answers instead.
        app = web.Application(
            client_max_size=self.max_body_bytes,
            middlewares=[*([_traced] if tracing.state.on else []), self._problems, self._auth],
            handler_args={"max_line_size": self.max_body_bytes, "max_field_size": self.max_body_bytes},
        )
        if self.cluster_ids:  # without the v1.2 features (cluster-id and the others) this is a v1.1 RM
            app.router.add_get("/v1/info", self._info, allow_head=False)
        app.router.add_post("/v1/reservations", self._reserve)
        app.router.add_get("/v1/reservations", self._list, allow_head=False)
        app.router.add_get("/v1/reservations/{id}", self._get, allow_head=False)
        app.router.add_delete("/v1/reservations/{id}", self._release)
        app.router.add_post("/v1/reservations/{id}/commit", self._commit)
        app.router.add_post("/v1/reservations/{id}/renew", self._renew)
        if self.preemption:
            app.router.add_post("/v1/preemptions/{action}", self._preemption)
        if self.groups:
            app.router.add_post(_GROUPS, self._reserve_group)
            app.router.add_get(_GROUPS + "/{id}", self._get_group, allow_head=False)
            app.router.add_delete(_GROUPS + "/{id}", self._release_group)
            app.router.add_post(_GROUPS + "/{id}/renew", self._renew_group)
        else:
            app.router.add_route("*", _GROUPS, self._no_groups)
            app.router.add_route("*", _GROUPS + "/{tail:.*}", self._no_groups)
        if self.batch:
            app.router.add_post(_BATCH, self._batch)
        else:
            app.router.add_route("*", _BATCH, self._no_batch)
        if self.admin_token is not None:
            app.router.add_post(_ADMIN + "/reservations/{id}/revoke", self._revoke)
        app.router.add_get("/healthz", self._healthz, allow_head=False)
        app.router.add_get("/readyz", self._readyz, allow_head=False)
        app.router.add_get("/openapi.yaml", self._openapi_yaml, allow_head=False)
        app.router.add_get("/openapi.json", self._openapi_json, allow_head=False)
        return app

    # -- handlers -------------------------------------------------------------------------------

    def _back_pressure(self, *, need_inventory: bool = True) -> web.Response | None:
        if need_inventory and self._inventory is None:
            return problem(
                503, ProblemType.UNAVAILABLE, "the inventory is not loaded yet", headers={"Retry-After": "1"}
            )
        if self._pending >= self._max_pending:
            return problem(
                429,
                ProblemType.RATE_LIMITED,
                f"more than {self._max_pending} requests are waiting; retry shortly",
                headers={"Retry-After": "1"},
            )
        return None

    async def _info(self, _: web.Request) -> web.Response:
        """``GET /v1/info`` (contract v1.2): the version and the features this RM offers."""
        features = [Feature.RENEW, *([Feature.RESERVATION_GROUPS] if self.groups else [])]
        features += [*([Feature.BATCH] if self.batch else []), Feature.CLUSTER_ID, Feature.NODE_PREFERENCES]
        features.append(Feature.TOLERATION_COMPARISONS)
        if self.preemption:
            features += [Feature.PREEMPTION, Feature.RULE_PREEMPTION]
            if self.groups:
                features.append(Feature.GROUP_PREEMPTION)
        features.append(Feature.REVOCATION)
        if self.devices is not None:
            features.append(Feature.DEVICES)
        info = ContractInfo(contract_version=CONTRACT_VERSION, features=frozenset(f.value for f in features))
        return web.json_response(
            {"contractVersion": info.contract_version, "features": sorted(info.features)}
        )

    def _unknown_cluster(
        self,
        cluster_id: str | None,
        *,
        at: tuple[str | int, ...] = (),
        placements: Sequence[tuple[tuple[str | int, ...], Placement]] = (),
    ) -> Answer | None:
        """The 400 a v1.1 RM answers for a field of v1.2, when serving as one: ``clusterId`` and
        ``placement.preferredNodeAffinity`` (unknown fields), a ``Gt`` or ``Lt`` toleration (an
        operator v1.1 does not have). ``placements``: each placement of the request, by its path."""
        if self.cluster_ids:
            return None
        errors: list[dict[str, str]] = []
        if cluster_id is not None:
            errors.append({"location": "/".join(map(str, (*at, "clusterId"))), "message": _EXTRA})
        for path, placement in placements:
            if placement.preferred_node_affinity is not None:
                location = "/".join(map(str, (*at, *path, "preferredNodeAffinity")))
                errors.append({"location": location, "message": _EXTRA})
            for index, toleration in enumerate(placement.tolerations):
                if toleration.operator in ("Gt", "Lt"):
                    location = "/".join(map(str, (*at, *path, "tolerations", index, "operator")))
                    errors.append({"location": location, "message": "Input should be 'Equal' or 'Exists'"})
        if not errors:
            return None
        detail = "; ".join(f"{error['location']}: {error['message']}" for error in errors)
        return Answer.refusal(400, ProblemType.INVALID_REQUEST, detail, errors=errors)

    def _unoffered_devices(self, paths: Sequence[tuple[str | int, ...]]) -> Answer | None:
        """The 400 a v1.2 RM answers for ``devices`` (v1.3), while this RM does not list the feature.

        ``paths``: where the request carries ``devices``. Accepting them and answering a node with no
        devices would bind a pod whose claims are never allocated, a pod that never starts.
        """
        if self.devices is not None or not paths:
            return None
        errors = [{"location": "/".join(map(str, (*path, "devices"))), "message": _EXTRA} for path in paths]
        detail = "; ".join(f"{error['location']}: {error['message']}" for error in errors)
        return Answer.refusal(400, ProblemType.INVALID_REQUEST, detail, errors=errors)

    async def _reserve(self, request: web.Request) -> web.Response:
        if not is_json(request):
            return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        body = await request.read()
        try:
            reservation_request = ReservationRequest.model_validate_json(body)
        except pydantic.ValidationError as error:
            detail, errors = validation_errors(error)
            return problem(400, ProblemType.INVALID_REQUEST, detail, errors=errors)
        placed = [(("placement",), reservation_request.placement)]
        refused = self._unknown_cluster(
            reservation_request.cluster_id, placements=placed
        ) or self._unoffered_devices([()] if reservation_request.devices is not None else [])
        if refused is not None:
            return refused.response()
        if reservation_request.preemption_policy is not None and not self.preemption:
            errors = [{"location": "preemptionPolicy", "message": _EXTRA}]
            return problem(400, ProblemType.INVALID_REQUEST, f"preemptionPolicy: {_EXTRA}", errors=errors)
        if reservation_request.rule_preemption is not None and not self.preemption:
            errors = [{"location": "rulePreemption", "message": _EXTRA}]
            return problem(400, ProblemType.INVALID_REQUEST, f"rulePreemption: {_EXTRA}", errors=errors)
        busy = self._back_pressure()
        if busy is not None:
            return busy
        assert self._inventory is not None
        self._pending += 1
        try:
            outcome = await self._run(
                self._store.reserve,
                reservation_request,
                nodes=self._inventory,  # the store takes out the rooms held for preemptors
                policy=self.policy,
                pods=self._pods,
            )
        finally:
            self._pending -= 1
        answer = reserve_answer(reservation_request, outcome)
        if isinstance(outcome, Placed):
            self._remember_placed(reservation_request, outcome.reservation)
        elif isinstance(outcome, Unschedulable):
            await self._attach_plan(reservation_request, answer)
        return answer.response()

    async def _attach_plan(self, request: ReservationRequest, answer: Answer) -> None:
        """Add the preemption plan, if there is one, to an ``unschedulable`` answer."""
        plan = await self._plan_for(request) if answer.problem is not None else None
        if plan is None or answer.problem is None:
            return
        answer.problem["preemption"] = plan.to_json()
        log.info(
            "plan %s for pod %s: evict %s on %s",
            plan.plan_id,
            request.pod.uid,
            ", ".join(
                victim.key
                + (
                    f" (exceeds budget {', '.join(plan.violations[victim.uid])})"
                    if victim.uid in plan.violations
                    else ""
                )
                for victim in plan.victims
            ),
            plan.node,
        )

    async def _plan_for(self, request: ReservationRequest) -> Plan | None:
        """The preemption plan for a pod nothing fits (contract v1.2, feature ``preemption``):
        the preemptor's plan still active, else a new one, else None (see ``reference_rm/preemption``)."""
        if request.preemption_policy != "PreemptLowerPriority" or self._inventory is None:
            return None
        pod = request.pod
        if self._pods is None and (plan := await self._run(self._store.active_plan, pod.uid)) is not None:
            return plan  # without the mirror, finding the candidates costs a listing: skip it
        pods = self._pods if self._pods is not None else await self._placed_pods()
        inventory = self._inventory
        placement = request.placement
        requests = request.requested()
        budgets = self._budgets
        for_rules = {
            entry.node: frozenset(victim.uid for victim in entry.victims)
            for entry in request.rule_preemption or ()
        }
        # A listed node gets a plan only with its listed pods among the victims: room alone there is
        # room the pod never gets (the reserve never places on it while the caller lists it).
        for_room = [node for node in inventory if node.name not in for_rules] if for_rules else inventory

        def choose(
            used_by_node: Mapping[str, Mapping[str, Decimal]], spoken_for: frozenset[str]
        ) -> Proposal | None:
            """Run by the store inside its placement transaction, beside every replica's plans."""
            used = {node: dict(bucket) for node, bucket in used_by_node.items()}
            for name_of_node, entry in pods.nodes.items():  # the pods no reservation accounts for
                bucket = used.setdefault(name_of_node, {})
                for name, amount in entry.unclaimed.usage.items():
                    bucket[name] = bucket.get(name, Decimal(0)) + amount
            found = choose_victims(
                nodes=for_room,
                requests=requests,
                priority=pod.priority,
                placement={
                    "node_selector": placement.node_selector,
                    "affinity_terms": placement.affinity_terms(),
                    "tolerations": placement.toleration_dicts(),
                },
                used_by_node=used,
                pods=pods,
                spoken_for=spoken_for,
                budgets=budgets,
            )
            if for_rules:
                ruled = choose_rule_victims(
                    nodes=inventory,
                    requests=requests,
                    priority=pod.priority,
                    tolerations=placement.toleration_dicts(),
                    required=for_rules,
                    used_by_node=used,
                    pods=pods,
                    spoken_for=spoken_for,
                    budgets=budgets,
                )
                if ruled is not None and (found is None or ruled.rank() < found.rank()):
                    found = ruled
            if found is None:
                return None
            chosen = next(n for n in inventory if n.name == found.node)
            return Proposal(
                node=found.node,
                victims=found.victims,
                hold=effective_usage(requests, chosen),
                violations=found.violations,
            )

        return await self._run(
            self._store.propose_plan, pod.uid, choose, lease_seconds=self._plan_lease_seconds
        )

    def _remember_placed(self, request: ReservationRequest, reservation: StoredReservation) -> None:
        if self._pods is not None or not self.preemption:
            return  # the mirror knows every bound pod's priority
        pod = request.pod
        self._placed[reservation.id] = BoundPod(
            uid=pod.uid,
            key=f"{pod.namespace}/{pod.name}",
            node=reservation.node,
            usage=reservation.usage(),
            reservation_id=reservation.id,
            priority=pod.priority,
        )
        while len(self._placed) > _REMEMBERED_PLACED:
            self._placed.popitem(last=False)

    async def _placed_pods(self) -> ClusterPods:
        """Without the mirror: the committed reservations this process placed, as bound pods."""
        committed: list[BoundPod] = []
        after = 0
        while True:
            page, cursor = await self._run(
                self._store.list, state=ReservationState.COMMITTED, after=after, limit=500
            )
            committed.extend(known for item in page if (known := self._placed.get(item.id)) is not None)
            if cursor is None:
                return ClusterPods.of(committed)
            after = cursor

    async def _preemption(self, request: web.Request) -> web.Response:
        """``POST /v1/preemptions/{planId}:confirm`` and ``:cancel`` (contract v1.2): idempotent."""
        plan_id, _, verb = request.match_info["action"].rpartition(":")
        if verb not in ("confirm", "cancel") or not plan_id:
            return problem(404, ProblemType.NOT_FOUND, f"there is no {request.path} in contract v1")
        plan = await self._run(
            self._store.confirm_plan if verb == "confirm" else self._store.cancel_plan, plan_id
        )
        if plan is None:
            return problem(404, ProblemType.NOT_FOUND, f"no preemption plan {plan_id!r}")
        if verb == "confirm" and plan.state is not PlanState.CONFIRMED:
            return problem(
                409,
                ProblemType.PLAN_NOT_ACTIVE,
                f"preemption plan {plan_id} is {plan.state.value} and cannot be confirmed; reserve again "
                "for a new plan",
                title="Plan not active",
                state=plan.state.value,
            )
        log.info("%s plan %s (pod uid %s, node %s)", plan.state.value, plan_id, plan.pod_uid, plan.node)
        return web.json_response(plan.to_json())

    async def _commit(self, request: web.Request) -> web.Response:
        body = await request.read()
        if body.strip():
            if not is_json(request):
                return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
            try:
                parsed = json.loads(body)
            except ValueError:
                return problem(400, ProblemType.INVALID_REQUEST, "the body is not valid JSON")
            if parsed != {}:
                return problem(400, ProblemType.INVALID_REQUEST, "commit takes no fields; send {} or no body")
        pod_uid = _pod_uid_param(request)
        if isinstance(pod_uid, web.Response):
            return pod_uid
        reservation_id = request.match_info["id"]
        outcome = await self._run(self._store.commit, reservation_id, pod_uid=pod_uid)
        return commit_answer(reservation_id, outcome).response()

    async def _release(self, request: web.Request) -> web.Response:
        pod_uid = _pod_uid_param(request)
        if isinstance(pod_uid, web.Response):
            return pod_uid
        released = await self._run(self._store.release, request.match_info["id"], pod_uid=pod_uid)
        return release_answer(released).response()

    async def _renew(self, request: web.Request) -> web.Response:
        if not is_json(request):
            return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        try:
            renewal = RenewRequest.model_validate_json(await request.read())
        except pydantic.ValidationError as error:
            detail, errors = validation_errors(error)
            return problem(400, ProblemType.INVALID_REQUEST, detail, errors=errors)
        outcome = await self._run(
            self._store.renew,
            request.match_info["id"],
            pod_uid=renewal.pod_uid,
            ttl_seconds=renewal.ttl_seconds,
        )
        if isinstance(outcome, NotFound):
            return problem(404, ProblemType.NOT_FOUND, f"no reservation {request.match_info['id']!r}")
        if isinstance(outcome, PodMismatch):
            log.warning(
                "refused to renew %s of pod %s for pod %s",
                outcome.reservation.id,
                outcome.reservation.pod_uid,
                outcome.pod_uid,
            )
            return _pod_mismatch(outcome, "renewed").response()
        if isinstance(outcome, NotActive):
            return _not_active(outcome.reservation, "renewed").response()
        log.debug("renewed %s (pod uid %s) for %d s", outcome.id, outcome.pod_uid, renewal.ttl_seconds)
        return web.json_response(text=outcome.to_model().model_dump_json(by_alias=True))

    # -- batches (contract v1.1) -----------------------------------------------------------------

    async def _no_batch(self, request: web.Request) -> web.Response:
        return problem(
            404,
            ProblemType.NOT_FOUND,
            f"there is no {request.path} here: this resource manager serves contract v1 without "
            "batches (the reference RM was started with --no-batch); send single calls",
        )

    async def _batch(self, request: web.Request) -> web.Response:
        """``POST /v1/batch``: every operation answered as its single call would be, in order, after
        ONE transaction made them all durable.

        Only a wrong envelope (not JSON, no list of 1 to 500 operations, an unknown field) fails the
        whole request; an invalid operation gets its own 400 result and the others are carried out.
        """
        if not is_json(request):
            return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        body = await read_capped(
            request,
            limit=self.max_batch_body_bytes,
            advice="for a batch; send fewer operations per batch or raise the RM's --max-batch-body-bytes",
        )
        if isinstance(body, web.Response):
            return body
        envelope = batch_operations(body)
        if isinstance(envelope, web.Response):
            return envelope
        parsed = [_batch_operation(item, index) for index, item in enumerate(envelope)]
        parsed = [
            (
                self._unknown_cluster(
                    item.reserve.cluster_id,
                    at=("operations", index, "reserve"),
                    placements=[(("placement",), item.reserve.placement)],
                )
                or self._unoffered_devices(
                    [("operations", index, "reserve")] if item.reserve.devices is not None else []
                )
                or item
            )
            if isinstance(item, BatchOperation) and item.reserve is not None
            else item
            for index, item in enumerate(parsed)
        ]
        valid = [operation for operation in parsed if isinstance(operation, BatchOperation)]
        # As for the single calls: only a reserve needs the inventory (503 until it is loaded).
        busy = self._back_pressure(need_inventory=any(operation.reserve is not None for operation in valid))
        if busy is not None:
            return busy
        done: list[BatchOutcome] = []
        if valid:  # all invalid: nothing for the store to do
            self._pending += 1
            try:
                # Rooms held for preemptors (contract v1.2) the store takes out for every other pod.
                done = await self._run(
                    self._store.batch, valid, nodes=self._inventory or (), policy=self.policy, pods=self._pods
                )
                for operation, outcome in zip(valid, done, strict=True):
                    if operation.reserve is not None and isinstance(outcome, Placed):
                        self._remember_placed(operation.reserve, outcome.reservation)
            finally:
                self._pending -= 1
        outcomes = iter(done)
        results: list[Answer] = []
        for item in parsed:
            if isinstance(item, Answer):
                results.append(item)
                continue
            outcome = next(outcomes)
            answer = _batched_answer(item, outcome)
            if item.reserve is not None and isinstance(outcome, Unschedulable):
                await self._attach_plan(item.reserve, answer)  # as its single call would
            results.append(answer)
        text = ",".join(answer.result_json() for answer in results)
        return web.Response(text=f'{{"results":[{text}]}}', content_type="application/json")

    # -- reservation groups (contract v1.1) -----------------------------------------------------

    async def _no_groups(self, request: web.Request) -> web.Response:
        return problem(
            404,
            ProblemType.NOT_FOUND,
            f"there is no {request.path} here: this resource manager serves contract v1 without "
            "reservation groups (the reference RM was started with --no-groups)",
        )

    async def _read_group_body(self, request: web.Request) -> bytes | web.Response:
        """The body, up to the group limit (larger than one pod's: a group carries its members)."""
        return await read_capped(
            request,
            limit=self.max_group_body_bytes,
            advice="for a reservation group; split the group or raise the RM's --max-group-body-bytes",
        )

    def _group_answer(self, group: StoredGroup, *, status: int = 200) -> web.Response:
        return web.Response(
            status=status,
            text=group.to_model().model_dump_json(by_alias=True),
            content_type="application/json",
            headers={"Location": f"{_GROUPS}/{group.id}"},
        )

    async def _reserve_group(self, request: web.Request) -> web.Response:
        if not is_json(request):
            return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        body = await self._read_group_body(request)
        if isinstance(body, web.Response):
            return body
        try:
            group_request = ReservationGroupRequest.model_validate_json(body)
        except pydantic.ValidationError as error:
            detail, errors = validation_errors(error)
            return problem(400, ProblemType.INVALID_REQUEST, detail, errors=errors)
        placed = [(("members", i, "placement"), m.placement) for i, m in enumerate(group_request.members)]
        with_devices = [("members", i) for i, m in enumerate(group_request.members) if m.devices is not None]
        refused = self._unknown_cluster(
            group_request.cluster_id, placements=placed
        ) or self._unoffered_devices(with_devices)
        if refused is not None:
            return refused.response()
        if with_devices:  # the allocator is there, but groups do not carry devices to it yet
            reason = (
                "this RM does not allocate devices for reservation groups yet; reserve the pods one by one"
            )
            return Answer.refusal(
                409, ProblemType.UNSCHEDULABLE, reason, title="Unschedulable", reason=reason
            ).response()
        if group_request.preemption_policy is not None and not self.preemption:
            errors = [{"location": "preemptionPolicy", "message": _EXTRA}]
            return problem(400, ProblemType.INVALID_REQUEST, f"preemptionPolicy: {_EXTRA}", errors=errors)
        busy = self._back_pressure()
        if busy is not None:
            return busy
        assert self._inventory is not None
        self._pending += 1
        try:
            outcome = await self._run(
                self._store.reserve_group,
                group_request,
                nodes=self._inventory,
                policy=self.policy,
                pods=self._pods,
            )
        finally:
            self._pending -= 1
        who = f"{group_request.group.namespace}/{group_request.group.name}"
        if isinstance(outcome, GroupPlaced):
            log.info(
                "%s group %s for %s (%d members) on %s",
                "reserved" if outcome.created else "replayed",
                outcome.group.id,
                who,
                len(outcome.group.members),
                ", ".join(sorted({member.node for member in outcome.group.members})),
            )
            return self._group_answer(outcome.group, status=201 if outcome.created else 200)
        if isinstance(outcome, GroupConflict):
            log.info("idempotency key %r reused for a different group request", group_request.idempotency_key)
            return problem(
                409,
                ProblemType.IDEMPOTENCY_KEY_REUSED,
                f"idempotency key {group_request.idempotency_key!r} already belongs to reservation group "
                f"{outcome.existing.id} for a different request; release that group first or use a new key",
                title="Idempotency key reused",
                groupId=outcome.existing.id,
            )
        log.info("group %s unschedulable: %s", who, outcome.reason)
        plan = await self._group_plan_for(group_request)
        if plan is not None:
            log.info(
                "plan %s for group %s: evict %s; members on %s",
                plan.plan_id,
                who,
                ", ".join(f"{victim.key} on {victim.node}" for victim in plan.victims),
                ", ".join(member.node for member in plan.members),
            )
        return problem(
            409,
            ProblemType.UNSCHEDULABLE,
            outcome.reason,
            title="Unschedulable",
            reason=outcome.reason,
            retryAfterSeconds=outcome.retry_after,
            **({"preemption": plan.to_json()} if plan is not None else {}),
        )

    async def _group_plan_for(self, request: ReservationGroupRequest) -> Plan | None:
        """One preemption plan for a whole group nothing fits (feature ``group-preemption``): the
        group's plan still active, else a new one (victims on any nodes, below every member's
        priority), else None. Stored and held as a pod's plan, under :func:`group_plan_key`."""
        if request.preemption_policy != "PreemptLowerPriority" or self._inventory is None:
            return None
        key = group_plan_key(request.group.namespace, request.group.name)
        if self._pods is None and (plan := await self._run(self._store.active_plan, key)) is not None:
            return plan
        pods = self._pods if self._pods is not None else await self._placed_pods()
        inventory = self._inventory
        asks = [
            MemberAsk(
                label=f"{member.pod.namespace}/{member.pod.name}",
                requests=member.requested(),
                node_selector=member.placement.node_selector,
                affinity_terms=member.placement.affinity_terms(),
                tolerations=member.placement.toleration_dicts(),
            )
            for member in request.members
        ]
        priority = min(member.pod.priority for member in request.members)
        budgets, policy = self._budgets, self.policy

        def choose(
            used_by_node: Mapping[str, Mapping[str, Decimal]], spoken_for: frozenset[str]
        ) -> Proposal | None:
            used = {node: dict(bucket) for node, bucket in used_by_node.items()}
            for name_of_node, entry in pods.nodes.items():  # the pods no reservation accounts for
                bucket = used.setdefault(name_of_node, {})
                for name, amount in entry.unclaimed.usage.items():
                    bucket[name] = bucket.get(name, Decimal(0)) + amount
            found = choose_group_victims(
                members=asks,
                topology_keys=[constraint.key for constraint in request.topology],
                nodes=inventory,
                priority=priority,
                used_by_node=used,
                pods=pods,
                policy=policy,
                spoken_for=spoken_for,
                budgets=budgets,
            )
            if found is None:
                return None
            by_name = {node.name: node for node in inventory}
            members = tuple(
                PlanMember(
                    pod_uid=member.pod.uid, node=node, hold=effective_usage(ask.requests, by_name[node])
                )
                for member, ask, node in zip(request.members, asks, found.nodes, strict=True)
            )
            return Proposal(
                node=members[0].node,
                victims=found.victims,
                hold={},
                violations=found.violations,
                members=members,
            )

        return await self._run(self._store.propose_plan, key, choose, lease_seconds=self._plan_lease_seconds)

    async def _get_group(self, request: web.Request) -> web.Response:
        group = await self._run(self._store.get_group, request.match_info["id"])
        if group is None:
            return problem(404, ProblemType.NOT_FOUND, f"no reservation group {request.match_info['id']!r}")
        return self._group_answer(group)

    async def _release_group(self, request: web.Request) -> web.Response:
        group = await self._run(self._store.release_group, request.match_info["id"])
        if group is None:
            return problem(404, ProblemType.NOT_FOUND, f"no reservation group {request.match_info['id']!r}")
        log.info("released the reserved members of group %s", group.id)
        return web.Response(status=204)

    async def _renew_group(self, request: web.Request) -> web.Response:
        if not is_json(request):
            return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        try:
            renewal = GroupRenewRequest.model_validate_json(await request.read())
        except pydantic.ValidationError as error:
            detail, errors = validation_errors(error)
            return problem(400, ProblemType.INVALID_REQUEST, detail, errors=errors)
        group_id = request.match_info["id"]
        outcome = await self._run(self._store.renew_group, group_id, ttl_seconds=renewal.ttl_seconds)
        if isinstance(outcome, NotFound):
            return problem(404, ProblemType.NOT_FOUND, f"no reservation group {group_id!r}")
        if isinstance(outcome, NotActive):
            return problem(
                409,
                ProblemType.RESERVATION_NOT_ACTIVE,
                f"reservation group {group_id} has no active member (all released or expired) and cannot "
                "be renewed; reserve the group again",
                title="Reservation not active",
                state=outcome.reservation.state.value,
            )
        log.debug("renewed group %s for %d s", group_id, renewal.ttl_seconds)
        return self._group_answer(outcome)

    async def _get(self, request: web.Request) -> web.Response:
        stored = await self._run(self._store.get, request.match_info["id"])
        if stored is None:
            return problem(404, ProblemType.NOT_FOUND, f"no reservation {request.match_info['id']!r}")
        return web.json_response(text=stored.to_model().model_dump_json(by_alias=True))

    async def _list(self, request: web.Request) -> web.Response:
        checked = list_query(request.rel_url.query, cluster_ids=self.cluster_ids)
        if isinstance(checked, web.Response):
            return checked
        query: ListQuery = checked
        state: ReservationState | tuple[ReservationState, ...] | None = None
        if query.state is not None:
            known = [s for s in ReservationState if self.cluster_ids or s is not ReservationState.REVOKED]
            try:
                state = ReservationState(query.state)
                if state not in known:
                    raise ValueError
            except ValueError:
                allowed = ", ".join(s.value for s in known)
                return problem(400, ProblemType.INVALID_REQUEST, f"state must be one of {allowed}")
            if state is ReservationState.REVOKED:
                revocation_shown.set(True)  # only a caller that knows the state can ask for it
            elif state is ReservationState.RELEASED and not revocation_shown.get():
                state = (ReservationState.RELEASED, ReservationState.REVOKED)  # what it reads as released
        after = 0
        if query.cursor is not None:
            cursor = query.cursor
            if not (cursor.startswith("s") and cursor[1:].isdigit() and len(cursor) < 20):
                return problem(400, ProblemType.INVALID_REQUEST, "cursor is not one this server issued")
            after = int(cursor[1:])
        items, next_seq = await self._run(
            self._store.list,
            scheduler_name=query.filters.get("schedulerName"),
            state=state,
            pod_uid=query.filters.get("podUid"),
            group_id=query.filters.get("groupId"),
            cluster_id=query.filters.get("clusterId"),
            after=after,
            limit=query.limit,
        )
        page = {
            "items": [item.to_model().model_dump(by_alias=True, mode="json") for item in items],
            "nextCursor": f"s{next_seq}" if next_seq is not None else None,
        }
        return web.json_response(page)

    async def _revoke(self, request: web.Request) -> web.Response:
        """``POST /admin/v1/reservations/{id}/revoke`` ``{"reason": "..."}``: an operator takes an
        active reservation back (not part of the contract: how the reference RM lets a test, or an
        administrator, cause what a batch system does by itself when it cancels or preempts a job).
        Answers the reservation as revoked (``200``), ``404`` unknown, ``409`` no longer active."""
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            return problem(400, ProblemType.INVALID_REQUEST, "the body is not valid JSON")
        reason = body.get("reason") if isinstance(body, dict) else None
        if not isinstance(reason, str) or not 1 <= len(reason) <= 1024 or set(body) != {"reason"}:
            return problem(
                400, ProblemType.INVALID_REQUEST, 'send {"reason": "..."}: 1 to 1024 characters saying why'
            )
        reservation_id = request.match_info["id"]
        outcome = await self._run(self._store.revoke, reservation_id, reason=reason)
        if isinstance(outcome, NotFound):
            return problem(404, ProblemType.NOT_FOUND, f"no reservation {reservation_id!r}")
        if isinstance(outcome, NotActive):
            return _not_active(outcome.reservation, "revoked").response()
        log.warning(
            "revoked %s of pod %s/%s (%s) on node %s: %s",
            outcome.id,
            outcome.namespace,
            outcome.name,
            outcome.pod_uid,
            outcome.node,
            reason,
        )
        revocation_shown.set(True)
        return web.json_response(text=outcome.to_model().model_dump_json(by_alias=True))

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        if self._inventory is None:
            return problem(
                503, ProblemType.UNAVAILABLE, "the inventory is not loaded yet", headers={"Retry-After": "1"}
            )
        if self._storage_failure is not None:
            with contextlib.suppress(sqlite3.Error, *UNREACHABLE):  # _run keeps the new reason
                await self._run(self._store.check_writable)
                log.info("writes to the database succeed again (%s before): ready", self._storage_failure)
                self._storage_failure = None
        if self._storage_failure is not None:
            return problem(
                503,
                ProblemType.UNAVAILABLE,
                f"writes to the database fail ({self._storage_failure}), so every reserve would fail: free "
                "space on its volume, repair the disk or bring the database back; the RM turns ready by "
                "itself once a write commits",
                headers={"Retry-After": "5"},
            )
        for check in self._readiness_checks:
            if (reason := check()) is not None:
                return problem(503, ProblemType.UNAVAILABLE, reason, headers={"Retry-After": "5"})
        return web.json_response({"status": "ready", "nodes": str(len(self._inventory))})

    async def _openapi_yaml(self, _: web.Request) -> web.Response:
        return web.Response(text=openapi_text(), content_type="application/yaml")

    async def _openapi_json(self, _: web.Request) -> web.Response:
        return web.json_response(yaml.safe_load(openapi_text()))


@dataclass
class RunningServer:
    """A reference RM listening on a socket."""

    url: str
    port: int
    rm: ReferenceRM


@contextlib.asynccontextmanager
async def serve_reference_rm(
    *,
    db_path: pathlib.Path | str,
    host: str = "127.0.0.1",
    port: int = 0,
    inventory: Sequence[InventoryNode] | None = None,
    token: str | None = None,
    token_file: pathlib.Path | None = None,
    token_overlap: float = DEFAULT_TOKEN_OVERLAP,
    auth_disabled: bool = False,
    policy: Policy = Policy.BINPACK,
    ssl_context: ssl.SSLContext | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_pending: int = 1024,
    groups: bool = True,
    max_group_body_bytes: int = DEFAULT_MAX_GROUP_BODY_BYTES,
    batch: bool = True,
    max_batch_body_bytes: int = DEFAULT_MAX_BATCH_BODY_BYTES,
    retention: float = 3600.0,
    max_released_rows: int = DEFAULT_MAX_RELEASED_ROWS,
    cluster_ids: bool = True,
    db_password_file: pathlib.Path | None = None,
    preemption: bool = True,
    admin_token: str | None = None,
    foreign_retry_seconds: float = FOREIGN_RETRY_SECONDS,
    percentage_of_nodes_to_score: int = 0,
    device_allocator: DeviceAllocator | None = None,
) -> AsyncIterator[RunningServer]:
    """Run the reference RM in this event loop until the block exits.

    ``inventory=None`` starts it not ready (``/readyz`` 503) until ``server.rm.set_inventory`` is
    called, which is how the node mirror feeds it.  A token is required unless ``auth_disabled``.
    """
    if auth_disabled:
        tokens = None
    elif token is None and token_file is None:
        raise ValueError("the reference RM needs a bearer token (token or token_file), or auth_disabled=True")
    else:
        tokens = TokenCheck(token=token, token_file=token_file, overlap=token_overlap)
    rm = ReferenceRM(
        db_path=db_path,
        tokens=tokens,
        policy=policy,
        inventory=inventory,
        max_body_bytes=max_body_bytes,
        max_pending=max_pending,
        groups=groups,
        max_group_body_bytes=max_group_body_bytes,
        batch=batch,
        max_batch_body_bytes=max_batch_body_bytes,
        retention=retention,
        max_released_rows=max_released_rows,
        cluster_ids=cluster_ids,
        db_password_file=db_password_file,
        preemption=preemption,
        admin_token=admin_token,
        foreign_retry_seconds=foreign_retry_seconds,
        percentage_of_nodes_to_score=percentage_of_nodes_to_score,
        device_allocator=device_allocator,
    )
    runner = web.AppRunner(rm.application(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        bound_port = int(runner.addresses[0][1])
        scheme = "https" if ssl_context is not None else "http"
        shown_host = f"[{host}]" if ":" in host else host
        log.info(
            "reference RM (contract %s%s) listening on %s://%s:%d",
            CONTRACT_VERSION if cluster_ids else "1.1.0",
            "".join(
                ([] if groups else [", without reservation groups"])
                + ([] if batch else [", without batches"])
            ),
            scheme,
            host,
            bound_port,
        )
        yield RunningServer(url=f"{scheme}://{shown_host}:{bound_port}", port=bound_port, rm=rm)
    finally:
        await runner.cleanup()
        await rm.close()


@web.middleware
async def _traced(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Continue the caller's trace (W3C `traceparent`, contract v1) in a server span per request.

    Only the method, the route, the reservation id and the status are recorded: never a header.
    """
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path
    attributes = {"http.request.method": request.method, "http.route": route}
    if "id" in request.match_info:
        attributes["bindery.reservation"] = request.match_info["id"]
    with (
        tracing.extract(request.headers),
        tracing.span(f"{request.method} {route}", attributes, kind="server"),
    ):
        response = await handler(request)
        tracing.set_attributes({"http.response.status_code": response.status})
        return response
