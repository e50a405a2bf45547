"""Conformance checks for any server claiming to implement the Bindery RM contract v1.

The kit speaks raw HTTP (httpx), not Bindery's client, so it tests exactly what is on the wire:
status codes, content types, problem ``type`` URIs, and state.  Each check cleans up what it
created, so checks can run in any order against a live server.

What the server under test must provide (pass other values with ``--resource``/``--capacity``):

* a pool whose nodes together have exactly ``capacity`` (default 4) of the extended resource
  ``resource`` (default ``bindery.dev/conformance-slot``), nothing else using it during the run;
  each node's share must be a whole number.  The kit tolerates every taint, so tainted nodes are fine;
* a bearer token (the kit also checks that a missing or wrong one is refused);
* uncommitted reservations expire on time (the kit uses a 2-second lease).

Each check says which minor version of v1 introduced what it tests (``Check.since``): an RM that
implements v1.0 runs ``--contract-version 1.0`` and skips the v1.1 checks (``podUid`` on commit and
release, renew, reservation groups, batches), which a v1.0 server would fail; at 1.0 the ``groups-path``
check accepts a 404 on ``/v1/reservation-groups`` (see :mod:`bindery.conformance.groups`), and the
``batch-path`` check a 404 or 405 on ``/v1/batch`` (see :mod:`bindery.conformance.batch`). Below
1.2 the ``info-path`` check accepts a 404 or 405 on ``/v1/info`` and no check sends ``clusterId``
(see :mod:`bindery.conformance.clusters`).

For the topology check pass ``--topology-key``: a node label whose value differs on every node of
the pool (``kubernetes.io/hostname`` on Kubernetes nodes); without it only a key no node has is
tried.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bindery.conformance.batch import (
    check_batch_concurrent_no_overcommit,
    check_batch_invalid_operation,
    check_batch_limits,
    check_batch_matches_singles,
    check_batch_mixed,
    check_batch_path,
    check_batch_replay,
)
from bindery.conformance.clusters import check_cluster_id_validated, check_cluster_isolation, check_info_path
from bindery.conformance.groups import (
    check_group_all_or_nothing,
    check_group_bad_requests,
    check_group_concurrent,
    check_group_members,
    check_group_renew_and_expiry,
    check_group_replay,
    check_group_topology,
    check_groups_path,
)
from bindery.conformance.harness import (
    CONTRACT_VERSIONS,
    DEFAULT_RESOURCE,
    ConformanceConfig,
    ConformanceFailure,
    Harness,
    expect_problem,
    expect_reservation,
    expect_status,
    instant,
    require,
)
from bindery.conformance.preemption import check_group_preemption, check_preemption
from bindery.conformance.preferences import check_group_node_preferences, check_node_preferences
from bindery.conformance.revocation import check_revocation
from bindery.conformance.rulepreemption import check_rule_preemption
from bindery.rm.errors import ProblemType

__all__ = [
    "CHECKS",
    "CONTRACT_VERSIONS",
    "DEFAULT_RESOURCE",
    "Check",
    "ConformanceConfig",
    "ConformanceFailure",
    "Harness",
    "Result",
    "checks_for",
    "run_checks",
]

# -- the checks ------------------------------------------------------------------------------------


async def check_health(h: Harness) -> None:
    """/healthz and /readyz answer 200 without authentication."""
    for path in ("/healthz", "/readyz"):
        expect_status(await h.http.get(path), 200, f"GET {path}")


async def check_auth_required(h: Harness) -> None:
    """A missing or wrong bearer token gets 401 unauthorized and changes nothing."""
    body = h.request_body()
    uid = body["pod"]["uid"]
    missing = await h.http.post("/v1/reservations", json=body)
    expect_problem(missing, 401, ProblemType.UNAUTHORIZED, "reserve without a token")
    wrong = await h.http.post(
        "/v1/reservations", json=body, headers={"Authorization": "Bearer not-the-token"}
    )
    expect_problem(wrong, 401, ProblemType.UNAUTHORIZED, "reserve with a wrong token")
    listed = await h.http.get("/v1/reservations")
    expect_problem(listed, 401, ProblemType.UNAUTHORIZED, "list without a token")
    released = await h.http.delete("/v1/reservations/anything")
    expect_problem(released, 401, ProblemType.UNAUTHORIZED, "release without a token")
    require(not await h.list_all(podUid=uid), "a request refused for its token still created a reservation")


async def check_bad_requests(h: Harness) -> None:
    """Malformed or invalid requests get 4xx problem+json and change nothing."""

    def bad(**changes: Any) -> bytes:
        body = h.request_body()
        body.update(changes)
        return json.dumps(body).encode()

    uid_probe = h.request_body()
    cases: list[tuple[str, bytes, str, int, str]] = [
        ("malformed JSON", b'{"pod": ', "application/json", 400, ProblemType.INVALID_REQUEST),
        ("an unknown field", bad(colour="red"), "application/json", 400, ProblemType.INVALID_REQUEST),
        ("cpu: -1", bad(resources={"cpu": "-1"}), "application/json", 400, ProblemType.INVALID_REQUEST),
        (
            "memory: 1e400",
            bad(resources={"memory": "1e400"}),
            "application/json",
            400,
            ProblemType.INVALID_REQUEST,
        ),
        (
            "a garbage quantity",
            bad(resources={"cpu": "lots"}),
            "application/json",
            400,
            ProblemType.INVALID_REQUEST,
        ),
        (
            "an invalid resource name",
            bad(resources={"Not A/Valid Name": "1"}),
            "application/json",
            400,
            ProblemType.INVALID_REQUEST,
        ),
        ("a missing field", b'{"resources": {}}', "application/json", 400, ProblemType.INVALID_REQUEST),
        ("a JSON array", b"[]", "application/json", 400, ProblemType.INVALID_REQUEST),
        ("ttlSeconds: 0", bad(ttlSeconds=0), "application/json", 400, ProblemType.INVALID_REQUEST),
        ("a text/plain body", bad(), "text/plain", 415, ProblemType.UNSUPPORTED_MEDIA_TYPE),
        (
            "a 2 MiB body",
            bad(padding="x" * (2 * 1024 * 1024)),
            "application/json",
            413,
            ProblemType.PAYLOAD_TOO_LARGE,
        ),
    ]
    for what, content, media, status, kind in cases:
        response = await h.http.post(
            "/v1/reservations", content=content, headers={**h.auth, "Content-Type": media}
        )
        if status == 413 and response.status_code == 400:
            # A server whose body limit is above 2 MiB rejects the unknown padding field instead.
            expect_problem(response, 400, ProblemType.INVALID_REQUEST, f"reserve with {what}")
        else:
            expect_problem(response, status, kind, f"reserve with {what}")
    expect_problem(
        await h.http.get("/v1/reservations", params={"state": "bogus"}, headers=h.auth),
        400,
        ProblemType.INVALID_REQUEST,
        "list with state=bogus",
    )
    mine = [item for item in await h.list_all() if str(item.get("podUid", "")).startswith(h.run_id)]
    require(not mine, f"rejected requests created reservations: {mine}")
    # A well-formed request still works afterwards (nothing was left half-done).
    expect_reservation(await h.reserve(uid_probe), 201, "a valid reserve after the bad ones")


async def check_idempotent_replay(h: Harness) -> None:
    """The same key with the same request returns the same reservation (200), quantities by value."""
    body = h.request_body()
    first = expect_reservation(await h.reserve(body), 201, "first reserve")
    require(first["state"] == "reserved", f"a new reservation must be 'reserved', got {first['state']!r}")
    require(bool(first.get("expiresAt")), "a reserved reservation must say when it expires (expiresAt)")
    replay = expect_reservation(await h.reserve(body), 200, "replayed reserve")
    require(
        replay["id"] == first["id"] and replay["node"] == first["node"],
        "the replay returned another reservation",
    )
    respelled = json.loads(json.dumps(body))
    respelled["resources"] = {h.config.resource: "1000m"}
    same = expect_reservation(await h.reserve(respelled), 200, "replay with the quantity spelled 1000m")
    require(same["id"] == first["id"], "quantities must be compared by value: 1000m is the same request as 1")


async def check_key_reuse_conflict(h: Harness) -> None:
    """The same key with a different request gets 409 idempotency-key-reused; the original stays."""
    body = h.request_body()
    first = expect_reservation(await h.reserve(body), 201, "first reserve")
    different = json.loads(json.dumps(body))
    different["pod"]["priority"] = 1000
    expect_problem(
        await h.reserve(different), 409, ProblemType.IDEMPOTENCY_KEY_REUSED, "reserve reusing a key"
    )
    still = expect_reservation(await h.get(first["id"]), 200, "GET the original")
    require(still["state"] == "reserved", f"the original changed to {still['state']!r}")


async def check_commit_idempotent(h: Harness) -> None:
    """Commit makes the reservation committed with no expiry; committing again is fine."""
    first = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    committed = expect_reservation(await h.commit(first["id"]), 200, "commit")
    require(committed["state"] == "committed", f"after commit the state is {committed['state']!r}")
    require(committed.get("expiresAt") is None, "a committed reservation must not expire (expiresAt null)")
    again = expect_reservation(await h.commit(first["id"]), 200, "second commit")
    require(
        again["state"] == "committed" and again["id"] == first["id"],
        "a second commit changed the reservation",
    )


async def check_release_idempotent(h: Harness) -> None:
    """Release answers 204 every time; a released reservation cannot be committed (409)."""
    first = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    expect_status(await h.release(first["id"]), 204, "release")
    expect_status(await h.release(first["id"]), 204, "second release")
    after = await h.get(first["id"])
    if after.status_code == 200:
        require(after.json()["state"] == "released", f"after release the state is {after.json()['state']!r}")
    else:
        expect_problem(after, 404, ProblemType.NOT_FOUND, "GET a released reservation")
    expect_problem(
        await h.commit(first["id"]), 409, ProblemType.RESERVATION_NOT_ACTIVE, "commit a released reservation"
    )
    committed = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    expect_reservation(await h.commit(committed["id"]), 200, "commit")
    expect_status(await h.release(committed["id"]), 204, "release a committed reservation")


async def check_unknown_ids(h: Harness) -> None:
    """Unknown ids: release 204, commit 404, GET 404."""
    unknown = f"no-such-reservation-{h.run_id}"
    expect_status(await h.release(unknown), 204, "release an unknown id")
    expect_problem(await h.commit(unknown), 404, ProblemType.NOT_FOUND, "commit an unknown id")
    expect_problem(await h.get(unknown), 404, ProblemType.NOT_FOUND, "GET an unknown id")


async def check_unschedulable(h: Harness) -> None:
    """Asking for more than exists gets 409 unschedulable with a human reason."""
    body = h.request_body(amount=str(h.config.capacity + 1))
    problem = expect_problem(
        await h.reserve(body), 409, ProblemType.UNSCHEDULABLE, "reserve more than exists"
    )
    require(
        isinstance(problem.get("reason"), str) and bool(problem["reason"]), "unschedulable needs a reason"
    )


async def check_ttl_expiry(h: Harness) -> None:
    """An uncommitted reservation expires after its lease and frees its capacity; a committed one stays."""
    ttl = h.config.ttl_seconds
    leased = [
        expect_reservation(await h.reserve(h.request_body(ttl=ttl)), 201, "reserve a short lease")
        for _ in range(h.config.capacity - 1)
    ]
    kept = expect_reservation(await h.reserve(h.request_body(ttl=ttl)), 201, "reserve")
    expect_reservation(await h.commit(kept["id"]), 200, "commit")
    expect_problem(
        await h.reserve(h.request_body()), 409, ProblemType.UNSCHEDULABLE, "reserve while the pool is held"
    )
    await asyncio.sleep(ttl + 1.5)
    expired = await h.get(leased[0]["id"])
    if expired.status_code == 200:
        require(
            expired.json()["state"] == "expired", f"after its lease the state is {expired.json()['state']!r}"
        )
    else:
        expect_problem(expired, 404, ProblemType.NOT_FOUND, "GET an expired reservation")
    expect_problem(
        await h.commit(leased[0]["id"]), 409, ProblemType.RESERVATION_NOT_ACTIVE, "commit after expiry"
    )
    still = expect_reservation(await h.get(kept["id"]), 200, "GET the committed reservation")
    require(still["state"] == "committed", "a committed reservation expired")
    for _ in leased:
        expect_reservation(
            await h.reserve(h.request_body()), 201, "reserve the capacity an expired lease held"
        )


async def check_no_overcommit(h: Harness) -> None:
    """3×capacity concurrent one-slot reserves: exactly ``capacity`` succeed, the rest are unschedulable."""
    capacity = h.config.capacity
    bodies = [h.request_body() for _ in range(3 * capacity)]
    responses = await asyncio.gather(*(h.reserve(body) for body in bodies))
    won = [r for r in responses if r.status_code == 201]
    for response in responses:
        if response.status_code != 201:
            expect_problem(response, 409, ProblemType.UNSCHEDULABLE, "a concurrent reserve that did not fit")
    require(
        len(won) <= capacity, f"{len(won)} one-slot reservations succeeded but only {capacity} slots exist"
    )
    require(len(won) == capacity, f"only {len(won)} of {capacity} free slots could be reserved")
    held = await h.list_all(schedulerName=h.scheduler_name)
    active = [item for item in held if item["state"] in ("reserved", "committed")]
    require(len(active) == capacity, f"the list shows {len(active)} active reservations, expected {capacity}")
    for response in won:
        expect_status(await h.release(response.json()["id"]), 204, "release")
    expect_reservation(await h.reserve(h.request_body()), 201, "reserve after releasing everything")


async def check_list_filters_and_pagination(h: Harness) -> None:
    """List filters by schedulerName, state and podUid, and pages through nextCursor."""
    name = f"{h.scheduler_name}-list"
    made = [
        expect_reservation(await h.reserve(h.request_body(scheduler_name=name)), 201, "reserve")
        for _ in range(3)
    ]
    expect_reservation(await h.commit(made[0]["id"]), 200, "commit")
    pages = 0
    seen: list[str] = []
    query: dict[str, str] = {"schedulerName": name, "limit": "1"}
    while True:
        response = await h.http.get("/v1/reservations", params=query, headers=h.auth)
        expect_status(response, 200, "list one page")
        page = response.json()
        require(len(page["items"]) <= 1, "limit=1 returned more than one item")
        seen.extend(item["id"] for item in page["items"])
        pages += 1
        if not page.get("nextCursor") or pages > 10:
            break
        query["cursor"] = page["nextCursor"]
    require(sorted(seen) == sorted(m["id"] for m in made), f"paging found {seen}, expected the 3 created")
    committed = await h.list_all(schedulerName=name, state="committed")
    require([c["id"] for c in committed] == [made[0]["id"]], "state=committed did not filter")
    by_uid = await h.list_all(podUid=made[1]["podUid"])
    require([c["id"] for c in by_uid] == [made[1]["id"]], "podUid did not filter")


async def _expect_unchanged(h: Harness, before: dict[str, Any], what: str) -> None:
    """The reservation reads exactly as ``before`` (state, node, lease): ``what`` changed nothing."""
    after = expect_reservation(await h.get(before["id"]), 200, f"GET the reservation after {what}")
    for key in ("state", "node", "podUid", "expiresAt"):
        require(
            after.get(key) == before.get(key),
            f"{what} was refused but changed {key} from {before.get(key)!r} to {after.get(key)!r}",
        )


async def check_commit_pod_mismatch(h: Harness) -> None:
    """Commit with another pod's podUid: 409 pod-mismatch, no change; its own pod still commits."""
    mine = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    other = f"{h.run_id}-another-pod"
    expect_problem(
        await h.commit(mine["id"], pod_uid=other), 409, ProblemType.POD_MISMATCH, "commit for another pod"
    )
    await _expect_unchanged(h, mine, "a commit for another pod")
    committed = expect_reservation(
        await h.commit(mine["id"], pod_uid=mine["podUid"]), 200, "commit for its pod"
    )
    require(committed["state"] == "committed", f"a commit for its own pod left it {committed['state']!r}")
    expect_problem(
        await h.commit(mine["id"], pod_uid=other),
        409,
        ProblemType.POD_MISMATCH,
        "commit a committed reservation for another pod",
    )


