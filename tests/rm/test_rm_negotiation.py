"""Contract negotiation fails closed: an error on `GET /v1/info` never takes a feature back.

Why: a v1.1 replica behind the RM's Service mid-rollout, a rollback or a proxy that answers 404
once made the client fall back to v1.1 for five minutes; its lists then went out without
`clusterId`, and the reconcile pass released every other cluster's reservations of the name. Here
the reference RM serves v1.2 behind `tests/rmproxy.py`, which answers the path as such a replica
would; the client's cluster is A, the other cluster's reservations are made by a client of B.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncIterator

import pytest

from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.rm.client import Negotiation, ResourceManagerClient
from bindery.rm.errors import RMRejected
from bindery.rm.models import Feature, PodIdentity, ReservationRequest
from tests.rmproxy import RMFaultProxy, rm_fault_proxy

from .conftest import TOKEN, small_inventory


def _request(uid: str) -> ReservationRequest:
    return ReservationRequest(
        pod=PodIdentity(uid=uid, namespace="ns", name=f"pod-{uid}", scheduler_name="shared"),
        resources={"cpu": "100m"},
        idempotency_key=uid,
        ttl_seconds=60,
    )


def _client(
    url: str, *, cluster_id: str | None, negotiation: Negotiation | None = None, confirm: float = 5.0
) -> ResourceManagerClient:
    return ResourceManagerClient(
        base_url=url,
        token=TOKEN,
        allow_insecure_http=True,
        cluster_id=cluster_id,
        negotiation=negotiation,
        legacy_confirm_after=confirm,
        backoff_initial=0.01,
        backoff_max=0.02,
    )


@pytest.fixture
async def behind_proxy(tmp_path: pathlib.Path) -> AsyncIterator[tuple[RunningServer, RMFaultProxy]]:
    async with (
        serve_reference_rm(db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token=TOKEN) as rm,
        rm_fault_proxy(upstream=rm.url, seed=1, rate=0.0) as proxy,
    ):
        yield rm, proxy


async def test_a_404_on_info_after_cluster_id_was_offered_keeps_lists_scoped(
    behind_proxy: tuple[RunningServer, RMFaultProxy], caplog: pytest.LogCaptureFixture
) -> None:
    """A negotiated with the RM; then a reserve meets a v1.1 replica (400 to clusterId), so the
    client asks `/v1/info` again and meets it too (404). A's list still asks for A's cluster only:
    B's reservation is not in it, and the client says what it kept."""
    rm, proxy = behind_proxy
    async with _client(proxy.url, cluster_id="a") as a, _client(rm.url, cluster_id="b") as b:
        theirs = await b.reserve(_request("pb"))
        mine = await a.reserve(_request("pa"))
        proxy.answer("/v1/reservations", 400, 1)
        with pytest.raises(RMRejected):
            await a.reserve(_request("pa2"))
        proxy.answer("/v1/info", 404, 1)
        with caplog.at_level(logging.WARNING, logger="bindery.rm.client"):
            listed = {r.id for r in await a.list_reservations(scheduler_name="shared")}
        assert proxy.scripted("/v1/info") == 0, "the client did not ask /v1/info again"
        assert theirs.id not in listed, "a 404 on /v1/info made A list B's reservations"
        assert mine.id in listed
        assert (await a.contract_info()).offers(Feature.CLUSTER_ID)
        kept = [r.getMessage() for r in caplog.records if "/v1/info" in r.getMessage()]
        assert kept, "the client did not say it kept the contract"
        assert "keeps" in kept[0], kept


async def test_a_5xx_on_info_after_negotiation_fails_no_call(
    behind_proxy: tuple[RunningServer, RMFaultProxy],
) -> None:
    """A known contract outlives an RM that cannot answer `/v1/info` for a while: the list goes on,
    scoped, instead of failing with the info call."""
    rm, proxy = behind_proxy
    async with _client(proxy.url, cluster_id="a") as a, _client(rm.url, cluster_id="b") as b:
        theirs = await b.reserve(_request("pb"))
        await a.reserve(_request("pa"))
        a._info_until = float("-inf")  # the cached answer's period is over
        proxy.answer("/v1/info", 503, 10)
        listed = {r.id for r in await a.list_reservations(scheduler_name="shared")}
        assert theirs.id not in listed


async def test_a_rebuilt_client_starts_from_what_the_rm_offered_before(
    behind_proxy: tuple[RunningServer, RMFaultProxy],
) -> None:
    """A rotated Secret builds a new client; handed the ResourceManager's negotiation, its first
    `/v1/info` meeting a 404 still keeps the cluster id."""
    rm, proxy = behind_proxy
    negotiation = Negotiation()
    async with _client(rm.url, cluster_id="b") as b:
        theirs = await b.reserve(_request("pb"))
    async with _client(proxy.url, cluster_id="a", negotiation=negotiation) as first:
        assert await first.negotiated()
    proxy.answer("/v1/info", 404, 1)
    async with _client(proxy.url, cluster_id="a", negotiation=negotiation) as rebuilt:
        listed = {r.id for r in await rebuilt.list_reservations(scheduler_name="shared")}
        assert proxy.scripted("/v1/info") == 0
        assert theirs.id not in listed
        assert await rebuilt.negotiated()


async def test_a_first_404_leaves_the_contract_unknown_until_an_answer_settles_it(
    behind_proxy: tuple[RunningServer, RMFaultProxy],
) -> None:
    """Met first, one 404 is not a verdict: `negotiated()` says False (the reconcile pass decides
    nothing from a list meanwhile); the next answer, a 200, settles it."""
    _, proxy = behind_proxy
    proxy.answer("/v1/info", 404, 1)
    async with _client(proxy.url, cluster_id="a", confirm=0.0) as a:
        assert not await a.negotiated()
        assert await a.negotiated()
        assert (await a.contract_info()).offers(Feature.CLUSTER_ID)


async def test_a_v1_1_rm_is_known_as_such_after_a_second_404(tmp_path: pathlib.Path) -> None:
    """An RM that really has no `/v1/info` answers 404 again when asked later: then it is v1.1."""
    async with (
        serve_reference_rm(
            db_path=tmp_path / "old.sqlite", inventory=small_inventory(), token=TOKEN, cluster_ids=False
        ) as old,
        _client(old.url, cluster_id="a", confirm=0.0) as a,
    ):
        assert not await a.negotiated()
        assert await a.negotiated()
        assert not (await a.contract_info()).offers(Feature.CLUSTER_ID)


async def test_a_200_that_lists_fewer_features_is_a_downgrade_said_loudly(
    behind_proxy: tuple[RunningServer, RMFaultProxy], caplog: pytest.LogCaptureFixture
) -> None:
    """The only explicit downgrade is the RM's own 200 answer: the client follows it and logs an
    error that names the features withdrawn."""
    _, proxy = behind_proxy
    async with _client(proxy.url, cluster_id="a") as a:
        assert (await a.contract_info()).offers(Feature.CLUSTER_ID)
        a._info_until = float("-inf")
        proxy.answer("/v1/info", 200, 1, body={"contractVersion": "1.1.0", "features": ["renew"]})
        with caplog.at_level(logging.ERROR, logger="bindery.rm.client"):
            info = await a.contract_info()
        assert not info.offers(Feature.CLUSTER_ID)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors, "the withdrawal was not logged as an error"
        assert "cluster-id" in errors[0], errors
        assert "withdrew" in errors[0], errors
