"""A round-robin TCP proxy in front of several reference RM replicas, that can drop connections.

For tests and benchmarks (the chaos suite on PostgreSQL, ``benchmarks/rm_bench.py``,
``benchmarks/ceiling.py --rm-postgres``), not for deployments: a Service does this job there.

Why TCP and not HTTP: a Service or a layer-4 load balancer in front of the RM's replicas spreads
*connections*, not requests; a client's keep-alive connection stays with one replica until it is
closed. Forwarding bytes (no parsing) keeps that behaviour, and cutting a socket here is what a
client sees when a load balancer, a node or a replica goes away: the request may or may not have
reached a replica, and an answer may be lost after the replica applied it.

Each accepted connection goes to the next upstream in turn; an upstream that refuses the connection
(a SIGKILLed replica) is skipped for the next one, as a load balancer that retries on connect failure
does (Envoy's ``connect-failure``, HAProxy's ``redispatch``). If every upstream refuses, the client's
connection is closed.

Faults, drawn per connection from a seeded ``random.Random`` (``drop_rate``, 0 by default):

- ``refuse``: the connection is closed before anything reaches a replica;
- ``lost_answer``: the client's bytes reach the replica, which applies them; the connection is cut
  when the first byte of the answer comes back, so the client never sees it.

and on demand: :meth:`RoundRobinProxy.cut_all` aborts every open connection at once (a load balancer
restarted, a network partition healed).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

FAULTS = ("refuse", "lost_answer")
_CHUNK = 65536


class RoundRobinProxy:
    """What a test steers and reads: `drop_rate`, connections per upstream, faults by kind."""

    def __init__(self, *, upstreams: Sequence[str], seed: int, drop_rate: float = 0.0) -> None:
        if not upstreams:
            raise ValueError("a round-robin proxy needs at least one upstream")
        self.upstreams = [_host_port(url) for url in upstreams]
        self.drop_rate = drop_rate
        self.url = ""
        #: upstream index -> connections it was given
        self.connections: collections.Counter[int] = collections.Counter()
        self.faults: collections.Counter[str] = collections.Counter()
        self.unreachable = 0
        self._turn = 0
        self._rng = random.Random(seed)
        self._open: set[asyncio.StreamWriter] = set()

    def cut_all(self) -> int:
        """Abort every open connection, counted as fault ``cut``; returns the sockets aborted (2 each)."""
        cut = self._abort_all()
        self.faults["cut"] += cut
        return cut

    def _abort_all(self) -> int:
        open_ = list(self._open)
        for writer in open_:
            writer.transport.abort()
        return len(open_)

    def _draw(self) -> str | None:
        if self.drop_rate <= 0 or self._rng.random() >= self.drop_rate:
            return None
        kind = self._rng.choice(FAULTS)
        self.faults[kind] += 1
        return kind

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for _ in range(len(self.upstreams)):
            index = self._turn % len(self.upstreams)
            self._turn += 1
            host, port = self.upstreams[index]
            try:
                streams = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=5)
            except (OSError, TimeoutError):
                continue
            self.connections[index] += 1
            return streams
        self.unreachable += 1
        return None

    async def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        fault = self._draw()
        if fault == "refuse":
            client_writer.transport.abort()
            return
        upstream = await self._connect()
        if upstream is None:
            client_writer.transport.abort()
            return
        upstream_reader, upstream_writer = upstream
        self._open.update((client_writer, upstream_writer))
        try:
            await _race(
                _pipe(client_reader, upstream_writer, cut=None),
                _pipe(upstream_reader, client_writer, cut=client_writer if fault == "lost_answer" else None),
            )
        finally:
            for writer in (client_writer, upstream_writer):
                self._open.discard(writer)
                writer.transport.abort()


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, cut: asyncio.StreamWriter | None
) -> None:
    """Copy until EOF; with `cut`, abort that connection instead of passing the first chunk on."""
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while chunk := await reader.read(_CHUNK):
            if cut is not None:
                cut.transport.abort()
                return
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _race(*pipes: Coroutine[Any, Any, None]) -> None:
    """Run both directions until both end (each ends on EOF, an error or an abort)."""
    tasks = [asyncio.create_task(pipe) for pipe in pipes]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


def _host_port(url: str) -> tuple[str, int]:
    hostport = url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    return host, int(port)


@contextlib.asynccontextmanager
async def round_robin_proxy(
    *, upstreams: Sequence[str], seed: int, drop_rate: float = 0.0
) -> AsyncIterator[RoundRobinProxy]:
    """Serve a `RoundRobinProxy` over `upstreams` (``http://host:port``) on a loopback port."""
    proxy = RoundRobinProxy(upstreams=upstreams, seed=seed, drop_rate=drop_rate)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy.url = f"http://127.0.0.1:{port}"
    try:
        yield proxy
    finally:
        server.close()
        proxy._abort_all()
        await server.wait_closed()


async def _serve_forever(upstreams: Sequence[str]) -> None:
    async with round_robin_proxy(upstreams=upstreams, seed=0) as proxy:
        print(f"{BANNER} {proxy.url}", flush=True)
        await asyncio.Event().wait()


#: The first line ``python -m bindery.devcluster.rrproxy`` prints, followed by its URL.
BANNER = "round-robin proxy at"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bindery.devcluster.rrproxy URL URL…``: the proxy as its own process (benchmarks
    run it apart, so its CPU is neither the clients' nor the replicas')."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bindery.devcluster.rrproxy", description=main.__doc__)
    parser.add_argument("upstreams", nargs="+", metavar="URL")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(args.upstreams))


if __name__ == "__main__":
    main()