async def check_release_pod_mismatch(h: Harness) -> None:
    """Release with another pod's podUid: 409 pod-mismatch, capacity still held; its own pod releases."""
    other = f"{h.run_id}-another-pod"
    reserved = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    expect_problem(
        await h.release(reserved["id"], pod_uid=other),
        409,
        ProblemType.POD_MISMATCH,
        "release a reserved reservation for another pod",
    )
    await _expect_unchanged(h, reserved, "a release for another pod")
    committed = expect_reservation(await h.commit(reserved["id"], pod_uid=reserved["podUid"]), 200, "commit")
    expect_problem(
        await h.release(committed["id"], pod_uid=other),
        409,
        ProblemType.POD_MISMATCH,
        "release a committed reservation for another pod",
    )
    await _expect_unchanged(h, committed, "a release for another pod")
    # Still held: the pool is full with the rest, so one more does not fit.
    fill = [
        expect_reservation(await h.reserve(h.request_body()), 201, "reserve the rest of the pool")
        for _ in range(h.config.capacity - 1)
    ]
    expect_problem(
        await h.reserve(h.request_body()),
        409,
        ProblemType.UNSCHEDULABLE,
        "reserve while a reservation refused for another pod still holds its slot",
    )
    expect_status(await h.release(committed["id"], pod_uid=committed["podUid"]), 204, "release for its pod")
    after = await h.get(committed["id"])
    if after.status_code == 200:
        require(after.json()["state"] == "released", f"after release the state is {after.json()['state']!r}")
    expect_status(
        await h.release(committed["id"], pod_uid=other), 204, "release a released reservation for another pod"
    )
    expect_reservation(await h.reserve(h.request_body()), 201, "reserve the slot it freed")
    for item in fill:
        expect_status(await h.release(item["id"]), 204, "release")


