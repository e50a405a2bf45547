"""Leader election on a coordination.k8s.io Lease, as kube-scheduler does (15 s / 10 s / 2 s).

Two active replicas would reserve capacity for the same pending pods and release each other's
reservations, so only the leader schedules. Standbys keep their watches warm and take over when the
lease expires. Kopf's peering is not used: it pauses operators by priority without a lease and
without fencing. The lease is updated with the resourceVersion it was read at, so two candidates
can never both believe they acquired it.

Three rules make the lease a fence and not just a flag:

- **Expiry is judged by observation, never by the holder's clock.** A standby remembers the record
  as it last saw it (holder, renewTime, resourceVersion) and the moment, on its own monotonic
  clock, at which it saw that record change; it may take the lease only once `leaseDurationSeconds`
  have passed on that clock without a change. This is what client-go does (`observedTime`). A
  `renewTime` far in the past (the holder's clock is behind, or ours is ahead) therefore cannot make
  a live lease look expired: a leader that keeps renewing keeps changing the record.
- **The leader's own validity is counted from before its write.** `last_renewal` is the monotonic
  time at which the successful create/replace was *sent*; a standby observes the new record no
  earlier than the write landed, so the leader's view of "my lease is good until `last_renewal +
  renew_deadline`" always ends at least `lease_duration - renew_deadline` before any standby may
  take over (assuming both monotonic clocks tick at the same rate, not that they agree on the time).
- **Every lease call is bounded** by `LeaseTiming.request_timeout` and by what is left until the
  renew deadline, so a hung apiserver connection cannot keep the renew loop from noticing that the
  deadline passed.

The decisions (what did I observe? may I take the lease? am I still within my renew deadline?) are
pure functions of the Lease and a monotonic clock reading; only `LeaderElector` talks to the
apiserver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any

from bindery.k8s import ApiClient, ApiError, Conflict, NotFound, create, get, replace, resources
from bindery.typedefs import Logger


@dataclasses.dataclass(frozen=True)
class LeaseTiming:
    """kube-scheduler's defaults. `lease_duration > renew_deadline > retry_period` is required."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"lease timing {self.lease_duration:g}/{self.renew_deadline:g}/{self.retry_period:g} s "
                "is unsafe: it needs lease duration > renew deadline > retry period > 0, so that a "
                "leader stops before its lease can expire; use e.g. kube-scheduler's 15/10/2"
            )

    @property
    def request_timeout(self) -> float:
        """Bound of one lease call (get, create or replace): a retry period, and never more than a
        third of the renew deadline, so several attempts fit before the leader must give up."""
        return min(self.retry_period, self.renew_deadline / 3)

    @property
    def pause_budget(self) -> float:
        """How long a leader that missed its renew deadline may take to stop its cycles: half the gap
        between the renew deadline and the lease's expiry, leaving the other half as a margin for
        Bindings already on the wire. A pause that overruns it makes the process exit."""
        return (self.lease_duration - self.renew_deadline) / 2


@dataclasses.dataclass(frozen=True)
class Observation:
    """The Lease record as this replica last saw it, and when (its monotonic clock) it last changed."""

    holder: str | None
    renew_time: str | None
    resource_version: str | None
    lease_duration: float
    observed_at: float

    def same_record(self, other: Observation) -> bool:
        return (self.holder, self.renew_time, self.resource_version, self.lease_duration) == (
            other.holder,
            other.renew_time,
            other.resource_version,
            other.lease_duration,
        )


def micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def observe(
    *, previous: Observation | None, lease: Mapping[str, Any] | None, now: float
) -> Observation | None:
    """Pure: the record in `lease` as seen at monotonic time `now`.

    `observed_at` moves only when the record differs from `previous`: an unchanged record keeps the
    time it was first seen, which is what expiry is counted from. No Lease → None.
    """
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    seen = Observation(
        holder=spec.get("holderIdentity") or None,
        renew_time=spec.get("renewTime") or None,
        resource_version=(lease.get("metadata") or {}).get("resourceVersion"),
        lease_duration=float(spec.get("leaseDurationSeconds") or 0),
        observed_at=now,
    )
    if previous is not None and previous.same_record(seen):
        return previous
    return seen


