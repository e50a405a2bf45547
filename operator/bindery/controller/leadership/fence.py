"""The fence on the path that writes a Binding: a replica past its renew deadline never binds.

Only :meth:`bindery.controller.leadership.term.Leadership.holds` is asked; see :class:`FencedBinder`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import NoReturn

from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import Binder
from bindery.typedefs import Logger


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
