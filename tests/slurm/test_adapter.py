"""``bindery rm slurm`` against a live slurmctld: the contract kept, Slurm's queue honoured,
state surviving the adapter's death, and a job cancelled by hand seen as such."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest
import yaml

from bindery.conformance.kit import CHECKS, ConformanceConfig, run_checks
from bindery.devcluster.slurm import API, SlurmBed
from bindery.slurm_rm.mapping import JobRecord
from tests.slurm.conftest import AdapterProcess

# A short run for every CI build: one check per operation of v1.0 and v1.1 the adapter serves.
SHORT_CHECKS = (
    "health",
    "auth-required",
    "idempotent-replay",
    "commit-idempotent",
    "release-idempotent",
    "unschedulable",
    "commit-pod-mismatch",
    "renew-refusals",
    "group-all-or-nothing",
    "batch-mixed",
    # Contract v1.2, the version the adapter's GET /v1/info names: cluster-id.
    "info-path",
    "cluster-isolation",
    "cluster-id-validated",
)
HOSTNAME = "kubernetes.io/hostname"


def _kit(adapter: AdapterProcess, names: list[str]) -> list[str]:
    bed = adapter.bed

    async def scancel(reservation_id: str, reason: str) -> None:
        del reason  # Slurm reports its own (the job's state)
        await asyncio.to_thread(bed.run_client, "scancel", reservation_id.removeprefix("slurm-"))

    config = ConformanceConfig(
        revoke=scancel,
        url=adapter.url,
        token=adapter.token_file.read_text().strip(),
        resource="cpu",
        capacity=sum(node.cpus for node in adapter.bed.nodes),
        # One reserve takes ~0.5 s (Slurm starts the job, the adapter sees it RUNNING): the kit's
        # 2-second lease would run out while it fills the pool.
        ttl_seconds=10,
        topology_key=HOSTNAME,  # the node map labels each node with its own name
    )
    results = asyncio.run(run_checks(config, names=names, contract_version="1.2"))
    return [f"{r.check.name}: {r.error}" for r in results if not r.passed]


@pytest.fixture
def no_queue_adapter(slurm_bed: SlurmBed, slurm_adapter: AdapterProcess) -> AdapterProcess:
    """The kit reserves past the pool on purpose; without queueing, no refused job lingers.

    A group is a hetjob, which Slurm 22.05 starts from its backfill scheduler only, and hetjobs
    sharing nodes about one per backfill cycle (each plans whole nodes for the ones after it): the
    bed's cycle is 1 s and the kit races four groups, so the wait is 8 s, not the default 3."""
    slurm_adapter.kill(signal.SIGTERM)
    slurm_adapter.options = ("--queue-hold-seconds", "0", "--start-wait", "8")
    node_map = slurm_bed.workdir / "node-map.yaml"
    node_map.write_text(
        yaml.safe_dump({"nodes": [{"name": n.name, "labels": {HOSTNAME: n.name}} for n in slurm_bed.nodes]})
    )
    slurm_adapter.node_map = str(node_map)
    slurm_adapter.start()
    return slurm_adapter


def test_the_conformance_kit_passes_against_the_adapter(no_queue_adapter: AdapterProcess) -> None:
    """The kit at the version the adapter names (1.2: its GET /v1/info lists cluster-id and
    revocation; node-preferences and preemption, which it does not list, are checked as absent).
    CI runs SHORT_CHECKS; BINDERY_SLURM_KIT=full runs every check:
    `BINDERY_SLURM_KIT=full .venv/bin/pytest tests/slurm -k conformance`."""
    full = os.environ.get("BINDERY_SLURM_KIT") == "full"
    names = [c.name for c in CHECKS] if full else list(SHORT_CHECKS)
    assert _kit(no_queue_adapter, names) == []


