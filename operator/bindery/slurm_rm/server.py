"""The contract served in front of slurmrestd: a reservation is a placeholder job.

**Reserve** submits a batch job (``exec sleep infinity``) sized from the pod's requests
(:mod:`bindery.slurm_rm.mapping`) on ONE Slurm node the request allows (``nodelist``: naming every
feasible node would let Slurm end the job when any of them goes away, slurm-bridge issue #43). The
node is the allowed one with the most CPUs free now, counting this adapter's own pending
placeholders; when none has room, the one with the fewest of them, where the job queues.

**A synchronous reserve meets an asynchronous allocation** like this: reserve waits up to
``start_wait`` seconds for slurmctld to start the job. Running: ``201`` with the node. Still
pending: ``409 unschedulable`` with Slurm's reason (``Priority``, ``Resources``, …) in ``reason``,
so the pod's ``FailedScheduling`` says why, and ``retryAfterSeconds``, so Bindery asks again. A job
placed on room the adapter's own ended placeholders still hold while Slurm tears them down waits
for that teardown too (up to ``teardown_wait`` more). The pending job stays in Slurm's queue, keyed
by the request's ``idempotencyKey`` (the pod UID): the next reserve with the same key finds it
instead of submitting another, and answers ``201`` once it runs. Slurm's priorities, fair share,
QOS and partitions thus order the pods. A job whose pod stops asking (deleted, bound elsewhere) is
cancelled ``hold_seconds`` after the last ask, pending or started; ``hold_seconds = 0`` is a plain
RM's behaviour, no queueing: a pod that fits no node by the adapter's count of free CPUs and memory
is refused at once, and a job Slurm keeps pending is cancelled.

**Commit** marks the job committed and lifts its time limit; **release** cancels it; **renew**
moves the lease and the time limit. A reserved job's Slurm time limit is its lease plus a margin,
so Slurm itself ends a placeholder the adapter forgot. All state is in the job's comment: the
adapter keeps nothing of its own and may be SIGKILLed and restarted at any point. A job Slurm ended
(``scancel`` by hand, the time limit, a DOWN node, preemption) lists as ``expired`` when it was
only reserved; a committed one is **revoked** (contract v1.2 ``revocation``, advertised in ``GET
/v1/info``) with Slurm's final state and reason, once it is no longer ``COMPLETING``. The adapter
tells it from one it ended itself by the comment it writes before every ``scancel`` of its own
(``ended``). A caller that does not send ``Bindery-Features: revocation`` reads it ``released``. A
release acknowledges it; Slurm refuses to change a finished job's comment, so the acknowledgement
is kept in memory (after an adapter restart the revocation shows again until Slurm forgets the job,
after ``MinJobAge``, and its id then answers 404).

**A reservation group** (contract v1.1, all or nothing) is ONE Slurm heterogeneous job (hetjob)
across the members' nodes when the members are on distinct nodes, so Slurm itself starts all of
it or none. Its members are placed by the adapter's own count of free CPUs and memory (as above),
within one value of each topology key, the node with the most free CPUs first (which spreads
them); the hetjob has one component per member, pinned to its node (``nodelist``, that node
only) and sized from it (CPUs, memory, GRES). Running: ``201`` with every member's node. Not
started within ``start_wait``: ``409`` with Slurm's reason, and the hetjob keeps its place in
Slurm's queue, keyed by the group's ``idempotencyKey`` (Bindery's key for a group is stable
across its retries): the next reserve with that key finds it and answers ``201`` once Slurm
starts it. A group that fits the nodes' capacity, a member per node, but not their free room now
is submitted too and waits the same way; one that fits no node even empty is refused at once.
``hold_seconds = 0`` (no queueing) refuses without submitting when the count says no room, and
cancels a hetjob Slurm did not start. Nothing of a group ever runs half-started.

**Members that share a node** (more members than nodes, or the count packs two on one node) make
a job per member instead, as before hetjobs: all started by Slurm within ``start_wait`` or all
cancelled, and such a group never queues in Slurm (a half-started gang would hold nodes for
nothing). Slurm 22.05 cannot hold them in one hetjob, as found below.

What slurmctld 22.05 / slurmrestd v0.0.38 allow, checked on the bed, and what follows from it:

- ``POST /job/submit`` takes ``jobs`` (one entry per component) with a script run on component
  0. ``GET /jobs`` lists each component as its own job (``job_id``, ``het_job_id`` = the
  leader's id, ``het_job_offset``); ``GET /job/{leader}`` answers every component.
- Components cannot share a node. Pinned with ``nodelist``, slurmctld adds each component's
  required nodes to the others' excluded nodes ("avoid scheduling deadlock") and refuses two on
  one node (``Invalid node name specified``). Pinned by ``exclude_nodes`` instead, the submit is
  taken but the hetjob never starts (``PENDING: Resources`` on empty nodes): backfill plans whole
  nodes for the component it will start, so the second component on that node plans later, and
  a hetjob starts only when every component can start now. Hence the job per member above. (A
  component holding several members would not do either: Slurm cannot shrink a running job's
  CPUs, so a released member's share would stay allocated, which the contract forbids.)
- Hetjobs are started by the backfill scheduler alone, every ``bf_interval`` (default 30 s; the
  bed sets 1 s): on a site with the default a group may wait that long, in Slurm's queue. And,
  for the same whole-node planning, hetjobs sharing nodes start about one per cycle: on the bed,
  four pairs submitted at once started 0.8, 1.9, 2.8 and 3.8 s later, with or without
  ``bf_hetjob_immediate`` and ``bf_min_prio_reserve``. With queueing they wait; without it
  (``hold_seconds = 0``) ``start_wait`` must cover a burst of groups.
- Each component has its own ``comment``, at most 1024 characters (on submit and on update).
- ``POST /job/{leader}`` updates EVERY component (a comment too: it would overwrite the
  others'). One component is ``{leader}+{offset}``, which slurmrestd takes URL-encoded only:
  ``POST /job/{leader}%2B{offset}``. Claim, commit, renew and release write one component.
- ``DELETE /job/{id}`` of a running non-leader component cancels that component alone; of the
  leader (or ``leader%2B0``) the whole hetjob; a pending hetjob is cancelled only whole. So a
  member's release marks it ``released`` in its component's comment and cancels the component,
  except component 0, which lives until every member of the group has ended and is then
  cancelled with the whole job: the share of the member in component 0 (index 0) stays
  allocated in Slurm, and counted as used, until the group's last member ends.
- A component's time limit is its own, but component 0 ending ends the whole hetjob: committing
  any member lifts component 0's time limit too, a renew of a member elsewhere raises component
  0's to at least that member's, and a renew never lowers component 0's below another component's
  or a committed member's need.
- Revocation works per component: an administrator's ``scancel <leader>+<offset>`` revokes that
  member only; ``scancel <leader>`` revokes every member.

A member's reservation id is ``slurm-<job>-<index>`` (the hetjob's leader, or the member's own
job); the group's id, key and each member's place are in the comments, so GET, renew and release
read the group back from slurmctld.

**A batch** (``POST /v1/batch``) carries out its operations one after the other, each exactly as
its single call (the same code answers both), so a reserve later in a batch sees the effects of
those before it.

``podUid`` is checked on commit, release and renew (contract v1.1).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import datetime
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Container, Mapping, Sequence
from typing import Any, TypeVar

import pydantic
from aiohttp import web

from bindery.rm import serving
from bindery.rm.errors import ProblemType
from bindery.rm.models import (
    CONTRACT_VERSION,
    FEATURES_HEADER,
    BatchOperation,
    Feature,
    GroupRenewRequest,
    RenewRequest,
    ReservationGroupRequest,
    ReservationRequest,
    ReservationState,
)
from bindery.slurm_rm.mapping import (
    DEFAULT_GRES_MAP,
    CommentTooLong,
    GresAsk,
    JobRecord,
    JobSize,
    MappedNode,
    PodRequest,
    allowed,
    decode_records,
    encode_component,
    fingerprint,
    job_size,
    parse_gres,
)
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
#: As the reference RM's: a group carries up to 1000 members, a batch up to 500 operations.
MAX_GROUP_BODY_BYTES = 2 * 1024 * 1024
MAX_BATCH_BODY_BYTES = 4 * 1024 * 1024
_PUBLIC = frozenset({"/healthz", "/readyz"})
_DOWN = ("down", "drain", "fail", "future", "maint", "reboot")
#: Acknowledged revocations remembered (job ids); Slurm forgets ended jobs after MinJobAge.
ACKNOWLEDGED_KEPT = 100_000


def problem(status: int, kind: str, detail: str, **extensions: Any) -> web.Response:
    """The contract's problem answer (:func:`bindery.rm.serving.problem`); a 503 says when to ask
    again, as slurmctld is usually back within a second."""
    headers = {"Retry-After": "1"} if status == 503 else None
    return serving.problem(status, kind, detail, headers=headers, **extensions)


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat().replace("+00:00", "Z")


#: The states of a job that holds (or is about to hold) its allocation.
_HOLDING = ("PENDING", "RUNNING", "CONFIGURING")


def _time_limit(job: dict[str, Any]) -> int:
    """A job's time limit in minutes as slurmrestd answers it (v0.0.38: a number; later: a
    ``{set, infinite, number}`` object); INFINITE when none, 0 when it does not say."""
    value = job.get("time_limit")
    if isinstance(value, dict):
        if value.get("infinite"):
            return INFINITE
        value = value.get("number")
    return int(value) if isinstance(value, int | float) else 0


def _minutes(seconds: float) -> int:
    """A Slurm time limit (minutes) that outlasts ``seconds`` by at least a minute."""
    return math.ceil(seconds / 60) + 1


#: Whether the answer being built may show state ``revoked`` (contract v1.2 ``revocation``): set per
#: request from the ``Bindery-Features`` header (or ``?state=revoked``); other callers read released.
revocation_shown: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "slurm_revocation_shown", default=False
)


def visible(state: ReservationState) -> ReservationState:
    """The state as the caller of the current request may see it (a v1.1 caller never sees revoked)."""
    if state is ReservationState.REVOKED and not revocation_shown.get():
        return ReservationState.RELEASED
    return state


def revoked_because(job: dict[str, Any]) -> str:
    """Slurm's own account of why a placeholder ended: its final state and reason. (Not its exit
    code: slurmrestd 22.05 gives a scancelled job's signal, 15, where a reader expects a status.)"""
    parts = [f"Slurm job {job.get('job_id')} is {job.get('job_state')}"]
    reason = job.get("state_reason")
    if reason and reason != "None":
        parts.append(f"reason {reason}")
    return ", ".join(parts) + " (ended by Slurm, not by this adapter)"


