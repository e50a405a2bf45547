"""The binding pool: where pods wait in PreBind, apart from the scheduling slots.

A PreBind wait can last minutes (a volume being provisioned: up to ``volumeBindTimeoutSeconds``,
600 s by default). Counted against ``maxInFlight``, as it once was, a namespace with that many
pods whose claims are never provisioned held every slot, and no other namespace's pod was tried
until their timeouts. kube-scheduler runs its binding cycle apart from its scheduling cycle; here a
PreBind plugin that is about to wait calls :meth:`~bindery.scheduling.framework.CycleContext.
wait_apart`, the pod leaves the in-flight budget and enters this pool.

The pool is bounded (``maxBindingWaits``) because each pod in it polls the apiserver for its
claims; optionally at most ``maxBindingWaitsPerNamespace`` of them per namespace. A pod that finds
the pool full waits in the pool's own queue: no slot, no apiserver reads, its reservation's lease
renewed meanwhile. Places are given namespace by namespace in turn (first come first served within
one), so a namespace with hundreds of queued pods does not keep another's one pod waiting behind
all of them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging

from bindery.scheduling.decisions import Failure, FailureKind, Stage
from bindery.scheduling.defaults import call_budget
from bindery.scheduling.framework import CycleContext, Status
from bindery.scheduling.lease import MIN_CALL_SECONDS

__all__ = ["DEFAULT_MAX_BINDING_WAITS", "BindingPool", "BindingStats", "admit"]

log = logging.getLogger(__name__)

#: Pods of one ResourceManager waiting in PreBind at once (spec.maxBindingWaits' default). Each
#: reads its claims every half second: 64 waits are about 128 GETs a second at most.
DEFAULT_MAX_BINDING_WAITS = 64
#: How often a pod queued for the pool checks that it still exists and that its lease holds.
QUEUED_POLL_SECONDS = 1.0


def _check(size: int, per_namespace: int | None) -> None:
    if size < 1:
        raise ValueError(f"the binding pool's size is {size}; it must be at least 1")
    if per_namespace is not None and per_namespace < 1:
        raise ValueError(f"the binding pool's per-namespace share is {per_namespace}; it must be at least 1")


@dataclasses.dataclass(frozen=True, slots=True)
class BindingStats:
    #: pods waiting in PreBind inside the pool
    admitted: int
    #: pods waiting for a place in the pool
    queued: int


class BindingPool:
    """Places for PreBind waits, per ResourceManager. Not thread-safe; one event loop."""

    def __init__(self, *, size: int = DEFAULT_MAX_BINDING_WAITS, per_namespace: int | None = None) -> None:
        _check(size, per_namespace)
        self._size = size
        self._share = per_namespace
        self._admitted: dict[str, str] = {}  # uid -> namespace
        self._held: collections.Counter[str] = collections.Counter()  # namespace -> admitted
        #: namespace -> its queued pods, in arrival order
        self._queued: dict[str, dict[str, asyncio.Future[None]]] = {}
        #: namespace -> when it was last given a place (namespaces with pods held or queued only)
        self._served: dict[str, int] = {}
        self._grants = itertools.count()

    def reconfigure(self, *, size: int, per_namespace: int | None) -> None:
        _check(size, per_namespace)
        self._size, self._share = size, per_namespace
        self._grant()

    def stats(self) -> BindingStats:
        return BindingStats(admitted=len(self._admitted), queued=sum(len(q) for q in self._queued.values()))

    def ask(self, *, uid: str, namespace: str) -> asyncio.Future[None]:
        """A place for the pod: a future done once it is admitted (at once if there is room)."""
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if uid in self._admitted:
            ticket.set_result(None)
            return ticket
        self._served.setdefault(namespace, -1)
        self._queued.setdefault(namespace, {})[uid] = ticket
        self._grant()
        return ticket

    def release(self, uid: str) -> None:
        """The pod's wait ended (or it gave up queueing): its place goes to the next in turn.
        Idempotent; an unknown pod is ignored."""
        namespace = self._admitted.pop(uid, None)
        if namespace is not None:
            self._held[namespace] -= 1
            if self._held[namespace] <= 0:
                del self._held[namespace]
        else:
            for ns, queued in list(self._queued.items()):
                ticket = queued.pop(uid, None)
                if ticket is not None:
                    ticket.cancel()
                    if not queued:
                        del self._queued[ns]
                    break
        self._grant()

    def _grant(self) -> None:
        """Free places to queued pods: the namespace served longest ago first (never served: first)."""
        while len(self._admitted) < self._size:
            eligible = [ns for ns in self._queued if self._share is None or self._held[ns] < self._share]
            if not eligible:
                break
            namespace = min(eligible, key=lambda ns: self._served.get(ns, -1))
            queued = self._queued[namespace]
            uid, ticket = next(iter(queued.items()))
            del queued[uid]
            if not queued:
                del self._queued[namespace]
            if ticket.done():  # its waiter was cancelled
                continue
            self._admitted[uid] = namespace
            self._held[namespace] += 1
            self._served[namespace] = next(self._grants)
            ticket.set_result(None)
        for namespace in [ns for ns in self._served if ns not in self._held and ns not in self._queued]:
            del self._served[namespace]


async def admit(*, ctx: CycleContext, pool: BindingPool) -> Status:
    """Wait for the pod's place in the pool; meanwhile check it still exists and keep its lease.

    A failure (the pod gone, its lease lost) leaves the queue; so does a cancellation.
    """
    pod = ctx.pod
    ticket = pool.ask(uid=pod.uid, namespace=pod.namespace)
    if ticket.done():
        return Status.success()
    log.info("pod %s waits for a place in the binding pool", pod.key)
    try:
        while not ticket.done():
            if ctx.ports.pods.get(pod.uid) is None:
                pool.release(pod.uid)
                return Status.failed(
                    Failure(
                        kind=FailureKind.POD_GONE,
                        message="the pod was deleted or bound by someone else while it waited for the "
                        "binding pool",
                        stage=Stage.PRE_BIND,
                    )
                )
            if await call_budget(ctx, cap=QUEUED_POLL_SECONDS, needed=MIN_CALL_SECONDS) is None:
                pool.release(pod.uid)
                return Status.failed(
                    Failure(
                        kind=FailureKind.LEASE_EXPIRED,
                        message="the reservation's lease ran out and could not be renewed while the pod "
                        "waited for a place in the binding pool",
                        stage=Stage.PRE_BIND,
                    )
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(QUEUED_POLL_SECONDS):
                    await asyncio.shield(ticket)
    except BaseException:
        pool.release(pod.uid)
        raise
    return Status.success()
