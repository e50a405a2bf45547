"""Conformance checks of contract v1.2: ``GET /v1/info`` and the ``cluster-id`` feature.

Why they matter: several Kubernetes clusters may share one RM and one scheduler name. Each cluster's
Bindery lists the reservations of its names to reconcile them, and releases those whose pods it
cannot find; an RM that lists another cluster's reservations under a cluster's id lets that cluster
free allocations of running pods elsewhere, and the RM then sells the capacity twice. So the kit
checks that a reservation made with cluster X is never listed under cluster Y.

At ``--contract-version`` 1.0 or 1.1 the ``info-path`` check accepts a ``404`` or ``405`` on
``/v1/info`` (that is how a client recognises an RM without v1.2), and no check sends ``clusterId``:
a v1.1 RM refuses unknown fields, so the kit must not send one to an RM certified below 1.2.
"""

from __future__ import annotations

from typing import Any

import httpx

from bindery.conformance.harness import (
    ConformanceFailure,
    Harness,
    expect_problem,
    expect_reservation,
    expect_status,
    is_json,
    require,
)
from bindery.rm.errors import ProblemType

INFO_PATH = "/v1/info"
CLUSTER_ID_FEATURE = "cluster-id"


def _v1_2(h: Harness) -> bool:
    return tuple(int(part) for part in h.contract_version.split(".")) >= (1, 2)


async def _info(h: Harness) -> dict[str, Any]:
    response = await h.http.get(INFO_PATH, headers=h.auth)
    if response.status_code in (404, 405):
        raise ConformanceFailure(
            f"GET {INFO_PATH} answered {response.status_code}: the RM does not speak contract v1.2; certify "
            "it with --contract-version 1.1 (or 1.0), or add the path"
        )
    expect_status(response, 200, f"GET {INFO_PATH}")
    require(is_json(response), f"GET {INFO_PATH}: expected application/json")
    info = response.json()
    require(isinstance(info, dict), f"GET {INFO_PATH}: expected an object, got {info!r}")
    return dict(info)


async def check_info_path(h: Harness) -> None:
    """GET /v1/info names the contract version and the features (v1.2); below 1.2 a 404 is fine."""
    response = await h.http.get(INFO_PATH, headers=h.auth)
    if response.status_code in (404, 405) and not _v1_2(h):
        return  # an RM of v1.1 or older: exactly what a client reads as "no v1.2 here"
    info = await _info(h)
    version = info.get("contractVersion")
    require(
        isinstance(version, str) and version.startswith("1."),
        f"GET {INFO_PATH}: contractVersion must be the v1 version the RM implements, got {version!r}",
    )
    features = info.get("features") or []
    require(
        isinstance(features, list) and all(isinstance(f, str) for f in features),
        f"GET {INFO_PATH}: features must be a list of strings, got {features!r}",
    )
    if _v1_2(h):
        require(
            CLUSTER_ID_FEATURE in features,
            f"GET {INFO_PATH} does not list {CLUSTER_ID_FEATURE!r} (features: {features}); "
            "a v1.2 RM offers it",
        )
    expect_problem(
        await h.http.get(INFO_PATH), 401, ProblemType.UNAUTHORIZED, f"GET {INFO_PATH} without a token"
    )


def _with_cluster(body: dict[str, Any], cluster: str) -> dict[str, Any]:
    return {**body, "clusterId": cluster}


async def _listed(h: Harness, **params: str) -> set[str]:
    return {str(item.get("id")) for item in await h.list_all(schedulerName=h.scheduler_name, **params)}


async def check_cluster_isolation(h: Harness) -> None:
    """A reservation made with cluster X carries X, is listed under X and never under Y; one made
    without a cluster is listed only without a filter; group members carry the group's cluster."""
    await _info(h)
    x, y = f"{h.run_id}-cluster-x", f"{h.run_id}-cluster-y"
    in_x = expect_reservation(
        await h.reserve(_with_cluster(h.request_body(), x)), 201, "reserve with clusterId X"
    )
    require(
        in_x.get("clusterId") == x,
        f"the reservation made with clusterId {x!r} says {in_x.get('clusterId')!r}",
    )
    read = expect_reservation(await h.get(in_x["id"]), 200, "GET the reservation made with clusterId X")
    require(
        read.get("clusterId") == x,
        f"GET of a reservation made with clusterId {x!r} says {read.get('clusterId')!r}",
    )
    in_y = expect_reservation(
        await h.reserve(_with_cluster(h.request_body(), y)), 201, "reserve with clusterId Y"
    )
    plain = expect_reservation(await h.reserve(h.request_body()), 201, "reserve without clusterId")
    require(
        plain.get("clusterId") is None,
        f"a reservation made without clusterId says clusterId {plain.get('clusterId')!r}",
    )
    expect_reservation(await h.commit(in_x["id"]), 200, "commit the reservation of cluster X")

    under_x = await _listed(h, clusterId=x)
    under_y = await _listed(h, clusterId=y)
    everything = await _listed(h)
    require(in_x["id"] in under_x, f"?clusterId=X does not list the reservation made with X ({in_x['id']})")
    require(
        in_x["id"] not in under_y,
        f"?clusterId=Y lists {in_x['id']}, made with cluster X: a cluster would release another "
        "cluster's reservations",
    )
    require(
        under_x == {in_x["id"]},
        f"?clusterId=X lists {sorted(under_x - {in_x['id']})} besides X's own reservation (Y's, or one "
        "made without a cluster)",
    )
    require(under_y == {in_y["id"]}, f"?clusterId=Y lists {sorted(under_y)}, expected only {in_y['id']}")
    require(
        {in_x["id"], in_y["id"], plain["id"]} <= everything,
        "a list without clusterId must list every cluster's reservations and those made without one",
    )
    committed_y = await h.list_all(schedulerName=h.scheduler_name, clusterId=y, state="committed")
    require(not committed_y, f"?clusterId=Y&state=committed lists X's committed reservation: {committed_y}")

    body = _with_cluster(h.group_body(1), x)
    response = await h.reserve_group(body)
    expect_status(response, 201, "reserve a group with clusterId X")
    members = [member for member in response.json().get("members") or [] if isinstance(member, dict)]
    require(
        bool(members) and all(member.get("clusterId") == x for member in members),
        f"the members of a group reserved with clusterId {x!r} say {[m.get('clusterId') for m in members]}",
    )
    ids = {str(member.get("id")) for member in members}
    require(ids <= await _listed(h, clusterId=x), "?clusterId=X does not list X's group members")
    require(not ids & await _listed(h, clusterId=y), "?clusterId=Y lists the members of X's group")


async def check_cluster_id_validated(h: Harness) -> None:
    """An empty or over-long clusterId is 400 invalid-request, in the request and in the list."""
    await _info(h)
    for bad in ("", "x" * 254):
        body = _with_cluster(h.request_body(), bad)
        expect_problem(
            await h.reserve(body),
            400,
            ProblemType.INVALID_REQUEST,
            f"reserve with clusterId of {len(bad)} chars",
        )
        listed: httpx.Response = await h.http.get(
            "/v1/reservations", params={"clusterId": bad}, headers=h.auth
        )
        expect_problem(listed, 400, ProblemType.INVALID_REQUEST, f"list with clusterId of {len(bad)} chars")
