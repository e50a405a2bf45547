"""Level-triggered reconciliation: a ResourceManager's active reservations agree with the pods.

Watches are edge-triggered and edges get lost: a pod deleted while the watch of bound pods was down
(an apiserver restart, a 410, a timeout), a reserve whose answer never came back, an operator that
crashed between reserve and commit, a scheduler name moved from one ResourceManager to another
(the new owner's watch releases at the new RM, the old RM keeps the allocation). Each loss leaks
capacity, and a committed reservation never expires, so it leaks for good. So every
ResourceManager gets a :class:`Reconciler` whose pass compares the RM's active reservations with
the pods as they are now, and acts on the difference. The per-RM supervisor runs a pass at start,
on gaining leadership, after every relist of the watch of pods on nodes (the one that feeds the
releases, :mod:`bindery.controller.watches.placed`) and periodically
(``spec.reconcileIntervalSeconds``, default 30 s; well inside the reservation lease, so a reserved
reservation whose pod got bound is committed long before it could expire).

What a pass decides for each active reservation (:func:`reconcile_action`, from :func:`pod_fate`):

- its pod is gone, was replaced under its name (another UID), is bound to another node, or has
  finished → **release** (with the reservation's pod UID, contract v1.1); the pod's reservation
  annotation is never a reason (tenants may edit it, see :func:`pod_fate`);
- it is ``reserved`` and its pod (same UID) is bound to its node and running → **commit** (the
  Binding landed, the commit was lost);
- its pod is still pending → **left alone**: the pod's next cycle reserves with the same
  idempotency key and gets it back, and a Binding still in flight (another leader's, or this
  process's own) may yet land on it; a reservation whose pod never binds expires after its TTL;
- ``committed`` to its running pod → nothing to do;
- one of several active reservations for the same running pod on its node → all but one are
  **released** (:func:`surplus`: the committed one is kept, else the oldest).

And for the other direction: a bound, running pod of a served scheduler name without any active
reservation has resources the RM does not account for, and may hand out again. When Bindery bound
it (the RM lost the reservation: a crash that lost acknowledged writes, a restore from a backup),
the pass reserves and commits again for it on its node (:mod:`bindery.controller.reservations.restore`). A pod
Bindery did not bind, or whose restore the RM refuses, gets one Warning event ``ReservationMissing``
(once per pod UID, remembered bounded) and is counted; a refused restore is asked for again after
a backoff per pod (``RESTORE_BACKOFF``: 30 s doubling to 10 minutes), not by every pass: a thousand
refused pods would otherwise be a thousand reserves per pass.

Which reservations: those of every scheduler name this RM serves now or served earlier in this
process (a name moved to another RM). Reservations of other names are left alone, even names
another ResourceManager of this operator serves: an external RM may serve other clusters, whose
pods this operator cannot see and must not judge gone, and another cluster may use the same name
with this RM. (So a name moved away while no operator ran leaves its old RM's allocations to that
RM: they are released only if the name comes back.) A namespaced operator touches only reservations
of pods in its namespaces.

With a cluster id (contract v1.2) the RM lists only this cluster's reservations, so those made
before the upgrade (no cluster id: a v1.1 operator, or an old replica during a rolling upgrade) are
listed separately and matched strictly by pod UID (:func:`unscoped_action`): a pod of that UID here
settles its reservation as above (a Binding that landed during the upgrade gets its commit); a UID
not found here is left alone, because another cluster sharing the RM and the name may own it,
unless an earlier pass of this process found it here (its pod is gone: release). What this cannot
settle (a pod gone before any pass of this process saw it) is left to the watch of bound pods, the
lease of a reserved one, and `bindery audit`, which checks unscoped reservations too.

A pass fails closed on the contract. Until the RM's contract is settled (a 200 answer to
``GET /v1/info``, or a v1.1 verdict confirmed by a second answer; see
:meth:`bindery.rm.client.ResourceManagerClient.negotiated`), a list may show every cluster's
reservations, so the pass lists nothing and decides nothing: it raises :class:`ContractUnknown`,
is counted (``bindery_reconcile_passes_total{outcome="contract_unknown"}``) and retried with the
supervisor's backoff. And whatever a list holds, a reservation whose ``clusterId`` is set and is
not this cluster's is never committed, released or acknowledged (:func:`foreign`): an RM that
ignores the filter, or a list sent unscoped, cannot make a pass settle another cluster's.

Cost of a pass: one list of bound pods per scheduler name (and namespace), two reservation lists
per name at the RM (four with a cluster id: the unscoped ones are read from every cluster's), and
one pod GET per reservation whose pod is not in those lists (pending pods, departed pods); per
bound pod without an active reservation, a pod GET and a reservation list by UID, and for one
Bindery bound, a reserve and a commit (a refused restore repeats them once its backoff is over).
Pure decisions live in functions; the class only reads and acts.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from bindery.adapters.events import KubeEventSink
from bindery.adapters.reads import read_pod
from bindery.apiserver import ApiClient
from bindery.backoff import BackoffPolicy
from bindery.controller.metrics import Metrics
from bindery.controller.reservations.boundpods import list_bound_pods
from bindery.controller.reservations.fate import TERMINAL_PHASES, Settle, pod_fate
from bindery.controller.reservations.restore import Restorer
from bindery.controller.reservations.revocation import RevocationReport, Revocations
from bindery.rm.errors import RMError
from bindery.rm.models import Reservation, ReservationRequest, ReservationState
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.revocation import OnRevoked
from bindery.typedefs import Logger

#: Pods warned about a missing reservation (so each gets one event), and unscoped reservations whose
#: pod was seen here: each remembered up to this many, oldest forgotten first.
REMEMBERED = 10_000
#: The events' reportingController: a reconcile pass acts for the ResourceManager, not for one name.
REPORTING_CONTROLLER = "bindery"
MISSING_REASON = "ReservationMissing"
#: Explicit bounds on the apiserver calls of a pass (a list of thousands of pods takes a while).
LIST_TIMEOUT_SECONDS = 60.0
READ_TIMEOUT_SECONDS = 10.0
#: When a refused restore of a pod is asked for again: after 30 s, doubling per refusal, at most 10 min.
RESTORE_BACKOFF = BackoffPolicy(initial=30.0, maximum=600.0)


class ContractUnknown(Exception):
    """The RM's contract is not settled yet: a pass would not know whose reservations it lists."""


