"""Reservation groups (contract v1.1) on the reference RM over real HTTP, and as its own process.

All-or-nothing under concurrent groups (no partial group, no overcommit), replay and key reuse,
topology, per-member commit and release, group release and renew, the list's ``groupId``, the body
limit, an RM without groups, and a SIGKILLed RM process that comes back with its groups.
"""

from __future__ import annotations

import asyncio
import collections
import pathlib
import random
import signal
import subprocess
from decimal import Decimal
from typing import Any

import httpx
import pytest
import yaml

from bindery.quantity import parse_quantity
from bindery.reference_rm import InventoryNode, serve_reference_rm
from bindery.reference_rm.cli import serve_command, served_url
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import (
    ProblemType,
    RMConflict,
    RMGroupsUnsupported,
    RMProtocolError,
    RMRejected,
    RMUnavailable,
    RMUnschedulable,
)
from bindery.rm.models import ReservationGroupRequest, ReservationState

from .conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}
ZONE = "topology.kubernetes.io/zone"


def inventory(*spec: tuple[str, str, str]) -> list[InventoryNode]:
    """(name, cpu, zone) per node."""
    return [
        InventoryNode(name=name, allocatable={"cpu": Decimal(cpu), "pods": Decimal(110)}, labels={ZONE: zone})
        for name, cpu, zone in spec
    ]


def group_body(
    key: str, count: int, *, cpu: str = "1", topology: tuple[str, ...] = (), ttl: int = 60
) -> dict[str, Any]:
    return {
        "group": {"namespace": "ns", "name": key, "uid": f"uid-{key}", "schedulerName": "bindery"},
        "members": [
            {
                "pod": {
                    "uid": f"{key}-{i}",
                    "namespace": "ns",
                    "name": f"{key}-{i}",
                    "schedulerName": "bindery",
                },
                "resources": {"cpu": cpu},
            }
            for i in range(count)
        ],
        "topology": [{"key": k} for k in topology],
        "idempotencyKey": key,
        "ttlSeconds": ttl,
    }


def group_request(key: str, count: int, **options: Any) -> ReservationGroupRequest:
    return ReservationGroupRequest.model_validate(group_body(key, count, **options))


def rm_client(url: str) -> ResourceManagerClient:
    return ResourceManagerClient(base_url=url, token=TOKEN, allow_insecure_http=True)


async def listed(url: str, **params: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url) as http:
        response = await http.get("/v1/reservations", params={"limit": "500", **params}, headers=AUTH)
        assert response.status_code == 200, response.text
        return list(response.json()["items"])


def overcommitted(items: list[dict[str, Any]], nodes: list[InventoryNode]) -> list[str]:
    capacity = {node.name: node.allocatable["cpu"] for node in nodes}
    used: dict[str, Decimal] = collections.defaultdict(Decimal)
    for item in items:
        if item["state"] in ("reserved", "committed"):
            used[item["node"]] += parse_quantity(item["resources"]["cpu"])
    return [
        f"{node}: {amount} of {capacity[node]} cpu"
        for node, amount in used.items()
        if amount > capacity[node]
    ]


async def test_a_group_of_8_with_room_for_7_gets_nothing_then_everything(tmp_path: pathlib.Path) -> None:
    nodes = inventory(("n1", "4", "a"), ("n2", "4", "a"))
    async with serve_reference_rm(db_path=tmp_path / "db", inventory=nodes, token=TOKEN) as server:
        async with rm_client(server.url) as client:
            blocker = await client.reserve_group(group_request("blocker", 1))
            with pytest.raises(RMUnschedulable) as refused:
                await client.reserve_group(group_request("gang", 8))
            assert refused.value.reason == (
                "group ns/gang needs 8 pods of 1 cpu reserved together; the RM could place only 7 of "
                "them, for member ns/gang-7: 0/2 nodes are available: 2 Insufficient cpu."
            )
            assert refused.value.retry_after is not None  # the blocker's lease may free room
            assert [item["podUid"] for item in await listed(server.url)] == ["blocker-0"]
            await client.release_group(blocker.id)
            gang = await client.reserve_group(group_request("gang", 8))
        assert [m.pod_uid for m in gang.members] == [f"gang-{i}" for i in range(8)]
        assert all(m.state is ReservationState.RESERVED and m.group_id == gang.id for m in gang.members)
        assert gang.expires_at is not None