def state_of(
    job: dict[str, Any], record: JobRecord, now: float, acknowledged: Container[str] = ()
) -> ReservationState | None:
    """The contract state of a placeholder job, or None while it is not a reservation yet.

    A committed job Slurm ended by itself is ``revoked`` (contract v1.2) until a release
    acknowledges it (``acknowledged``: reservation ids; kept in memory, since Slurm refuses to change a
    finished job's comment), then ``released``."""
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
    if record.committed and record.ended is None and job.get("job_state") == "COMPLETING":
        # Still ending: Slurm holds the allocation and its final state (CANCELLED, TIMEOUT,
        # NODE_FAIL, PREEMPTED…), the reason worth reporting, is not known yet.
        return ReservationState.COMMITTED
    if not record.committed:
        return ReservationState.EXPIRED
    return (
        ReservationState.RELEASED if placeholder_id(job, record) in acknowledged else ReservationState.REVOKED
    )


def placeholder_id(job: dict[str, Any], record: JobRecord) -> str:
    """``slurm-<job id>`` for a single pod's job; ``slurm-<hetjob id>-<index>`` for a group's member
    (several members may share one component, the group's job on their node)."""
    if record.group is not None:
        return f"slurm-{job.get('het_job_id') or job['job_id']}-{record.index}"
    return f"slurm-{job['job_id']}"


def reservation_json(job: dict[str, Any], record: JobRecord, state: ReservationState) -> dict[str, Any]:
    shown = visible(state)
    answer = {
        "id": placeholder_id(job, record),
        "node": record.node,
        "state": shown.value,
        "expiresAt": _iso(record.expires_at) if state is ReservationState.RESERVED else None,
        "podUid": record.pod_uid,
        "schedulerName": record.scheduler,
        "namespace": record.namespace,
        "name": record.name,
        "resources": record.resources,
        "createdAt": _iso(record.created),
    }
    if record.group is not None:
        answer["groupId"] = record.group
    if record.cluster is not None:
        answer["clusterId"] = record.cluster
    if shown is ReservationState.REVOKED:
        answer["revokedReason"] = revoked_because(job)
        answer["revokedAt"] = _iso(float(job["end_time"])) if job.get("end_time") else _iso(time.time())
    return answer


def group_json(
    group_id: str,
    members: Sequence[tuple[dict[str, Any], JobRecord]],
    now: float,
    acknowledged: Container[str] = (),
) -> dict[str, Any]:
    """A reservation group as the contract answers it: its members in the order asked."""
    ordered = sorted(members, key=lambda pair: pair[1].index)
    items = []
    for job, record in ordered:
        state = state_of(job, record, now, acknowledged) or ReservationState.RESERVED
        items.append(reservation_json(job, record, state))
    leases = [item["expiresAt"] for item in items if item["state"] == ReservationState.RESERVED.value]
    return {
        "id": group_id,
        "members": items,
        "expiresAt": min(leases) if leases else None,
        "topologyValue": ordered[0][1].topology if ordered else {},
    }