def foreign(*, reservation: Reservation, cluster_id: str | None) -> bool:
    """Pure: the reservation names a cluster, and not this one (None: this cluster sends no id, so
    none of its reservations names one). Such a reservation is never settled here, whatever the
    list it came in: its pod is in another cluster, where it may run."""
    return reservation.cluster_id is not None and reservation.cluster_id != cluster_id


def reconcile_action(*, reservation: Reservation, pod: Mapping[str, Any] | None) -> Settle | None:
    """Pure: what a pass does with one active reservation given its pod's body (None: no such pod).

    None means leave it: the pod is pending (its next cycle or a late Binding settles it), or the
    reservation is already committed to its running pod.
    """
    fate = pod_fate(pod_uid=reservation.pod_uid, node=reservation.node, pod=pod)
    if fate is Settle.COMMIT and reservation.state is ReservationState.COMMITTED:
        return None
    return fate


def unscoped_action(
    *, reservation: Reservation, pod: Mapping[str, Any] | None, seen_here: bool
) -> Settle | None:
    """Pure: what a pass does with an active reservation made without a cluster id.

    Such a reservation was made before the upgrade to contract v1.2, by this cluster or by any
    other cluster sharing the RM and the scheduler name. Only the pod UID says whose it is (UIDs
    are random UUIDs, so one found here is this cluster's pod); a namespace/name found here with
    another UID may be another cluster's pod under the same name, and no pod at all may be a pod of
    another cluster. So a pod of that UID here is settled as any reservation would be, and a UID not
    found here is left alone, unless an earlier pass of this process saw it here (`seen_here`):
    then its pod is gone and it is released.
    """
    if pod is None or (pod.get("metadata") or {}).get("uid") != reservation.pod_uid:
        return Settle.RELEASE if seen_here else None
    return reconcile_action(reservation=reservation, pod=pod)