async def test_concurrent_groups_are_all_or_nothing_and_never_overcommit(tmp_path: pathlib.Path) -> None:
    nodes = inventory(("n1", "4", "a"), ("n2", "4", "a"), ("n3", "4", "b"))
    rng = random.Random(11)
    asks = [(f"g{i}", rng.randint(2, 7), rng.choice(["1", "500m", "1500m"])) for i in range(24)]

    async def one(url: str, key: str, count: int, cpu: str) -> bool:
        async with rm_client(url) as client:
            try:
                group = await client.reserve_group(group_request(key, count, cpu=cpu))
            except RMUnschedulable:
                return False
            assert len(group.members) == count
            return True

    async with serve_reference_rm(db_path=tmp_path / "db", inventory=nodes, token=TOKEN) as server:
        outcomes = await asyncio.gather(*(one(server.url, *ask) for ask in asks))
        items = await listed(server.url)
    assert 0 < sum(outcomes) < len(asks)  # contention really happened
    by_group = collections.Counter(item["groupId"] for item in items)
    members_of = {item["groupId"]: item["podUid"].rsplit("-", 1)[0] for item in items}
    for (key, count, _), reserved in zip(asks, outcomes, strict=True):
        held = [group for group, owner in members_of.items() if owner == key]
        if reserved:
            assert len(held) == 1
            assert by_group[held[0]] == count, f"group {key} holds {by_group[held[0]]} of {count} members"
        else:
            assert held == [], f"refused group {key} holds reservations"
    assert overcommitted(items, nodes) == []


async def test_two_groups_that_fit_alone_but_not_together(tmp_path: pathlib.Path) -> None:
    nodes = inventory(("n1", "4", "a"), ("n2", "4", "b"))
    async with serve_reference_rm(db_path=tmp_path / "db", inventory=nodes, token=TOKEN) as server:
        async with rm_client(server.url) as one, rm_client(server.url) as two:
            results = await asyncio.gather(
                one.reserve_group(group_request("left", 5)),
                two.reserve_group(group_request("right", 5)),
                return_exceptions=True,
            )
        items = await listed(server.url)
    assert sorted(type(result).__name__ for result in results) == ["RMUnschedulable", "ReservationGroup"]
    assert len(items) == 5
    assert len({item["groupId"] for item in items}) == 1


async def test_replay_and_key_reuse(tmp_path: pathlib.Path) -> None:
    nodes = inventory(("n1", "4", "a"))
    async with serve_reference_rm(db_path=tmp_path / "db", inventory=nodes, token=TOKEN) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as http:
            first = await http.post("/v1/reservation-groups", json=group_body("g", 2, cpu="1000m"))
            again = await http.post("/v1/reservation-groups", json=group_body("g", 2, cpu="1"))
            other = await http.post("/v1/reservation-groups", json=group_body("g", 3))
        assert first.status_code == 201
        assert first.headers["Location"] == f"/v1/reservation-groups/{first.json()['id']}"
        assert again.status_code == 200  # the same request: quantities compare by value
        assert again.json() == first.json()
        assert other.status_code == 409
        assert other.json()["type"] == ProblemType.IDEMPOTENCY_KEY_REUSED
        assert other.json()["groupId"] == first.json()["id"]
        assert len(await listed(server.url)) == 2
        async with rm_client(server.url) as client:
            with pytest.raises(RMConflict, match="already belongs to reservation group"):
                await client.reserve_group(group_request("g", 3))


async def test_topology_lands_every_member_in_one_zone(tmp_path: pathlib.Path) -> None:
    nodes = inventory(("a1", "2", "a"), ("a2", "2", "a"), ("b1", "3", "b"), ("b2", "3", "b"))
    zone_of = {node.name: node.labels[ZONE] for node in nodes}
    async with (
        serve_reference_rm(db_path=tmp_path / "db", inventory=nodes, token=TOKEN) as server,
        rm_client(server.url) as client,
    ):
        five = await client.reserve_group(group_request("five", 5, topology=(ZONE,)))
        four = await client.reserve_group(group_request("four", 4, topology=(ZONE,)))
        with pytest.raises(RMUnschedulable) as refused:
            await client.reserve_group(group_request("two", 2, topology=(ZONE,)))
    assert {zone_of[m.node] for m in five.members} == {"b"}
    assert five.topology_value == {ZONE: "b"}
    assert {zone_of[m.node] for m in four.members} == {"a"}
    assert "the most any value holds is 1" in refused.value.reason
    # Without topology the same two pods would fit (one cpu left in each zone).


