"""An httpx transport that sends through aiohttp: the RM client's API, aiohttp's connection pool.

Why: the RM client makes two calls per scheduled pod (reserve and commit), and with httpx's own
transport (httpcore) each cost the operator about 1.7 ms of CPU, mostly in httpcore's pool
bookkeeping, which on every request checks every idle pooled connection for expiry. aiohttp sends
the same request for about a quarter of that, and it is already in the process (Kopf and
kubernetes_asyncio use it). `benchmarks/rm_client_cpu.py` measures both.

`httpx.AsyncClient` stays the client's surface (timeouts, headers, response decoding and
streaming are still httpx's), so only the sending changes. aiohttp's failures are mapped onto
httpx's exception classes, which is all the client above looks at:

- connecting fails → `httpx.ConnectError`; no connection within the connect timeout →
  `httpx.ConnectTimeout`;
- no byte within the read timeout → `httpx.ReadTimeout`;
- the connection closes mid-answer or the framing is broken → `httpx.RemoteProtocolError`;
- anything else aiohttp raises → `httpx.TransportError`.

Bodies are handed to httpx undecoded (aiohttp's `auto_decompress` off), so httpx decodes them as
before and the client's size cap still applies to what it decodes. The environment's proxy for the
RM's URL is resolved once, when the transport is made: aiohttp's `trust_env` would re-read it (and
~/.netrc) on a worker thread for every request.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

import aiohttp
import httpx
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

__all__ = ["AiohttpTransport"]


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        *,
        base_url: str,
        ssl_context: ssl.SSLContext | None,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int = 100,
    ) -> None:
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None
        # LookupError: no proxy variable for this scheme, or NO_PROXY names the RM.
        with contextlib.suppress(LookupError):
            self._proxy, self._proxy_auth = get_env_proxy_for_url(URL(base_url))
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use: a ClientSession belongs to the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self._max_connections),
                timeout=self._timeout,
                auto_decompress=False,
                trust_env=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._open()
        body = await request.aread()
        try:
            response = await session.request(
                request.method,
                URL(str(request.url), encoded=True),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                proxy=self._proxy,
                proxy_auth=self._proxy_auth,
            )
        except aiohttp.ConnectionTimeoutError as error:
            raise httpx.ConnectTimeout(_why(error), request=request) from error
        except aiohttp.SocketTimeoutError as error:
            raise httpx.ReadTimeout(_why(error), request=request) from error
        except aiohttp.ClientConnectorError as error:
            raise httpx.ConnectError(_why(error), request=request) from error
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as error:
            raise httpx.RemoteProtocolError(_why(error), request=request) from error
        except (TimeoutError, aiohttp.ClientError) as error:
            raise httpx.TransportError(_why(error), request=request) from error
        return httpx.Response(
            status_code=response.status,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
            stream=_Body(response=response, request=request),
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode()},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _Body(httpx.AsyncByteStream):
    """The answer's body as aiohttp delivers it, with its failures in httpx's terms."""

    def __init__(self, *, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except aiohttp.SocketTimeoutError as error:
            raise httpx.ReadTimeout(_why(error), request=self._request) from error
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as error:
            raise httpx.RemoteProtocolError(_why(error), request=self._request) from error
        except (TimeoutError, aiohttp.ClientError) as error:
            raise httpx.ReadError(_why(error), request=self._request) from error

    async def aclose(self) -> None:
        self._response.release()


def _why(error: BaseException) -> str:
    return str(error) or type(error).__name__