def surplus(
    reservations: Iterable[Reservation], pods: Mapping[str, Mapping[str, Any]]
) -> dict[str, Reservation]:
    """Pure: id → the reservation kept instead, for each surplus reservation of a running pod.

    A pod (same UID) running on its node uses one reservation there. Others for the same UID on
    that node (a retried reserve under another idempotency key, an old replica's, one made before
    the cluster-id upgrade) would each be committed and kept while it runs, holding its resources
    twice or more. The kept one is the one the pod was bound with (its annotation: PostBind is
    about to commit it, and an RM that recognises its pods by the annotation counts the pod as
    foreign once that one is gone), then the committed one (the RM already counts it as in use),
    then the oldest; reservations on other nodes are released anyway (the pod is bound elsewhere).
    The annotation only chooses among the pod's own reservations on its node, so editing it frees
    nothing the pod does not hold twice. `pods` maps pod UID → body, of the pods known to this pass.
    """
    # One reservation may be listed twice (reserved, then committed, when its commit landed between
    # a pass's two lists): it is one reservation, never its own surplus; its committed copy counts.
    unique: dict[str, Reservation] = {}
    for reservation in reservations:
        if reservation.id not in unique or reservation.state is ReservationState.COMMITTED:
            unique[reservation.id] = reservation
    by_uid: dict[str, list[Reservation]] = collections.defaultdict(list)
    for reservation in unique.values():
        pod = pods.get(reservation.pod_uid)
        if (
            pod is None
            or pod_fate(pod_uid=reservation.pod_uid, node=reservation.node, pod=pod) is not Settle.COMMIT
        ):
            continue
        by_uid[reservation.pod_uid].append(reservation)
    found: dict[str, Reservation] = {}
    for uid, same in by_uid.items():
        if len(same) < 2:
            continue
        bound_with = ((pods[uid].get("metadata") or {}).get("annotations") or {}).get(RESERVATION_ANNOTATION)
        ranked = sorted(
            same,
            key=lambda r: (
                r.id != bound_with,
                r.state is not ReservationState.COMMITTED,
                r.created_at is None,
                r.created_at.timestamp() if r.created_at else 0.0,
                r.id,
            ),
        )
        found |= {extra.id: ranked[0] for extra in ranked[1:]}
    return found


