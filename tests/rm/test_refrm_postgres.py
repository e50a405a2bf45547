"""The reference RM on PostgreSQL, as its own processes: the conformance kit, and several active
replicas on one database that never overcommit and answer every idempotency key once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

import httpx
import psycopg
import pytest

from bindery.conformance import CHECKS
from bindery.conformance.cli import main as conformance_main
from bindery.devcluster.postgres import PostgresServer
from bindery.devcluster.rrproxy import round_robin_proxy
from bindery.quantity import parse_quantity
from bindery.reference_rm.cli import serve_command, served_url

from .conftest import ADMIN_TOKEN, TOKEN

SLOT = "bindery.dev/conformance-slot"
INVENTORY = (
    "nodes:\n"
    f"  - {{name: a, allocatable: {{cpu: '64', {SLOT}: '3'}}}}\n"
    f"  - {{name: b, allocatable: {{cpu: '64', {SLOT}: '2'}},"
    " taints: [{key: k, value: v, effect: NoSchedule}]}\n"
)
#: The replicas' test: room for 60 of the 100 keys, so many placements race before it is full.
HA_INVENTORY = (
    "nodes:\n"
    f"  - {{name: a, allocatable: {{cpu: '64', {SLOT}: '40'}}}}\n"
    f"  - {{name: b, allocatable: {{cpu: '64', {SLOT}: '20'}}}}\n"
)
HA_CAPACITY = {"a": Decimal(40), "b": Decimal(20)}


@contextlib.contextmanager
def replicas(
    count: int,
    *,
    db: str,
    postgres: PostgresServer,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
    nodes: str = INVENTORY,
    processes: list[subprocess.Popen[bytes]] | None = None,
) -> Iterator[list[str]]:
    """``count`` ``bindery rm serve`` processes on one PostgreSQL database; their URLs (and their
    processes appended to ``processes``, for a test that kills one).

    The password reaches them through ``--db-password-file`` (PGPASSWORD is removed from their
    environment, so the flag is what logs them in).  Each one still running at the end must stop
    cleanly on SIGTERM."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(nodes)
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN_TOKEN)
    options = [
        *("--inventory", str(inventory), "--db-password-file", str(postgres.password_file)),
        *("--admin-token-file", str(admin_file)),
    ]
    servers: list[subprocess.Popen[bytes]] = [] if processes is None else processes
    try:
        urls = []
        for _ in range(count):
            server = subprocess.Popen(
                serve_command(db=db, token_file=token_file, options=options), stdout=subprocess.PIPE, env=env
            )
            servers.append(server)
            assert server.stdout is not None
            banner = server.stdout.readline()
            assert banner, f"a replica exited with {server.wait(timeout=30)} before serving"
            urls.append(served_url(banner))
        yield urls
    finally:
        running = [server for server in servers if server.poll() is None]
        for server in running:
            server.send_signal(signal.SIGTERM)
        codes = [server.wait(timeout=30) for server in running]
    assert codes == [0] * len(running)


