"""One writer per SQLite database (issue 20, scenario 11).

Two ``bindery rm serve`` processes on one ``--db`` both started: each counted only its own
reservations in memory, so together they handed out a node twice. The second one must refuse to
start (exit 2) and say which process holds the database, and a holder killed with SIGKILL must not
leave a stale lock behind: the next RM starts at once.
"""

from __future__ import annotations

import asyncio
import pathlib
import signal
import socket
import subprocess

import yaml

from bindery.reference_rm.cli import serve_command, served_url
from tests.rm.conftest import TOKEN

DEADLINE = 60.0


def _argv(directory: pathlib.Path) -> list[str]:
    inventory = directory / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "allocatable": {"cpu": "1"}}]}))
    token_file = directory / "token"
    token_file.write_text(TOKEN)
    return serve_command(
        db=directory / "rm.sqlite", token_file=token_file, options=["--inventory", str(inventory)]
    )


async def _start(
    argv: list[str], *, stderr: int = subprocess.DEVNULL
) -> tuple[asyncio.subprocess.Process, bytes]:
    """The process and its first line on stdout (empty when it exited without serving)."""
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=stderr)
    assert process.stdout is not None
    return process, await asyncio.wait_for(process.stdout.readline(), timeout=DEADLINE)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    await asyncio.wait_for(process.wait(), timeout=DEADLINE)


async def test_a_second_rm_on_one_database_exits_2_naming_the_holder(tmp_path: pathlib.Path) -> None:
    argv = _argv(tmp_path)
    first, banner = await _start(argv)
    try:
        assert banner, "the first reference RM did not start"
        second, second_banner = await _start(argv, stderr=subprocess.PIPE)
        try:
            assert not second_banner, f"a second RM serves the same database at {served_url(second_banner)}"
            assert second.stderr is not None
            stderr = (await asyncio.wait_for(second.stderr.read(), timeout=DEADLINE)).decode()
            assert await asyncio.wait_for(second.wait(), timeout=DEADLINE) == 2, stderr
        finally:
            await _stop(second)
        assert f"pid {first.pid}" in stderr, stderr
        assert socket.gethostname() in stderr, stderr
        assert str(tmp_path / "rm.sqlite") in stderr, stderr
    finally:
        await _stop(first)


async def test_a_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path: pathlib.Path) -> None:
    argv = _argv(tmp_path)
    first, banner = await _start(argv)
    try:
        assert banner, "the first reference RM did not start"
    finally:
        first.send_signal(signal.SIGKILL)
        await asyncio.wait_for(first.wait(), timeout=DEADLINE)
    after, after_banner = await _start(argv)
    try:
        assert after_banner, "the RM did not start after its predecessor was killed: a stale lock"
    finally:
        await _stop(after)
