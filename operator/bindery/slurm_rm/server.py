"""The contract served in front of slurmrestd: a reservation is a placeholder job.

**Reserve** submits a batch job (``exec sleep infinity``) sized from the pod's requests
(:mod:`bindery.slurm_rm.mapping`) on ONE Slurm node the request allows (``nodelist``: naming every
feasible node would let Slurm end the job when any of them goes away, slurm-bridge issue #43). The
node is the allowed one with the most CPUs free now, counting this adapter's own pending
placeholders; when none has room, the one with the fewest of them, where the job queues.

**A synchronous reserve meets an asynchronous allocation** like this: reserve waits up to
``start_wait`` seconds for slurmctld to start the job. Running: ``201`` with the node. Still
pending: ``409 unschedulable`` with Slurm's reason (``Priority``, ``Resources``, …) in ``reason``,
so the pod's ``FailedScheduling`` says why, and ``retryAfterSeconds``, so Bindery asks again. The
pending job stays in Slurm's queue, keyed by the request's ``idempotencyKey`` (the pod UID): the
next reserve with the same key finds it instead of submitting another, and answers ``201`` once it
runs. Slurm's priorities, fair share, QOS and partitions thus order the pods. A job whose pod stops
asking (deleted, bound elsewhere) is cancelled ``hold_seconds`` after the last ask, pending or
started; ``hold_seconds = 0`` cancels a pending job at once (no queueing: a plain RM's behaviour).

**Commit** marks the job committed and lifts its time limit; **release** cancels it; **renew**
moves the lease and the time limit. A reserved job's Slurm time limit is its lease plus a margin,
so Slurm itself ends a placeholder the adapter forgot. All state is in the job's comment: the
adapter keeps nothing of its own and may be SIGKILLed and restarted at any point. A job Slurm ended
(``scancel`` by hand, the time limit, a DOWN node, preemption) lists as ``released`` when it was
committed and ``expired`` otherwise; Slurm forgets ended jobs after ``MinJobAge``, and their ids
then answer 404.

Contract v1.1 without reservation groups and ``/v1/batch`` (both answer 404); ``podUid`` is
checked on commit, release and renew.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hmac
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pydantic
from aiohttp import web

from bindery.rm.errors import ProblemType
from bindery.rm.models import RenewRequest, ReservationRequest, ReservationState
from bindery.slurm_rm.mapping import JobRecord, MappedNode, allowed, fingerprint, job_size
from bindery.slurm_rm.slurmrest import SlurmError, SlurmRest, SlurmUnreachable

log = logging.getLogger(__name__)

INFINITE = 0xFFFFFFFF  # Slurm's INFINITE: no time limit
PLACEHOLDER_SCRIPT = (
    "#!/bin/sh\n"
    "# Bindery placeholder: holds this allocation for a Kubernetes pod.\n"
    "# Cancelling it frees the pod's share.\n"
    "exec sleep infinity\n"
)
MAX_BODY_BYTES = 64 * 1024
_PUBLIC = frozenset({"/healthz", "/readyz"})
_LIST_PARAMS = frozenset({"schedulerName", "state", "podUid", "groupId", "limit", "cursor"})
_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
}
_TITLES |= {
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    500: "Internal Error",
    503: "Unavailable",
}
_KINDS = {
    400: ProblemType.INVALID_REQUEST,
    404: ProblemType.NOT_FOUND,
    405: ProblemType.METHOD_NOT_ALLOWED,
    413: ProblemType.PAYLOAD_TOO_LARGE,
    415: ProblemType.UNSUPPORTED_MEDIA_TYPE,
}
_DOWN = ("down", "drain", "fail", "future", "maint", "reboot")


def problem(status: int, kind: str, detail: str, **extensions: Any) -> web.Response:
    body = {"type": kind, "title": _TITLES.get(status, "Error"), "status": status, "detail": detail}
    body |= {key: value for key, value in extensions.items() if value is not None}
    headers = {"Retry-After": "1"} if status == 503 else None
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/problem+json", headers=headers
    )


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat().replace("+00:00", "Z")


def _minutes(seconds: float) -> int:
    """A Slurm time limit (minutes) that outlasts ``seconds`` by at least a minute."""
    return math.ceil(seconds / 60) + 1


def state_of(job: dict[str, Any], record: JobRecord, now: float) -> ReservationState | None:
    """The contract state of a placeholder job, or None while it is not a reservation yet."""
    if not record.claimed:
        return None
    if job.get("job_state") == "RUNNING" and record.ended is None:
        if record.committed:
            return ReservationState.COMMITTED
        if record.expires_at is not None and record.expires_at <= now:
            return ReservationState.EXPIRED
        return ReservationState.RESERVED
    if record.ended == "released":
        return ReservationState.RELEASED
    if record.ended == "expired":
        return ReservationState.EXPIRED
    # Ended by Slurm: an administrator's scancel, the time limit, a DOWN node, preemption.
    return ReservationState.RELEASED if record.committed else ReservationState.EXPIRED


def reservation_json(job: dict[str, Any], record: JobRecord, state: ReservationState) -> dict[str, Any]:
    return {
        "id": f"slurm-{job['job_id']}",
        "node": record.node,
        "state": state.value,
        "expiresAt": _iso(record.expires_at) if state is ReservationState.RESERVED else None,
        "podUid": record.pod_uid,
        "schedulerName": record.scheduler,
        "namespace": record.namespace,
        "name": record.name,
        "resources": record.resources,
        "createdAt": _iso(record.created),
    }


def _job_id(reservation_id: str) -> int | None:
    number = reservation_id.removeprefix("slurm-")
    if reservation_id.startswith("slurm-") and number.isdigit() and len(number) < 12:
        return int(number)
    return None


class SlurmRM:
    """The aiohttp application and the sweeper that ends abandoned and expired placeholders."""

    def __init__(
        self,
        slurm: SlurmRest,
        nodes: Sequence[MappedNode],
        *,
        token: str,
        slurm_user: str,
        partition: str | None = None,
        start_wait: float = 3.0,
        retry_after: int = 5,
        hold_seconds: float = 30.0,
        sweep_interval: float = 0.5,
    ) -> None:
        self.slurm = slurm
        self.nodes = tuple(nodes)
        self.by_slurm = {node.slurm: node for node in self.nodes}
        self.token = token
        # Any Slurm user may write any comment: only the adapter's own jobs can be placeholders.
        self.slurm_user = slurm_user
        self.partition = partition
        self.start_wait = start_wait
        self.retry_after = retry_after
        self.hold_seconds = hold_seconds
        self.sweep_interval = sweep_interval
        # Every read-decide-write of a job's comment happens under this lock (one adapter process).
        self._lock = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None

    # -- plumbing ---------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path not in _PUBLIC:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return problem(
                    401,
                    ProblemType.UNAUTHORIZED,
                    "a valid bearer token for this resource manager is required "
                    "(Authorization: Bearer <token>)",
                )
        try:
            return await handler(request)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            return problem(error.status, _KINDS.get(error.status, ProblemType.INTERNAL), error.reason)
        except SlurmUnreachable as error:
            return problem(
                503, ProblemType.UNAVAILABLE, f"Slurm is not answering ({error}); retry after Retry-After"
            )
        except SlurmError as error:
            log.warning("slurmrestd refused %s %s: %s", request.method, request.path, error)
            return problem(500, ProblemType.INTERNAL, f"slurmrestd refused a call: {error}")

    def application(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._middleware])
        app.router.add_post("/v1/reservations", self._reserve)
        app.router.add_get("/v1/reservations", self._list, allow_head=False)
        app.router.add_get("/v1/reservations/{id}", self._get, allow_head=False)
        app.router.add_delete("/v1/reservations/{id}", self._release)
        app.router.add_post("/v1/reservations/{id}/commit", self._commit)
        app.router.add_post("/v1/reservations/{id}/renew", self._renew)
        app.router.add_get("/healthz", self._healthz, allow_head=False)
        app.router.add_get("/readyz", self._readyz, allow_head=False)
        app.on_startup.append(self._start_sweeper)
        app.on_cleanup.append(self._stop_sweeper)
        return app

    async def _start_sweeper(self, _: web.Application) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="slurm-rm-sweeper")

    async def _stop_sweeper(self, _: web.Application) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.slurm.aclose()

    def _decode(self, job: dict[str, Any] | None) -> JobRecord | None:
        """The record of one of the adapter's own placeholder jobs; None for anybody else's job."""
        if job is None or job.get("user_name") != self.slurm_user:
            return None
        return JobRecord.decode(job.get("comment"))

    async def _records(self) -> list[tuple[dict[str, Any], JobRecord]]:
        pairs = []
        for job in await self.slurm.jobs():
            record = self._decode(job)
            if record is not None:
                pairs.append((job, record))
        return pairs

    async def _record(self, job_id: int) -> tuple[dict[str, Any], JobRecord] | None:
        job = await self.slurm.job(job_id)
        record = self._decode(job)
        return (job, record) if job is not None and record is not None else None

    async def _write(self, job_id: int, record: JobRecord, **changes: Any) -> None:
        await self.slurm.update(job_id, {"comment": record.encode(), **changes})

    async def _end(self, job_id: int, record: JobRecord, why: str) -> None:
        record.ended = why
        with contextlib.suppress(SlurmError):  # a job that ended meanwhile takes no comment
            await self._write(job_id, record)
        await self.slurm.cancel(job_id)

    # -- reserve ----------------------------------------------------------------------------------

    async def _reserve(self, request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        try:
            body = ReservationRequest.model_validate_json(await request.read())
        except pydantic.ValidationError as error:
            errors = [
                {"location": "/".join(str(p) for p in item["loc"]) or "body", "message": item["msg"]}
                for item in error.errors(include_url=False, include_input=False)
            ][:20]
            detail = f"{errors[0]['location']}: {errors[0]['message']}"
            return problem(400, ProblemType.INVALID_REQUEST, detail, errors=errors)
        if body.cluster_id is not None:
            return problem(
                400,
                ProblemType.INVALID_REQUEST,
                "clusterId: Extra inputs are not permitted (this RM speaks contract v1.1)",
                errors=[{"location": "clusterId", "message": "Extra inputs are not permitted"}],
            )
        now = time.time()
        created = False
        async with self._lock:
            existing = None
            for job, record in await self._records():
                if record.key != body.idempotency_key or record.ended is not None:
                    continue
                if job.get("job_state") not in ("PENDING", "RUNNING", "CONFIGURING"):
                    continue
                if state_of(job, record, now) is ReservationState.EXPIRED:
                    continue
                existing = (job, record)
            if existing is not None:
                job, record = existing
                if record.fingerprint != fingerprint(body):
                    return problem(
                        409,
                        ProblemType.IDEMPOTENCY_KEY_REUSED,
                        f"idempotency key {body.idempotency_key!r} already holds Slurm job {job['job_id']} "
                        "for a different request; use a new key for a new request",
                    )
                job_id = int(job["job_id"])
            else:
                choice = await self._choose(body)
                if isinstance(choice, web.Response):
                    return choice
                try:
                    job_id = await self._submit(body, choice, now)
                except SlurmUnreachable:
                    raise
                except SlurmError as error:  # Slurm's own refusal: a limit, a QOS, a partition
                    return problem(
                        409,
                        ProblemType.UNSCHEDULABLE,
                        "Slurm refused the pod's placeholder job",
                        reason=f"Slurm refused a job on {choice.slurm}: {error}",
                        retryAfterSeconds=self.retry_after,
                    )
                created = True
        deadline = time.monotonic() + self.start_wait
        while True:
            polled = await self.slurm.job(job_id)
            if polled is None or polled.get("job_state") != "PENDING" or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.1)
        async with self._lock:
            return await self._settle(job_id, created=created)

    async def _choose(self, body: ReservationRequest) -> MappedNode | web.Response:
        size, unmapped = job_size(body)
        slurm_nodes = {node["name"]: node for node in await self.slurm.nodes()}
        pending: dict[str, int] = {}
        queued: dict[str, int] = {}
        for job, record in await self._records():
            if job.get("job_state") == "PENDING" and record.ended is None:
                slurm_name = next((n.slurm for n in self.nodes if n.name == record.node), None)
                if slurm_name is not None:
                    queued[slurm_name] = queued.get(slurm_name, 0) + 1
                    pending[slurm_name] = pending.get(slurm_name, 0) + int(job.get("cpus") or 0)
        reasons: dict[str, int] = {}
        candidates: list[tuple[int, MappedNode]] = []
        for node in self.nodes:
            info = slurm_nodes.get(node.slurm)
            why = allowed(node, body)
            if why is None and info is None:
                why = "not known to Slurm"
            elif why is None and info is not None and any(f in str(info.get("state")).lower() for f in _DOWN):
                why = f"Slurm node {node.slurm} is {info.get('state')}"
            elif why is None and unmapped:
                why = f"Insufficient {unmapped[0]}"
            elif why is None and info is not None and int(info.get("cpus") or 0) < size.cpus:
                why = "Insufficient cpu"
            elif why is None and info is not None and int(info.get("real_memory") or 0) < size.memory_mib:
                why = "Insufficient memory"
            if why is not None:
                reasons[why] = reasons.get(why, 0) + 1
                continue
            assert info is not None
            free = int(info.get("cpus") or 0) - int(info.get("alloc_cpus") or 0) - pending.get(node.slurm, 0)
            free_memory = int(info.get("real_memory") or 0) - int(info.get("alloc_memory") or 0)
            candidates.append((free if free_memory >= size.memory_mib else -1, node))
        if not candidates:
            parts = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
            return problem(
                409,
                ProblemType.UNSCHEDULABLE,
                "no mapped Slurm node can ever hold this pod",
                reason=f"0/{len(self.nodes)} nodes are available: {parts}.",
            )
        fitting = [(free, node) for free, node in candidates if free >= size.cpus]
        if fitting:
            return max(fitting, key=lambda pair: pair[0])[1]
        return min(candidates, key=lambda pair: queued.get(pair[1].slurm, 0))[1]

    async def _submit(self, body: ReservationRequest, node: MappedNode, now: float) -> int:
        size, _ = job_size(body)
        record = JobRecord(
            key=body.idempotency_key,
            pod_uid=body.pod.uid,
            scheduler=body.pod.scheduler_name,
            namespace=body.pod.namespace,
            name=body.pod.name,
            node=node.name,
            fingerprint=fingerprint(body),
            resources=body.canonical_resources(),
            ttl=body.ttl_seconds,
            created=now,
            hold_until=now + max(self.hold_seconds, self.start_wait) + 5,
        )
        job: dict[str, Any] = {
            "name": f"bindery:{body.pod.namespace}/{body.pod.name}"[:200],
            "comment": record.encode(),
            "nodelist": node.slurm,
            "cpus_per_task": size.cpus,
            "memory_per_node": size.memory_mib,
            "time_limit": _minutes(body.ttl_seconds + self.hold_seconds),
            "requeue": False,
            "current_working_directory": "/tmp",
            "standard_output": "/dev/null",
            "standard_error": "/dev/null",
            "environment": {"PATH": "/usr/bin:/bin"},
        }
        if self.partition:
            job["partition"] = self.partition
        job_id = await self.slurm.submit(job, PLACEHOLDER_SCRIPT)
        log.info("reserve %s: Slurm job %s on %s (%s)", body.idempotency_key, job_id, node.slurm, size)
        return job_id

    async def _settle(self, job_id: int, *, created: bool) -> web.Response:
        found = await self._record(job_id)
        if found is None:
            return problem(
                409,
                ProblemType.UNSCHEDULABLE,
                "the placeholder job vanished",
                reason=f"Slurm job {job_id} is gone",
                retryAfterSeconds=self.retry_after,
            )
        job, record = found
        now = time.time()
        state = job.get("job_state")
        if state == "RUNNING":
            status = 200
            if not record.claimed:
                record.claimed = True
                record.expires_at = now + record.ttl
                started = float(job.get("start_time") or now)
                await self._write(job_id, record, time_limit=_minutes(now - started + record.ttl))
                status = 201
            elif created:
                status = 201
            answer = reservation_json(job, record, state_of(job, record, now) or ReservationState.RESERVED)
            return web.json_response(
                answer, status=status, headers={"Location": f"/v1/reservations/slurm-{job_id}"}
            )
        reason = (
            f"Slurm job {job_id} on {self._slurm_name(record.node)} is {state}: {job.get('state_reason')}"
        )
        if state == "PENDING":
            if self.hold_seconds <= 0:
                await self._end(job_id, record, "abandoned")
                reason += "; cancelled (the adapter runs without queueing)"
            else:
                record.hold_until = now + self.hold_seconds
                await self._write(job_id, record)
                reason += "; the pod keeps its place in Slurm's queue while Bindery asks again"
        return problem(
            409,
            ProblemType.UNSCHEDULABLE,
            "Slurm has not started the pod's placeholder job",
            reason=reason,
            retryAfterSeconds=self.retry_after,
        )

    def _slurm_name(self, kube_name: str) -> str:
        return next((n.slurm for n in self.nodes if n.name == kube_name), kube_name)

    # -- commit, release, renew, get, list ---------------------------------------------------------

    async def _lookup(self, request: web.Request) -> tuple[int, dict[str, Any], JobRecord] | None:
        job_id = _job_id(request.match_info["id"])
        if job_id is None:
            return None
        found = await self._record(job_id)
        if found is None or not found[1].claimed:
            return None
        return job_id, found[0], found[1]

    async def _commit(self, request: web.Request) -> web.Response:
        async with self._lock:
            found = await self._lookup(request)
            if found is None:
                return problem(404, ProblemType.NOT_FOUND, f"no reservation {request.match_info['id']}")
            job_id, job, record = found
            pod_uid = request.rel_url.query.get("podUid")
            if pod_uid is not None and pod_uid != record.pod_uid:
                return _mismatch(request.match_info["id"])
            state = state_of(job, record, time.time())
            if state is ReservationState.RESERVED:
                record.committed, record.expires_at = True, None
                await self._write(job_id, record, time_limit=INFINITE)
                state = ReservationState.COMMITTED
            if state is not ReservationState.COMMITTED:
                return _not_active(request.match_info["id"], state)
            return web.json_response(reservation_json(job, record, state))

    async def _release(self, request: web.Request) -> web.Response:
        async with self._lock:
            found = await self._lookup(request)
            if found is None:
                return web.Response(status=204)
            job_id, job, record = found
            state = state_of(job, record, time.time())
            if state is None or not state.active:
                return web.Response(status=204)
            pod_uid = request.rel_url.query.get("podUid")
            if pod_uid is not None and pod_uid != record.pod_uid:
                return _mismatch(request.match_info["id"])
            await self._end(job_id, record, "released")
            return web.Response(status=204)

    async def _renew(self, request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        try:
            body = RenewRequest.model_validate_json(await request.read())
        except pydantic.ValidationError as error:
            first = error.errors(include_url=False, include_input=False)[0]
            return problem(
                400, ProblemType.INVALID_REQUEST, f"{'/'.join(map(str, first['loc']))}: {first['msg']}"
            )
        async with self._lock:
            found = await self._lookup(request)
            if found is None:
                return problem(404, ProblemType.NOT_FOUND, f"no reservation {request.match_info['id']}")
            job_id, job, record = found
            if body.pod_uid != record.pod_uid:
                return _mismatch(request.match_info["id"])
            now = time.time()
            state = state_of(job, record, now)
            if state is ReservationState.RESERVED:
                record.expires_at = now + body.ttl_seconds
                started = float(job.get("start_time") or now)
                await self._write(job_id, record, time_limit=_minutes(now - started + body.ttl_seconds))
            elif state is not ReservationState.COMMITTED:
                return _not_active(request.match_info["id"], state)
            return web.json_response(reservation_json(job, record, state))

    async def _get(self, request: web.Request) -> web.Response:
        found = await self._lookup(request)
        if found is None:
            return problem(404, ProblemType.NOT_FOUND, f"no reservation {request.match_info['id']}")
        _, job, record = found
        state = state_of(job, record, time.time())
        assert state is not None  # _lookup returns claimed records only
        return web.json_response(reservation_json(job, record, state))

    async def _list(self, request: web.Request) -> web.Response:
        query = request.rel_url.query
        unknown = sorted(set(query) - _LIST_PARAMS)
        if unknown:
            return problem(400, ProblemType.INVALID_REQUEST, f"unknown query parameters {unknown}")
        try:
            limit = int(query.get("limit", "100"))
            if not 1 <= limit <= 500:
                raise ValueError
        except ValueError:
            return problem(400, ProblemType.INVALID_REQUEST, "limit must be an integer from 1 to 500")
        wanted_state = query.get("state")
        if wanted_state is not None and wanted_state not in {s.value for s in ReservationState}:
            return problem(400, ProblemType.INVALID_REQUEST, f"unknown state {wanted_state!r}")
        after = 0
        if "cursor" in query:
            if not query["cursor"].isdigit() or len(query["cursor"]) > 12:
                return problem(400, ProblemType.INVALID_REQUEST, "cursor is not one this server issued")
            after = int(query["cursor"])
        if "groupId" in query:  # no reservation groups here: no reservation has one
            return web.json_response({"items": []})
        now = time.time()
        items: list[tuple[int, dict[str, Any]]] = []
        for job, record in await self._records():
            state = state_of(job, record, now)
            job_id = int(job["job_id"])
            if state is None or job_id <= after:
                continue
            if query.get("schedulerName") not in (None, record.scheduler):
                continue
            if query.get("podUid") not in (None, record.pod_uid) or wanted_state not in (None, state.value):
                continue
            items.append((job_id, reservation_json(job, record, state)))
        items.sort(key=lambda pair: pair[0])
        page: dict[str, Any] = {"items": [item for _, item in items[:limit]]}
        if len(items) > limit:
            page["nextCursor"] = str(items[limit - 1][0])
        return web.json_response(page)

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        try:
            await self.slurm.nodes()
        except SlurmError as error:
            return problem(503, ProblemType.UNAVAILABLE, f"slurmrestd is not answering: {error}")
        return web.json_response({"status": "ready"})

    # -- the sweeper --------------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except SlurmError as error:
                log.warning("sweeping placeholder jobs failed (will retry): %s", error)
            await asyncio.sleep(self.sweep_interval)

    async def sweep(self) -> None:
        """Cancel placeholders whose lease expired, and unclaimed ones whose pod stopped asking."""
        async with self._lock:
            now = time.time()
            for job, record in await self._records():
                if record.ended is not None or job.get("job_state") not in ("PENDING", "RUNNING"):
                    continue
                job_id = int(job["job_id"])
                if not record.claimed and record.hold_until < now:
                    log.info("Slurm job %s: nobody asked for it since its hold; cancelling", job_id)
                    await self._end(job_id, record, "abandoned")
                elif state_of(job, record, now) is ReservationState.EXPIRED:
                    log.info("Slurm job %s: the reservation's lease ran out; cancelling", job_id)
                    await self._end(job_id, record, "expired")


def _mismatch(reservation_id: str) -> web.Response:
    return problem(
        409,
        ProblemType.POD_MISMATCH,
        f"reservation {reservation_id} belongs to another pod; nothing changed",
    )


def _not_active(reservation_id: str, state: ReservationState | None) -> web.Response:
    return problem(
        409,
        ProblemType.RESERVATION_NOT_ACTIVE,
        f"reservation {reservation_id} is {state.value if state else 'gone'}; reserve again",
    )
