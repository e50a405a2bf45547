"""After a restart: finish or undo the group reservations an earlier process left.

Reservations outlive the process, Bindings too. The first pass of each group after a start looks
for member reservations still ``reserved`` for its pending pods (the reconciler leaves those of
pending pods alone and commits those whose pod is bound): it renews their group's lease and binds
those members with them, or, if the group can no longer be renewed, releases it. So an operator
killed between the group reservation and some Bindings ends, after its restart, with every member
bound and committed, or with everything released.

Every RM call (the leftover lookup, the renewal, the releases) goes through the profile's one RM
stack (:class:`bindery.controller.rmstack.RMStack`), fenced: a replica past its renew deadline
renews and releases nothing, and its recovery leaves the group to the leader.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bindery.apiserver import ApiClient, NotFound, get, resources
from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.placement import Member, Placement
from bindery.controller.podgroups.reporting import READ_SECONDS
from bindery.controller.rmstack import NotLeading, RMStack
from bindery.rm.errors import RMError
from bindery.rm.models import Reservation, ReservationState
from bindery.scheduling.framework import Profile
from bindery.scheduling.lease import lease_from_answer
from bindery.scheduling.podgroups import PodGroupInfo
from bindery.scheduling.podspec import PodInfo
from bindery.typedefs import Logger

if TYPE_CHECKING:
    from bindery.controller.podgroups.state import GroupState

__all__ = ["Recovery"]


class Recovery:
    """Settles what an earlier process left reserved for one profile's pod groups."""

    def __init__(
        self,
        *,
        profile: Callable[[], Profile],
        rm: Callable[[], RMStack],
        api: ApiClient,
        logger: Logger,
        metrics: Metrics,
        placement: Placement,
        on_released: Callable[[], None],
    ) -> None:
        self._profile = profile
        self._rm = rm
        self._api = api
        self._logger = logger
        self._metrics = metrics
        self._placement = placement
        self._on_released = on_released

    async def recover(self, info: PodGroupInfo, group: GroupState, pending: Sequence[PodInfo]) -> bool:
        """Bind pending members that still hold a group member reservation from an earlier process.

        Returns whether it bound any (the caller looks again at what is left pending). Raises
        :class:`bindery.controller.rmstack.NotLeading` if the renewal was fenced.
        """
        by_uid = {pod.uid: pod for pod in pending}
        names = {pod.scheduler_name for pod in pending}
        left: list[Reservation] = []
        try:
            for scheduler_name in sorted(names):
                reservations = await self._rm().list_reservations(
                    scheduler_name=scheduler_name, state=ReservationState.RESERVED.value
                )
                left.extend(r for r in reservations if r.group_id and r.pod_uid in by_uid)
        except RMError as error:
            self._logger.warning(f"could not look for leftover reservations of pod group {info.key}: {error}")
            return False
        if not left:
            return False
        profile = self._profile()
        adopted = False
        for group_id in sorted({r.group_id for r in left if r.group_id}):
            try:
                sent_at, sent_at_wall = profile.clock(), datetime.datetime.now(datetime.UTC)
                renewed = await self._rm().renew_group(group_id, ttl_seconds=profile.reservation_ttl_seconds)
            except NotLeading:
                raise
            except RMError as error:
                self._logger.warning(
                    f"pod group {info.key}: reservation group {group_id}, left by an earlier process, "
                    f"cannot be renewed ({error}); releasing it and placing the group anew"
                )
                await self._placement.release_group(group_id, info=info)
                continue
            reserved = [r for r in renewed.members if r.state is ReservationState.RESERVED]
            # All or none: adopt the group only if every member is pending here with its reservation
            # or already bound (its commit is the reconciler's). A member deleted or replaced
            # meanwhile (its reservation may be released already), or not offered yet, means the
            # group as reserved can no longer bind whole: release what no bound pod holds, and
            # place the group anew.
            bound = {
                r.pod_uid
                for r in renewed.members
                if not (r.state is ReservationState.RESERVED and r.pod_uid in by_uid)
                and (r.state is ReservationState.COMMITTED or await self._bound_with(r))
            }
            whole = all(
                r.pod_uid in bound or (r.state is ReservationState.RESERVED and r.pod_uid in by_uid)
                for r in renewed.members
            )
            if not whole:
                self._logger.info(
                    f"pod group {info.key}: reservation group {group_id}, left by an earlier process, "
                    "has members that are gone or not pending here; releasing it and placing the "
                    "group anew"
                )
                await self._release_members([r for r in reserved if r.pod_uid not in bound], info=info)
                continue
            pairs = [
                Member(
                    pod=by_uid[r.pod_uid],
                    reservation=r,
                    lease_expires=lease_from_answer(
                        reservation=r,
                        ttl_seconds=profile.reservation_ttl_seconds,
                        sent_at=sent_at,
                        sent_at_wall=sent_at_wall,
                    ).expires,
                )
                for r in reserved
                if r.pod_uid in by_uid
            ]
            if not pairs:
                continue
            self._logger.info(
                f"pod group {info.key}: binding {len(pairs)} members with reservation group {group_id}, "
                "left reserved by an earlier process"
            )
            await self._placement.bind_all(info, group, pairs, group_id=group_id, started=time.perf_counter())
            adopted = True
        return adopted

    async def _bound_with(self, reservation: Reservation) -> bool:
        """Whether the reservation's pod (same UID) is bound to a node."""
        if not reservation.namespace or not reservation.name:
            return False
        try:
            pod = await get(
                self._api,
                resources.PODS,
                namespace=reservation.namespace,
                name=reservation.name,
                request_timeout=READ_SECONDS,
            )
        except NotFound:
            return False
        return bool(
            (pod.get("metadata") or {}).get("uid") == reservation.pod_uid
            and (pod.get("spec") or {}).get("nodeName")
        )

    async def _release_members(self, reservations: Sequence[Reservation], *, info: PodGroupInfo) -> None:
        released = False
        for reservation in reservations:
            try:
                await self._rm().release(reservation.id, pod_uid=reservation.pod_uid)
                released = True
            except RMError as error:
                self._logger.warning(
                    f"could not release reservation {reservation.id} of pod group {info.key}: {error}; "
                    "it expires by itself"
                )
        if released:
            self._metrics.release(resource_manager=self._profile().name, reason="group")
            self._on_released()