def may_acquire(*, observation: Observation | None, identity: str, now: float) -> bool:
    """Pure: the lease is absent, ours, released, or unchanged for its whole duration on our clock."""
    if observation is None or not observation.holder or observation.holder == identity:
        return True
    return observation.observed_at + observation.lease_duration < now


def within_renew_deadline(*, last_renewal: float | None, now: float, timing: LeaseTiming) -> bool:
    """Pure: may a leader whose last successful renewal was sent at `last_renewal` still act?

    This is the fence: past the renew deadline a leader starts no Binding and stops its cycles,
    whether or not it has noticed yet that its renewals fail (a process that was stopped and
    resumed finds itself past it at once).
    """
    return last_renewal is not None and now - last_renewal < timing.renew_deadline


def past_exit_point(*, last_renewal: float | None, now: float, timing: LeaseTiming) -> bool:
    """Pure: is it too late for a leader that lost its lease to pause in order (it must exit)?

    The exit point is `pause_budget` after the renew deadline, midway to the earliest moment a
    standby may take the lease: cycles cancelled after it would release reservations that the next
    leader may already be reusing.
    """
    if last_renewal is None:
        return False
    return now >= last_renewal + timing.renew_deadline + timing.pause_budget


def claimed_spec(
    *, lease: Mapping[str, Any] | None, identity: str, now: datetime.datetime, timing: LeaseTiming
) -> dict[str, Any]:
    """Pure: the Lease spec that makes `identity` the holder (keeps acquireTime while renewing).

    `renewTime` is informational only (for people and for other tools); no replica of Bindery
    judges expiry by it.
    """
    spec = dict((lease or {}).get("spec") or {})
    renewing = spec.get("holderIdentity") == identity
    transitions = int(spec.get("leaseTransitions") or 0)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, round(timing.lease_duration)),
        "acquireTime": spec.get("acquireTime") if renewing else micro_time(now),
        "renewTime": micro_time(now),
        "leaseTransitions": transitions if renewing or lease is None else transitions + 1,
    }


class LeaseLost(Exception):
    """Another replica holds the lease: this one is no longer the leader."""


