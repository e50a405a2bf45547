"""The reference RM's storage stays bounded, and a failing disk makes it unready (issue 20, scenario 6).

A tenant could fill the RM's disk: each reservation row stored the whole canonical request (labels,
tolerations, affinity: up to 64 KiB), and released rows stayed an hour with no cap. Once the disk
was full every write and the cleanup answered 500 while ``/readyz`` stayed 200, so nothing told the
operator (or the kubelet) that the RM could no longer place anything.

The disk-full test fills a real, small tmpfs (it needs root to mount one; it is skipped otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import pathlib
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest
import yaml

from bindery.reference_rm.cli import serve_command, served_url
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.reference_rm.server import serve_reference_rm
from bindery.reference_rm.store import Conflict, GroupPlaced, Placed, ReservationStore
from bindery.rm.models import ReservationGroupRequest, ReservationRequest, ReservationState
from tests.rm.conftest import TOKEN, StoreFactory

NODES = [InventoryNode(name="n1", allocatable={"cpu": Decimal(1000)})]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEADLINE = 60.0


def body(uid: str, *, tolerations: int = 0, flavour: str = "a") -> dict[str, object]:
    """A reserve body; ``tolerations`` long ones make it about 240 bytes bigger each."""
    return {
        "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "s"},
        "resources": {"cpu": "1"},
        "placement": {
            "tolerations": [
                {"key": f"example.com/{flavour}{index:03d}-{'k' * 200}", "operator": "Exists"}
                for index in range(tolerations)
            ]
        },
        "idempotencyKey": uid,
        "ttlSeconds": 300,
    }


def request(uid: str, **options: object) -> ReservationRequest:
    return ReservationRequest.model_validate(body(uid, **options))  # type: ignore[arg-type]


def row_bytes(path: pathlib.Path, reservation_id: str) -> int:
    """What one reservation's row holds, every column counted in bytes."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        columns = [str(row[1]) for row in db.execute("PRAGMA table_info(reservations)")]
        lengths = ", ".join(f"length(CAST({column} AS BLOB))" for column in columns)
        row = db.execute(f"SELECT {lengths} FROM reservations WHERE id = ?", (reservation_id,)).fetchone()
    assert row is not None
    return sum(int(length or 0) for length in row)