def _body(uid: str, cpu: str = "1", ttl: int = 60) -> dict[str, Any]:
    return {
        "pod": {"uid": uid, "namespace": "ns", "name": uid, "schedulerName": "slurm-test"},
        "resources": {"cpu": cpu, "memory": "64Mi"},
        "idempotencyKey": uid,
        "ttlSeconds": ttl,
    }


def _blocker(bed: SlurmBed, node: str, cpus: int) -> int:
    """A job of Slurm's own users, not Bindery's: it fills ``node``."""
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=str(bed.socket)), base_url="http://s", timeout=30
    ) as c:
        job = {
            "name": "site-job",
            "nodelist": node,
            "cpus_per_task": cpus,
            "memory_per_node": 64,
            "current_working_directory": "/tmp",
            "standard_output": "/dev/null",
            "environment": {"PATH": "/bin:/usr/bin"},
        }
        answer = c.post(
            f"/slurm/{API}/job/submit", json={"job": job, "script": "#!/bin/sh\nexec sleep 100000\n"}
        )
        return int(answer.json()["job_id"])


def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout} s: {what}")


def _state(bed: SlurmBed, job_id: str) -> str:
    return next((row["state"] for row in bed.squeue() if row["id"] == job_id), "gone")


def test_a_pod_waits_in_slurms_queue_behind_a_site_job_then_gets_its_node(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    blockers = [_blocker(slurm_bed, node.name, node.cpus) for node in slurm_bed.nodes]
    _until(lambda: all(_state(slurm_bed, str(b)) == "RUNNING" for b in blockers), 30, "site jobs RUNNING")
    with slurm_adapter.client() as client:
        refused = client.post("/v1/reservations", json=_body("queued-pod"))
        assert refused.status_code == 409, refused.text
        problem = refused.json()
        assert problem["type"].endswith(":unschedulable")
        assert "PENDING" in problem["reason"], problem["reason"]
        assert "Resources" in problem["reason"], problem["reason"]
        assert problem["retryAfterSeconds"] == 5
        queued = [row for row in slurm_bed.squeue() if row["state"] == "PENDING"]
        assert [row["name"] for row in queued] == ["bindery:ns/queued-pod"]
        slurm_bed.run_client("scancel", str(blockers[0]), str(blockers[1]))

        def granted() -> dict[str, Any] | None:
            answer = client.post("/v1/reservations", json=_body("queued-pod"))
            return answer.json() if answer.status_code == 201 else None

        reservation = _until(granted, 30, "the queued pod's reserve answered 201")
    assert reservation["id"] == f"slurm-{queued[0]['id']}"  # the job that queued, not a new one
    assert reservation["state"] == "reserved"
    assert reservation["node"] in {n.name for n in slurm_bed.nodes}
    assert _state(slurm_bed, queued[0]["id"]) == "RUNNING"


def test_the_adapter_sigkilled_and_restarted_keeps_every_reservation(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    with slurm_adapter.client() as client:
        kept = client.post("/v1/reservations", json=_body("kept"))
        assert kept.status_code == 201, kept.text
        assert client.post(f"/v1/reservations/{kept.json()['id']}/commit").status_code == 200
        leased = client.post("/v1/reservations", json=_body("leased"))
        assert leased.status_code == 201, leased.text
    slurm_adapter.kill(signal.SIGKILL)
    slurm_adapter.start()
    with slurm_adapter.client() as client:
        items = client.get("/v1/reservations", params={"schedulerName": "slurm-test"}).json()["items"]
        assert {(item["podUid"], item["state"]) for item in items} == {
            ("kept", "committed"),
            ("leased", "reserved"),
        }
        replay = client.post("/v1/reservations", json=_body("leased"))
        assert (replay.status_code, replay.json()["id"]) == (200, leased.json()["id"])
        assert (
            client.delete(f"/v1/reservations/{leased.json()['id']}", params={"podUid": "leased"}).status_code
            == 204
        )
    job_id = leased.json()["id"].removeprefix("slurm-")
    _until(lambda: _state(slurm_bed, job_id) in ("gone", "CANCELLED", "COMPLETING"), 30, "released job ends")


def test_a_placeholder_cancelled_by_hand_lists_as_released(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    with slurm_adapter.client() as client:
        made = client.post("/v1/reservations", json=_body("cancelled-by-admin"))
        assert made.status_code == 201, made.text
        reservation_id = made.json()["id"]
        assert client.post(f"/v1/reservations/{reservation_id}/commit").status_code == 200
        slurm_bed.run_client("scancel", reservation_id.removeprefix("slurm-"))
        _until(
            lambda: client.get(f"/v1/reservations/{reservation_id}").json()["state"] == "released",
            30,
            "the cancelled placeholder lists as released",
        )


def test_slurmctld_down_answers_unavailable_and_its_restart_keeps_the_reservations(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    with slurm_adapter.client() as client:
        kept = client.post("/v1/reservations", json=_body("before-crash"))
        assert kept.status_code == 201, kept.text
        assert client.post(f"/v1/reservations/{kept.json()['id']}/commit").status_code == 200
        # A SIGKILL before slurmctld's background save loses the commit (see wait_state_saved).
        slurm_bed.wait_state_saved(time.time())
        slurm_bed.kill("slurmctld", signal.SIGKILL)
        # slurmrestd tries slurmctld for ~9 s, then fails: Bindery must hear "retry", not "broken".
        down = client.post("/v1/reservations", json=_body("during-crash"))
        assert down.status_code == 503, down.text
        assert down.json()["type"].endswith(":unavailable")
        assert down.headers["Retry-After"] == "1"
        slurm_bed.start_slurmctld()
        slurm_bed.wait_idle(timeout=60)
        after = client.get(f"/v1/reservations/{kept.json()['id']}")
        assert after.status_code == 200, after.text
        assert after.json()["state"] == "committed"
        again = client.post("/v1/reservations", json=_body("during-crash"))
        assert again.status_code == 201, again.text


def test_a_job_of_another_slurm_user_is_never_taken_for_a_reservation(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """Any Slurm user may write any comment: one forging a placeholder's must not appear as, or
    replace, a reservation (Bindery would trust it as a pod's committed share)."""
    forged = JobRecord(
        key="victim", pod_uid="victim", scheduler="slurm-test", namespace="ns", name="victim",
        node="slurm-0", fingerprint="x", resources={"cpu": "1"}, ttl=60, created=time.time(),
        hold_until=time.time() + 600, claimed=True, committed=True,
    )  # fmt: skip
    job_id = slurm_bed.run_client(
        # Held: it need not run to be listed (and the bed's 0700 work directory is root's alone).
        "sbatch", "--parsable", "--hold", "--uid=nobody", "--gid=nogroup", "--nodelist=slurm-0", "--mem=64",
        "--output=/dev/null", "--chdir=/tmp", f"--comment={forged.encode()}", "--wrap=exec sleep 100000",
    ).strip()  # fmt: skip
    _until(lambda: _state(slurm_bed, job_id) == "PENDING", 30, "the forged job queued")
    with slurm_adapter.client() as client:
        listed = client.get("/v1/reservations", params={"schedulerName": "slurm-test"}).json()["items"]
        assert listed == []
        assert client.get(f"/v1/reservations/slurm-{job_id}").status_code == 404
        mine = client.post("/v1/reservations", json=_body("victim"))
        assert mine.status_code == 201, mine.text
        assert mine.json()["id"] != f"slurm-{job_id}"


def _group(name: str, cpus: int, count: int) -> dict[str, Any]:
    members = [
        {
            "pod": {
                "uid": f"{name}-{i}",
                "namespace": "ns",
                "name": f"{name}-{i}",
                "schedulerName": "slurm-test",
            },
            "resources": {"cpu": str(cpus), "memory": "64Mi"},
        }
        for i in range(count)
    ]
    group = {"namespace": "ns", "name": name, "schedulerName": "slurm-test"}
    return {"group": group, "members": members, "idempotencyKey": name, "ttlSeconds": 60}


def test_a_group_with_a_member_slurm_refuses_leaves_no_job_behind(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """All or nothing against Slurm's own decision: slurm-1 is reserved for another user, which the
    adapter's count of free CPUs does not see. Slurm refuses the group's heterogeneous job (one
    component on each node) whole: the group is refused and nothing is left in Slurm's queue."""
    slurm_bed.run_client(
        "scontrol", "create", "reservation", "ReservationName=site-maintenance", "StartTime=now",
        "Duration=60", "Nodes=slurm-1", "Users=nobody", "Flags=ignore_jobs",
    )  # fmt: skip
    with slurm_adapter.client() as client:
        refused = client.post("/v1/reservation-groups", json=_group("gang", cpus=4, count=2))
        assert refused.status_code == 409, refused.text
        problem = refused.json()
        assert problem["type"].endswith(":unschedulable")
        # One heterogeneous job for the whole group: Slurm refuses it whole.
        assert "Slurm refused the group's job" in problem["reason"], problem["reason"]
        assert "reserved" in problem["reason"], problem["reason"]
        try:
            _until(
                lambda: not [r for r in slurm_bed.squeue() if r["name"].startswith("bindery:")],
                30,
                "no placeholder job of the refused group left in Slurm's queue",
            )
        except AssertionError:
            raise AssertionError(slurm_bed.squeue()) from None
        assert client.get("/v1/reservations", params={"schedulerName": "slurm-test"}).json()["items"] == []
        slurm_bed.run_client("scontrol", "delete", "ReservationName=site-maintenance")
        placed = client.post("/v1/reservation-groups", json=_group("gang", cpus=4, count=2))
        assert placed.status_code == 201, placed.text
        group = placed.json()
        assert sorted(m["node"] for m in group["members"]) == ["slurm-0", "slurm-1"]
        assert [m["groupId"] for m in group["members"]] == [group["id"]] * 2
    running = [r for r in slurm_bed.squeue() if r["name"] == "bindery:ns/gang"]  # the group's hetjob
    assert sorted((r["state"], r["nodes"]) for r in running) == [
        ("RUNNING", "slurm-0"),
        ("RUNNING", "slurm-1"),
    ]


def test_the_revocation_check_passes_with_scancel_as_the_hook(no_queue_adapter: AdapterProcess) -> None:
    """Contract v1.2 revocation, as a Slurm site causes it: the kit's hook runs ``scancel``."""
    bed = no_queue_adapter.bed

    async def scancel(reservation_id: str, reason: str) -> None:
        del reason  # Slurm keeps its own: the job's state (CANCELLED) is the reason reported
        await asyncio.to_thread(bed.run_client, "scancel", reservation_id.removeprefix("slurm-"))

    config = ConformanceConfig(
        url=no_queue_adapter.url,
        token=no_queue_adapter.token_file.read_text().strip(),
        resource="cpu",
        capacity=sum(node.cpus for node in bed.nodes),
        ttl_seconds=10,
        revoke=scancel,
    )
    check = next(c for c in CHECKS if c.name == "revocation")
    results = asyncio.run(run_checks(config, names=[check.name]))
    assert [f"{r.check.name}: {r.error}" for r in results if not r.passed] == []


def test_a_placeholder_cancelled_by_hand_is_revoked_with_slurms_state_one_released_by_the_adapter_is_not(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """A committed placeholder Slurm ended (here an administrator's scancel) reads revoked, with
    Slurm's state, to a caller sending Bindery-Features: revocation, and released to any other; one
    the adapter itself cancelled (a release) never reads revoked."""
    shown = {"Bindery-Features": "revocation"}
    with slurm_adapter.client() as client:
        made = {uid: client.post("/v1/reservations", json=_body(uid)) for uid in ("by-admin", "by-adapter")}
        assert {uid: answer.status_code for uid, answer in made.items()} == {
            "by-admin": 201,
            "by-adapter": 201,
        }
        ids = {uid: answer.json()["id"] for uid, answer in made.items()}
        for reservation_id in ids.values():
            assert client.post(f"/v1/reservations/{reservation_id}/commit").status_code == 200
        assert client.delete(f"/v1/reservations/{ids['by-adapter']}").status_code == 204
        slurm_bed.run_client("scancel", ids["by-admin"].removeprefix("slurm-"))
        revoked = _until(
            lambda: (
                (a := client.get(f"/v1/reservations/{ids['by-admin']}", headers=shown).json())["state"]
                == "revoked"
                and a
            ),
            30,
            "the cancelled placeholder reads revoked",
        )
        assert "CANCELLED" in revoked["revokedReason"], revoked
        assert revoked["revokedAt"]
        plain = client.get(f"/v1/reservations/{ids['by-admin']}").json()
        assert (plain["state"], plain.get("revokedReason")) == ("released", None)
        listed = client.get("/v1/reservations", params={"state": "revoked"}, headers=shown).json()["items"]
        assert [item["id"] for item in listed] == [ids["by-admin"]]
        by_adapter = client.get(f"/v1/reservations/{ids['by-adapter']}", headers=shown).json()
        assert by_adapter["state"] == "released"
        # The caller's release acknowledges it: no longer listed as revoked.
        assert (
            client.delete(f"/v1/reservations/{ids['by-admin']}", params={"podUid": "by-admin"}).status_code
            == 204
        )
        assert (
            client.get("/v1/reservations", params={"state": "revoked"}, headers=shown).json()["items"] == []
        )
        info = client.get("/v1/info").json()
        assert "revocation" in info["features"]
        assert "cluster-id" in info["features"]


def test_a_group_placed_on_room_slurm_is_still_tearing_down_waits_for_it(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """The adapter counts a placeholder it cancelled as free while Slurm tears it down, so a group
    placed on that room must wait for the teardown, not be cancelled whole after ``start_wait``.
    CI once saw exactly that (the kit's group-all-or-nothing on a loaded host). Here slurm-0's
    slurmd is frozen, so a released placeholder stays COMPLETING until it is thawed, 3 s later."""
    slurm_adapter.kill(signal.SIGTERM)
    slurm_adapter.options = ("--queue-hold-seconds", "0", "--start-wait", "1")
    slurm_adapter.start()
    cpus = sum(node.cpus for node in slurm_bed.nodes)

    def group(name: str) -> dict[str, Any]:
        return {
            "group": {"namespace": "ns", "name": name, "uid": f"{name}-uid", "schedulerName": "slurm-test"},
            "members": [
                {
                    "pod": {
                        "uid": f"{name}-{i}",
                        "namespace": "ns",
                        "name": f"{name}-{i}",
                        "schedulerName": "slurm-test",
                    },
                    "resources": {"cpu": "1", "memory": "64Mi"},
                }
                for i in range(cpus)
            ],
            "idempotencyKey": name,
            "ttlSeconds": 60,
        }

    with slurm_adapter.client() as client:
        first = client.post("/v1/reservation-groups", json=group("first"))
        assert first.status_code == 201, first.text
        slurm_bed.signal("slurmd-slurm-0", signal.SIGSTOP)
        thaw = threading.Timer(3, slurm_bed.signal, ("slurmd-slurm-0", signal.SIGCONT))
        thaw.start()
        try:
            assert client.delete(f"/v1/reservation-groups/{first.json()['id']}").status_code == 204
            second = client.post("/v1/reservation-groups", json=group("second"))
        finally:
            thaw.join()
            slurm_bed.signal("slurmd-slurm-0", signal.SIGCONT)
    assert second.status_code == 201, second.text
    assert sorted(m["node"] for m in second.json()["members"]) == sorted(
        node.name for node in slurm_bed.nodes for _ in range(node.cpus)
    )