def _job_id(reservation: str) -> tuple[int, int | None] | None:
    """The job id of ``slurm-<job>``, or the hetjob id and member index of ``slurm-<hetjob>-<index>``."""
    if not reservation.startswith("slurm-"):
        return None
    number, _, index = reservation.removeprefix("slurm-").partition("-")
    if not number.isdigit() or len(number) >= 12 or (index and (not index.isdigit() or len(index) > 4)):
        return None
    return int(number), (int(index) if index else None)


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
        teardown_wait: float = 15.0,
        retry_after: int = 5,
        hold_seconds: float = 30.0,
        sweep_interval: float = 0.5,
        gres_map: Mapping[str, str] = DEFAULT_GRES_MAP,
    ) -> None:
        self.slurm = slurm
        self.nodes = tuple(nodes)
        self.by_slurm = {node.slurm: node for node in self.nodes}
        self.token = token
        # Any Slurm user may write any comment: only the adapter's own jobs can be placeholders.
        self.slurm_user = slurm_user
        self.partition = partition
        self.start_wait = start_wait
        self.teardown_wait = teardown_wait
        self.retry_after = retry_after
        self.hold_seconds = hold_seconds
        self.sweep_interval = sweep_interval
        #: Kubernetes extended resource -> Slurm GRES (see mapping.py's "GRES").
        self.gres_map = dict(gres_map)
        # Every read-decide-write of a job's comment happens under this lock (one adapter process).
        self._lock = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None
        #: Job ids of revoked reservations a release acknowledged (contract v1.2 revocation), oldest
        #: first, bounded: Slurm forgets ended jobs after MinJobAge anyway. Lost on restart, so a
        #: revocation may be shown again until then (Bindery acts on a pod once; see its docs).
        self._acknowledged: collections.OrderedDict[str, None] = collections.OrderedDict()

    def _state_of(self, job: dict[str, Any], record: JobRecord, now: float) -> ReservationState | None:
        return state_of(job, record, now, self._acknowledged)

    def _acknowledge(self, reservation: str) -> None:
        self._acknowledged[reservation] = None
        while len(self._acknowledged) > ACKNOWLEDGED_KEPT:
            self._acknowledged.popitem(last=False)

    # -- plumbing ---------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        asked = request.headers.get(FEATURES_HEADER, "")
        revocation_shown.set(
            Feature.REVOCATION.value in {f.strip() for f in asked.split(",")}
            or request.rel_url.query.get("state") == ReservationState.REVOKED.value
        )
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
            return problem(error.status, serving.KINDS.get(error.status, ProblemType.INTERNAL), error.reason)
        except SlurmUnreachable as error:
            return problem(
                503, ProblemType.UNAVAILABLE, f"Slurm is not answering ({error}); retry after Retry-After"
            )
        except SlurmError as error:
            log.warning("slurmrestd refused %s %s: %s", request.method, request.path, error)
            return problem(500, ProblemType.INTERNAL, f"slurmrestd refused a call: {error}")

    def application(self) -> web.Application:
        # aiohttp's limit is the largest body of any path; each handler checks its own.
        app = web.Application(client_max_size=MAX_BATCH_BODY_BYTES, middlewares=[self._middleware])
        app.router.add_get("/v1/info", self._info, allow_head=False)
        app.router.add_post("/v1/reservations", self._reserve)
        app.router.add_post("/v1/reservation-groups", self._reserve_group)
        app.router.add_get("/v1/reservation-groups/{id}", self._get_group, allow_head=False)
        app.router.add_delete("/v1/reservation-groups/{id}", self._release_group)
        app.router.add_post("/v1/reservation-groups/{id}/renew", self._renew_group)
        app.router.add_post("/v1/batch", self._batch)
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

    def _decode(self, job: dict[str, Any] | None) -> list[JobRecord]:
        """The reservations one of the adapter's own placeholder jobs holds (a group's component
        holds the members on its node); none for anybody else's job."""
        if job is None or job.get("user_name") != self.slurm_user:
            return []
        return decode_records(job.get("comment"))

    async def _placeholders(self) -> list[tuple[dict[str, Any], list[JobRecord]]]:
        """Every placeholder job (a group's hetjob: every component) with the reservations it holds."""
        found = []
        for job in await self.slurm.jobs():
            records = self._decode(job)
            if records:
                found.append((job, records))
        return found

    async def _records(self) -> list[tuple[dict[str, Any], JobRecord]]:
        return [(job, record) for job, records in await self._placeholders() for record in records]

    async def _record(self, job_id: int) -> tuple[dict[str, Any], JobRecord] | None:
        """A placeholder job of one pod (alone, or a member of a group that is a job per member)."""
        job = await self.slurm.job(job_id)
        records = self._decode(job)
        if job is None or len(records) != 1 or job.get("het_job_id"):
            return None
        return job, records[0]

    async def _write(self, job: dict[str, Any], record: JobRecord, **changes: Any) -> None:
        """Write ``record`` (and ``changes``) into its job's comment. A group member's is its
        component's, shared with the members on its node: written as a whole, to that component only."""
        job_id = int(job["job_id"])
        if record.group is None or not job.get("het_job_id"):  # one pod's own job
            await self.slurm.update(job_id, {"comment": record.encode(), **changes})
            job["comment"] = record.encode()
            return
        members = [record if r.index == record.index else r for r in decode_records(job.get("comment"))]
        if changes.get("time_limit") not in (None, INFINITE) and any(
            r.committed and r.ended is None for r in members
        ):
            changes["time_limit"] = INFINITE  # a committed member's share never times out
        comment = encode_component(members)
        leader, offset = int(job.get("het_job_id") or job_id), int(job.get("het_job_offset") or 0)
        limit = changes.get("time_limit")
        if limit not in (None, INFINITE):
            # Component 0 ending ends the whole hetjob: its time limit reaches as far as every
            # other component's (the components start together), so it never cuts short a member
            # committed, or renewed alone, on another node.
            components = await self.slurm.het_job(leader)
            first = next((c for c in components if int(c.get("het_job_offset") or 0) == 0), None)
            others = [c for c in components if int(c.get("het_job_offset") or 0) != 0]
            if offset == 0:
                if any(r.committed and r.ended is None for c in components for r in self._decode(c)):
                    changes["time_limit"] = INFINITE
                else:
                    changes["time_limit"] = max(
                        [limit, *(_time_limit(c) for c in others if c.get("job_state") in _HOLDING)]
                    )
            elif first is not None and _time_limit(first) < limit:
                await self.slurm.update_component(leader, 0, {"time_limit": limit})
        await self.slurm.update_component(leader, offset, {"comment": comment, **changes})
        job["comment"] = comment  # later writes in this call see this one

    async def _component_records(self, leader: int) -> list[tuple[dict[str, Any], JobRecord]]:
        """Every member of the group whose hetjob is ``leader``, with its component."""
        return [(job, record) for job in await self.slurm.het_job(leader) for record in self._decode(job)]

    async def _end(self, job: dict[str, Any], record: JobRecord, why: str) -> None:
        """Mark ``record`` ended by the adapter, then cancel what no longer holds a live reservation:
        a single pod's job; a group's component once all its members ended (not component 0:
        cancelling it cancels the whole hetjob, in 22.05 as in later releases), and the whole
        hetjob once every member of the group has ended."""
        record.ended = why
        with contextlib.suppress(SlurmError):  # a job that ended meanwhile takes no comment
            await self._write(job, record)
        job_id = int(job["job_id"])
        if record.group is None or not job.get("het_job_id"):
            await self.slurm.cancel(job_id)
            return
        leader, offset = int(job.get("het_job_id") or job_id), int(job.get("het_job_offset") or 0)
        if offset != 0 and all(r.ended is not None for r in decode_records(job.get("comment"))):
            await self.slurm.cancel(job_id)  # this component only (22.05: a running one may be)
        live = [
            r
            for component, r in await self._component_records(leader)
            if r.ended is None and component.get("job_state") in ("PENDING", "RUNNING", "CONFIGURING")
        ]
        if not live:
            await self.slurm.cancel(leader)

    # -- reserve ----------------------------------------------------------------------------------

    async def _reserve(self, request: web.Request) -> web.Response:
        body = await _json_body(request, ReservationRequest, limit=MAX_BODY_BYTES, what="a reserve's")
        if isinstance(body, web.Response):
            return body
        return await self.reserve(body)

    async def reserve(self, body: ReservationRequest) -> web.Response:
        """``POST /v1/reservations`` for a validated request, as its own call or in a batch."""
        now = time.time()
        created = False
        async with self._lock:
            existing = None
            # One listing of Slurm's queue serves the replay check and the choice of node.
            placeholders = await self._placeholders()
            for job, record in [(job, record) for job, records in placeholders for record in records]:
                if record.group is not None or record.key != body.idempotency_key or record.ended is not None:
                    continue
                if job.get("job_state") not in ("PENDING", "RUNNING", "CONFIGURING"):
                    continue
                if self._state_of(job, record, now) is ReservationState.EXPIRED:
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
                choice = await self._choose(body, placeholders=placeholders)
                if isinstance(choice, web.Response):
                    return choice
                record = JobRecord(
                    key=body.idempotency_key,
                    pod_uid=body.pod.uid,
                    scheduler=body.pod.scheduler_name,
                    namespace=body.pod.namespace,
                    name=body.pod.name,
                    node=choice.name,
                    fingerprint=fingerprint(body),
                    resources=body.canonical_resources(),
                    ttl=body.ttl_seconds,
                    created=now,
                    hold_until=self._unclaimed_hold(now),
                    cluster=body.cluster_id,
                )
                try:
                    job_id = await self._submit(record, self._size(body)[0], choice)
                except SlurmUnreachable:
                    raise
                except SlurmError as error:  # Slurm's own refusal: a limit, a QOS, a partition
                    if error.job_id is not None:  # refused, yet queued: cancel it
                        with contextlib.suppress(SlurmError):
                            await self.slurm.cancel(error.job_id)
                    return problem(
                        409,
                        ProblemType.UNSCHEDULABLE,
                        "Slurm refused the pod's placeholder job",
                        reason=f"Slurm refused a job on {choice.slurm}: {error}",
                        retryAfterSeconds=self.retry_after,
                    )
                created = True
        await self._await_start([job_id])
        async with self._lock:
            return await self._settle(job_id, created=created)

    def _unclaimed_hold(self, now: float) -> float:
        """Until when a new placeholder nobody has claimed yet is kept: past the reserve's own wait
        (start and teardown), so the sweeper never cancels a job its reserve is still waiting on,
        and for ``hold_seconds`` when queueing."""
        return now + max(self.hold_seconds, self.start_wait + self.teardown_wait) + 5

    async def _await_start(self, job_ids: Sequence[int]) -> None:
        """Until none of the jobs is PENDING any more, or ``start_wait`` has passed.

        The adapter places a job on room its own ended placeholders still hold while Slurm tears
        them down (see ``_view``): Slurm starts the job only once that teardown is over, which a
        slow slurmd or a loaded host can stretch past ``start_wait``. So while any of those
        teardowns lasts, the wait is extended (to ``start_wait`` after the teardown is seen over:
        a group's hetjob starts at Slurm's next backfill cycle after that), up to ``teardown_wait``
        more in all: refusing would break the adapter's own promise of room, and a group would be
        cancelled whole for it."""
        start = time.monotonic()
        deadline, limit = start + self.start_wait, start + self.start_wait + self.teardown_wait
        waiting = list(job_ids)
        tearing = False
        while waiting:
            now = time.monotonic()
            if now >= deadline:
                if now >= limit:
                    return
                was, tearing = tearing, await self._tearing_down()
                if not tearing and not was:
                    return
                deadline = min(limit, now + self.start_wait)
            still = []
            for job_id in waiting:
                polled = await self.slurm.job(job_id)
                if polled is not None and polled.get("job_state") == "PENDING":
                    still.append(job_id)
            waiting = still
            if waiting:
                await asyncio.sleep(0.1)

    async def _tearing_down(self) -> bool:
        """Whether a placeholder the adapter ended still holds its allocation in Slurm."""
        placeholders = await self._placeholders()
        kept = self._kept_leaders(placeholders, time.time())
        return any(
            all(record.ended is not None for record in records)
            and job.get("job_state") in ("RUNNING", "CONFIGURING", "COMPLETING")
            and not _kept(job, kept)
            for job, records in placeholders
        )

    def _kept_leaders(
        self, placeholders: Sequence[tuple[dict[str, Any], list[JobRecord]]], now: float
    ) -> set[int]:
        """The hetjobs whose component 0 Slurm keeps running for a member still live in another
        component: component 0 ends only with the whole job, so its ended member's share stays."""
        kept = set()
        for job, records in placeholders:
            if (
                job.get("het_job_id")
                and int(job.get("het_job_offset") or 0) != 0
                and job.get("job_state") in ("PENDING", "RUNNING", "CONFIGURING")
                and any(
                    r.ended is None and self._state_of(job, r, now) is not ReservationState.EXPIRED
                    for r in records
                )
            ):
                kept.add(int(job["het_job_id"]))
        return kept

    async def _view(
        self, *, placeholders: list[tuple[dict[str, Any], list[JobRecord]]] | None = None
    ) -> dict[str, _NodeRoom]:
        """What each mapped Slurm node has free by the adapter's count: Slurm's allocations, plus
        its own pending placeholders (Slurm will start them there), minus the running ones it has
        ended (or whose lease ran out) that Slurm has not processed the cancel of yet."""
        slurm_nodes = {node["name"]: node for node in await self.slurm.nodes()}
        by_kube = {node.name: node.slurm for node in self.nodes}
        now = time.time()
        rooms: dict[str, _NodeRoom] = {}
        for node in self.nodes:
            info = slurm_nodes.get(node.slurm)
            if info is None:
                continue
            total, used = parse_gres(info.get("gres")), parse_gres(info.get("gres_used"))
            rooms[node.slurm] = _NodeRoom(
                info=info,
                cpus=int(info.get("cpus") or 0) - int(info.get("alloc_cpus") or 0),
                memory_mib=int(info.get("real_memory") or 0) - int(info.get("alloc_memory") or 0),
                gres={name: count - used.get(name, 0) for name, count in total.items()},
                gres_total=total,
            )
        if placeholders is None:
            placeholders = await self._placeholders()
        kept = self._kept_leaders(placeholders, now)
        for job, records in placeholders:
            # One job per pod, or a group's hetjob component (its comment could hold several).
            room = rooms.get(by_kube.get(records[0].node, ""))
            if room is None:
                continue
            cpus, memory = int(job.get("cpus") or 0), _job_memory(job)
            gres = parse_gres(job.get("tres_per_node"))
            state = job.get("job_state")
            if state == "PENDING" and any(record.ended is None for record in records):
                room.queued += 1
                room.take(cpus, memory, gres, sign=1)
            elif (
                state in ("RUNNING", "CONFIGURING")
                and not _kept(job, kept)
                and all(
                    record.ended is not None or self._state_of(job, record, now) is ReservationState.EXPIRED
                    for record in records
                )
            ):  # ended by the adapter, or about to be (its lease ran out): its CPUs come back.
                # Not COMPLETING ones: Slurm 22.05 already leaves those out of alloc_cpus (the
                # node reads idle while slurmd tears the job down); a job placed there starts
                # after the teardown, which _await_start waits for.
                room.take(cpus, memory, gres, sign=-1)
        return rooms

    def _size(self, request: PodRequest) -> tuple[JobSize, list[str]]:
        return job_size(request, self.gres_map)

    def _why_not(self, node: MappedNode, room: _NodeRoom | None, request: PodRequest) -> str | None:
        """Why ``node`` can never hold ``request`` (its constraints, Slurm's state, its size), or None."""
        size, unmapped = self._size(request)
        why = allowed(node, request)
        if why is not None:
            return why
        if room is None:
            return "not known to Slurm"
        if any(flag in str(room.info.get("state")).lower() for flag in _DOWN):
            return f"Slurm node {node.slurm} is {room.info.get('state')}"
        if unmapped:
            return unmapped[0]
        if int(room.info.get("cpus") or 0) < size.cpus:
            return "Insufficient cpu"
        if int(room.info.get("real_memory") or 0) < size.memory_mib:
            return "Insufficient memory"
        for ask in size.gres:
            if room.gres_total.get(ask.gres, 0) < ask.count:
                return f"Insufficient {ask.resource}"
        return None

    async def _choose(
        self,
        body: ReservationRequest,
        *,
        placeholders: list[tuple[dict[str, Any], list[JobRecord]]] | None = None,
    ) -> MappedNode | web.Response:
        """``placeholders``: the adapter's jobs as the caller just listed them (listed here if None)."""
        size, _ = self._size(body)
        rooms = await self._view(placeholders=placeholders)
        reasons: dict[str, int] = {}
        candidates: list[tuple[int, MappedNode]] = []
        for node in self.nodes:
            room = rooms.get(node.slurm)
            why = self._why_not(node, room, body)
            if why is not None:
                reasons[why] = reasons.get(why, 0) + 1
                continue
            assert room is not None
            has_room = room.memory_mib >= size.memory_mib and room.lacks(size) is None
            candidates.append((room.cpus if has_room else -1, node))
        if not candidates:
            return problem(
                409,
                ProblemType.UNSCHEDULABLE,
                "no mapped Slurm node can ever hold this pod",
                reason=f"0/{len(self.nodes)} nodes are available: {_counted(reasons)}.",
            )
        fitting = [(free, node) for free, node in candidates if free >= size.cpus]
        if fitting:
            return max(fitting, key=lambda pair: pair[0])[1]
        if self.hold_seconds <= 0:
            # Without queueing a job that does not fit by the count would only be cancelled after
            # start_wait: answer at once (a batch of many such reserves would otherwise take
            # start_wait each).
            for _, node in candidates:
                room = rooms[node.slurm]
                why = "Insufficient cpu" if room.cpus < size.cpus else "Insufficient memory"
                if room.cpus >= size.cpus and room.memory_mib >= size.memory_mib:
                    why = f"Insufficient {room.lacks(size)}"
                reasons[why] = reasons.get(why, 0) + 1
            return problem(
                409,
                ProblemType.UNSCHEDULABLE,
                "no mapped Slurm node has room for this pod now",
                reason=f"0/{len(self.nodes)} nodes are available: {_counted(reasons)}.",
                retryAfterSeconds=self.retry_after,
            )
        return min(candidates, key=lambda pair: rooms[pair[1].slurm].queued)[1]

    def _spec(self, name: str, comment: str, size: JobSize, node: MappedNode, ttl: int) -> dict[str, Any]:
        """A placeholder job (or one hetjob component) of ``size`` on ``node`` alone."""
        job: dict[str, Any] = {
            "name": name[:200],
            "comment": comment,
            "nodelist": node.slurm,
            "cpus_per_task": size.cpus,
            "memory_per_node": size.memory_mib,
            "time_limit": _minutes(ttl + self.hold_seconds),
            "requeue": False,
            "current_working_directory": "/tmp",
            "standard_output": "/dev/null",
            "standard_error": "/dev/null",
            "environment": {"PATH": "/usr/bin:/bin"},
        }
        if size.gres:
            # Per node, and the job has one node: exactly the pod's count ("gres" is sbatch's
            # --gres; slurmctld stores it as tres_per_node "gres:gpu:1").
            job["gres"] = size.gres_spec()
        if self.partition:
            job["partition"] = self.partition
        return job

    async def _submit(self, record: JobRecord, size: JobSize, node: MappedNode) -> int:
        name = f"bindery:{record.namespace}/{record.name}"
        job_id = await self.slurm.submit(
            self._spec(name, record.encode(), size, node, record.ttl), PLACEHOLDER_SCRIPT
        )
        log.info("reserve %s: Slurm job %s on %s (%s)", record.key, job_id, node.slurm, size)
        return job_id

    async def _claim(self, job: dict[str, Any], record: JobRecord, now: float) -> None:
        """The pod's first answer for a running job: its lease starts now."""
        record.claimed = True
        record.expires_at = now + record.ttl
        started = float(job.get("start_time") or now)
        await self._write(job, record, time_limit=_minutes(now - started + record.ttl))

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
                await self._claim(job, record, now)
                status = 201
            elif created:
                status = 201
            answer = reservation_json(
                job, record, self._state_of(job, record, now) or ReservationState.RESERVED
            )
            return web.json_response(
                answer, status=status, headers={"Location": f"/v1/reservations/slurm-{job_id}"}
            )
        reason = (
            f"Slurm job {job_id} on {self._slurm_name(record.node)} is {state}: {job.get('state_reason')}"
        )
        if state == "PENDING":
            if self.hold_seconds <= 0:
                await self._end(job, record, "abandoned")
                reason += "; cancelled (the adapter runs without queueing)"
            else:
                record.hold_until = now + self.hold_seconds
                await self._write(job, record)
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

    async def _lookup(self, reservation: str) -> tuple[dict[str, Any], JobRecord] | None:
        """A claimed reservation by id: a single pod's job, or a group member in its component."""
        parsed = _job_id(reservation)
        if parsed is None:
            return None
        job_id, index = parsed
        if index is None:
            found = await self._record(job_id)
        else:
            found = next(
                (
                    (job, record)
                    for job, record in await self._component_records(job_id)
                    if record.index == index and int(job.get("het_job_id") or job["job_id"]) == job_id
                ),
                None,
            )
        if found is None or not found[1].claimed:
            return None
        return found

    async def _commit(self, request: web.Request) -> web.Response:
        return await self.commit(request.match_info["id"], request.rel_url.query.get("podUid"))

    async def commit(self, reservation_id: str, pod_uid: str | None) -> web.Response:
        """``POST /v1/reservations/{id}/commit[?podUid=]``, as its own call or in a batch."""
        async with self._lock:
            found = await self._lookup(reservation_id)
            if found is None:
                return problem(404, ProblemType.NOT_FOUND, f"no reservation {reservation_id}")
            job, record = found
            if pod_uid is not None and pod_uid != record.pod_uid:
                return _mismatch(reservation_id)
            state = self._state_of(job, record, time.time())
            if state is ReservationState.RESERVED:
                record.committed, record.expires_at = True, None
                await self._write(job, record, time_limit=INFINITE)
                if job.get("het_job_id") and int(job.get("het_job_offset") or 0) != 0:
                    # Component 0's time limit would end the whole hetjob, this member with it.
                    await self.slurm.update_component(int(job["het_job_id"]), 0, {"time_limit": INFINITE})
                state = ReservationState.COMMITTED
            if state is not ReservationState.COMMITTED:
                return _not_active(reservation_id, state)
            return web.json_response(reservation_json(job, record, state))

    async def _release(self, request: web.Request) -> web.Response:
        return await self.release(request.match_info["id"], request.rel_url.query.get("podUid"))

    async def release(self, reservation_id: str, pod_uid: str | None) -> web.Response:
        """``DELETE /v1/reservations/{id}[?podUid=]``, as its own call or in a batch."""
        async with self._lock:
            found = await self._lookup(reservation_id)
            if found is None:
                return web.Response(status=204)
            job, record = found
            state = self._state_of(job, record, time.time())
            if state is ReservationState.REVOKED and pod_uid in (None, record.pod_uid):
                self._acknowledge(placeholder_id(job, record))  # the caller dealt with the pod
            if state is None or not state.active:
                return web.Response(status=204)
            if pod_uid is not None and pod_uid != record.pod_uid:
                return _mismatch(reservation_id)
            await self._end(job, record, "released")
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
            found = await self._lookup(request.match_info["id"])
            if found is None:
                return problem(404, ProblemType.NOT_FOUND, f"no reservation {request.match_info['id']}")
            job, record = found
            if body.pod_uid != record.pod_uid:
                return _mismatch(request.match_info["id"])
            now = time.time()
            state = self._state_of(job, record, now)
            if state is ReservationState.RESERVED:
                record.expires_at = now + body.ttl_seconds
                started = float(job.get("start_time") or now)
                await self._write(job, record, time_limit=_minutes(now - started + body.ttl_seconds))
            elif state is not ReservationState.COMMITTED:
                return _not_active(request.match_info["id"], state)
            return web.json_response(reservation_json(job, record, state))

    async def _get(self, request: web.Request) -> web.Response:
        found = await self._lookup(request.match_info["id"])
        if found is None:
            return problem(404, ProblemType.NOT_FOUND, f"no reservation {request.match_info['id']}")
        job, record = found
        state = self._state_of(job, record, time.time())
        assert state is not None  # _lookup returns claimed records only
        return web.json_response(reservation_json(job, record, state))

    async def _list(self, request: web.Request) -> web.Response:
        checked = serving.list_query(request.rel_url.query, cluster_ids=True)
        if isinstance(checked, web.Response):
            return checked
        query = checked.filters
        limit = checked.limit
        wanted_state = checked.state
        if wanted_state is not None and wanted_state not in {s.value for s in ReservationState}:
            return problem(400, ProblemType.INVALID_REQUEST, f"unknown state {wanted_state!r}")
        after = 0
        if checked.cursor is not None:
            if not checked.cursor.isdigit() or len(checked.cursor) > 16:
                return problem(400, ProblemType.INVALID_REQUEST, "cursor is not one this server issued")
            after = int(checked.cursor)
        now = time.time()
        items: list[tuple[int, dict[str, Any]]] = []
        for job, record in await self._records():
            state = self._state_of(job, record, now)
            # Ordered by job, then member (a group's component holds several): job * 10^4 + index.
            job_id = int(job["job_id"]) * 10_000 + record.index
            if state is None or job_id <= after:
                continue
            if query.get("schedulerName") not in (None, record.scheduler):
                continue
            if query.get("groupId") not in (None, record.group):
                continue
            if query.get("clusterId") not in (None, record.cluster):
                continue
            if query.get("podUid") not in (None, record.pod_uid) or wanted_state not in (
                None,
                visible(state).value,
            ):
                continue
            items.append((job_id, reservation_json(job, record, state)))
        items.sort(key=lambda pair: pair[0])
        page: dict[str, Any] = {"items": [item for _, item in items[:limit]]}
        if len(items) > limit:
            page["nextCursor"] = str(items[limit - 1][0])
        return web.json_response(page)

    async def _info(self, _: web.Request) -> web.Response:
        """``GET /v1/info`` (contract v1.2): only what this adapter does: ``cluster-id`` (the cluster
        rides in the job's comment record), not ``node-preferences``, ``toleration-comparisons`` or
        ``preemption``, whose fields Bindery then never sends it."""
        features = sorted(
            f.value for f in (Feature.RENEW, Feature.RESERVATION_GROUPS, Feature.BATCH, Feature.CLUSTER_ID)
        )
        return web.json_response(
            {"contractVersion": CONTRACT_VERSION, "features": sorted([*features, Feature.REVOCATION.value])}
        )

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        try:
            await self.slurm.nodes()
        except SlurmError as error:
            return problem(503, ProblemType.UNAVAILABLE, f"slurmrestd is not answering: {error}")
        return web.json_response({"status": "ready"})

    # -- reservation groups (contract v1.1) ---------------------------------------------------------

    async def _members(self, group_id: str) -> list[tuple[dict[str, Any], JobRecord]]:
        """The claimed members of a group slurmctld still knows (it forgets ended jobs after MinJobAge)."""
        return [
            (job, record)
            for job, record in await self._records()
            if record.group == group_id and record.claimed
        ]

    async def _reserve_group(self, request: web.Request) -> web.Response:
        body = await _json_body(
            request, ReservationGroupRequest, limit=MAX_GROUP_BODY_BYTES, what="a group's"
        )
        if isinstance(body, web.Response):
            return body
        who = f"group {body.group.namespace}/{body.group.name}"
        now = time.time()
        async with self._lock:
            mine = [
                (job, record)
                for job, record in await self._records()
                if record.group_key == body.idempotency_key and record.ended is None
            ]
            active = [
                pair
                for pair in mine
                if (self._state_of(pair[0], pair[1], now) or ReservationState.EXPIRED).active
            ]
            if active:
                group_id = str(active[0][1].group)
                if active[0][1].fingerprint != fingerprint(body):
                    return problem(
                        409,
                        ProblemType.IDEMPOTENCY_KEY_REUSED,
                        f"idempotency key {body.idempotency_key!r} already belongs to reservation group "
                        f"{group_id} for a different request; release that group first or use a new key",
                        groupId=group_id,
                    )
                replayed = await self._members(group_id)
                return web.json_response(group_json(group_id, replayed, now, self._acknowledged))
            queued = [
                (job, record)
                for job, record in mine
                if not record.claimed and job.get("job_state") in ("PENDING", "RUNNING", "CONFIGURING")
            ]
            if queued and not queued[0][0].get("het_job_id"):  # a job per member, being started
                return problem(
                    409,
                    ProblemType.UNSCHEDULABLE,
                    f"{who} is being placed by an earlier call with the same key",
                    reason=f"{who}: an earlier call with key {body.idempotency_key!r} is still waiting for "
                    "Slurm to start its jobs",
                    retryAfterSeconds=1,
                )
            if queued:  # the group's hetjob, waiting in Slurm's queue: keyed by the idempotency key
                job, record = queued[0]
                if record.fingerprint != fingerprint(body):
                    return problem(
                        409,
                        ProblemType.IDEMPOTENCY_KEY_REUSED,
                        f"idempotency key {body.idempotency_key!r} already holds Slurm job "
                        f"{job['het_job_id']} for a different group; use a new key for a new request",
                    )
                leader: int | list[tuple[int, JobRecord]] = int(job["het_job_id"])
            else:
                submitted = await self._submit_group(body, who, now)
                if isinstance(submitted, web.Response):
                    return submitted
                leader = submitted
        if isinstance(leader, list):  # a job per member (members share a node)
            return await self._start_members(leader, who)
        await self._await_start([leader])  # Slurm starts every component at once, or none
        async with self._lock:
            return await self._settle_group(leader, who)

    async def _start_members(self, submitted: list[tuple[int, JobRecord]], who: str) -> web.Response:
        """A group submitted as a job per member: all started within the wait, or all cancelled."""
        await self._await_start([job_id for job_id, _ in submitted])
        async with self._lock:
            now = time.time()
            members: list[tuple[dict[str, Any], JobRecord]] = []
            for job_id, record in submitted:
                found = await self._record(job_id)
                if found is None or found[0].get("job_state") != "RUNNING":
                    state = found[0].get("job_state") if found else "gone"
                    why = found[0].get("state_reason") if found else "unknown to slurmctld"
                    refusal = (
                        f"{who} needs {len(submitted)} pods started together; Slurm did not start member "
                        f"{record.namespace}/{record.name} within {self.start_wait:g} s (Slurm job {job_id} "
                        f"is {state}: {why}), so every job of the group was cancelled"
                    )
                    for other_id, _ in submitted:
                        with contextlib.suppress(SlurmError):
                            await self.slurm.cancel(other_id)
                    log.info("%s", refusal)
                    return problem(
                        409,
                        ProblemType.UNSCHEDULABLE,
                        refusal,
                        reason=refusal,
                        retryAfterSeconds=self.retry_after,
                    )
                members.append(found)
            for job, record in members:
                await self._claim(job, record, now)
            group_id = str(members[0][1].group)
            log.info("reserved %s as %s, a job per member", who, group_id)
            return web.json_response(
                group_json(group_id, members, now, self._acknowledged),
                status=201,
                headers={"Location": f"/v1/reservation-groups/{group_id}"},
            )

    async def _submit_group(
        self, body: ReservationGroupRequest, who: str, now: float
    ) -> int | list[tuple[int, JobRecord]] | web.Response:
        """Place the group by the adapter's count and submit it: as ONE heterogeneous job, a
        component per member, when its members are on distinct nodes (the leader's id); as a job
        per member when some share a node (their ids), which Slurm 22.05 cannot hold in one hetjob;
        or the refusal."""
        rooms = await self._view()
        placed = self._place_group(body, rooms)
        if isinstance(placed, str):
            # No room now. Queueing: a group that fits the nodes' capacity, a member per node,
            # waits in Slurm's queue as one hetjob, as a single pod does. Otherwise refused at once.
            queued = self._place_group(body, _capacity(rooms)) if self.hold_seconds > 0 else placed
            if isinstance(queued, str) or len({node.name for node in queued[0]}) < len(queued[0]):
                return problem(
                    409, ProblemType.UNSCHEDULABLE, placed, reason=placed, retryAfterSeconds=self.retry_after
                )
            placed = queued
        nodes, topology = placed
        group_id = f"slurm-group-{uuid.uuid4().hex[:16]}"
        group_fingerprint = fingerprint(body)
        by_node: dict[str, list[int]] = {}
        records = []
        for index, (member, node) in enumerate(zip(body.members, nodes, strict=True)):
            by_node.setdefault(node.slurm, []).append(index)
            records.append(
                JobRecord(
                    key=body.idempotency_key,
                    pod_uid=member.pod.uid,
                    scheduler=member.pod.scheduler_name,
                    namespace=member.pod.namespace,
                    name=member.pod.name,
                    node=node.name,
                    fingerprint=group_fingerprint,
                    resources=member.canonical_resources(),
                    ttl=body.ttl_seconds,
                    created=now,
                    hold_until=self._unclaimed_hold(now),
                    group=group_id,
                    group_key=body.idempotency_key,
                    index=index,
                    topology=topology,
                    cluster=body.cluster_id,
                )
            )
        if len(by_node) < len(records):
            submitted: list[tuple[int, JobRecord]] = []
            try:
                for record, member, node in zip(records, body.members, nodes, strict=True):
                    record.hold_until = now + self.start_wait + self.teardown_wait + 30
                    submitted.append((await self._submit(record, self._size(member)[0], node), record))
            except SlurmError as error:
                made = [job_id for job_id, _ in submitted]
                for job_id in made if error.job_id is None else [*made, error.job_id]:
                    with contextlib.suppress(SlurmError):
                        await self.slurm.cancel(job_id)
                if isinstance(error, SlurmUnreachable):
                    raise
                reason = f"{who}: Slurm refused the job of member {len(submitted)}: {error}"
                return problem(
                    409, ProblemType.UNSCHEDULABLE, reason, reason=reason, retryAfterSeconds=self.retry_after
                )
            return submitted
        specs = []
        for slurm_name, indices in by_node.items():
            sizes = [self._size(body.members[i])[0] for i in indices]
            gres: dict[str, GresAsk] = {}
            for ask in (ask for size in sizes for ask in size.gres):
                held = gres.get(ask.gres)
                gres[ask.gres] = dataclasses.replace(ask, count=ask.count + (held.count if held else 0))
            size = JobSize(sum(s.cpus for s in sizes), sum(s.memory_mib for s in sizes), tuple(gres.values()))
            try:
                comment = encode_component([records[i] for i in indices])
            except CommentTooLong as error:
                # One member per component here (members sharing a node get a job each), so
                # splitting the group would not help: only shorter names do.
                reason = (
                    f"{who}: {error}, and the adapter keeps each reservation's state there; shorten "
                    "the pod's name, namespace or scheduler name, or the group's idempotency key or "
                    "cluster id"
                )
                return problem(409, ProblemType.UNSCHEDULABLE, reason, reason=reason)
            name = f"bindery:{body.group.namespace}/{body.group.name}"
            specs.append(self._spec(name, comment, size, self.by_slurm[slurm_name], body.ttl_seconds))
        try:
            leader = await self.slurm.submit_het(specs, PLACEHOLDER_SCRIPT)
        except SlurmError as error:
            if error.job_id is not None:  # refused, yet queued: cancel it
                with contextlib.suppress(SlurmError):
                    await self.slurm.cancel(error.job_id)
            if isinstance(error, SlurmUnreachable):
                raise
            reason = f"{who}: Slurm refused the group's job ({len(specs)} components, one per node): {error}"
            return problem(
                409, ProblemType.UNSCHEDULABLE, reason, reason=reason, retryAfterSeconds=self.retry_after
            )
        log.info(
            "reserve group %s: Slurm hetjob %s, a component on each of %s",
            body.idempotency_key, leader, ", ".join(by_node),
        )  # fmt: skip
        return leader

    async def _settle_group(self, leader: int, who: str) -> web.Response:
        """The answer once the wait is over: 201 when Slurm started the hetjob (every component
        runs), else 409 with Slurm's reason, the hetjob kept in Slurm's queue (or cancelled whole
        when the adapter runs without queueing)."""
        components = await self.slurm.het_job(leader)
        pairs = [(job, record) for job in components for record in self._decode(job)]
        if not pairs:
            why = f"Slurm job {leader} of {who} is gone"
            return problem(
                409, ProblemType.UNSCHEDULABLE, why, reason=why, retryAfterSeconds=self.retry_after
            )
        group_id = str(pairs[0][1].group)
        now = time.time()
        states = [str(job.get("job_state")) for job in components]
        if all(record.claimed for _, record in pairs):  # a concurrent call with the same key claimed it
            return web.json_response(group_json(group_id, pairs, now, self._acknowledged))
        if all(state == "RUNNING" for state in states):
            for job in components:
                records = self._decode(job)
                for record in records:
                    record.claimed, record.expires_at = True, now + record.ttl
                started = float(job.get("start_time") or now)
                comment = encode_component(records)
                await self.slurm.update_component(
                    leader,
                    int(job.get("het_job_offset") or 0),
                    {"comment": comment, "time_limit": _minutes(now - started + records[0].ttl)},
                )
                job["comment"] = comment
            pairs = [(job, record) for job in components for record in self._decode(job)]
            log.info("reserved %s as %s: Slurm hetjob %s on %s", who, group_id, leader,
                     ", ".join(str(job.get("nodes")) for job in components))  # fmt: skip
            return web.json_response(
                group_json(group_id, pairs, now, self._acknowledged),
                status=201,
                headers={"Location": f"/v1/reservation-groups/{group_id}"},
            )
        where = ", ".join(self._slurm_name(self._decode(job)[0].node) for job in components)
        reason = (
            f"{who} needs {len(pairs)} pods started together; Slurm job {leader} (one component on each "
            f"of {where}) is {states[0]}: {components[0].get('state_reason')}"
        )
        if self.hold_seconds > 0 and states[0] in ("PENDING", "CONFIGURING"):
            for job in components:
                records = self._decode(job)
                for record in records:
                    record.hold_until = now + self.hold_seconds
                comment = encode_component(records)
                await self.slurm.update_component(
                    leader, int(job.get("het_job_offset") or 0), {"comment": comment}
                )
            reason += "; the group keeps its place in Slurm's queue while Bindery asks again"
        else:
            await self.slurm.cancel(leader)  # whole: nothing of the group runs
            reason += "; its job was cancelled whole, nothing of the group runs"
        log.info("%s", reason)
        return problem(
            409, ProblemType.UNSCHEDULABLE, reason, reason=reason, retryAfterSeconds=self.retry_after
        )

    def _place_group(
        self, body: ReservationGroupRequest, rooms: dict[str, _NodeRoom]
    ) -> tuple[list[MappedNode], dict[str, str]] | str:
        """A node for every member, by the adapter's count of free capacity, within one value of each
        topology key; or why the group does not fit (the member that did not, and why)."""
        who = f"group {body.group.namespace}/{body.group.name}"
        keys = [constraint.key for constraint in body.topology]
        domains: dict[tuple[str, ...], list[MappedNode]] = {}
        unlabelled = 0
        for node in self.nodes:
            if all(key in node.labels for key in keys):
                domains.setdefault(tuple(node.labels[key] for key in keys), []).append(node)
            else:
                unlabelled += 1
        if not domains:
            return f"{who} asks for one value of {', '.join(keys)}; no mapped node has that label"
        best: tuple[int, str] = (-1, "")
        # The domain with the most free CPUs first: the likeliest to hold the whole group.
        for value, nodes in sorted(
            domains.items(),
            key=lambda item: -sum(max(rooms[n.slurm].cpus, 0) for n in item[1] if n.slurm in rooms),
        ):
            free = {
                n.slurm: dataclasses.replace(rooms[n.slurm], gres=dict(rooms[n.slurm].gres))
                for n in nodes
                if n.slurm in rooms
            }
            chosen: list[MappedNode] = []
            for member in body.members:
                size, _ = self._size(member)
                reasons: dict[str, int] = {}
                fitting: list[MappedNode] = []
                for node in nodes:
                    why = self._why_not(node, rooms.get(node.slurm), member)
                    if why is None and (free[node.slurm].cpus < size.cpus):
                        why = "Insufficient cpu"
                    elif why is None and free[node.slurm].memory_mib < size.memory_mib:
                        why = "Insufficient memory"
                    elif why is None and free[node.slurm].lacks(size) is not None:
                        why = f"Insufficient {free[node.slurm].lacks(size)}"
                    if why is None:
                        fitting.append(node)
                    else:
                        reasons[why] = reasons.get(why, 0) + 1
                if not fitting:
                    if len(chosen) > best[0]:
                        where = (
                            f" on {', '.join(f'{k}={v}' for k, v in zip(keys, value, strict=True))}"
                            if keys
                            else ""
                        )
                        best = (
                            len(chosen),
                            f"for member {member.pod.namespace}/{member.pod.name}{where}: "
                            f"0/{len(nodes)} nodes are available: {_counted(reasons)}.",
                        )
                    break
                node = max(fitting, key=lambda n: free[n.slurm].cpus)
                free[node.slurm].take(size.cpus, size.memory_mib, size.gres_counts(), sign=1)
                chosen.append(node)
            else:
                return chosen, dict(zip(keys, value, strict=True))
        within = f" on nodes sharing one value of {', '.join(keys)}" if keys else " together"
        tried = f"; {len(domains)} values tried" if keys else ""
        lacking = f" {unlabelled} node(s) lack the label and take no member." if keys and unlabelled else ""
        return (
            f"{who} needs {len(body.members)} pods reserved{within}; the RM could place only {best[0]} of "
            f"them{tried}, {best[1]}{lacking}"
        )

    async def _get_group(self, request: web.Request) -> web.Response:
        group_id = request.match_info["id"]
        members = await self._members(group_id)
        if not members:
            return problem(404, ProblemType.NOT_FOUND, f"no reservation group {group_id}")
        return web.json_response(group_json(group_id, members, time.time(), self._acknowledged))

    async def _release_group(self, request: web.Request) -> web.Response:
        group_id = request.match_info["id"]
        async with self._lock:
            members = await self._members(group_id)
            if not members:
                return problem(404, ProblemType.NOT_FOUND, f"no reservation group {group_id}")
            now = time.time()
            for job, record in members:
                if self._state_of(job, record, now) is ReservationState.RESERVED:  # committed ones stay
                    await self._end(job, record, "released")
            return web.Response(status=204)

    async def _renew_group(self, request: web.Request) -> web.Response:
        body = await _json_body(request, GroupRenewRequest)
        if isinstance(body, web.Response):
            return body
        group_id = request.match_info["id"]
        async with self._lock:
            members = await self._members(group_id)
            if not members:
                return problem(404, ProblemType.NOT_FOUND, f"no reservation group {group_id}")
            now = time.time()
            states = [self._state_of(job, record, now) for job, record in members]
            if not any(state is not None and state.active for state in states):
                return problem(
                    409,
                    ProblemType.RESERVATION_NOT_ACTIVE,
                    f"reservation group {group_id} has no active member (all released or expired); "
                    "reserve the group again",
                )
            for (job, record), state in zip(members, states, strict=True):
                if state is ReservationState.RESERVED:
                    record.expires_at = now + body.ttl_seconds
                    started = float(job.get("start_time") or now)
                    await self._write(job, record, time_limit=_minutes(now - started + body.ttl_seconds))
            return web.json_response(group_json(group_id, members, now, self._acknowledged))

    # -- batches (contract v1.1) --------------------------------------------------------------------

    async def _batch(self, request: web.Request) -> web.Response:
        """``POST /v1/batch``: each operation carried out in order by the code of its single call."""
        if request.content_type != "application/json":
            return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        operations = serving.batch_operations(await request.read())
        if isinstance(operations, web.Response):
            return operations
        results = []
        for index, item in enumerate(operations):
            try:
                operation = BatchOperation.model_validate(item)
            except pydantic.ValidationError as error:
                results.append(_result(_invalid(error, at=("operations", index))))
                continue
            if operation.reserve is not None:
                answer = await self.reserve(operation.reserve)
            elif operation.commit is not None:
                answer = await self.commit(operation.commit.reservation_id, operation.commit.pod_uid)
            else:
                assert operation.release is not None
                answer = await self.release(operation.release.reservation_id, operation.release.pod_uid)
            results.append(_result(answer))
        return web.json_response({"results": results})

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
            abandoned: set[int] = set()
            for job, record in await self._records():
                if record.ended is not None or job.get("job_state") not in ("PENDING", "RUNNING"):
                    continue
                job_id = int(job["job_id"])
                if not record.claimed and record.hold_until < now:
                    if record.group is None:
                        log.info("Slurm job %s: nobody asked for it since its hold; cancelling", job_id)
                        await self._end(job, record, "abandoned")
                    elif int(job.get("het_job_id") or job_id) not in abandoned:
                        # A group's hetjob is claimed whole: cancelled whole (Slurm cancels a pending
                        # one only whole anyway).
                        leader = int(job.get("het_job_id") or job_id)
                        abandoned.add(leader)
                        log.info(
                            "Slurm job %s: nobody asked for its group since its hold; cancelling", leader
                        )
                        await self.slurm.cancel(leader)
                elif self._state_of(job, record, now) is ReservationState.EXPIRED:
                    log.info("%s: the reservation's lease ran out; cancelling", placeholder_id(job, record))
                    await self._end(job, record, "expired")


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
        f"reservation {reservation_id} is {visible(state).value if state else 'gone'}; reserve again",
    )