async def test_members_are_ordinary_reservations(tmp_path: pathlib.Path) -> None:
    nodes = inventory(("n1", "8", "a"))
    async with (
        serve_reference_rm(db_path=tmp_path / "db", inventory=nodes, token=TOKEN) as server,
        rm_client(server.url) as client,
    ):
        gang = await client.reserve_group(group_request("g", 4))
        first, second, third, _ = gang.members
        committed = await client.commit(first.id, pod_uid=first.pod_uid)
        assert committed.group_id == gang.id
        await client.release(second.id, pod_uid=second.pod_uid)
        renewed = await client.renew_group(gang.id, ttl_seconds=3600)
        assert renewed.members[0].expires_at is None
        assert renewed.members[2].expires_at == renewed.expires_at
        assert third.expires_at is not None
        assert renewed.expires_at is not None
        assert renewed.expires_at > third.expires_at
        listed_members = await client.list_reservations(group_id=gang.id)
        assert [r.id for r in listed_members] == [m.id for m in gang.members]
        assert {r.group_id for r in await client.list_reservations()} == {gang.id}
        await client.release_group(gang.id)
        after = await client.get_group(gang.id)
        assert [m.state for m in after.members] == [
            ReservationState.COMMITTED,
            ReservationState.RELEASED,
            ReservationState.RELEASED,
            ReservationState.RELEASED,
        ]
        assert after.expires_at is None
        # The committed member is released on its own, as its pod ends.
        await client.release(first.id, pod_uid=first.pod_uid)
        with pytest.raises(RMConflict):
            await client.renew_group(gang.id, ttl_seconds=30)
        await client.release_group(gang.id)  # idempotent
        await client.release_group("grp-never-made")  # unknown: not an error
        with pytest.raises(RMRejected) as unknown:
            await client.get_group("grp-never-made")
        assert unknown.value.status == 404


async def test_a_group_of_1000_fits_in_the_body_limit_and_a_larger_body_is_413(
    tmp_path: pathlib.Path,
) -> None:
    nodes = inventory(*((f"n{i}", "100", "a") for i in range(10)))
    async with serve_reference_rm(db_path=tmp_path / "db", inventory=nodes, token=TOKEN) as server:
        async with rm_client(server.url) as client:
            big = await client.reserve_group(group_request("big", 1000))
        assert len(big.members) == 1000
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as http:
            too_large = await http.post(
                "/v1/reservation-groups",
                content=b"{" + b" " * (3 * 2**20) + b"}",
                headers={"Content-Type": "application/json"},
            )
            bad = await http.post("/v1/reservation-groups", json={**group_body("bad", 1), "minMember": 1})
            empty = await http.post("/v1/reservation-groups", json=group_body("empty", 0))
    assert too_large.status_code == 413
    assert too_large.json()["type"] == ProblemType.PAYLOAD_TOO_LARGE
    assert bad.status_code == 400
    assert "minMember" in bad.json()["detail"]
    assert empty.status_code == 400


async def test_an_rm_without_groups_answers_404_and_the_client_says_unsupported(
    tmp_path: pathlib.Path,
) -> None:
    nodes = inventory(("n1", "8", "a"))
    async with serve_reference_rm(
        db_path=tmp_path / "db", inventory=nodes, token=TOKEN, groups=False
    ) as server:
        async with rm_client(server.url) as client:
            with pytest.raises(RMGroupsUnsupported, match="has no reservation groups"):
                await client.reserve_group(group_request("g", 2))
            with pytest.raises(RMRejected) as unknown:
                await client.get_group("grp-1")
            assert unknown.value.status == 404
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as http:
            answer = await http.post("/v1/reservation-groups", json=group_body("g", 2))
        assert answer.status_code == 404
        assert "without reservation groups" in answer.json()["detail"]
        assert await listed(server.url) == []