async def check_renew_extends_lease(h: Harness) -> None:
    """Renew moves expiresAt later and keeps a reservation alive past its original lease."""
    ttl = h.config.ttl_seconds
    leased = expect_reservation(await h.reserve(h.request_body(ttl=ttl)), 201, "reserve a short lease")
    renewed = expect_reservation(
        await h.renew(leased["id"], pod_uid=leased["podUid"], ttl=ttl + 60), 200, "renew"
    )
    require(renewed["state"] == "reserved", f"after renew the state is {renewed['state']!r}")
    require(
        instant(renewed.get("expiresAt"), "expiresAt after renew")
        > instant(leased.get("expiresAt"), "expiresAt"),
        f"renew did not move expiresAt later: {leased.get('expiresAt')} → {renewed.get('expiresAt')}",
    )
    await asyncio.sleep(ttl + 1.5)
    alive = expect_reservation(await h.get(leased["id"]), 200, "GET after the original lease ended")
    require(
        alive["state"] == "reserved", f"a renewed reservation is {alive['state']!r} after its first lease"
    )
    expect_reservation(
        await h.commit(leased["id"], pod_uid=leased["podUid"]), 200, "commit after the first lease"
    )


async def check_renew_idempotent(h: Harness) -> None:
    """Renewing twice is fine; renewing a committed reservation answers it unchanged."""
    first = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    for what in ("renew", "renew again"):
        again = expect_reservation(await h.renew(first["id"], pod_uid=first["podUid"], ttl=60), 200, what)
        require(again["id"] == first["id"] and again["state"] == "reserved", f"{what} answered {again}")
    committed = expect_reservation(await h.commit(first["id"]), 200, "commit")
    renewed = expect_reservation(
        await h.renew(first["id"], pod_uid=first["podUid"], ttl=60), 200, "renew a committed reservation"
    )
    require(
        renewed["state"] == "committed" and renewed.get("expiresAt") is None,
        f"renewing a committed reservation changed it: {committed} → {renewed}",
    )