def test_conformance_kit_against_a_reference_rm_process_on_postgres(
    postgres: PostgresServer,
    postgres_db: str,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with replicas(1, db=postgres_db, postgres=postgres, tmp_path=tmp_path, token_file=token_file) as (url,):
        # The reference RM lists `revocation`: the kit revokes through its admin path.
        revoke = shlex.join(
            [
                *(sys.executable, "-m", "bindery.reference_rm.cli", "revoke", "--url", url),
                *("--admin-token-file", str(tmp_path / "admin-token"), "--reason", "{reason}", "{id}"),
            ]
        )
        code = conformance_main(
            ["--url", url, "--token-file", str(token_file), "--capacity", "5", "--revoke-command", revoke]
        )
        output = capsys.readouterr().out
        assert code == 0, output
        assert f"{len(CHECKS)}/{len(CHECKS)} checks passed" in output


def body(key: str) -> dict[str, Any]:
    return {
        "pod": {"uid": key, "namespace": "ha", "name": key, "schedulerName": "s", "priority": 0},
        "resources": {SLOT: "1"},
        "placement": {"tolerations": [{"operator": "Exists"}]},
        "idempotencyKey": key,
        "ttlSeconds": 300,
    }


async def burst(urls: Sequence[str], *, clients: int, keys_per_client: int) -> dict[str, list[str | None]]:
    """``clients`` concurrent clients; each sends each of its keys twice, to two different replicas
    (round robin over ``urls``), all at once.  Per key, the reservation id of each answer (None: refused)."""
    answers: dict[str, list[str | None]] = defaultdict(list)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    turn = iter(range(10**9))
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:

        async def send(key: str) -> None:
            url = urls[next(turn) % len(urls)]
            response = await http.post(f"{url}/v1/reservations", json=body(key))
            if response.status_code in (200, 201):
                answers[key].append(str(response.json()["id"]))
            else:
                assert response.status_code == 409, response.text  # unschedulable, nothing else
                answers[key].append(None)

        async def client(index: int) -> None:
            for n in range(keys_per_client):
                key = f"c{index}-k{n}"
                await asyncio.gather(send(key), send(key))

        await asyncio.gather(*(client(index) for index in range(clients)))
    return answers


def active_rows(db: str) -> list[tuple[str, str, str, str]]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT id, idempotency_key, node, resources FROM reservations "
            "WHERE state IN ('reserved', 'committed')"
        ).fetchall()
    return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]


@pytest.mark.parametrize("count", [2, 3])
async def test_replicas_on_one_database_never_overcommit_and_answer_each_key_once(
    count: int,
    postgres: PostgresServer,
    postgres_db: str,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
) -> None:
    """50 clients, 100 keys sent twice each to different replicas, 60 slots: exactly 60 reservations,
    no node past its allocatable, and both answers of a key name the same reservation.

    It fails without the placement lock row: with the lock taken out (and the unique index of active
    keys, which otherwise turns the race into 500s) six runs of six left node a at 41 or 42 of 40 slots."""
    with replicas(
        count, db=postgres_db, postgres=postgres, tmp_path=tmp_path, token_file=token_file, nodes=HA_INVENTORY
    ) as urls:
        answers = await burst(urls, clients=50, keys_per_client=2)
    assert len(answers) == 100
    rows = active_rows(postgres_db)
    # Never overcommitted: per node, the active reservations fit its allocatable.
    used: Counter[str] = Counter()
    for _, _, node, resources in rows:
        used[node] += int(parse_quantity(json.loads(resources)[SLOT]))
    assert all(used[node] <= HA_CAPACITY[node] for node in used), used
    assert sum(used.values()) == sum(HA_CAPACITY.values())  # and all of it used: refusals were real
    # Every key answered once: one active row per key, and every answer that placed names it.
    keys = Counter(key for _, key, _, _ in rows)
    assert all(n == 1 for n in keys.values()), keys
    by_key = {key: id_ for id_, key, _, _ in rows}
    for key, ids in answers.items():
        # Both sends of a key met at the lock row: the second replays the first, placed or refused.
        assert ids == [by_key.get(key)] * 2, (key, ids)


