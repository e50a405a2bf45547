"""Leadership, in a room of its own: the election loop, the fence, and how leading starts and stops.

The runtime learns about leadership through two callbacks only — `on_started` (activate every
profile) and `on_stopped` (pause every profile) — and asks one question, `holds()`, on the path
that writes a Binding (`FencedBinder`). Everything about Leases stays here and in `leader.py`.

A term, end to end:

1. Stand by: read the Lease every retry period; take it once the record has not changed for its
   whole duration on this replica's monotonic clock (`leader.may_acquire`).
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
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NoReturn

from kubernetes_asyncio import client

from bindery.controller.leader import LeaderElector, LeaseTiming, past_exit_point
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import Binder

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


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
    ) -> None:
        self._namespace = namespace
        self._name = name
        self._hostname = hostname
        self.timing = timing
        self._logger = logger
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._exit = exit_process
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

    def start(self, *, api: client.ApiClient) -> None:
        self._task = asyncio.create_task(self._elect_forever(api=api), name="bindery leader election")

    async def close(self) -> None:
        """Graceful stop: stop leading (pause every profile), then hand the lease over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _elect_forever(self, *, api: client.ApiClient) -> None:
        while True:
            elector = LeaderElector(
                api=api,
                namespace=self._namespace,
                name=self._name,
                identity=f"{self._hostname}_{uuid.uuid4().hex[:8]}",
                timing=self.timing,
                logger=self._logger,
                on_renewal=self._count_renewal,
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


class FencedBinder:
    """A Binder that sends nothing unless `holds()`: a replica past its renew deadline never binds.

    Refusing by raising would make the cycle report a failure on the pod (an Event and a condition
    written by a replica that is not the leader) and release a reservation the next leader may
    reuse. Instead the Binding waits, unsent, for what always follows a lost lease: the pause, which
    cancels the cycle mid-Binding (its reservation is kept), or the exit of the process.

    The fence is checked before the Binding starts *and* while it is in flight: a timer at the renew
    deadline cancels a Binding that has not finished by then. A process frozen (SIGSTOP, a VM pause)
    while opening the connection or between the check and the write would otherwise send the
    Binding when it wakes, long after another replica took over. On waking, asyncio runs the expired
    timer before the task resumes, so the request is cancelled before it is written. What no timer
    can stop is a write already under way in the step the process froze in (from the fence check to
    the socket write may be one synchronous step): it goes out on waking, and the apiserver refuses
    it (409) because the next leader bound that pod.
    """

    def __init__(
        self,
        *,
        binder: Binder,
        holds: Callable[[], bool],
        holds_for: Callable[[], float],
        logger: Logger,
    ) -> None:
        self._binder = binder
        self._holds = holds
        self._holds_for = holds_for
        self._logger = logger
        #: Bindings withheld, or cut in flight, because the lease was not held (tests and logs read it)
        self.withheld = 0

    async def bind(  # the Binder protocol's signature: `timeout` is the Binding's own bound
        self,
        *,
        pod: PodInfo,
        node: str,
        annotations: Mapping[str, str],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        if not self._holds():
            await self._withhold(
                f"not binding pod {pod.key} to {node}: this replica no longer holds the lease; "
                "the cycle ends when scheduling pauses"
            )
        task = asyncio.current_task()
        assert task is not None, "a Binding is always sent from a task"
        loop = asyncio.get_running_loop()
        cut = False
        timer: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal timer, cut
            if (left := self._holds_for()) > 0:
                timer = loop.call_later(left, check)  # renewed meanwhile: look again then
                return
            cut = True
            self._holds()  # past its exit point (it was frozen), the process exits right here
            task.cancel()

        timer = loop.call_later(self._holds_for(), check)
        try:
            if timeout is None:
                await self._binder.bind(pod=pod, node=node, annotations=annotations)
            else:
                await self._binder.bind(pod=pod, node=node, annotations=annotations, timeout=timeout)
            return
        except asyncio.CancelledError:
            if not cut or task.uncancel() > 0:
                raise  # the pause or a stop, not (only) the fence
        finally:
            if timer is not None:
                timer.cancel()
        await self._withhold(
            f"stopped binding pod {pod.key} to {node}: this replica's lease ran out while the Binding "
            "was in flight (it may or may not have reached the apiserver); the cycle ends when "
            "scheduling pauses and keeps its reservation"
        )

    async def _withhold(self, message: str) -> NoReturn:
        self.withheld += 1
        self._logger.warning(message)
        await asyncio.Event().wait()  # cancelled by the pause
        raise AssertionError("unreachable: only cancellation ends the wait")
