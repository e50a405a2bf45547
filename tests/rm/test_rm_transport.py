"""The RM client's aiohttp transport honours the environment's proxy, resolved once, like httpx did.

The "proxy" is a raw socket server on loopback that records the request line it receives and
answers with a reservation: a request sent through a proxy names the absolute URL.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from bindery.devcluster.plane import free_port
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMUnavailable
from tests.rm.test_rm_client import REQUEST, RESERVATION

RM_URL = "http://rm.invalid:8080"  # never resolved: the proxy is asked for it by name


class RecordingProxy:
    def __init__(self) -> None:
        self.request_lines: list[str] = []
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.request_lines.append(lines[0])
        length = next((int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length:")), 0)
        await reader.readexactly(length)
        body = json.dumps(RESERVATION).encode()
        writer.write(
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[RecordingProxy]:
    recording = RecordingProxy()
    server = await asyncio.start_server(recording.handle, "127.0.0.1", 0)
    recording.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield recording


def _client(url: str = RM_URL) -> ResourceManagerClient:
    return ResourceManagerClient(base_url=url, token="t", allow_insecure_http=True, max_attempts=1)


async def test_the_environments_proxy_carries_the_calls(
    proxy: RecordingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with _client() as client:
        reservation = await client.reserve(REQUEST)
    assert reservation.id == RESERVATION["id"]
    assert proxy.request_lines == [f"POST {RM_URL}/v1/reservations HTTP/1.1"]


async def test_no_proxy_names_the_rm_and_the_proxy_is_bypassed(
    proxy: RecordingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "localhost")
    async with _client(f"http://localhost:{free_port()}") as client:  # nothing listens there
        with pytest.raises(RMUnavailable, match=r"ConnectError"):
            await client.reserve(REQUEST)
    assert proxy.request_lines == []