async def test_postgres_down_is_503_and_not_ready_and_the_key_replays_after_restart(
    postgres: PostgresServer, postgres_db: str, tmp_path: pathlib.Path, token_file: pathlib.Path
) -> None:
    """PostgreSQL SIGKILLed under a running replica: a reserve is refused with 503 and Retry-After
    (ask again), not a 500, and /readyz says why; after the restart the replica reconnects by itself,
    turns ready, and the same key places once."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with replicas(1, db=postgres_db, postgres=postgres, tmp_path=tmp_path, token_file=token_file) as (url,):
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
            before = await http.post("/v1/reservations", json=body("before"))
            assert before.status_code == 201, before.text
            postgres.kill(signal.SIGKILL)
            try:
                down = await http.post("/v1/reservations", json=body("during"))
                assert down.status_code == 503, down.text
                assert down.headers["Retry-After"] == "1"
                assert "did not answer" in down.json()["detail"]
                unready = await http.get("/readyz")
                assert unready.status_code == 503, unready.text
                assert "bring the database back" in unready.json()["detail"]
            finally:
                postgres.restart()
            deadline = asyncio.get_running_loop().time() + 30
            while (ready := await http.get("/readyz")).status_code != 200:
                assert asyncio.get_running_loop().time() < deadline, ready.text
                await asyncio.sleep(0.2)
            again = await http.post("/v1/reservations", json=body("during"))
            assert again.status_code == 201, again.text
            replay = await http.post("/v1/reservations", json=body("during"))
            assert replay.status_code == 200, replay.text
            assert replay.json()["id"] == again.json()["id"]
            kept = await http.get(f"/v1/reservations/{before.json()['id']}")
            assert kept.status_code == 200, kept.text  # what was committed before the crash is there


def group_body(key: str, members: int) -> dict[str, Any]:
    return {
        "group": {"namespace": "ha", "name": key, "uid": f"{key}-uid", "schedulerName": "s"},
        "members": [
            {
                "pod": {
                    "uid": f"{key}-{index}",
                    "namespace": "ha",
                    "name": f"{key}-{index}",
                    "schedulerName": "s",
                },
                "resources": {SLOT: "1"},
                "placement": {"tolerations": [{"operator": "Exists"}]},
            }
            for index in range(members)
        ],
        "idempotencyKey": key,
        "ttlSeconds": 300,
    }


async def test_groups_and_batches_across_replicas_are_all_or_nothing_and_never_overcommit(
    postgres: PostgresServer, postgres_db: str, tmp_path: pathlib.Path, token_file: pathlib.Path
) -> None:
    """Two replicas; 30 groups of 3 (each sent twice, to both replicas) and 20 batches of 3 reserves
    race for 60 slots, 150 asked: every group holds all its members or none, both answers of a group
    key name the same group, no node is past its allocatable, and every placed batch reserve is there.

    Without the placement lock row it failed 3 runs of 3 (node a at 41 or 43 of 40 slots)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    group_answers: dict[str, list[str | None]] = defaultdict(list)
    batch_placed: list[str] = []
    with replicas(
        2, db=postgres_db, postgres=postgres, tmp_path=tmp_path, token_file=token_file, nodes=HA_INVENTORY
    ) as urls:
        async with httpx.AsyncClient(headers=headers, timeout=60) as http:

            async def group(index: int, replica: int) -> None:
                response = await http.post(
                    f"{urls[replica]}/v1/reservation-groups", json=group_body(f"g{index}", 3)
                )
                assert response.status_code in (200, 201, 409), response.text
                group_answers[f"g{index}"].append(
                    str(response.json()["id"]) if response.status_code != 409 else None
                )

            async def batch(index: int) -> None:
                operations = [{"reserve": body(f"b{index}-{n}")} for n in range(3)]
                response = await http.post(f"{urls[index % 2]}/v1/batch", json={"operations": operations})
                assert response.status_code == 200, response.text
                for result in response.json()["results"]:
                    assert result["status"] in (201, 409), result
                    if result["status"] == 201:
                        batch_placed.append(str(result["reservation"]["id"]))

            await asyncio.gather(
                *(group(index, replica) for index in range(30) for replica in (0, 1)),
                *(batch(index) for index in range(20)),
            )
    rows = active_rows(postgres_db)
    used: Counter[str] = Counter()
    for _, _, node, resources in rows:
        used[node] += int(parse_quantity(json.loads(resources)[SLOT]))
    assert all(used[node] <= HA_CAPACITY[node] for node in used), used
    ids = {id_ for id_, _, _, _ in rows}
    assert set(batch_placed) <= ids  # a placed batch reserve was committed with its batch
    with psycopg.connect(postgres_db) as conn:
        members = conn.execute(
            "SELECT g.idempotency_key, g.id, count(r.id) FROM reservation_groups g "
            "JOIN reservations r ON r.group_id = g.id AND r.state IN ('reserved', 'committed') "
            "GROUP BY g.idempotency_key, g.id"
        ).fetchall()
    held = {str(key): str(group_id) for key, group_id, _ in members}
    assert all(count == 3 for _, _, count in members), members  # all members or none
    assert len(held) == len(members)  # one active group per key
    for key, answers in group_answers.items():
        assert answers == [held.get(key)] * 2, (key, answers)
    assert sum(used.values()) == 3 * len(held) + len(batch_placed)


