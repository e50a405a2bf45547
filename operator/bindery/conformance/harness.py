"""What every conformance check stands on: the configuration, a raw HTTP harness that remembers
what to clean up, and the assertions that turn a wrong answer into a message saying where.

Kept apart from the checks so that groups of checks can live in modules of their own
(:mod:`bindery.conformance.groups` for contract v1.1 reservation groups,
:mod:`bindery.conformance.batch` for its batches).
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "CONTRACT_VERSIONS",
    "DEFAULT_RESOURCE",
    "ConformanceConfig",
    "ConformanceFailure",
    "Harness",
    "RevokeHook",
    "expect_problem",
    "expect_reservation",
    "expect_status",
    "instant",
    "is_json",
    "require",
]

DEFAULT_RESOURCE = "bindery.dev/conformance-slot"
#: The minor versions of contract v1 the kit knows, oldest first.
CONTRACT_VERSIONS = ("1.0", "1.1", "1.2")


#: Takes a reservation back as the RM's operator would (contract v1.2 ``revocation``): called with the
#: reservation id and a reason; returns once the RM was told (it may show the state a little later).
RevokeHook = Callable[[str, str], Awaitable[None]]


class ConformanceFailure(AssertionError):
    """The server under test broke the contract; the message says where."""


@dataclass(frozen=True)
class ConformanceConfig:
    url: str
    token: str
    resource: str = DEFAULT_RESOURCE
    capacity: int = 4
    ttl_seconds: int = 2
    ca_file: str | None = None
    client_cert: tuple[str, str] | None = None
    timeout: float = 10.0
    #: v1.1 groups: a node label key whose value differs on every node of the pool (for example
    #: ``kubernetes.io/hostname``); without one the topology check tests only a key no node has.
    topology_key: str | None = None
    #: v1.2 ``revocation``: how to make the RM revoke a reservation (see :mod:`.revocation`).
    revoke: RevokeHook | None = None


@dataclass
class Harness:
    """A raw HTTP session against the server under test, remembering what to clean up."""

    config: ConformanceConfig
    http: httpx.AsyncClient
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    created: list[str] = field(default_factory=list)
    created_groups: list[str] = field(default_factory=list)
    #: The contract version the RM is certified at (``--contract-version``).
    contract_version: str = CONTRACT_VERSIONS[-1]
    _counter: int = 0

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.token}"}

    @property
    def scheduler_name(self) -> str:
        return f"conformance-{self.run_id}"

    def request_body(
        self,
        *,
        key: str | None = None,
        amount: str = "1",
        ttl: int | None = None,
        scheduler_name: str | None = None,
    ) -> dict[str, Any]:
        """A valid reservation request for one slot; a fresh pod uid/key unless ``key`` is given."""
        self._counter += 1
        uid = key or f"{self.run_id}-pod-{self._counter}"
        return {
            "pod": {
                "uid": uid,
                "namespace": "conformance",
                "name": f"pod-{uid}",
                "schedulerName": scheduler_name or self.scheduler_name,
                "priority": 0,
                "labels": {"app": "conformance"},
            },
            "resources": {self.config.resource: amount},
            "placement": {"tolerations": [{"operator": "Exists"}]},
            "idempotencyKey": uid,
            "ttlSeconds": ttl or 60,
        }

    async def reserve(self, body: dict[str, Any]) -> httpx.Response:
        response = await self.http.post("/v1/reservations", json=body, headers=self.auth)
        if response.status_code in (200, 201) and is_json(response):
            self.created.append(response.json().get("id", ""))
        return response

    async def get(self, reservation_id: str) -> httpx.Response:
        return await self.http.get(f"/v1/reservations/{reservation_id}", headers=self.auth)

    async def commit(self, reservation_id: str, *, pod_uid: str | None = None) -> httpx.Response:
        return await self.http.post(
            f"/v1/reservations/{reservation_id}/commit", json={}, params=_pod(pod_uid), headers=self.auth
        )

    async def release(self, reservation_id: str, *, pod_uid: str | None = None) -> httpx.Response:
        return await self.http.delete(
            f"/v1/reservations/{reservation_id}", params=_pod(pod_uid), headers=self.auth
        )

    async def renew(self, reservation_id: str, *, pod_uid: str, ttl: int) -> httpx.Response:
        return await self.http.post(
            f"/v1/reservations/{reservation_id}/renew",
            json={"podUid": pod_uid, "ttlSeconds": ttl},
            headers=self.auth,
        )

    async def list_all(self, **params: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        query = dict(params)
        for _ in range(1000):
            response = await self.http.get("/v1/reservations", params=query, headers=self.auth)
            expect_status(response, 200, "GET /v1/reservations")
            page = response.json()
            items.extend(page["items"])
            if not page.get("nextCursor"):
                return items
            query["cursor"] = page["nextCursor"]
        raise ConformanceFailure("GET /v1/reservations: pagination did not end after 1000 pages")

    # -- reservation groups (v1.1) ----------------------------------------------------------------

    def group_body(
        self,
        count: int,
        *,
        amount: str = "1",
        ttl: int | None = None,
        topology: Sequence[str] = (),
        key: str | None = None,
    ) -> dict[str, Any]:
        """A valid group request of ``count`` one-slot members (fresh pod uids and key)."""
        self._counter += 1
        name = f"{self.run_id}-group-{self._counter}"
        return {
            "group": {
                "namespace": "conformance",
                "name": name,
                "uid": f"{name}-uid",
                "schedulerName": self.scheduler_name,
            },
            "members": [
                {
                    "pod": {
                        "uid": f"{name}-{index}",
                        "namespace": "conformance",
                        "name": f"pod-{name}-{index}",
                        "schedulerName": self.scheduler_name,
                    },
                    "resources": {self.config.resource: amount},
                    "placement": {"tolerations": [{"operator": "Exists"}]},
                }
                for index in range(count)
            ],
            "topology": [{"key": topology_key} for topology_key in topology],
            "idempotencyKey": key or name,
            "ttlSeconds": ttl or 60,
        }

    async def reserve_group(self, body: dict[str, Any]) -> httpx.Response:
        response = await self.http.post("/v1/reservation-groups", json=body, headers=self.auth)
        if response.status_code in (200, 201) and is_json(response):
            answer = response.json()
            self.created_groups.append(str(answer.get("id", "")))
            self.created.extend(str(member.get("id", "")) for member in answer.get("members") or [])
        return response

    async def get_group(self, group_id: str) -> httpx.Response:
        return await self.http.get(f"/v1/reservation-groups/{group_id}", headers=self.auth)

    async def release_group(self, group_id: str) -> httpx.Response:
        return await self.http.delete(f"/v1/reservation-groups/{group_id}", headers=self.auth)

    async def renew_group(self, group_id: str, *, ttl: int) -> httpx.Response:
        return await self.http.post(
            f"/v1/reservation-groups/{group_id}/renew", json={"ttlSeconds": ttl}, headers=self.auth
        )

    # -- batches (v1.1) ------------------------------------------------------------------------

    async def batch(self, operations: Sequence[Any]) -> httpx.Response:
        """``POST /v1/batch``; the reservations its results hold are released at cleanup."""
        response = await self.http.post("/v1/batch", json={"operations": list(operations)}, headers=self.auth)
        if response.status_code == 200 and is_json(response):
            answer = response.json()
            results = answer.get("results") if isinstance(answer, dict) else None
            for result in results if isinstance(results, list) else []:
                reservation = result.get("reservation") if isinstance(result, dict) else None
                if isinstance(reservation, dict) and isinstance(reservation.get("id"), str):
                    self.created.append(reservation["id"])
        return response

    async def cleanup(self) -> None:
        for group_id in self.created_groups:
            if group_id:
                await self.release_group(group_id)
        self.created_groups.clear()
        for reservation_id in self.created:
            if reservation_id:
                await self.release(reservation_id)
        self.created.clear()


def _pod(pod_uid: str | None) -> dict[str, str]:
    return {} if pod_uid is None else {"podUid": pod_uid}


def _media(response: httpx.Response) -> str:
    value: str = response.headers.get("content-type") or ""
    return value.split(";", maxsplit=1)[0].strip()


def is_json(response: httpx.Response) -> bool:
    return _media(response) == "application/json"


def expect_status(response: httpx.Response, expected: int | Sequence[int], what: str) -> None:
    allowed = (expected,) if isinstance(expected, int) else tuple(expected)
    if response.status_code not in allowed:
        raise ConformanceFailure(
            f"{what}: expected HTTP {' or '.join(map(str, allowed))}, got {response.status_code}: "
            f"{response.text[:300]}"
        )


def expect_problem(response: httpx.Response, status: int, kind: str, what: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status and type."""
    expect_status(response, status, what)
    media = _media(response)
    if media != "application/problem+json":
        raise ConformanceFailure(f"{what}: expected content type application/problem+json, got {media!r}")
    try:
        body = response.json()
    except json.JSONDecodeError:
        raise ConformanceFailure(f"{what}: the problem body is not JSON: {response.text[:200]!r}") from None
    if not isinstance(body, dict) or body.get("type") != kind or body.get("status") != status:
        raise ConformanceFailure(f"{what}: expected problem type {kind} with status {status}, got {body}")
    if not isinstance(body.get("title"), str):
        raise ConformanceFailure(f"{what}: the problem has no title: {body}")
    return body


def expect_reservation(response: httpx.Response, status: int | Sequence[int], what: str) -> dict[str, Any]:
    expect_status(response, status, what)
    if not is_json(response):
        raise ConformanceFailure(
            f"{what}: expected application/json, got {response.headers.get('content-type')}"
        )
    body = response.json()
    for key in ("id", "node", "state", "podUid", "schedulerName"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise ConformanceFailure(f"{what}: the reservation lacks a string {key!r}: {body}")
    return dict(body)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceFailure(message)


def instant(value: object, what: str) -> datetime.datetime:
    if not isinstance(value, str):
        raise ConformanceFailure(f"{what} must be a date-time string, got {value!r}")
    try:
        return datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ConformanceFailure(f"{what} is not an RFC 3339 date-time: {value!r}") from None