async def check_renew_refusals(h: Harness) -> None:
    """Renew: another pod's UID 409 pod-mismatch, released 409 not active, unknown 404, bad body 400."""
    mine = expect_reservation(await h.reserve(h.request_body()), 201, "reserve")
    expect_problem(
        await h.renew(mine["id"], pod_uid=f"{h.run_id}-another-pod", ttl=600),
        409,
        ProblemType.POD_MISMATCH,
        "renew for another pod",
    )
    await _expect_unchanged(h, mine, "a renew for another pod")
    for what, body in (
        ("an unknown field", {"podUid": mine["podUid"], "ttlSeconds": 60, "colour": "red"}),
        ("ttlSeconds: 0", {"podUid": mine["podUid"], "ttlSeconds": 0}),
        ("no podUid", {"ttlSeconds": 60}),
    ):
        response = await h.http.post(f"/v1/reservations/{mine['id']}/renew", json=body, headers=h.auth)
        expect_problem(response, 400, ProblemType.INVALID_REQUEST, f"renew with {what}")
    await _expect_unchanged(h, mine, "an invalid renew")
    unknown = f"no-such-reservation-{h.run_id}"
    expect_problem(
        await h.renew(unknown, pod_uid=mine["podUid"], ttl=60),
        404,
        ProblemType.NOT_FOUND,
        "renew an unknown id",
    )
    expect_status(await h.release(mine["id"]), 204, "release")
    expect_problem(
        await h.renew(mine["id"], pod_uid=mine["podUid"], ttl=60),
        409,
        ProblemType.RESERVATION_NOT_ACTIVE,
        "renew a released reservation",
    )


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Harness], Awaitable[None]]
    since: str = "1.0"  # the contract version that introduced what this check tests

    @property
    def description(self) -> str:
        return (self.run.__doc__ or "").strip().splitlines()[0]


