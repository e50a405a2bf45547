"""A profile's one handle to its resource manager: metrics, tracing, the leader fence and settling.

There used to be three handles to one RM client: the raw client, a measured one (metrics and
traces) and the cycles' one (measured, fenced, releases settled against unconfirmed Bindings).
Which of them a call used decided whether it was fenced and measured, and the pod-group path, the
reconciler and the bound-pod watch took the unfenced ones: a replica past its renew deadline could
still release or renew a reservation group the next leader was binding. So every layer is applied
here, in one class, and every caller of a profile (pod cycles, pod groups, the reconciler, the
bound-pod watch, the unconfirmed Bindings, the readiness probe) gets this one object. The raw
client lives only inside it: nothing else can reach an unfenced client.

What each call goes through, outermost first:

* **the leader fence** (``holds()``): past its renew deadline another replica may lead and may
  have reused a pod's reservation (same idempotency key) for a Binding of its own. A release is
  then skipped (logged; the leader settles it: its reconciliation or the TTL), and a renewal
  raises :class:`NotLeading` (keeping alive what the leader may be using is the leader's call).
  Reserve, commit and reads pass: a commit is always right for a bound pod, and the Binding that
  would follow a reserve is fenced by :class:`~bindery.controller.leadership.FencedBinder`;
* **settling**: a release of a reservation whose Binding got no answer asks the profile's
  :class:`Settler` first (:class:`~bindery.controller.reservations.unconfirmed.UnconfirmedBinds`),
  which commits instead when the pod turns out bound with it. The stack knows it by this protocol
  only: the settler reads pods and calls the RM through this stack, so it sits above it;
* **measurement**: every request is timed into ``bindery_rm_request_duration_seconds`` and, with
  tracing on, gets a client span (:class:`~bindery.controller.metrics.MeasuredRM`).

A rotated credential swaps the client underneath (:meth:`RMStack.use`); callers keep their handle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from bindery.controller.metrics import MeasuredRM, Metrics
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMError
from bindery.rm.models import (
    PreemptionPlan,
    Reservation,
    ReservationGroup,
    ReservationGroupRequest,
    ReservationRequest,
)
from bindery.typedefs import Logger

__all__ = ["NotLeading", "RMStack", "Settler"]


class NotLeading(RMError):
    """A renewal refused before it was sent: this replica no longer holds the leader lease."""


class Settler(Protocol):
    """Who decides, before a release is sent, whether it must not be: the profile's unconfirmed
    Bindings. `reservation_id in settler` says whether to ask; `settle_before_release` True means
    the release is not sent (committed instead, or kept while its pod is unreadable)."""

    def __contains__(self, reservation_id: object, /) -> bool: ...

    async def settle_before_release(self, reservation_id: str, /) -> bool: ...


class RMStack:
    """The fenced, settled, measured RM client of one profile (see the module docstring)."""

    def __init__(
        self,
        *,
        client: ResourceManagerClient,
        metrics: Metrics,
        resource_manager: str,
        holds: Callable[[], bool],
        logger: Logger,
    ) -> None:
        self._metrics = metrics
        self._name = resource_manager
        self._holds = holds
        self._logger = logger
        self._settler: Settler | None = None
        self._client = client
        self._measured = MeasuredRM(inner=client, metrics=metrics, resource_manager=resource_manager)

    def settle_through(self, settler: Settler) -> None:
        """Releases of the reservations `settler` holds are checked by it first (wired once, after
        the settler is made: it calls the RM through this stack)."""
        self._settler = settler

    def use(self, client: ResourceManagerClient) -> ResourceManagerClient:
        """Send from now on through ``client`` (credentials rotated); returns the one replaced."""
        old, self._client = self._client, client
        self._measured = MeasuredRM(inner=client, metrics=self._metrics, resource_manager=self._name)
        return old

    @property
    def breaker_state(self) -> str:
        """The client's circuit-breaker state (a metrics label)."""
        return self._client.breaker.state

    @property
    def clock_skew(self) -> float | None:
        """The RM's clock minus this host's, seconds, at the last readiness probe (None: unknown)."""
        last = self._client.clock.last
        return last.seconds if last is not None else None

    async def aclose(self) -> None:
        await self._client.aclose()

    def takes_rule_preemption(self) -> bool:
        """Whether the RM may receive ``rulePreemption`` (PodPlacementRules names a rule's victims
        only then)."""
        return self._client.takes_rule_preemption()

    async def negotiated(self) -> bool:
        """Whether the RM's contract is settled (reconciliation decides nothing from a list before)."""
        return await self._client.negotiated()

    # -- the ReservationClient verbs ---------------------------------------------------------------

    async def reserve(self, request: ReservationRequest, /) -> Reservation:
        return await self._measured.reserve(request)

    async def commit(self, reservation_id: str, /, *, pod_uid: str | None = None) -> Reservation:
        return await self._measured.commit(reservation_id, pod_uid=pod_uid)

    async def release(self, reservation_id: str, /, *, pod_uid: str | None = None) -> None:
        await self.release_unless_kept(reservation_id, pod_uid=pod_uid)

    async def release_unless_kept(self, reservation_id: str, /, *, pod_uid: str | None = None) -> bool:
        """Release; False if nothing was sent: the fence kept it, or settling did (committed, or
        its pod unreadable). A caller that remembers what it released must not remember these."""
        if not self._leads(f"releasing reservation {reservation_id} of pod {pod_uid}"):
            return False
        settler = self._settler
        if (
            settler is not None
            and reservation_id in settler
            and await settler.settle_before_release(reservation_id)
        ):
            return False
        await self._measured.release(reservation_id, pod_uid=pod_uid)
        return True

    async def renew(self, reservation_id: str, /, *, pod_uid: str, ttl_seconds: int) -> Reservation:
        self._fence(f"renew reservation {reservation_id} of pod {pod_uid}")
        return await self._measured.renew(reservation_id, pod_uid=pod_uid, ttl_seconds=ttl_seconds)

    async def list_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None, pod_uid: str | None = None
    ) -> list[Reservation]:
        return await self._measured.list_reservations(
            scheduler_name=scheduler_name, state=state, pod_uid=pod_uid
        )

    async def list_unscoped_reservations(
        self, *, scheduler_name: str | None = None, state: str | None = None
    ) -> list[Reservation]:
        client = self._client
        return await self._measured.measure(
            "list",
            lambda: client.list_unscoped_reservations(scheduler_name=scheduler_name, state=state),
        )

    async def list_revoked_reservations(self, *, scheduler_name: str | None = None) -> list[Reservation]:
        client = self._client
        return await self._measured.measure(
            "list", lambda: client.list_revoked_reservations(scheduler_name=scheduler_name)
        )

    # -- groups (contract v1.1) and readiness -----------------------------------------------------

    async def reserve_group(self, request: ReservationGroupRequest, /) -> ReservationGroup:
        client = self._client
        return await self._measured.measure("reserve_group", lambda: client.reserve_group(request))

    async def renew_group(self, group_id: str, /, *, ttl_seconds: int) -> ReservationGroup:
        self._fence(f"renew reservation group {group_id}")
        client = self._client
        return await self._measured.measure(
            "renew_group", lambda: client.renew_group(group_id, ttl_seconds=ttl_seconds)
        )

    async def release_group(self, group_id: str, /) -> bool:
        """Release every member of the group; False if the fence kept it (nothing was sent)."""
        if not self._leads(f"releasing reservation group {group_id}"):
            return False
        client = self._client
        await self._measured.measure("release_group", lambda: client.release_group(group_id))
        return True

    # -- preemption plans (contract v1.2) -------------------------------------------------------

    async def confirm_preemption(self, plan_id: str, /) -> PreemptionPlan:
        self._fence(f"confirm preemption plan {plan_id}")
        client = self._client
        return await self._measured.measure("confirm_preemption", lambda: client.confirm_preemption(plan_id))

    async def cancel_preemption(self, plan_id: str, /) -> None:
        if not self._leads(f"cancelling preemption plan {plan_id}"):
            return
        client = self._client
        await self._measured.measure("cancel_preemption", lambda: client.cancel_preemption(plan_id))

    async def check_ready(self) -> None:
        await self._measured.measure("ready", self._client.check_ready)

    async def serves(self) -> bool:
        return await self._client.serves()

    # -- the fence --------------------------------------------------------------------------------

    def _leads(self, what: str) -> bool:
        if self._holds():
            return True
        self._logger.warning(
            f"not {what}: this replica no longer holds the leader lease; the leader settles it"
        )
        return False

    def _fence(self, what: str) -> None:
        if not self._holds():
            raise NotLeading(f"did not {what}: this replica no longer holds the leader lease")
