"""The Lease's I/O: one candidacy that acquires, renews and releases the lease.

Every decision is a pure rule of :mod:`.rules` (what was observed, whether the lease may be taken,
whether the renew deadline passed); this class only reads and writes the Lease, each call bounded
by what is left of the renew deadline, and writes with the resourceVersion it read, so two
candidates can never both believe they acquired it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Callable, Mapping
from typing import Any

from bindery.apiserver import ApiClient, ApiError, Conflict, NotFound, create, get, replace, resources
from bindery.controller.leadership.rules import (
    LeaseTiming,
    Observation,
    claimed_spec,
    held_back,
    may_acquire,
    observe,
    within_renew_deadline,
)
from bindery.typedefs import Logger


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
        hold_back: Callable[[], float] | None = None,
        claims: asyncio.Lock | None = None,
    ) -> None:
        self._api = api
        #: seconds to leave a free lease to other replicas (a Lease per ResourceManager); None: never
        self._hold_back = hold_back
        #: one claim at a time among this process's candidacies, so `hold_back` counts every lease
        #: this replica took, the one taken a moment ago included
        self._claims = claims
        self._free_since: float | None = None  # when this candidacy first saw the lease free
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
            async with self._claims or contextlib.nullcontext():
                claimed = await self._try_claim(within=self.timing.request_timeout)
            if claimed:
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
                    self._free_since = None
                    if self.last_renewal is not None:
                        holder = self.observation.holder if self.observation else None
                        raise LeaseLost(f"it is held by {holder}")
                    return False
                if self.last_renewal is None and self._leave_to_others():
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

    def _leave_to_others(self) -> bool:
        """The lease is free: leave it to replicas that lead fewer profiles for a while (`hold_back`)."""
        if self._hold_back is None:
            return False
        now = self._clock()
        wait = self._hold_back()
        if wait > 0 and self._free_since is None:
            self._free_since = now
        return held_back(since=self._free_since, now=now, wait=wait)

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
