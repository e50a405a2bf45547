"""Settle the reservation of a Binding that got no answer, before the RM lets it expire.

When every attempt of a Binding goes unanswered, the pod may or may not be bound. The cycle keeps
the reservation (releasing the capacity of a pod that may be running there is worse than holding
capacity a little longer), but a kept reservation that nobody commits expires after its TTL, and the
RM then hands capacity that a running pod uses to another pod. So each profile remembers these
reservations until it learns what happened to the pod:

- the pod (same UID) is bound to the reservation's node: the Binding landed, so **commit**. The
  pod then gets the ``Scheduled`` event and ``PodScheduled=True`` back: the cycle had reported a
  failure, and a running pod should not keep saying it is unscheduled;
- the pod is gone, was replaced, finished, or is bound to another node: **release**;
- the pod is still pending: nothing is done here. Its next cycle reserves with the same idempotency
  key, gets this reservation back, and then commits or releases it like any other.

Two sources tell, whichever comes first: reads of the pod, starting right after the cycle (retried
with backoff while the apiserver does not answer, for as long as the reservation lives), and the
bound-pod watch, which sees the pod as soon as it is bound, including by a Binding that was still
in flight when that read ran. The pod's ``bindery.dev/reservation-id`` annotation only finds the
reservation a watch event is about; it never decides a release: its owner may overwrite it, and
the pod (same UID) on the node is the one this reservation holds room for.

While the pod is still pending, its lease is kept alive: when less than a third of it is left, the
pod is read again and, still pending, the reservation is renewed (contract v1.1). A late Binding can
land after the original lease would have run out, and must still find its reservation alive. An RM
that cannot renew (v1.0) leaves the reservation to its next cycle or its expiry, as before.

Only the reservation a later cycle of the pod actually ended with is forgotten here (that cycle
bound with it and committed it); a cycle that failed before reserving, or got another reservation,
does not settle this one, and a late Binding may still land with it.

A third path closes a race: the pod's next cycle gets the same reservation back, and if the late
Binding lands meanwhile, that cycle finds the pod gone from the unbound pods and would release it.
So every release of the profile goes through its RM stack (:class:`bindery.controller.rmstack.
RMStack`), which asks :meth:`UnconfirmedBinds.settle_before_release` first when the reservation is
one of these: the pod is read, and the reservation committed instead if the pod is bound with it; a
reservation already committed here (the watch may see the late Binding first) is never released.

Pod groups hand their members' unanswered Bindings here too, through the same follow-up as a pod's
cycle: a member is committed as soon as it is seen bound, like any pod.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from bindery.adapters.reads import read_pod
from bindery.apiserver import ApiClient
from bindery.controller.reservations.fate import Settle, pod_fate, reservation_to_release
from bindery.controller.rmstack import NotLeading
from bindery.rm.errors import RMConflict, RMError, RMUnsupported
from bindery.scheduling.framework import RESERVATION_ANNOTATION, ReservationClient
from bindery.scheduling.lease import lease_from_answer
from bindery.scheduling.podspec import PodInfo
from bindery.typedefs import Logger

REMEMBERED_COMMITS = 10_000
#: How long one read of the pod may take (the generated client's default is 5 minutes).
READ_TIMEOUT_SECONDS = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class UnconfirmedBind:
    """A reservation whose Binding got no answer: the pod it was made for and the node it holds."""

    reservation_id: str
    pod: PodInfo
    node: str
    #: The tracker's clock (time.monotonic) after which the RM has let the reservation expire.
    deadline: float
    #: The lease a renewal asks for.
    ttl_seconds: float = 60.0


def fate(*, bind: UnconfirmedBind, pod: Mapping[str, Any] | None) -> Settle | None:
    """Pure: :func:`~bindery.controller.reservations.fate.pod_fate` of the bind's reservation.

    None means the pod is still pending: its next cycle settles the reservation. The pod's
    reservation annotation is not consulted: its owner may have overwritten it since the Binding,
    and the pod that runs on the node is the one this reservation was made for there.
    """
    return pod_fate(pod_uid=bind.pod.uid, node=bind.node, pod=pod)


class UnconfirmedBinds:
    """The unconfirmed Bindings of one profile, settled by a read of the pod or by the bound-pod watch."""

    def __init__(
        self,
        *,
        api: ApiClient,
        rm: Callable[[], ReservationClient],
        logger: Logger,
        on_released: Callable[[], None] = lambda: None,
        on_committed: Callable[[UnconfirmedBind], Awaitable[None]] | None = None,
        on_not_bound: Callable[[str], None] = lambda uid: None,
        first_retry: float = 0.5,
        max_retry: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._rm = rm
        self._logger = logger
        self._on_released = on_released
        self._on_committed = on_committed
        self._on_not_bound = on_not_bound
        self._first_retry = first_retry
        self._max_retry = max_retry
        self._renew_delays: dict[str, float] = {}  # reservation id -> next wait after a failed renewal
        self._clock = clock
        self._pending: dict[str, UnconfirmedBind] = {}  # reservation id -> bind
        #: ids committed here: a cycle that still holds one must not release it
        self._committed: collections.OrderedDict[str, UnconfirmedBind] = collections.OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._following: dict[str, asyncio.Task[None]] = {}  # reservation id -> its follow-up

    def __len__(self) -> int:
        """Reservations still waiting for their pod's fate (0 once every pod left)."""
        return len(self._pending)

    def __contains__(self, reservation_id: object) -> bool:
        """Whether a release of this id must be checked first (pending, or committed here)."""
        return reservation_id in self._pending or reservation_id in self._committed

    def track(
        self,
        *,
        reservation_id: str,
        pod: PodInfo,
        node: str,
        ttl_seconds: float,
        expires: float | None = None,
    ) -> None:
        """Remember the reservation of a Binding that got no answer and start reading its pod.

        ``expires``: when its lease runs out on this tracker's clock, as the cycle last knew it
        (default: a whole TTL from now).
        """
        now = self._clock()
        for rid in [rid for rid, known in self._pending.items() if known.deadline <= now]:
            del self._pending[rid]  # expired at the RM: nothing left to commit or release
        bind = UnconfirmedBind(
            reservation_id=reservation_id,
            pod=pod,
            node=node,
            deadline=now + ttl_seconds if expires is None else expires,
            ttl_seconds=ttl_seconds,
        )
        self._pending[reservation_id] = bind
        running = self._following.get(reservation_id)
        if running is not None and not running.done():
            return  # a later cycle got the same reservation back and lost its answer too
        task = asyncio.create_task(self._follow(reservation_id), name=f"settle {bind.reservation_id}")
        self._following[reservation_id] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda done: self._following.pop(reservation_id, None))

    def forget(self, reservation_id: str) -> None:
        """A later cycle of the pod bound it with this reservation and committed it."""
        self._pending.pop(reservation_id, None)

    def forget_pod(self, pod_uid: str) -> None:
        """The pod left for good: nothing of it is tracked any more."""
        for rid in [rid for rid, bind in self._pending.items() if bind.pod.uid == pod_uid]:
            del self._pending[rid]

    async def observe(self, *, event_type: str, pod: Mapping[str, Any]) -> None:
        """A bound-pod watch event: settle the reservation it carries, if it is one of ours."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        bind = self._pending.get(str(annotations.get(RESERVATION_ANNOTATION) or ""))
        if bind is None or (pod.get("metadata") or {}).get("uid") != bind.pod.uid:
            return  # not ours, or another pod that copied the annotation: it says nothing of ours
        if reservation_to_release(event_type=event_type, pod=pod) is not None:
            del self._pending[bind.reservation_id]  # deleted or finished: the watch releases it
            return
        decided = fate(bind=bind, pod=pod)
        if decided is not None:
            await self._settle(bind, decided)

    async def settle_before_release(self, reservation_id: str) -> bool:
        """A cycle is about to release `reservation_id`: True if that must not happen (handled here).

        The pod is read once: bound with it → committed (True); unbound or gone → the caller
        releases (False); no answer → kept, left to the watch and the expiry (True).
        """
        committed = self._committed.get(reservation_id)
        if committed is not None:
            return await self._keep_committed(committed)
        bind = self._pending.get(reservation_id)
        if bind is None:
            return False
        try:
            pod = await self._read(bind)
        except Exception as exc:
            self._logger.warning(
                f"not releasing reservation {reservation_id} of pod {bind.pod.key}: its Binding got no "
                f"answer earlier and reading the pod failed ({exc}), so it may be bound with it"
            )
            return True
        if fate(bind=bind, pod=pod) is Settle.COMMIT:
            await self._settle(bind, Settle.COMMIT)
            return True
        self._pending.pop(reservation_id, None)
        return False

    async def _keep_committed(self, bind: UnconfirmedBind) -> bool:
        """A release of a reservation committed here: kept while its pod runs with it.

        Every release of the profile comes through here, those of a departed pod too (the bound-pod
        watch, the reconciler): the pod is read, and only one that is gone or finished lets the
        release through. Unreadable, or still bound with it, the reservation stays committed.
        """
        rid = bind.reservation_id
        try:
            pod = await self._read(bind)
        except Exception as exc:
            self._logger.warning(
                f"not releasing reservation {rid} of pod {bind.pod.key}, committed after a Binding that "
                f"got no answer: reading the pod failed ({exc})"
            )
            return True
        if fate(bind=bind, pod=pod) is Settle.RELEASE:
            self._committed.pop(rid, None)
            return False
        self._logger.info(
            f"not releasing reservation {rid}: its pod was bound by a Binding that got no answer, and "
            "it is committed"
        )
        return True

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(self, reservation_id: str) -> None:
        """Read the pod until its fate is known, keeping the lease alive while it is pending."""
        try:
            await self._follow_until_known(reservation_id)
        finally:
            self._renew_delays.pop(reservation_id, None)

    async def _follow_until_known(self, reservation_id: str) -> None:
        delay = self._first_retry
        while (bind := self._pending.get(reservation_id)) is not None:
            try:
                pod = await self._read(bind)
            except Exception as exc:  # ApiError (transport errors too): the apiserver is still away
                if not await self._wait(bind, delay, f"reading pod {bind.pod.key} failed: {exc}"):
                    return
                delay = min(delay * 2, self._max_retry)
                continue
            delay = self._first_retry
            decided = fate(bind=bind, pod=pod)
            if decided is not None:
                await self._settle(bind, decided)
                return
            if not await self._keep_alive(bind):
                self._logger.info(
                    f"pod {bind.pod.key} is still pending after a Binding that got no answer; its next "
                    f"cycle reuses reservation {bind.reservation_id}"
                )
                return

    async def _keep_alive(self, bind: UnconfirmedBind) -> bool:
        """The pod is pending: sleep until the lease runs low, or renew it if it does; False: stop.

        The caller reads the pod again after each return, so a reservation is renewed only for a
        pod seen pending less than a third of a lease earlier.
        """
        rid = bind.reservation_id
        low_at = bind.deadline - bind.ttl_seconds / 3
        if (wait := low_at - self._clock()) > 0:
            await asyncio.sleep(wait)
            return True  # the caller reads the pod again, unless the watch settled it meanwhile
        sent_at, sent_at_wall = self._clock(), datetime.datetime.now(datetime.UTC)
        try:
            renewed = await self._rm().renew(
                rid, pod_uid=bind.pod.uid, ttl_seconds=max(1, math.ceil(bind.ttl_seconds))
            )
        except RMUnsupported:
            return False  # contract v1.0: the next cycle or the expiry settles it, as before v1.1
        except NotLeading:
            return False  # past the renew deadline: the next leader settles it (reconcile, or TTL)
        except RMConflict as exc:  # expired, released or not this pod's: nothing left to keep
            self._pending.pop(rid, None)
            self._logger.warning(
                f"reservation {rid} of pod {bind.pod.key} (a Binding that got no answer) can no longer "
                f"be renewed: {exc}"
            )
            return False
        except RMError as exc:  # the RM is away: back off, or the pod would be read every half second
            delay = self._renew_delays.get(rid, self._first_retry)
            self._renew_delays[rid] = min(delay * 2, self._max_retry)
            return await self._wait(bind, delay, f"renewing it failed: {exc}")
        self._renew_delays.pop(rid, None)
        lease = lease_from_answer(
            reservation=renewed, ttl_seconds=bind.ttl_seconds, sent_at=sent_at, sent_at_wall=sent_at_wall
        )
        if rid in self._pending:
            self._pending[rid] = dataclasses.replace(self._pending[rid], deadline=lease.expires)
        self._logger.info(
            f"renewed reservation {rid} of pod {bind.pod.key}, still pending after a Binding that got no "
            "answer"
        )
        return True

    async def _read(self, bind: UnconfirmedBind) -> dict[str, Any] | None:
        return await read_pod(
            api=self._api,
            namespace=bind.pod.namespace,
            name=bind.pod.name,
            timeout_seconds=READ_TIMEOUT_SECONDS,
        )

    async def _settle(self, bind: UnconfirmedBind, decided: Settle) -> None:
        """Commit or release, retrying the RM while the reservation lives; the first caller wins."""
        if self._pending.pop(bind.reservation_id, None) is None:
            return  # the watch or the read settled it already
        if decided is not Settle.COMMIT:  # the pod's assumed copy (inter-pod rules) is not on the node
            self._on_not_bound(bind.pod.uid)
        if decided is Settle.COMMIT:  # from now on no cycle may release it, even while committing
            self._committed[bind.reservation_id] = bind
            while len(self._committed) > REMEMBERED_COMMITS:
                self._committed.popitem(last=False)
        delay = self._first_retry
        while True:
            try:
                if decided is Settle.COMMIT:
                    await self._rm().commit(bind.reservation_id, pod_uid=bind.pod.uid)
                else:
                    await self._rm().release(bind.reservation_id, pod_uid=bind.pod.uid)
            except RMConflict as exc:
                self._logger.error(
                    f"reservation {bind.reservation_id} of pod {bind.pod.key} (bound to {bind.node} by a "
                    f"Binding that got no answer) can no longer be committed: {exc}"
                )
                return
            except RMError as exc:
                if not await self._wait(bind, delay, f"could not {decided} it: {exc}"):
                    return
                delay = min(delay * 2, self._max_retry)
                continue
            break
        if decided is Settle.COMMIT:
            self._logger.info(
                f"pod {bind.pod.key} is bound to {bind.node} after all: committed reservation "
                f"{bind.reservation_id}"
            )
            if self._on_committed is not None:
                await self._on_committed(bind)
        else:
            self._logger.info(
                f"pod {bind.pod.key} was not bound by the Binding that got no answer: released "
                f"reservation {bind.reservation_id}"
            )
            self._on_released()

    async def _wait(self, bind: UnconfirmedBind, delay: float, problem: str) -> bool:
        """Sleep before the next try; False (and a loud log) once the reservation has expired."""
        if self._clock() + delay >= bind.deadline:
            self._pending.pop(bind.reservation_id, None)
            self._logger.error(
                f"gave up settling reservation {bind.reservation_id} of pod {bind.pod.key}: {problem}; "
                "it expires now, and if the pod was bound the resource manager may place other pods "
                "on its capacity: check the apiserver and the resource manager"
            )
            return False
        self._logger.warning(
            f"settling reservation {bind.reservation_id} of pod {bind.pod.key}: {problem}; "
            f"retrying in {delay:g}s"
        )
        await asyncio.sleep(delay)
        return True
