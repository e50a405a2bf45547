"""A mirror cut off from the apiserver makes the reference RM unready (issue 20, item 11).

The mirrors retry for ever, which is right, but ``/readyz`` stayed 200 all along: an RM whose watch
of the nodes and pods had been failing for an hour still placed pods on the snapshot of an hour
ago, and nothing told the operator. Here the RM reaches the REAL dev apiserver through a TCP relay
the test cuts (open connections dropped, new ones refused) and then restores on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
import urllib.parse

import httpx
from kubernetes_asyncio import client

from bindery.devcluster.plane import ControlPlane
from bindery.reference_rm.mirror import MirrorHealth
from tests.rm.test_refrm_accounting import DEADLINE, Pool, eventually, make_nodes, rm_process


class Relay:
    """A TCP relay to ``target`` that can be cut and restored on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def cut(self) -> None:
        """Refuse new connections and drop the open ones (as an apiserver that vanished)."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()
        self._server = None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, upstream_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        self._writers -= {writer, upstream_writer}


async def readyz(base_url: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url) as http:
        return await http.get("/readyz")


async def wait_readyz(base_url: str, status: int) -> httpx.Response:
    deadline = time.monotonic() + DEADLINE
    while True:
        answer = await readyz(base_url)
        if answer.status_code == status or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.2)


async def test_a_mirror_cut_off_from_the_apiserver_makes_the_rm_unready_until_it_is_back(
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
) -> None:
    pool = Pool()
    (node,) = await make_nodes(kube_api, pool, 1)
    apiserver = urllib.parse.urlsplit(controlplane.server)
    assert apiserver.hostname is not None
    assert apiserver.port is not None
    relay = Relay((apiserver.hostname, apiserver.port))
    await relay.open()
    kubeconfig = controlplane.mint_kubeconfig(
        user=f"stale-rm-{pool.id}",
        groups=["system:masters"],
        path=tmp_path / "relayed.kubeconfig",
        server=f"https://127.0.0.1:{relay.port}",
    )
    try:
        async with rm_process(
            plane=controlplane,
            pool=pool,
            directory=tmp_path,
            token_file=token_file,
            kubeconfig=kubeconfig,
            extra_options=["--mirror-stale-seconds", "2"],
        ) as rm:
            await relay.cut()
            unready = await wait_readyz(rm.base_url, 503)
            assert unready.status_code == 503, (
                f"/readyz answered {unready.status_code} with the apiserver unreachable for {DEADLINE} s"
            )
            detail = unready.json()["detail"]
            assert "mirror" in detail, detail
            assert "failing for" in detail, detail
            await relay.open()
            ready = await wait_readyz(rm.base_url, 200)
            assert ready.status_code == 200, f"not ready again with the apiserver back: {ready.text}"
            await eventually(rm.check_ready, "the RM stayed ready")
    finally:
        with contextlib.suppress(AssertionError):
            await relay.cut()
        await client.CoreV1Api(kube_api).delete_node(name=node)


def test_the_health_of_a_mirror_follows_its_failures_and_successes() -> None:
    """The same rules without a plane: a streak of failures past the bound is stale, any list or
    answered watch in between starts over, and a quiet watch that simply resumes never is."""
    now = [0.0]
    health = MirrorHealth(what="pod", stale_after=60, clock=lambda: now[0])
    health.cursor.lists, health.cursor.watches = 1, 1  # listed, then watching
    now[0] = 500.0  # a quiet set: no failure at all
    assert health.stale_reason() is None
    health.failed()
    health.last_error = "watch of pods for the mirror failed: connection refused"
    now[0] = 559.0
    health.failed()
    assert health.stale_reason() is None
    now[0] = 561.0
    reason = health.stale_reason()
    assert reason is not None
    assert "pod mirror has been failing for 61 s" in reason
    assert "connection refused" in reason
    health.cursor.watches += 1  # the apiserver answered a watch again
    assert health.stale_reason() is None
    health.failed()  # a new streak starts here, not at the first failure
    now[0] = 620.0
    assert health.stale_reason() is None
    health.ended = True
    assert "pod mirror stopped" in (health.stale_reason() or "")