CHECKS: tuple[Check, ...] = (
    Check("health", check_health),
    Check("auth-required", check_auth_required),
    Check("bad-requests", check_bad_requests),
    Check("idempotent-replay", check_idempotent_replay),
    Check("key-reuse-conflict", check_key_reuse_conflict),
    Check("commit-idempotent", check_commit_idempotent),
    Check("release-idempotent", check_release_idempotent),
    Check("unknown-ids", check_unknown_ids),
    Check("unschedulable", check_unschedulable),
    Check("ttl-expiry", check_ttl_expiry),
    Check("no-overcommit", check_no_overcommit),
    Check("list-filters-and-pagination", check_list_filters_and_pagination),
    Check("commit-pod-mismatch", check_commit_pod_mismatch, since="1.1"),
    Check("release-pod-mismatch", check_release_pod_mismatch, since="1.1"),
    Check("renew-extends-lease", check_renew_extends_lease, since="1.1"),
    Check("renew-idempotent", check_renew_idempotent, since="1.1"),
    Check("renew-refusals", check_renew_refusals, since="1.1"),
    Check("groups-path", check_groups_path),
    Check("group-all-or-nothing", check_group_all_or_nothing, since="1.1"),
    Check("group-concurrent", check_group_concurrent, since="1.1"),
    Check("group-replay", check_group_replay, since="1.1"),
    Check("group-topology", check_group_topology, since="1.1"),
    Check("group-members", check_group_members, since="1.1"),
    Check("group-renew-and-expiry", check_group_renew_and_expiry, since="1.1"),
    Check("group-bad-requests", check_group_bad_requests, since="1.1"),
    Check("batch-path", check_batch_path),
    Check("batch-matches-singles", check_batch_matches_singles, since="1.1"),
    Check("batch-mixed", check_batch_mixed, since="1.1"),
    Check("batch-replay", check_batch_replay, since="1.1"),
    Check("batch-invalid-operation", check_batch_invalid_operation, since="1.1"),
    Check("batch-no-overcommit", check_batch_concurrent_no_overcommit, since="1.1"),
    Check("batch-limits", check_batch_limits, since="1.1"),
    Check("info-path", check_info_path),
    Check("cluster-isolation", check_cluster_isolation, since="1.2"),
    Check("cluster-id-validated", check_cluster_id_validated, since="1.2"),
    Check("node-preferences", check_node_preferences, since="1.2"),
    Check("group-node-preferences", check_group_node_preferences, since="1.2"),
    Check("preemption", check_preemption, since="1.2"),
    Check("group-preemption", check_group_preemption, since="1.2"),
    Check("revocation", check_revocation, since="1.2"),
    Check("rule-preemption", check_rule_preemption, since="1.2"),
)


