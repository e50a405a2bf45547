"""Acting on reservations an RM took back (contract v1.2 feature ``revocation``; issue 23).

A reconcile pass lists the RM's revoked reservations (only an RM listing the feature has any) and
hands them here with the pods it already read. Per reservation, :func:`revoked_action` decides:

- **Evict** (``spec.onRevoked: Evict``, the default): a Warning event ``Revoked`` on the pod naming
  the ResourceManager and the RM's reason, a log line, then the Eviction API (never a delete, so
  PodDisruptionBudgets hold). A ``429`` (a PDB refuses) leaves the revocation unacknowledged and is
  tried again by a later pass after a growing delay (5 s doubling up to 5 min), said once in a
  Warning event ``RevokedEvictionBlocked``.
- **Warn**: the event and the log line; the pod keeps running.
- a pod that no longer uses the reservation (gone, finished, being deleted, replaced, elsewhere,
  bound with another reservation): nothing to tell anyone.
- a pod not bound yet: left for a later pass, since a Binding may still land on the reservation
  (its cycle's release acknowledges the revocation if it does not).

Then the reservation is released with its pod's UID, which acknowledges it at the RM (it leaves
``?state=revoked``), so the next pass does not act again and ``bindery audit`` finds nothing held.
``bindery_revocations_total{action}`` counts evict, warn, acknowledge, eviction_blocked and failed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from bindery.adapters.events import KubeEventSink
from bindery.adapters.eviction import eviction
from bindery.apiserver import ApiClient, ApiError, answer_of, resources
from bindery.controller.metrics import Metrics
from bindery.rm.errors import RMError
from bindery.rm.models import Reservation
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.revocation import OnRevoked, RevokedAction, revoked_action, revoked_note
from bindery.typedefs import Logger

__all__ = ["REVOKED_REASON", "RevocationReport", "Revocations", "RevokingRM"]

REVOKED_REASON = "Revoked"
BLOCKED_REASON = "RevokedEvictionBlocked"
REPORTING_CONTROLLER = "bindery"
_TIMEOUT = 10.0
_FIRST_RETRY, _LAST_RETRY = 5.0, 300.0
#: Reservations whose eviction a PDB refused, remembered with their back-off (bounded).
_REMEMBERED = 10_000


class RevokingRM(Protocol):
    async def list_revoked_reservations(self, *, scheduler_name: str | None = None) -> list[Reservation]: ...

    async def list_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None, pod_uid: str | None = None
    ) -> list[Reservation]: ...

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None: ...


@dataclasses.dataclass
class _Blocked:
    attempts: int
    next_at: float


@dataclasses.dataclass(frozen=True)
class RevocationReport:
    evicted: tuple[str, ...] = ()  # namespace/name
    warned: tuple[str, ...] = ()  # pod UIDs: reconciliation does not warn them ReservationMissing again
    acknowledged: tuple[str, ...] = ()  # reservation ids released at the RM
    blocked: tuple[str, ...] = ()  # namespace/name whose eviction a PDB refused
    failed: tuple[str, ...] = ()  # reservation ids
    #: UIDs of every pod with a revoked reservation in this pass, acted on or not yet (a PDB, a
    #: back-off): told Revoked, so reconciliation does not call them ReservationMissing as well.
    pods: tuple[str, ...] = ()


class Revocations:
    """One ResourceManager's revocations; :meth:`handle` is called by its reconcile pass."""

    def __init__(
        self,
        *,
        resource_manager: str,
        api: ApiClient,
        logger: Logger,
        policy: Callable[[], OnRevoked],
        events: KubeEventSink,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resource_manager = resource_manager
        self._api = api
        self._logger = logger
        self._policy = policy
        self._events = events
        self._metrics = metrics or Metrics()
        self._clock = clock
        self._blocked: collections.OrderedDict[str, _Blocked] = collections.OrderedDict()
        #: Revocations this process acted on and acknowledged. An RM that cannot record the
        #: acknowledgement durably (the Slurm adapter keeps it in memory: Slurm refuses to change a
        #: finished job) shows them again after a restart; they are then only acknowledged again.
        self._handled: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def handle(
        self,
        rm: RevokingRM,
        revoked: Iterable[Reservation],
        *,
        pods: Mapping[str, Mapping[str, Any]],
        read: Callable[[Reservation], Awaitable[Mapping[str, Any] | None]],
    ) -> RevocationReport:
        """Act on each revoked reservation (pods: uid → body known to the pass; `read` fetches the
        others by name), then acknowledge it. A failure with one does not stop the others."""
        policy = self._policy()
        evicted: list[str] = []
        warned: list[str] = []
        acknowledged: list[str] = []
        blocked: list[str] = []
        failed: list[str] = []
        revoked = list(revoked)
        for reservation in revoked:
            backoff = self._blocked.get(reservation.id)
            if backoff is not None and self._clock() < backoff.next_at:
                continue
            try:
                pod = pods.get(reservation.pod_uid)
                if pod is None and reservation.namespace and reservation.name:
                    pod = await read(reservation)
                action = revoked_action(
                    reservation=reservation,
                    pod=pod,
                    policy=policy,
                    named_active=await self._named_active(rm, reservation, pod),
                )
                if action is RevokedAction.WAIT:
                    continue  # not bound yet: a later pass evicts it once bound, or its cycle releases
                if reservation.id in self._handled:
                    action = RevokedAction.ACKNOWLEDGE  # told and evicted before: not twice
                who = f"{reservation.namespace}/{reservation.name}"
                if action is not RevokedAction.ACKNOWLEDGE:
                    assert pod is not None
                    if backoff is None:  # one Revoked event, not one per retry after a PDB's refusal
                        await self._warn(
                            pod,
                            REVOKED_REASON,
                            revoked_note(
                                reservation=reservation, resource_manager=self.resource_manager, action=action
                            ),
                        )
                    self._logger.warning(
                        f"ResourceManager {self.resource_manager!r} revoked reservation {reservation.id} of "
                        f"pod {who} ({reservation.pod_uid}) on node {reservation.node}: "
                        f"{reservation.revoked_reason}; {action.value}"
                    )
                if action is RevokedAction.EVICT and not await self._evict(pod or {}, reservation):
                    blocked.append(who)
                    self._metrics.revocation(
                        resource_manager=self.resource_manager, action="eviction_blocked"
                    )
                    continue
                await rm.release(reservation.id, pod_uid=reservation.pod_uid)
            except (ApiError, RMError, TimeoutError) as exc:
                failed.append(reservation.id)
                self._metrics.revocation(resource_manager=self.resource_manager, action="failed")
                self._logger.warning(
                    f"could not act on revoked reservation {reservation.id} of pod "
                    f"{reservation.namespace}/{reservation.name}: {exc}; the next reconcile pass retries"
                )
                continue
            self._blocked.pop(reservation.id, None)
            self._handled[reservation.id] = None
            while len(self._handled) > _REMEMBERED:
                self._handled.popitem(last=False)
            acknowledged.append(reservation.id)
            self._metrics.revocation(resource_manager=self.resource_manager, action=action.value)
            if action is RevokedAction.EVICT:
                evicted.append(who)
            elif action is RevokedAction.WARN:
                warned.append(reservation.pod_uid)
        return RevocationReport(
            evicted=tuple(evicted),
            warned=tuple(warned),
            acknowledged=tuple(acknowledged),
            blocked=tuple(blocked),
            failed=tuple(failed),
            pods=tuple(r.pod_uid for r in revoked),
        )

    @staticmethod
    async def _named_active(rm: RevokingRM, reservation: Reservation, pod: Mapping[str, Any] | None) -> bool:
        """Whether the reservation the pod's annotation names, when another than `reservation`, is
        active at the RM (asked only then: one list by pod UID)."""
        named = (((pod or {}).get("metadata") or {}).get("annotations") or {}).get(RESERVATION_ANNOTATION)
        if not named or named == reservation.id:
            return True
        return any(
            r.id == named and r.state.active for r in await rm.list_reservations(pod_uid=reservation.pod_uid)
        )

    async def _evict(self, pod: Mapping[str, Any], reservation: Reservation) -> bool:
        """The Eviction API for the reservation's pod (its UID as precondition); False when a
        PodDisruptionBudget refuses (429). Gone already (404) or replaced (409) counts as done."""
        namespace, name = str(reservation.namespace), str(reservation.name)
        path = resources.PODS.path(namespace=namespace, name=name, subresource="eviction")
        async with asyncio.timeout(_TIMEOUT):
            status, payload = await answer_of(
                self._api,
                "POST",
                path,
                body=eviction(namespace, name, reservation.pod_uid),
                request_timeout=_TIMEOUT,
                what=f"evicting {namespace}/{name}",
            )
        if status == 429:
            previous = self._blocked.pop(reservation.id, None)
            attempts = 1 if previous is None else previous.attempts + 1
            delay = min(_LAST_RETRY, _FIRST_RETRY * 2 ** (attempts - 1))
            self._blocked[reservation.id] = _Blocked(attempts=attempts, next_at=self._clock() + delay)
            while len(self._blocked) > _REMEMBERED:
                self._blocked.popitem(last=False)
            self._logger.warning(
                f"the eviction of {namespace}/{name}, whose reservation {reservation.id} was revoked, was "
                f"refused (429, a PodDisruptionBudget); trying again in {delay:.0f} s"
            )
            if previous is None:
                await self._warn(
                    pod,
                    BLOCKED_REASON,
                    f"Evicting this pod, whose reservation ResourceManager {self.resource_manager} revoked, "
                    "was refused by a PodDisruptionBudget; Bindery tries again with a growing delay (up to "
                    f"{_LAST_RETRY:.0f} s) until the budget allows it. Meanwhile the pod runs on capacity "
                    "the resource manager no longer counts for it.",
                )
            return False
        if status >= 300 and status not in (404, 409):
            raise ApiError(
                payload.decode(errors="replace")[:500], status=status, what=f"evicting {namespace}/{name}"
            )
        return True

    async def _warn(self, pod: Mapping[str, Any], reason: str, note: str) -> None:
        await self._events.warning(
            pod=PodInfo.slim(pod), reason=reason, action="Revoking", note=note, reporter=REPORTING_CONTROLLER
        )
