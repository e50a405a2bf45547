"""Conformance check of contract v1.2's ``revocation`` feature.

Why it matters: a batch system ends allocations by itself (an administrator's ``scancel``, its own
preemption, a time limit, a node lost). Bindery learns of it only through ``state: revoked`` and
then evicts or warns about the pod that still runs there; an RM that lists the feature but keeps
showing the reservation ``committed`` leaves pods running on capacity sold again, and one that
shows ``revoked`` to a caller that did not ask breaks every v1.1 client (an unknown state).

The kit cannot cause a revocation through the contract (no caller may take capacity back), so it
takes a hook per RM: :attr:`ConformanceConfig.revoke` (``--revoke-command`` on the command line),
which the reference RM implements with ``bindery rm revoke`` and a Slurm site with ``scancel``.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from typing import Any

from bindery.conformance.clusters import _info
from bindery.conformance.harness import (
    ConformanceFailure,
    Harness,
    RevokeHook,
    expect_problem,
    expect_reservation,
    expect_status,
    instant,
    require,
)
from bindery.rm.errors import ProblemType

REVOCATION_FEATURE = "revocation"
FEATURES_HEADER = "Bindery-Features"
#: How long the RM may take to show a revocation (a batch system notices a cancelled job late).
SHOWN_WITHIN_SECONDS = 30.0


def command_hook(template: Sequence[str]) -> RevokeHook:
    """A revoke hook running ``template`` with ``{id}`` and ``{reason}`` substituted in each argument
    (``--revoke-command 'bindery rm revoke --url U --admin-token-file F --reason {reason} {id}'``)."""

    async def revoke(reservation_id: str, reason: str) -> None:
        argv = [part.replace("{id}", reservation_id).replace("{reason}", reason) for part in template]
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await process.communicate()
        if process.returncode != 0:
            raise ConformanceFailure(
                f"the revoke command {shlex.join(argv)} exited {process.returncode}: {output.decode()[-300:]}"
            )

    return revoke


async def _shown(h: Harness, reservation_id: str) -> dict[str, Any]:
    """The reservation as a caller that negotiated ``revocation`` reads it, once it reads revoked."""
    headers = {**h.auth, FEATURES_HEADER: REVOCATION_FEATURE}
    deadline = asyncio.get_running_loop().time() + SHOWN_WITHIN_SECONDS
    while True:
        response = await h.http.get(f"/v1/reservations/{reservation_id}", headers=headers)
        body = expect_reservation(response, 200, f"GET revoked reservation {reservation_id} (negotiated)")
        if body["state"] == "revoked" or asyncio.get_running_loop().time() > deadline:
            return body
        await asyncio.sleep(0.5)


async def _list(h: Harness, state: str, *, negotiated: bool) -> list[dict[str, Any]]:
    headers = {**h.auth, **({FEATURES_HEADER: REVOCATION_FEATURE} if negotiated else {})}
    response = await h.http.get(
        "/v1/reservations", params={"schedulerName": h.scheduler_name, "state": state}, headers=headers
    )
    expect_status(response, 200, f"GET /v1/reservations?state={state}")
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def check_revocation(h: Harness) -> None:
    """A committed reservation the RM takes back reads ``revoked`` with the reason to a caller that
    negotiated it and ``released`` to any other; its capacity is free again; it cannot be committed
    or renewed; a release acknowledges it (no longer listed as revoked)."""
    features = (await _info(h)).get("features") or []
    if REVOCATION_FEATURE not in features:
        return  # optional: an RM without it never shows the state
    if h.config.revoke is None:
        raise ConformanceFailure(
            f"the RM lists {REVOCATION_FEATURE!r} but the kit was given no way to revoke a reservation: "
            "pass --revoke-command (e.g. 'bindery rm revoke --url URL --admin-token-file F --reason "
            "{reason} {id}' for the reference RM, a script running scancel for Slurm)"
        )
    body = h.request_body()
    uid = body["pod"]["uid"]
    placed = expect_reservation(await h.reserve(body), 201, "reserve the reservation to revoke")
    rid = placed["id"]
    expect_reservation(await h.commit(rid, pod_uid=uid), 200, "commit it")
    reason = f"conformance run {h.run_id}: revoked by the kit"
    await h.config.revoke(rid, reason)

    seen = await _shown(h, rid)
    require(
        seen["state"] == "revoked",
        f"reservation {rid} was revoked {SHOWN_WITHIN_SECONDS:.0f} s ago and still reads {seen['state']!r} "
        f"to a caller sending {FEATURES_HEADER}: {REVOCATION_FEATURE}",
    )
    require(
        isinstance(seen.get("revokedReason"), str) and bool(seen["revokedReason"]),
        f"a revoked reservation must say why in revokedReason: {seen}",
    )
    instant(seen.get("revokedAt"), "revokedAt")
    plain = expect_reservation(await h.get(rid), 200, "GET the revoked reservation without the header")
    require(
        plain["state"] == "released" and plain.get("revokedReason") is None,
        "a caller that did not send the revocation feature must read a revoked reservation as released, "
        f"without revokedReason (a v1.1 client knows no state revoked): {plain}",
    )
    require(
        any(item["id"] == rid for item in await _list(h, "revoked", negotiated=True)),
        f"?state=revoked does not list revoked reservation {rid}",
    )
    require(
        not any(item["id"] == rid for item in await _list(h, "committed", negotiated=True)),
        f"?state=committed still lists revoked reservation {rid}",
    )
    require(
        any(item["id"] == rid for item in await _list(h, "released", negotiated=False)),
        f"?state=released, without the header, does not list revoked reservation {rid} (it reads released)",
    )

    # Its capacity is back: the whole pool can be reserved again.
    for i in range(h.config.capacity):
        expect_reservation(
            await h.reserve(h.request_body()),
            201,
            f"reserve slot {i + 1} of {h.config.capacity} after the revocation",
        )
    expect_problem(
        await h.commit(rid, pod_uid=uid),
        409,
        ProblemType.RESERVATION_NOT_ACTIVE,
        "commit a revoked reservation",
    )
    expect_problem(
        await h.renew(rid, pod_uid=uid, ttl=60),
        409,
        ProblemType.RESERVATION_NOT_ACTIVE,
        "renew a revoked reservation",
    )
    expect_status(await h.release(rid, pod_uid=uid), 204, "release (acknowledge) a revoked reservation")
    require(
        not any(item["id"] == rid for item in await _list(h, "revoked", negotiated=True)),
        f"reservation {rid} is still listed as revoked after its pod's release acknowledged it",
    )


__all__ = ["REVOCATION_FEATURE", "check_revocation", "command_hook"]