async def test_a_replica_sigkilled_mid_burst_loses_and_doubles_nothing(
    postgres: PostgresServer, postgres_db: str, tmp_path: pathlib.Path, token_file: pathlib.Path
) -> None:
    """Three replicas; once 30 of 100 keys are answered, one is SIGKILLed. Clients whose call
    fails (connection refused or reset, 503) ask the next replica with the same key, as Bindery's
    client does: no node past its allocatable, one active reservation per key, and every key's
    final answer names that reservation, whether the dead replica or a live one placed it."""
    processes: list[subprocess.Popen[bytes]] = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    final: dict[str, str | None] = {}
    failures = 0
    with replicas(
        3,
        db=postgres_db,
        postgres=postgres,
        tmp_path=tmp_path,
        token_file=token_file,
        nodes=HA_INVENTORY,
        processes=processes,
    ) as urls:
        async with httpx.AsyncClient(headers=headers, timeout=60) as http:

            async def send(key: str, first: int) -> None:
                nonlocal failures
                for attempt in range(9):
                    url = urls[(first + attempt) % len(urls)]
                    try:
                        response = await http.post(f"{url}/v1/reservations", json=body(key))
                    except httpx.TransportError:
                        failures += 1
                        continue
                    if response.status_code == 503:
                        failures += 1
                        continue
                    assert response.status_code in (200, 201, 409), response.text
                    final[key] = str(response.json()["id"]) if response.status_code != 409 else None
                    if len(final) == 30:
                        processes[0].send_signal(signal.SIGKILL)
                    return
                raise AssertionError(f"{key}: no replica answered in 9 attempts")

            async def client(index: int) -> None:
                for n in range(2):
                    await send(f"c{index}-k{n}", index)

            await asyncio.gather(*(client(index) for index in range(50)))
    assert processes[0].wait(timeout=30) == -signal.SIGKILL
    assert len(final) == 100
    rows = active_rows(postgres_db)
    used: Counter[str] = Counter()
    for _, _, node, resources in rows:
        used[node] += int(parse_quantity(json.loads(resources)[SLOT]))
    assert all(used[node] <= HA_CAPACITY[node] for node in used), used
    keys = Counter(key for _, key, _, _ in rows)
    assert all(n == 1 for n in keys.values()), keys
    by_key = {key: id_ for id_, key, _, _ in rows}
    assert final == {key: by_key.get(key) for key in final}
    print(f"calls that failed over to another replica: {failures}")