@dataclasses.dataclass
class _NodeRoom:
    """One Slurm node as the adapter counts it: what slurmrestd says, and what is free."""

    info: dict[str, Any]
    cpus: int
    memory_mib: int
    queued: int = 0  # the adapter's own placeholders pending there
    gres: dict[str, int] = dataclasses.field(default_factory=dict)  # free, by GRES name
    gres_total: dict[str, int] = dataclasses.field(default_factory=dict)  # configured

    def take(self, cpus: int, memory_mib: int, gres: Mapping[str, int], *, sign: int) -> None:
        """Count a job's share as used (``sign=1``) or as coming back (``sign=-1``)."""
        self.cpus -= sign * cpus
        self.memory_mib -= sign * memory_mib
        for name, count in gres.items():
            self.gres[name] = self.gres.get(name, 0) - sign * count

    def lacks(self, size: JobSize) -> str | None:
        """The first Kubernetes resource whose GRES is not free enough here now, or None."""
        return next((a.resource for a in size.gres if self.gres.get(a.gres, 0) < a.count), None)


def _kept(job: dict[str, Any], kept_leaders: set[int]) -> bool:
    """Whether ``job`` is a component 0 Slurm keeps for the rest of its hetjob (see _kept_leaders)."""
    return int(job.get("het_job_offset") or 0) == 0 and int(job.get("het_job_id") or 0) in kept_leaders


