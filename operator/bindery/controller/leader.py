"""Leader election on a coordination.k8s.io Lease, as kube-scheduler does (15 s / 10 s / 2 s).

Two active replicas would reserve capacity for the same pending pods and release each other's
reservations, so only the leader schedules. Standbys keep their watches warm and take over when the
lease expires. Kopf's peering is not used: it pauses operators by priority without a lease and
without fencing. The lease is updated with the resourceVersion it was read at, so two candidates
can never both believe they acquired it. A leader that cannot renew within `renew_deadline` stops
leading (kube-scheduler exits; here the operator stops and its supervisor restarts it).

The decisions (may I take the lease? is it still mine?) are pure functions of the Lease and the
clock; only `LeaderElector.run` talks to the apiserver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


@dataclasses.dataclass(frozen=True)
class LeaseTiming:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def may_acquire(*, lease: Mapping[str, Any] | None, identity: str, now: datetime.datetime) -> bool:
    """Pure: the lease is absent, ours, released, or expired."""
    if lease is None:
        return True
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return True
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return renewed is None or renewed + datetime.timedelta(seconds=duration) < now


def claimed_spec(
    *, lease: Mapping[str, Any] | None, identity: str, now: datetime.datetime, timing: LeaseTiming
) -> dict[str, Any]:
    """Pure: the Lease spec that makes `identity` the holder (keeps acquireTime while renewing)."""
    spec = dict((lease or {}).get("spec") or {})
    renewing = spec.get("holderIdentity") == identity
    transitions = int(spec.get("leaseTransitions") or 0)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": int(timing.lease_duration),
        "acquireTime": spec.get("acquireTime") if renewing else micro_time(now),
        "renewTime": micro_time(now),
        "leaseTransitions": transitions if renewing or lease is None else transitions + 1,
    }


class LeaderElector:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        logger: Logger,
    ) -> None:
        self._coordination = client.CoordinationV1Api(api)
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._timing = timing or LeaseTiming()
        self._logger = logger
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()

    async def run(self) -> None:
        """Acquire, then renew until renewing fails for `renew_deadline`; then set `lost` and return."""
        while True:
            if await self._try_claim():
                break
            await asyncio.sleep(self._timing.retry_period)
        self._logger.info(
            f"became the leader (Lease {self._namespace}/{self._name}, identity {self.identity})"
        )
        self.leading.set()
        loop = asyncio.get_running_loop()
        last_renewal = loop.time()
        while True:
            await asyncio.sleep(self._timing.retry_period)
            if await self._try_claim():
                last_renewal = loop.time()
            elif loop.time() - last_renewal > self._timing.renew_deadline:
                self._logger.error(f"lost the Lease {self._namespace}/{self._name}: stopped leading")
                self.leading.clear()
                self.lost.set()
                return

    async def release(self) -> None:
        """Give the Lease up on a graceful stop so a standby takes over at once, not after expiry."""
        try:
            lease = await self._read()
            spec = dict((lease or {}).get("spec") or {})
            if lease is None or spec.get("holderIdentity") != self.identity:
                return
            spec["holderIdentity"] = None
            body = {"metadata": {"name": self._name, "resourceVersion": lease["metadata"]["resourceVersion"]}}
            await self._coordination.replace_namespaced_lease(
                name=self._name, namespace=self._namespace, body={**body, "spec": spec}
            )
        except (client.ApiException, OSError, TimeoutError, aiohttp.ClientError) as exc:
            self._logger.warning(f"could not release the Lease {self._namespace}/{self._name}: {exc}")
        finally:
            self.leading.clear()

    async def _try_claim(self) -> bool:
        now = datetime.datetime.now(datetime.UTC)
        try:
            lease = await self._read()
            if not may_acquire(lease=lease, identity=self.identity, now=now):
                return False
            spec = claimed_spec(lease=lease, identity=self.identity, now=now, timing=self._timing)
            if lease is None:
                await self._coordination.create_namespaced_lease(
                    namespace=self._namespace, body={"metadata": {"name": self._name}, "spec": spec}
                )
            else:
                body = {
                    "metadata": {"name": self._name, "resourceVersion": lease["metadata"]["resourceVersion"]}
                }
                await self._coordination.replace_namespaced_lease(
                    name=self._name, namespace=self._namespace, body={**body, "spec": spec}
                )
        except client.ApiException as exc:
            if exc.status not in (404, 409):  # 409: someone else wrote it first
                self._logger.warning(f"Lease {self._namespace}/{self._name}: HTTP {exc.status} {exc.reason}")
            return False
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            self._logger.warning(f"Lease {self._namespace}/{self._name}: {exc}")
            return False
        return True

    async def _read(self) -> dict[str, Any] | None:
        try:
            lease = await self._coordination.read_namespaced_lease(name=self._name, namespace=self._namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = self._coordination.api_client.sanitize_for_serialization(lease)
        return body