def test_a_60_kib_request_leaves_a_row_of_bounded_size(tmp_path: pathlib.Path) -> None:
    big = request("big", tolerations=256)
    assert len(big.fingerprint()) > 60 * 1024
    store = ReservationStore(tmp_path / "db")
    placed = store.reserve(big, nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    # Idempotency still compares the whole request: the same one replays, another conflicts.
    replay = store.reserve(big, nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(replay, Placed)
    assert not replay.created
    other = request("big", tolerations=256, flavour="b")
    assert isinstance(store.reserve(other, nodes=NODES, policy=Policy.BINPACK), Conflict)
    store.close()
    size = row_bytes(tmp_path / "db", placed.reservation.id)
    assert size < 2048, f"a reservation row holds {size} bytes for a request of {len(big.fingerprint())}"


def test_rows_of_an_older_rm_keep_their_idempotency_and_shrink(tmp_path: pathlib.Path) -> None:
    """A database an older RM wrote holds the request's text: reopened, its replays still match."""
    big = request("old", tolerations=256)
    store = ReservationStore(tmp_path / "db")
    placed = store.reserve(big, nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "db")) as db, db:
        db.execute("UPDATE reservations SET fingerprint = ?", (big.fingerprint(),))  # as before digests
    reopened = ReservationStore(tmp_path / "db")
    replay = reopened.reserve(big, nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(replay, Placed)
    assert not replay.created
    reopened.close()
    assert row_bytes(tmp_path / "db", placed.reservation.id) < 2048


def test_released_rows_beyond_the_cap_are_deleted_newest_kept(make_store: StoreFactory) -> None:
    now = [1000.0]
    store = make_store(clock=lambda: now[0], max_released_rows=3)
    kept = store.reserve(request("kept"), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(kept, Placed)
    assert store.commit(kept.reservation.id) is not None
    released = []
    for index in range(10):
        now[0] += 1  # well inside the hour of retention
        placed = store.reserve(request(f"r{index}"), nodes=NODES, policy=Policy.BINPACK)
        assert isinstance(placed, Placed)
        store.release(placed.reservation.id)
        released.append(placed.reservation.id)
    group = ReservationGroupRequest.model_validate(
        {
            "group": {"namespace": "ns", "name": "g", "schedulerName": "s"},
            "members": [{"pod": body("g0")["pod"], "resources": {"cpu": "1"}}],
            "idempotencyKey": "g",
            "ttlSeconds": 300,
        }
    )
    grouped = store.reserve_group(group, nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(grouped, GroupPlaced)
    group_id = grouped.group.id
    now[0] += 1
    store.release_group(group_id)
    for index in range(10, 14):  # push the group's member out too
        now[0] += 1
        placed = store.reserve(request(f"r{index}"), nodes=NODES, policy=Policy.BINPACK)
        assert isinstance(placed, Placed)
        store.release(placed.reservation.id)
        released.append(placed.reservation.id)
    items, _ = store.list(state=ReservationState.RELEASED, limit=100)
    assert [item.id for item in items] == released[-3:]
    assert store.get_group(group_id) is None, "a group whose members are all gone is gone too"
    active, _ = store.list(state=ReservationState.COMMITTED, limit=100)
    assert [item.id for item in active] == [kept.reservation.id]
    store.close()


def test_retention_is_a_store_setting(make_store: StoreFactory) -> None:
    now = [1000.0]
    store = make_store(clock=lambda: now[0], retention=30)
    placed = store.reserve(request("a"), nodes=NODES, policy=Policy.BINPACK)
    assert isinstance(placed, Placed)
    store.release(placed.reservation.id)
    now[0] += 29
    assert store.get(placed.reservation.id) is not None
    now[0] += 31
    assert store.get(placed.reservation.id) is None
    store.close()


@contextlib.contextmanager
def small_disk(path: pathlib.Path, size: str = "2m") -> Iterator[pathlib.Path]:
    """A real filesystem of ``size`` at ``path`` (tmpfs), unmounted afterwards."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path: pathlib.Path) -> None:
    """Write ``path`` until the filesystem has no byte left."""
    with path.open("wb", buffering=0) as filler:
        for chunk in (64 * 1024, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    filler.write(b"\0" * chunk)
    with pytest.raises(OSError, match="No space left") as full, path.open("ab", buffering=0) as more:
        more.write(b"\0")
    assert full.value.errno == errno.ENOSPC


async def wait_ready(http: httpx.AsyncClient, status: int) -> httpx.Response:
    deadline = time.monotonic() + DEADLINE
    while True:
        answer = await http.get("/readyz")
        if answer.status_code == status or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.1)


async def test_a_full_disk_makes_the_rm_unready_until_space_is_back(tmp_path: pathlib.Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        async with (
            serve_reference_rm(db_path=disk / "rm.sqlite", inventory=NODES, token=TOKEN) as server,
            httpx.AsyncClient(base_url=server.url) as http,
        ):
            first = await http.post("/v1/reservations", json=body("before"), headers=AUTH)
            assert first.status_code == 201, first.text
            fill(disk / "filler")
            failed = await http.post("/v1/reservations", json=body(f"full-{uuid.uuid4()}"), headers=AUTH)
            assert failed.status_code == 500, failed.text
            unready = await http.get("/readyz")
            assert unready.status_code == 503, f"/readyz answered {unready.status_code} while writes fail"
            assert "full" in unready.json()["detail"], unready.json()
            still = await http.get("/readyz")  # it tried a write again, and that failed too
            assert still.status_code == 503, still.text
            os.remove(disk / "filler")
            ready = await wait_ready(http, 200)
            assert ready.status_code == 200, ready.text
            after = await http.post("/v1/reservations", json=body("after"), headers=AUTH)
            assert after.status_code == 201, after.text


async def test_the_cap_is_a_flag_of_rm_serve(tmp_path: pathlib.Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "allocatable": {"cpu": "8"}}]}))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    options = ["--inventory", str(inventory), "--max-released-rows", "1", "--retain-released-seconds", "600"]
    argv = serve_command(db=tmp_path / "rm.sqlite", token_file=token_file, options=options)
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        banner = await asyncio.wait_for(process.stdout.readline(), timeout=DEADLINE)
        assert banner, "the reference RM did not start"
        async with httpx.AsyncClient(base_url=served_url(banner), headers=AUTH) as http:
            for index in range(3):
                placed = await http.post("/v1/reservations", json=body(f"p{index}"))
                assert placed.status_code == 201, placed.text
                assert (await http.delete(f"/v1/reservations/{placed.json()['id']}")).status_code == 204
            listed = await http.get("/v1/reservations", params={"state": "released"})
        assert [item["podUid"] for item in listed.json()["items"]] == ["p2"]
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=DEADLINE)