def reported_unscheduled(pod: Mapping[str, Any]) -> bool:
    """Pure: the pod's PodScheduled condition is False (a failed cycle reported it)."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


def in_scope(*, reservation: Reservation, namespaces: Collection[str]) -> bool:
    """Pure: whether a namespaced operator (`namespaces` non-empty) may touch this reservation."""
    return not namespaces or reservation.namespace in namespaces


def missing_reservations(
    *, bound_pods: Iterable[Mapping[str, Any]], active_pod_uids: Collection[str], warned: Collection[str]
) -> list[Mapping[str, Any]]:
    """Pure: bound, running, not-deleting pods with no active reservation, not warned about yet."""
    found = []
    for pod in bound_pods:
        metadata = pod.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid or uid in active_pod_uids or uid in warned or metadata.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        found.append(pod)
    return found


def missing_note(*, pod: Mapping[str, Any], resource_manager: str, restore: str | None = None) -> str:
    """Pure: the Warning's text: what is wrong, why it matters, what to do. `restore`: why Bindery
    could not reserve again for a pod it bound (it keeps asking), None for a pod it did not bind."""
    spec = pod.get("spec") or {}
    if restore is not None:
        return (
            f"Pod is bound to node {spec.get('nodeName')} by Bindery, but ResourceManager {resource_manager} "
            "no longer holds its reservation, so the resource manager does not account for its resources "
            f"and may place other pods on them. Bindery asked for them again and could not get them: "
            f"{restore}. It asks again at later reconcile passes (after 30 s, doubling to 10 min); "
            "free room on the node, or check the resource manager's reservations for this pod UID."
        )
    return (
        f"Pod is bound to node {spec.get('nodeName')} with schedulerName {spec.get('schedulerName')}, "
        f"but ResourceManager {resource_manager} holds no active reservation for it, so the resource "
        "manager does not account for its resources and may place other pods on them. If the pod "
        "was bound outside Bindery (spec.nodeName set at creation), give it a schedulerName that "
        "Bindery does not serve; otherwise check the resource manager's reservations for this pod UID."
    )


class ReconcilingRM(Protocol):
    """What a pass needs of the RM client (:class:`bindery.rm.client.ResourceManagerClient`)."""

    async def negotiated(self) -> bool: ...

    async def reserve(self, request: ReservationRequest) -> Reservation: ...

    async def list_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None, pod_uid: str | None = None
    ) -> list[Reservation]: ...

    async def list_unscoped_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None
    ) -> list[Reservation]: ...

    async def list_revoked_reservations(self, *, scheduler_name: str | None = None) -> list[Reservation]: ...

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation: ...

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None: ...


@dataclasses.dataclass(frozen=True)
class ReconcileReport:
    """What one pass did: reservation ids committed, released and failed, pods newly warned about."""

    reason: str
    committed: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # namespace/name of pods warned about in this pass
    restored: tuple[str, ...] = ()  # namespace/name of pods whose lost reservation was made again
    kept: int = 0  # active reservations left alone (pending pod, or committed to its running pod)
    evicted: tuple[str, ...] = ()  # namespace/name of pods evicted because the RM revoked theirs
    revoked: tuple[str, ...] = ()  # revoked reservation ids acted on and acknowledged

    @property
    def actions(self) -> dict[str, Settle]:
        return {rid: Settle.COMMIT for rid in self.committed} | {rid: Settle.RELEASE for rid in self.released}


@dataclasses.dataclass
class _Outcome:
    """What a pass has done so far (the mutable side of ReconcileReport)."""

    committed: list[str] = dataclasses.field(default_factory=list)
    released: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    kept: int = 0


class Reconciler:
    """The reconcile passes of one ResourceManager; :meth:`run_once` is safe to call concurrently.

    `rm` and `scheduler_names` are read at every pass, so a rotated client or an edited spec is
    used by the next pass. `warn_missing` turns the ReservationMissing events off (a one-shot
    pass with nobody to remember whom it warned). `cluster_id` is the id this cluster sends (see
    :func:`foreign`).
    """

    def __init__(
        self,
        *,
        resource_manager: str,
        rm: Callable[[], ReconcilingRM],
        api: ApiClient,
        scheduler_names: Callable[[], Collection[str]],
        logger: Logger,
        namespaces: tuple[str, ...] = (),
        metrics: Metrics | None = None,
        on_released: Callable[[], None] = lambda: None,
        on_reported_unbound: Callable[[Reservation, Mapping[str, Any]], Awaitable[None]] | None = None,
        warn_missing: bool = True,
        hostname: str | None = None,
        events: KubeEventSink | None = None,
        on_revoked: Callable[[], OnRevoked] = lambda: OnRevoked.EVICT,
        cluster_id: str | None = None,
        restore_backoff: BackoffPolicy = RESTORE_BACKOFF,
    ) -> None:
        self.resource_manager = resource_manager
        self._restore_backoff = restore_backoff
        #: pod UID → (refusals in a row, loop time before which its restore is not asked for again)
        self._restore_due: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()
        self.cluster_id = cluster_id
        self.passes = 0  # finished passes (successful or not): tests wait on it
        self._rm = rm
        self._api = api
        self._events = events or KubeEventSink(api=api, hostname=hostname)
        self._scheduler_names = scheduler_names
        self._logger = logger
        self._namespaces = namespaces
        self._metrics = metrics or Metrics()
        self._on_released = on_released
        self._on_reported_unbound = on_reported_unbound
        self._warn_missing = warn_missing
        self._served_before: set[str] = set()
        self._warned: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: ids of unscoped reservations whose pod an earlier pass found here (see unscoped_action)
        self._seen_here: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = asyncio.Lock()
        #: UIDs of pods Bindery bound whose lost reservation the RM refused to restore, warned about
        #: once; unlike `_warned`, their restore is asked for again (see `_restore_due`).
        self._unrestored: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._restorer = Restorer(
            resource_manager=resource_manager,
            logger=logger,
            events=self._events,
            metrics=self._metrics,
        )
        self._revocations = Revocations(
            resource_manager=resource_manager,
            api=api,
            logger=logger,
            policy=on_revoked,
            events=self._events,
            metrics=self._metrics,
        )

    async def run_once(self, *, reason: str) -> ReconcileReport:
        """One pass; `reason` (start, leadership, relist, periodic, ...) is logged with it.

        Raises what reading the RM or the apiserver raised (RMError, or bindery.apiserver.ApiError, which
        covers transport errors): the pass then stopped before acting on anything it could not see
        whole. A failed commit or release of one reservation does not stop the pass; it is logged,
        counted and listed in the report.
        """
        async with self._lock:
            try:
                report = await self._pass(reason)
            except ContractUnknown as exc:
                self._metrics.reconcile_pass(
                    resource_manager=self.resource_manager, outcome="contract_unknown"
                )
                self._logger.warning(
                    f"reconcile pass of ResourceManager {self.resource_manager!r} ({reason}) skipped: {exc}"
                )
                raise
            except Exception as exc:
                self._metrics.reconcile_pass(resource_manager=self.resource_manager, outcome="error")
                self._logger.warning(
                    f"reconcile pass of ResourceManager {self.resource_manager!r} ({reason}) failed: {exc}; "
                    "the next pass retries"
                )
                raise
            finally:
                self.passes += 1
        self._metrics.reconcile_pass(resource_manager=self.resource_manager, outcome="ok")
        if (
            report.committed
            or report.released
            or report.failed
            or report.missing
            or report.revoked
            or report.restored
        ):
            self._logger.info(
                f"reconcile pass of ResourceManager {self.resource_manager!r} ({reason}): "
                f"{len(report.committed)} committed, {len(report.released)} released, "
                f"{len(report.failed)} failed, {len(report.missing)} pods without a reservation, "
                f"{len(report.restored)} restored, "
                f"{len(report.revoked)} revoked ({len(report.evicted)} pods evicted), "
                f"{report.kept} left alone"
            )
        return report

    async def _pass(self, reason: str) -> ReconcileReport:
        rm = self._rm()
        if not await rm.negotiated():
            raise ContractUnknown(
                "the RM's contract is not settled yet (its GET /v1/info answered no such path once, and "
                "no answer since confirmed it), so its lists may hold every cluster's reservations and "
                "nothing is released or committed from them; the pass is retried with backoff"
            )
        served = frozenset(self._scheduler_names())
        self._served_before |= served
        # Bound pods of the served names first, reservations after: a pod in this list was bound
        # before the reservations were read, so its reservation (made before its Binding) is listed.
        served_pods = await self._bound_pods(served)
        names = served | self._served_before
        # Listed reserved, then committed: a commit landing in between lists one reservation twice.
        # Keyed by id, the later (committed) copy wins, so each reservation is settled once.
        reservations = list(
            {
                reservation.id: reservation
                for name in sorted(names)
                for state in (ReservationState.RESERVED, ReservationState.COMMITTED)
                for reservation in await rm.list_reservations(scheduler_name=name, state=state.value)
                if in_scope(reservation=reservation, namespaces=self._namespaces)
            }.values()
        )
        reservations = self._ours(reservations, reason=reason)
        listed = {reservation.id for reservation in reservations}
        unscoped = list(
            {
                reservation.id: reservation
                for name in sorted(names)
                for state in (ReservationState.RESERVED, ReservationState.COMMITTED)
                for reservation in await rm.list_unscoped_reservations(scheduler_name=name, state=state.value)
                if in_scope(reservation=reservation, namespaces=self._namespaces)
                and reservation.id not in listed
            }.values()
        )
        unscoped = self._ours(unscoped, reason=reason)
        pods = dict(served_pods)
        pods |= await self._bound_pods(
            frozenset(r.scheduler_name for r in (*reservations, *unscoped)) - served
        )

        extra = surplus((*reservations, *unscoped), pods)
        done = _Outcome()
        for reservation in reservations:
            pod = pods.get(reservation.pod_uid)
            if pod is None and not (reservation.namespace and reservation.name):
                done.kept += 1  # the RM did not name the pod: unknown is not gone (a reserved one expires)
                continue
            if pod is None:
                pod = await self._read(reservation)  # pending or departed
            action = reconcile_action(reservation=reservation, pod=pod)
            await self._settle(rm, reservation, action, pod, reason=reason, done=done, extra=extra)
        for reservation in unscoped:
            pod = pods.get(reservation.pod_uid)
            if pod is None and reservation.namespace and reservation.name:
                pod = await self._read(reservation)
            if pod is not None and (pod.get("metadata") or {}).get("uid") == reservation.pod_uid:
                self._remember(self._seen_here, reservation.id)
            action = unscoped_action(
                reservation=reservation, pod=pod, seen_here=reservation.id in self._seen_here
            )
            await self._settle(rm, reservation, action, pod, reason=reason, done=done, extra=extra)
            if reservation.id in done.released:
                self._seen_here.pop(reservation.id, None)
        if done.released:  # before anything below may raise: these releases stand either way
            self._metrics.release(
                resource_manager=self.resource_manager, reason="reconcile", count=len(done.released)
            )
            self._on_released()
        revoked = await self._revoked(rm, names, pods)
        if revoked.acknowledged and not done.released:
            # A revoked reservation's room went back to the RM when it was revoked; this pass is the
            # first Bindery hears of it, and with onRevoked: Warn no pod leaves to wake the parked.
            self._on_released()
        for uid in revoked.warned:  # told Revoked already: no ReservationMissing on top
            self._remember(self._warned, uid)
        missing, restored = await self._report_missing(
            served_pods=served_pods.values(),
            active_pod_uids={r.pod_uid for r in (*reservations, *unscoped)} | set(revoked.pods),
            rm=rm,
        )
        return ReconcileReport(
            reason=reason,
            committed=tuple(done.committed),
            released=tuple(done.released),
            failed=tuple(done.failed),
            missing=tuple(missing),
            restored=tuple(restored),
            kept=done.kept,
            evicted=revoked.evicted,
            revoked=revoked.acknowledged,
        )

    def _ours(self, listed: list[Reservation], *, reason: str) -> list[Reservation]:
        """`listed` without the reservations of other clusters (:func:`foreign`), said and counted."""
        kept = [r for r in listed if not foreign(reservation=r, cluster_id=self.cluster_id)]
        if len(kept) < len(listed):
            others = sorted({str(r.cluster_id) for r in listed} - {str(self.cluster_id)})
            self._metrics.reconcile_action(
                resource_manager=self.resource_manager, action="foreign", count=len(listed) - len(kept)
            )
            self._logger.warning(
                f"reconcile ({reason}): ResourceManager {self.resource_manager!r} listed "
                f"{len(listed) - len(kept)} reservations of other clusters ({', '.join(others)}; this "
                f"cluster is {self.cluster_id!r}); left alone. The RM ignored the clusterId filter, or "
                "the list went out without it: check the RM's GET /v1/info and its cluster-id feature"
            )
        return kept

    async def _revoked(
        self, rm: ReconcilingRM, names: Collection[str], pods: Mapping[str, Mapping[str, Any]]
    ) -> RevocationReport:
        """The revoked reservations of `names` (an RM without the feature has none): act, acknowledge."""
        revoked = [
            reservation
            for name in sorted(names)
            for reservation in await rm.list_revoked_reservations(scheduler_name=name)
            if in_scope(reservation=reservation, namespaces=self._namespaces)
        ]
        revoked = self._ours(revoked, reason="revoked")
        if not revoked:
            return RevocationReport()
        return await self._revocations.handle(rm, revoked, pods=pods, read=self._read)

    async def _settle(
        self,
        rm: ReconcilingRM,
        reservation: Reservation,
        action: Settle | None,
        pod: Mapping[str, Any] | None,
        *,
        reason: str,
        done: _Outcome,
        extra: Mapping[str, Reservation],
    ) -> None:
        """Act on one reservation (release it if it is in `extra`, see :func:`surplus`) and record
        the outcome in `done`."""
        kept_instead = extra.get(reservation.id)
        why = None
        if kept_instead is not None:
            action = Settle.RELEASE
            why = f"surplus: the pod runs on {kept_instead.state.value} reservation {kept_instead.id}"
        if action is None:
            done.kept += 1
            return
        if await self._act(rm, reservation, action, reason, why=why):
            (done.committed if action is Settle.COMMIT else done.released).append(reservation.id)
            if action is Settle.COMMIT and pod is not None and reported_unscheduled(pod):
                await self._correct(reservation, pod)
        else:
            done.failed.append(reservation.id)

    async def _bound_pods(self, names: Collection[str]) -> dict[str, dict[str, Any]]:
        """uid → body of the bound pods of `names` (in the operator's namespaces, if it has any)."""
        found: dict[str, dict[str, Any]] = {}
        for name in sorted(names):
            for namespace in self._namespaces or (None,):
                items, _ = await list_bound_pods(
                    api=self._api, scheduler_name=name, namespace=namespace, within=LIST_TIMEOUT_SECONDS
                )
                for item in items:
                    found[str((item.get("metadata") or {}).get("uid") or "")] = item
        return found

    async def _correct(self, reservation: Reservation, pod: Mapping[str, Any]) -> None:
        """The pod's failed cycle said PodScheduled=False, yet it runs on this reservation (a Binding
        that got no answer landed and nobody else settled it): say it is scheduled after all."""
        if self._on_reported_unbound is None:
            return
        try:
            await self._on_reported_unbound(reservation, pod)
        except Exception as exc:  # best effort: the pod runs either way
            self._logger.warning(f"could not report pod {reservation.name} as scheduled: {exc}")

    async def _read(self, reservation: Reservation) -> dict[str, Any] | None:
        """The reservation's pod by name (a pass skips reservations whose pod the RM did not name)."""
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            return await read_pod(
                api=self._api, namespace=str(reservation.namespace), name=str(reservation.name)
            )

    async def _act(
        self,
        rm: ReconcilingRM,
        reservation: Reservation,
        action: Settle,
        reason: str,
        *,
        why: str | None = None,
    ) -> bool:
        pod = f"{reservation.namespace}/{reservation.name} ({reservation.pod_uid})"
        try:
            if action is Settle.COMMIT:
                await rm.commit(reservation.id, pod_uid=reservation.pod_uid)
            else:
                await rm.release(reservation.id, pod_uid=reservation.pod_uid)
        except RMError as exc:
            self._metrics.reconcile_action(resource_manager=self.resource_manager, action="failed")
            self._logger.warning(
                f"reconcile ({reason}): could not {action} {reservation.state.value} reservation "
                f"{reservation.id} of pod {pod} on node {reservation.node}: {exc}; the next pass retries"
            )
            return False
        self._metrics.reconcile_action(resource_manager=self.resource_manager, action=action.value)
        why = why or (
            "bound to its node, commit was lost" if action is Settle.COMMIT else "pod gone, replaced or done"
        )
        self._logger.info(
            f"reconcile ({reason}): {action.value} {reservation.state.value} reservation {reservation.id} "
            f"of pod {pod} on node {reservation.node} ({why})"
        )
        return True

    async def _report_missing(
        self, *, served_pods: Iterable[Mapping[str, Any]], active_pod_uids: set[str], rm: ReconcilingRM
    ) -> tuple[list[str], list[str]]:
        """Bound, running pods with no active reservation: restore those Bindery bound
        (:mod:`bindery.controller.reservations.restore`), warn about the rest once. Returns
        (warned, restored)."""
        if not self._warn_missing:
            return [], []
        warned: list[str] = []
        restored: list[str] = []
        clock = asyncio.get_running_loop().time
        for listed in missing_reservations(
            bound_pods=served_pods, active_pod_uids=active_pod_uids, warned=self._warned
        ):
            metadata = listed.get("metadata") or {}
            uid, namespace, name = (
                str(metadata["uid"]),
                str(metadata.get("namespace")),
                str(metadata.get("name")),
            )
            refusals, due = self._restore_due.get(uid, (0, 0.0))
            if clock() < due:
                continue  # its restore was refused: asked for again once the backoff is over
            # Confirm before acting: the pod may have gone (and its reservation with it) since the list.
            async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                pod = await read_pod(api=self._api, namespace=namespace, name=name)
            if pod is None or missing_reservations(bound_pods=[pod], active_pod_uids=(), warned=()) == []:
                continue
            if (pod.get("metadata") or {}).get("uid") != uid:
                continue
            history = await rm.list_reservations(pod_uid=uid)
            if any(r.state.active for r in history):
                continue
            outcome = await self._restorer.restore(rm, pod, history=history)
            if isinstance(outcome, Reservation):
                self._unrestored.pop(uid, None)
                self._restore_due.pop(uid, None)
                restored.append(f"{namespace}/{name}")
                continue
            if outcome.ours and not outcome.transient:
                refusals += 1
                self._restore_due[uid] = (refusals, clock() + self._restore_backoff.delay(attempts=refusals))
                self._restore_due.move_to_end(uid)
                while len(self._restore_due) > REMEMBERED:
                    self._restore_due.popitem(last=False)
            if outcome.transient or uid in self._unrestored:
                continue  # the RM did not answer, or it refused and was warned about: the next pass asks
            self._remember(self._unrestored if outcome.ours else self._warned, uid)
            self._metrics.reconcile_action(
                resource_manager=self.resource_manager, action="missing_reservation"
            )
            node = (pod.get("spec") or {}).get("nodeName")
            self._logger.warning(
                f"reconcile: pod {namespace}/{name} ({uid}) is bound to {node} "
                f"but ResourceManager {self.resource_manager!r} holds no active reservation for it"
                + (f"; restoring it failed: {outcome.why}" if outcome.ours else "")
            )
            try:
                await self._post_warning(pod, restore=outcome.why if outcome.ours else None)
            except Exception as exc:  # the metric and the log already tell; the event is best effort
                self._logger.warning(
                    f"could not post the {MISSING_REASON} event of pod {namespace}/{name}: {exc}"
                )
            warned.append(f"{namespace}/{name}")
        return warned, restored

    @staticmethod
    def _remember(memory: collections.OrderedDict[str, None], key: str) -> None:
        """Remember `key`, forgetting the oldest past REMEMBERED (memory stays bounded)."""
        memory[key] = None
        memory.move_to_end(key)
        while len(memory) > REMEMBERED:
            memory.popitem(last=False)

    async def _post_warning(self, pod: Mapping[str, Any], *, restore: str | None = None) -> None:
        await self._events.warning(
            pod=PodInfo.slim(pod),
            reason=MISSING_REASON,
            action="Reconciling",
            note=missing_note(pod=pod, resource_manager=self.resource_manager, restore=restore),
            reporter=REPORTING_CONTROLLER,
        )