async def test_postgres_restarted_mid_burst_loses_and_doubles_nothing(
    postgres: PostgresServer, postgres_db: str, tmp_path: pathlib.Path, token_file: pathlib.Path
) -> None:
    """Two replicas; once 30 of 100 keys are answered PostgreSQL is SIGKILLed and started again.
    Calls in between answer 503; clients ask again (the next replica, the same key) until the
    replicas reconnect by themselves: no node past its allocatable, one active reservation per key,
    and every key's final answer names it."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    final: dict[str, str | None] = {}
    refused = 0
    crash: asyncio.Task[None] | None = None

    async def crash_and_restart() -> None:
        await asyncio.to_thread(postgres.kill, signal.SIGKILL)
        await asyncio.to_thread(postgres.restart)

    try:
        with replicas(
            2, db=postgres_db, postgres=postgres, tmp_path=tmp_path, token_file=token_file, nodes=HA_INVENTORY
        ) as urls:
            async with httpx.AsyncClient(headers=headers, timeout=60) as http:
                deadline = asyncio.get_running_loop().time() + 120

                async def send(key: str, first: int) -> None:
                    nonlocal refused, crash
                    attempt = 0
                    while asyncio.get_running_loop().time() < deadline:
                        url = urls[(first + attempt) % len(urls)]
                        attempt += 1
                        response = await http.post(f"{url}/v1/reservations", json=body(key))
                        if response.status_code == 503:  # the database is away: ask again, as told
                            refused += 1
                            await asyncio.sleep(float(response.headers["Retry-After"]) / 10)
                            continue
                        assert response.status_code in (200, 201, 409), response.text
                        final[key] = str(response.json()["id"]) if response.status_code != 409 else None
                        if len(final) == 30 and crash is None:
                            crash = asyncio.create_task(crash_and_restart())
                        return
                    raise AssertionError(f"{key}: not answered in 120 s")

                async def client(index: int) -> None:
                    for n in range(2):
                        await send(f"c{index}-k{n}", index)

                await asyncio.gather(*(client(index) for index in range(50)))
                assert crash is not None
                await crash
    finally:
        if not postgres.running:
            postgres.restart()
    assert len(final) == 100
    rows = active_rows(postgres_db)
    used: Counter[str] = Counter()
    for _, _, node, resources in rows:
        used[node] += int(parse_quantity(json.loads(resources)[SLOT]))
    assert all(used[node] <= HA_CAPACITY[node] for node in used), used
    keys = Counter(key for _, key, _, _ in rows)
    assert all(n == 1 for n in keys.values()), keys
    by_key = {key: id_ for id_, key, _, _ in rows}
    assert final == {key: by_key.get(key) for key in final}
    print(f"calls answered 503 while PostgreSQL was away: {refused}")


@pytest.mark.parametrize("count", [2, 3])
async def test_replicas_behind_a_round_robin_proxy_that_drops_connections_never_overcommit(
    count: int,
    postgres: PostgresServer,
    postgres_db: str,
    tmp_path: pathlib.Path,
    token_file: pathlib.Path,
) -> None:
    """The deployment's shape: one address (a round-robin TCP proxy, as a Service) in front of the
    replicas. 50 clients send each of 100 keys twice, for 60 slots, while the proxy refuses one
    connection in five or cuts it after the replica applied the call (the answer is lost); a client
    whose call fails sends the same key again, as Bindery's client does. Every replica serves, no node
    is past its allocatable, one active reservation per key, and each key's last answer names it."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    final: dict[str, list[str | None]] = defaultdict(list)
    failed = 0
    with replicas(
        count, db=postgres_db, postgres=postgres, tmp_path=tmp_path, token_file=token_file, nodes=HA_INVENTORY
    ) as urls:
        async with (
            round_robin_proxy(upstreams=urls, seed=count, drop_rate=0.2) as proxy,
            httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=60) as http,
        ):

            async def send(key: str) -> None:
                nonlocal failed
                for _ in range(20):
                    try:
                        response = await http.post("/v1/reservations", json=body(key))
                    except httpx.TransportError:
                        failed += 1
                        continue
                    assert response.status_code in (200, 201, 409), response.text
                    final[key].append(str(response.json()["id"]) if response.status_code != 409 else None)
                    return
                raise AssertionError(f"{key}: 20 attempts through the proxy failed")

            async def client(index: int) -> None:
                for n in range(2):
                    key = f"c{index}-k{n}"
                    await asyncio.gather(send(key), send(key))

            await asyncio.gather(*(client(index) for index in range(50)))
    print(f"connections per replica {dict(proxy.connections)}, faults {dict(proxy.faults)}, failed {failed}")
    assert sorted(proxy.connections) == list(range(count)), proxy.connections  # every replica served
    assert proxy.faults["refuse"], proxy.faults
    assert proxy.faults["lost_answer"], proxy.faults
    assert len(final) == 100
    rows = active_rows(postgres_db)
    used: Counter[str] = Counter()
    for _, _, node, resources in rows:
        used[node] += int(parse_quantity(json.loads(resources)[SLOT]))
    assert all(used[node] <= HA_CAPACITY[node] for node in used), used
    assert sum(used.values()) == sum(HA_CAPACITY.values())
    keys = Counter(key for _, key, _, _ in rows)
    assert all(n == 1 for n in keys.values()), keys
    by_key = {key: id_ for id_, key, _, _ in rows}
    for key, ids in final.items():
        assert ids == [by_key.get(key)] * 2, (key, ids)
