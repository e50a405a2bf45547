"""The pure rules of leader election on a coordination.k8s.io Lease (kube-scheduler's 15 s / 10 s / 2 s).

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
pure functions of the Lease and a monotonic clock reading, here; only
:class:`bindery.controller.leadership.elector.LeaderElector` talks to the apiserver.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from collections.abc import Mapping
from typing import Any


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


#: Longest a replica holds back from a free Lease per ResourceManager, in retry periods, however
#: many it leads already: the spread must never cost failover more than this.
MAX_HOLD_BACK_PERIODS = 2


def lease_name_for(*, base: str, resource_manager: str) -> str:
    """Pure: the Lease of one ResourceManager's profile (`bindery run --lease-per-resource-manager`).

    `<base>-<name>` while it fits a Lease's name (a DNS subdomain, at most 253 characters); a longer
    one is cut and ends in a digest of the whole, so two ResourceManagers never share a Lease.
    """
    name = f"{base}-{resource_manager}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: 253 - 11].rstrip('-.')}-{digest}"


def hold_back_seconds(*, leading: int, timing: LeaseTiming) -> float:
    """Pure: how long a replica leading `leading` other profiles waits before taking a free Lease.

    kube-scheduler has one Lease, so the first replica up leads everything. With a Lease per
    ResourceManager the same race would let one replica take every Lease and leave the others
    idle. A replica that already leads some waits a retry period per profile it leads (at most
    `MAX_HOLD_BACK_PERIODS`), so one that leads none takes the Lease first: the profiles spread
    over the replicas, and a lone survivor still takes every Lease over, a few seconds later.
    """
    return min(max(leading, 0), MAX_HOLD_BACK_PERIODS) * timing.retry_period


def held_back(*, since: float | None, now: float, wait: float) -> bool:
    """Pure: is a free Lease, first seen free at `since`, still to be left to other replicas?"""
    if wait <= 0:
        return False
    return since is None or now - since < wait
