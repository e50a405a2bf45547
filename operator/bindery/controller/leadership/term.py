"""A term of leadership: the election loop, and how leading starts and stops.

The runtime learns about leadership through two callbacks only — `on_started` (activate every
profile) and `on_stopped` (pause every profile) — and asks one question, `holds()`, on the path
that writes a Binding (:mod:`.fence`). Everything about Leases stays in this package.

A term, end to end:

1. Stand by: read the Lease every retry period; take it once the record has not changed for its
   whole duration on this replica's monotonic clock (`rules.may_acquire`).
2. Lead: `on_started` runs while the lease keeps being renewed every retry period, each call
   bounded (`LeaseTiming.request_timeout`).
3. Stop at the renew deadline (or at once when another holder is seen): from that instant
   `holds()` is False, so no new Binding leaves this process; then `on_stopped` pauses every
   profile, which cancels the cycles in flight. They release nothing: `holds()` fences releases
   too (`rmstack.RMStack`), because the next leader may already have reused the
   pod's reservation; the pod's next cycle reuses it, or the new leader's reconciliation or its
   TTL settles it.
   The pause must be over by the term's *exit point*: last renewal + renew deadline +
   `LeaseTiming.pause_budget` (midway between the renew deadline and the earliest moment a standby
   may take the lease), so this process is quiet before any other replica can lead. **Otherwise the
   process exits** (status 1) — kube-scheduler exits whenever it loses its lease; we pause in order
   when there is time, because a restart costs a standby its warm caches, and exit when there is
   not: a process that cannot stop its cycles in time cannot be trusted to stop them later, and a
   release landing after the next leader reused that pod's reservation (the RM keys reservations by
   pod UID) would free capacity under a pod it bound. The Deployment restarts the process as a
   standby; the reservations it leaves are reused by the pods' next cycles or settled by the new
   leader's reconciliation or their TTL.
4. Stand by again with a fresh identity (a new candidacy; the old term's writes are not ours).

A process that was frozen (SIGSTOP, a long GC or VM pause) wakes past its renew deadline: `holds()`
is already False before any of its coroutines resumes, so a cycle that wakes up in the middle
cannot send its Binding; if it is past its exit point too, the first of the elector or such a cycle
to run makes the process exit. What no lease can fence is a Binding already on the wire when the
process froze; the apiserver refuses a second Binding of the same pod (409), and the new leader
reuses the old one's reservation, so that late write binds the pod exactly once and on a live
reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from bindery.apiserver import ApiClient
from bindery.controller.leadership.elector import LeaderElector
from bindery.controller.leadership.rules import LeaseTiming, past_exit_point
from bindery.typedefs import Logger


def _exit(status: int) -> NoReturn:
    logging.shutdown()
    os._exit(status)


class Leadership:
    """Runs candidacies one after another; tells the runtime when it starts and stops leading."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        hostname: str,
        timing: LeaseTiming,
        logger: Logger,
        on_started: Callable[[], Coroutine[Any, Any, None]],
        on_stopped: Callable[[], Coroutine[Any, Any, None]],
        exit_process: Callable[[int], NoReturn] = _exit,
        hold_back: Callable[[], float] | None = None,
        claims: asyncio.Lock | None = None,
    ) -> None:
        self._namespace = namespace
        self._name = name
        self._hostname = hostname
        self.timing = timing
        self._logger = logger
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._exit = exit_process
        #: a Lease per ResourceManager: how long to leave a free lease to replicas leading fewer
        self._hold_back = hold_back
        self._claims = claims  # shared by the process's Leases: one acquisition at a time
        self._elector: LeaderElector | None = None
        self._task: asyncio.Task[None] | None = None
        #: Renewal attempts of the leader's Lease by outcome, for `bindery_leader_lease_renewals_total`.
        self.renewals = {"ok": 0, "failed": 0}

    def holds(self) -> bool:
        """The fence: this replica leads and is inside its renew deadline right now.

        A replica that finds itself past its exit point (it was frozen) exits here, before the
        caller can act: it is too late to pause in order (see the module docstring).
        """
        elector = self._elector
        if elector is None:
            return False
        if elector.holds():
            return True
        self._exit_if_too_late(elector)
        return False

    def holds_for(self) -> float:
        """Seconds the fence stays open from now if no renewal succeeds meanwhile (0 when it is shut).

        `FencedBinder` cuts a Binding still in flight at this point instead of letting it finish.
        """
        elector = self._elector
        if elector is None or elector.last_renewal is None:
            return 0.0
        return max(0.0, elector.last_renewal + self.timing.renew_deadline - time.monotonic())

    def _exit_at(self, elector: LeaderElector) -> float | None:
        """Monotonic time by which a lost term must have paused (`leader.past_exit_point`)."""
        if elector.last_renewal is None:
            return None
        return elector.last_renewal + self.timing.renew_deadline + self.timing.pause_budget

    def _exit_if_too_late(self, elector: LeaderElector) -> None:
        """Exit when the exit point of the term has passed: this process was frozen or starved, another
        replica may lead by now and reuse the reservations of the cycles in flight, so cancelling them
        (which releases them) is no longer safe either."""
        if past_exit_point(last_renewal=elector.last_renewal, now=time.monotonic(), timing=self.timing):
            self._logger.critical(
                f"this replica could not act for longer than its {elector.lease} allows (over "
                f"{self.timing.renew_deadline + self.timing.pause_budget:g} s since its last renewal): "
                "another replica may lead by now, so it exits without touching its cycles; the "
                "Deployment restarts it as a standby"
            )
            self._exit(1)

    def _count_renewal(self, renewed: bool) -> None:
        self.renewals["ok" if renewed else "failed"] += 1

    def start(self, *, api: ApiClient) -> None:
        self._task = asyncio.create_task(self._elect_forever(api=api), name="bindery leader election")

    async def close(self) -> None:
        """Graceful stop: stop leading (pause every profile), then hand the lease over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _elect_forever(self, *, api: ApiClient) -> None:
        while True:
            elector = LeaderElector(
                api=api,
                namespace=self._namespace,
                name=self._name,
                identity=f"{self._hostname}_{uuid.uuid4().hex[:8]}",
                timing=self.timing,
                logger=self._logger,
                on_renewal=self._count_renewal,
                hold_back=self._hold_back,
                claims=self._claims,
            )
            try:
                await elector.acquire()
            except Exception as exc:  # a bug or an unexpected answer: stand by again, never crash
                self._logger.error(f"leader election failed: {exc}; retrying")
                await asyncio.sleep(self.timing.retry_period)
                continue
            graceful = True
            self._elector = elector
            started = asyncio.create_task(self._on_started(), name="bindery start leading")
            try:
                await elector.renew()
                graceful = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._logger.error(f"renewing the {elector.lease} failed: {exc}; stopped leading")
                graceful = False
            finally:
                await self._stop_leading(elector=elector, started=started, graceful=graceful)

    async def _stop_leading(
        self, *, elector: LeaderElector, started: asyncio.Task[None], graceful: bool
    ) -> None:
        """Pause every profile before the exit point, or exit; a graceful shutdown just pauses.

        Pausing cancels the cycles in flight, which release their reservations: safe only while no
        other replica can lead, since the next leader reuses a pod's reservation (the RM keys them
        by pod UID) and a late release would free capacity under a pod it binds.
        """
        exit_at = self._exit_at(elector)
        self._elector = None  # the fence closes before anything else happens
        started.cancel()
        if not graceful:
            self._exit_if_too_late(elector)

        async def stop() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await started
            await self._on_stopped()

        stopping = asyncio.create_task(stop(), name="bindery stop leading")
        if graceful or exit_at is None:
            await asyncio.shield(stopping)
            await elector.release()
            return
        done, _ = await asyncio.wait({stopping}, timeout=max(0.0, exit_at - time.monotonic()))
        if not done:
            self._logger.critical(
                f"could not stop the scheduling cycles before the exit point of the lost {elector.lease} "
                f"({self.timing.pause_budget:g} s after the renew deadline); exiting so that a process "
                "which may still be binding cannot overlap the next leader (the Deployment restarts "
                "this replica as a standby)"
            )
            self._exit(1)
        try:
            stopping.result()
        except Exception as exc:
            self._logger.error(f"pausing the profiles after losing the {elector.lease} failed: {exc}")