@dataclass(frozen=True)
class Result:
    check: Check
    error: str | None

    @property
    def passed(self) -> bool:
        return self.error is None


def http_client(config: ConformanceConfig) -> httpx.AsyncClient:
    verify: ssl.SSLContext | bool = True
    if config.url.startswith("https"):
        context = ssl.create_default_context(cafile=config.ca_file)
        if config.client_cert is not None:
            context.load_cert_chain(*config.client_cert)
        verify = context
    return httpx.AsyncClient(base_url=config.url, verify=verify, timeout=config.timeout)


async def run_check(
    check: Check,
    config: ConformanceConfig,
    http: httpx.AsyncClient,
    *,
    contract_version: str = CONTRACT_VERSIONS[-1],
) -> Result:
    harness = Harness(config=config, http=http, contract_version=contract_version)
    try:
        await check.run(harness)
    except ConformanceFailure as failure:
        return Result(check, str(failure))
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
        return Result(check, f"{type(error).__name__}: {error}")
    finally:
        await harness.cleanup()
    return Result(check, None)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def checks_for(contract_version: str = CONTRACT_VERSIONS[-1]) -> list[Check]:
    """The checks an RM implementing ``contract_version`` (e.g. ``"1.0"``) must pass."""
    if contract_version not in CONTRACT_VERSIONS:
        raise ValueError(f"unknown contract version {contract_version!r}; the kit knows {CONTRACT_VERSIONS}")
    return [check for check in CHECKS if _version(check.since) <= _version(contract_version)]


async def run_checks(
    config: ConformanceConfig,
    *,
    names: Sequence[str] | None = None,
    contract_version: str = CONTRACT_VERSIONS[-1],
) -> list[Result]:
    """Run the selected checks (all of ``contract_version`` by default) one after the other."""
    selected = [check for check in checks_for(contract_version) if names is None or check.name in names]
    async with http_client(config) as http:
        return [await run_check(check, config, http, contract_version=contract_version) for check in selected]