def _capacity(rooms: Mapping[str, _NodeRoom]) -> dict[str, _NodeRoom]:
    """The rooms as if every node were empty: where a group could ever run."""
    return {
        name: _NodeRoom(
            info=room.info,
            cpus=int(room.info.get("cpus") or 0),
            memory_mib=int(room.info.get("real_memory") or 0),
            gres=dict(room.gres_total),
            gres_total=room.gres_total,
        )
        for name, room in rooms.items()
    }


def _job_memory(job: dict[str, Any]) -> int:
    """The MiB a job asked for per node (slurmrestd v0.0.38 gives a plain number)."""
    value = job.get("memory_per_node")
    return value if isinstance(value, int) else 0


def _counted(reasons: dict[str, int]) -> str:
    return ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))


_Body = TypeVar("_Body", bound=pydantic.BaseModel)


async def _json_body(
    request: web.Request, model: type[_Body], *, limit: int | None = None, what: str = "a request's"
) -> _Body | web.Response:
    """The request's JSON body as `model`, or the problem to answer (415, 413 past `limit`, 400)."""
    if request.content_type != "application/json":
        return problem(415, ProblemType.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
    raw = await request.read()
    if limit is not None and len(raw) > limit:
        return problem(413, ProblemType.PAYLOAD_TOO_LARGE, f"{what} body is at most {limit} bytes")
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as error:
        return _invalid(error)


def _invalid(error: pydantic.ValidationError, *, at: tuple[str | int, ...] = ()) -> web.Response:
    """The 400 of a body (or a batch's operation at ``at``) that failed validation."""
    detail, errors = serving.validation_errors(error, at=at)
    return problem(400, ProblemType.INVALID_REQUEST, detail, errors=errors)


def _result(response: web.Response) -> dict[str, Any]:
    """A single call's answer as one result of a batch: its status and its body."""
    if response.status == 204 or not response.text:
        return {"status": response.status}
    body = json.loads(response.text)
    return {"status": response.status, ("problem" if response.status >= 400 else "reservation"): body}