async def _start(argv: list[str]) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert process.stdout is not None
    banner = await asyncio.wait_for(process.stdout.readline(), timeout=60)
    assert banner, "the reference RM did not start"
    return process, served_url(banner)


async def test_a_sigkilled_rm_process_comes_back_with_its_groups(tmp_path: pathlib.Path) -> None:
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": f"n{i}", "labels": {ZONE: "a"}, "allocatable": {"cpu": "2"}} for i in range(2)
                ]
            }
        )
    )
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv = serve_command(
        db=tmp_path / "rm.sqlite", token_file=token_file, options=["--inventory", str(inventory_file)]
    )
    process, url = await _start(argv)
    try:
        async with rm_client(url) as client:
            gang = await client.reserve_group(group_request("g", 3, ttl=600))
            await client.commit(gang.members[0].id, pod_uid=gang.members[0].pod_uid)
        process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(process.wait(), timeout=30)
        argv[argv.index("--listen") + 1] = url.removeprefix("http://")
        process, url = await _start(argv)
        async with rm_client(url) as client:
            again = await client.get_group(gang.id)
            replay = await client.reserve_group(group_request("g", 3, ttl=600))
            with pytest.raises(RMUnschedulable):  # the 3 cpu are still held: only 1 is free
                await client.reserve_group(group_request("h", 2))
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=30)
    assert [m.state for m in again.members] == [
        ReservationState.COMMITTED,
        ReservationState.RESERVED,
        ReservationState.RESERVED,
    ]
    assert replay.id == gang.id
    assert [m.id for m in replay.members] == [m.id for m in gang.members]


async def test_the_cli_flag_no_groups(tmp_path: pathlib.Path) -> None:
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "allocatable": {"cpu": "2"}}]}))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    process, url = await _start(
        serve_command(
            db=tmp_path / "rm.sqlite",
            token_file=token_file,
            options=["--inventory", str(inventory_file), "--no-groups"],
        )
    )
    try:
        async with rm_client(url) as client:
            with pytest.raises(RMGroupsUnsupported):
                await client.reserve_group(group_request("g", 1))
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=30)


async def test_an_rm_killed_while_groups_race_holds_whole_groups_after_restart(
    tmp_path: pathlib.Path,
) -> None:
    """SIGKILL the RM process while 30 groups are being reserved: after restart every group it
    holds has all its members, none is partial, and no node is overcommitted."""
    nodes = [(f"n{i}", "6", "a") for i in range(3)]
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(
        yaml.safe_dump(
            {"nodes": [{"name": n, "labels": {ZONE: z}, "allocatable": {"cpu": c}} for n, c, z in nodes]}
        )
    )
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv = serve_command(
        db=tmp_path / "rm.sqlite", token_file=token_file, options=["--inventory", str(inventory_file)]
    )
    sizes = {f"race{i}": 2 + i % 4 for i in range(30)}
    process, url = await _start(argv)
    first_answer = asyncio.Event()

    async def one(key: str) -> None:
        async with ResourceManagerClient(
            base_url=url, token=TOKEN, allow_insecure_http=True, max_attempts=1
        ) as client:
            try:
                await client.reserve_group(group_request(key, sizes[key], cpu="500m", ttl=600))
            except (RMUnschedulable, RMUnavailable, RMProtocolError):
                pass
            finally:
                first_answer.set()

    try:
        racing = [asyncio.create_task(one(key)) for key in sizes]
        await first_answer.wait()
        process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(process.wait(), timeout=30)
        await asyncio.gather(*racing)
        argv[argv.index("--listen") + 1] = url.removeprefix("http://")
        process, url = await _start(argv)
        items = await listed(url)
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=30)
    assert items, "not even the first group was stored"
    held = collections.Counter(item["groupId"] for item in items if item["state"] == "reserved")
    owner = {item["groupId"]: item["podUid"].rsplit("-", 1)[0] for item in items}
    partial = {owner[g]: f"{n} of {sizes[owner[g]]}" for g, n in held.items() if n != sizes[owner[g]]}
    assert partial == {}
    assert overcommitted(items, inventory(*nodes)) == []
