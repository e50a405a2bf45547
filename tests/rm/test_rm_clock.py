"""An RM whose clock is off says so (issue 20, item 13: clock-skew detection).

An RM clock 50 s behind made every lease it stamped look expired here, and the messages blamed the
lease TTL. The RM client now compares the Date header of each readiness probe with this host's
clock and logs once what is wrong, why it matters and what to do. The RM here is an HTTP server of
the test's own that stamps its answers with a clock it is told (the reference RM uses the host's).
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from bindery.rm.client import ResourceManagerClient


@dataclass
class SkewedRM:
    """Answers /readyz and the probe's list, with a Date header `offset` seconds from ours."""

    offset: float = 0.0
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, object] = {"items": []} if request.path == "/v1/reservations" else {"status": "ok"}
        response = web.json_response(body)
        response.headers["Date"] = email.utils.formatdate(time.time() + self.offset, usegmt=True)
        return response


@pytest.fixture
async def skewed_rm() -> AsyncIterator[SkewedRM]:
    rm = SkewedRM()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", rm.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rm.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield rm
    await runner.cleanup()


async def test_an_rm_clock_50_s_behind_is_reported_once_with_what_to_do(
    skewed_rm: SkewedRM, caplog: pytest.LogCaptureFixture
) -> None:
    skewed_rm.offset = -50.0
    async with ResourceManagerClient(base_url=skewed_rm.url, token="t", allow_insecure_http=True) as rm:
        with caplog.at_level(logging.INFO, logger="bindery.rm.client"):
            for _ in range(3):
                await rm.check_ready()
            warned = [r for r in caplog.records if r.levelno == logging.WARNING and "clock" in r.getMessage()]
            assert len(warned) == 1, [r.getMessage() for r in caplog.records]
            message = warned[0].getMessage()
            assert f"the clock of the RM at {skewed_rm.url} is 50 s behind" in message
            assert "expiresAt" in message
            assert "NTP" in message
            last = rm.clock.last
            assert last is not None
            assert -52.0 < last.seconds < -48.0, last

            skewed_rm.offset = 0.0  # fixed: said once, and the estimate follows
            await rm.check_ready()
            assert rm.clock.last is not None
            assert abs(rm.clock.last.seconds) < 2.0
            assert not rm.clock.off
            assert any("agrees with this host's again" in r.getMessage() for r in caplog.records)


async def test_an_rm_clock_within_the_tolerance_is_not_reported(
    skewed_rm: SkewedRM, caplog: pytest.LogCaptureFixture
) -> None:
    skewed_rm.offset = 2.0
    async with ResourceManagerClient(base_url=skewed_rm.url, token="t", allow_insecure_http=True) as rm:
        with caplog.at_level(logging.WARNING, logger="bindery.rm.client"):
            await rm.check_ready()
        assert rm.clock.last is not None
        assert not rm.clock.off
        assert not [r for r in caplog.records if "clock" in r.getMessage()]