class LeaderElector:
    """One candidacy: `acquire()` until the lease is ours, then `renew()` until it is lost."""

    def __init__(
        self,
        *,
        api: ApiClient,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        logger: Logger,
        clock: Callable[[], float] = time.monotonic,
        on_renewal: Callable[[bool], None] = lambda renewed: None,
    ) -> None:
        self._api = api
        self._on_renewal = on_renewal  # told whether each renewal attempt succeeded (metrics)
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self.timing = timing or LeaseTiming()
        self._logger = logger
        self._clock = clock
        self.observation: Observation | None = None
        #: monotonic time the last successful claim was sent; None until the lease is ours
        self.last_renewal: float | None = None

    @property
    def lease(self) -> str:
        return f"Lease {self._namespace}/{self._name}"

    def holds(self) -> bool:
        """The fence: the lease is ours and the renew deadline has not passed (monotonic clock)."""
        return within_renew_deadline(last_renewal=self.last_renewal, now=self._clock(), timing=self.timing)

    async def acquire(self) -> None:
        """Return once the lease is ours; try every retry period."""
        while True:
            if await self._try_claim(within=self.timing.request_timeout):
                break
            await asyncio.sleep(self.timing.retry_period)
        self._logger.info(f"became the leader ({self.lease}, identity {self.identity})")

    async def renew(self) -> None:
        """Renew every retry period; return when the renew deadline passed without a renewal, or
        at once when another replica is seen holding the lease."""
        while True:
            assert self.last_renewal is not None, "renew() before acquire()"
            left = self.last_renewal + self.timing.renew_deadline - self._clock()
            await asyncio.sleep(max(0.0, min(self.timing.retry_period, left)))
            left = self.last_renewal + self.timing.renew_deadline - self._clock()
            if left <= 0:
                self._logger.error(
                    f"could not renew the {self.lease} within the renew deadline "
                    f"({self.timing.renew_deadline:g} s): stopped leading"
                )
                return
            try:
                renewed = await self._try_claim(within=min(self.timing.request_timeout, left))
            except LeaseLost as lost:
                self._on_renewal(False)
                self._logger.error(f"lost the {self.lease}: {lost}; stopped leading")
                return
            self._on_renewal(renewed)

    async def release(self) -> None:
        """Give the Lease up on a graceful stop so a standby takes over at once, not after expiry."""
        self.last_renewal = None  # whatever happens below, this replica no longer acts as leader
        try:
            async with asyncio.timeout(self.timing.request_timeout * 2):
                lease = await self._read(within=self.timing.request_timeout)
                spec = dict((lease or {}).get("spec") or {})
                if lease is None or spec.get("holderIdentity") != self.identity:
                    return
                spec["holderIdentity"] = None
                metadata = {"name": self._name, "resourceVersion": lease["metadata"]["resourceVersion"]}
                await replace(
                    self._api,
                    resources.LEASES,
                    name=self._name,
                    namespace=self._namespace,
                    body={"metadata": metadata, "spec": spec},
                    request_timeout=self.timing.request_timeout,
                )
        except (ApiError, TimeoutError) as exc:
            self._logger.warning(f"could not release the {self.lease}: {exc}; it expires on its own")

    async def _try_claim(self, *, within: float) -> bool:
        """Read the lease and write it as ours if we may; bounded by `within` seconds in all.

        Raises `LeaseLost` when we were the leader and the lease shows another holder.
        """
        sent = self._clock()
        try:
            async with asyncio.timeout(within):
                lease = await self._read(within=within)
                self.observation = observe(previous=self.observation, lease=lease, now=self._clock())
                if not may_acquire(observation=self.observation, identity=self.identity, now=self._clock()):
                    if self.last_renewal is not None:
                        holder = self.observation.holder if self.observation else None
                        raise LeaseLost(f"it is held by {holder}")
                    return False
                sent = self._clock()
                written = await self._write(lease=lease, within=within)
        except (NotFound, Conflict):  # 409: someone else wrote it first
            return False
        except TimeoutError:
            self._logger.warning(f"{self.lease}: no answer within {within:g} s")
            return False
        except ApiError as exc:
            if exc.status:
                self._logger.warning(f"{self.lease}: HTTP {exc.status} {exc.reason or exc.message}")
            else:  # a transport failure, or the request's own timeout
                self._logger.warning(f"{self.lease}: {exc.message}")
            return False
        self.last_renewal = sent
        self.observation = observe(previous=self.observation, lease=written, now=sent)
        return True

    async def _write(self, *, lease: Mapping[str, Any] | None, within: float) -> dict[str, Any]:
        now = datetime.datetime.now(datetime.UTC)
        spec = claimed_spec(lease=lease, identity=self.identity, now=now, timing=self.timing)
        if lease is None:
            return await create(
                self._api,
                resources.LEASES,
                namespace=self._namespace,
                body={"metadata": {"name": self._name}, "spec": spec},
                request_timeout=within,
            )
        metadata = {"name": self._name, "resourceVersion": lease["metadata"]["resourceVersion"]}
        return await replace(
            self._api,
            resources.LEASES,
            name=self._name,
            namespace=self._namespace,
            body={"metadata": metadata, "spec": spec},
            request_timeout=within,
        )

    async def _read(self, *, within: float) -> dict[str, Any] | None:
        try:
            return await get(
                self._api,
                resources.LEASES,
                name=self._name,
                namespace=self._namespace,
                request_timeout=within,
            )
        except NotFound:
            return None
