"""A reservation group through Slurm is ONE heterogeneous job across the members' nodes (issue 23):
Slurm itself starts every component at once or none, so a group may wait in Slurm's queue."""

from __future__ import annotations

import signal
from typing import Any

from bindery.devcluster.slurm import SlurmBed
from tests.slurm.conftest import AdapterProcess
from tests.slurm.test_adapter import _blocker, _body, _until

SHOWN = {"Bindery-Features": "revocation"}


def _group(name: str, cpus: list[int]) -> dict[str, Any]:
    members = [
        {
            "pod": {
                "uid": f"{name}-{i}",
                "namespace": "ns",
                "name": f"{name}-{i}",
                "schedulerName": "slurm-test",
            },
            "resources": {"cpu": str(cpu), "memory": "64Mi"},
        }
        for i, cpu in enumerate(cpus)
    ]
    group = {"namespace": "ns", "name": name, "uid": f"{name}-uid", "schedulerName": "slurm-test"}
    return {"group": group, "members": members, "idempotencyKey": name, "ttlSeconds": 60}


def _rows(bed: SlurmBed, name: str) -> list[dict[str, str]]:
    """squeue's rows of the group's placeholder jobs (a hetjob component's id reads <leader>+<offset>)."""
    return sorted(
        (
            row
            for row in bed.squeue()
            if row["name"] == f"bindery:ns/{name}" or row["name"].startswith(f"bindery:ns/{name}-")
        ),
        key=lambda row: row["id"],
    )


def _running(bed: SlurmBed, name: str) -> list[dict[str, str]]:
    return [row for row in _rows(bed, name) if row["state"] in ("RUNNING", "CONFIGURING")]


def test_a_group_is_one_hetjob_with_a_component_on_each_members_node_and_a_release_leaves_none_running(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    with slurm_adapter.client() as client:
        placed = client.post("/v1/reservation-groups", json=_group("gang", [3, 3]))
        assert placed.status_code == 201, placed.text
        group = placed.json()
        assert sorted(member["node"] for member in group["members"]) == ["slurm-0", "slurm-1"]
        rows = _rows(slurm_bed, "gang")
        leaders = {row["id"].partition("+")[0] for row in rows}
        assert len(leaders) == 1, rows
        assert sorted(row["id"].partition("+")[2] for row in rows) == ["0", "1"], rows
        assert sorted((row["state"], row["nodes"]) for row in rows) == [
            ("RUNNING", "slurm-0"),
            ("RUNNING", "slurm-1"),
        ], rows
        # Each member is its own reservation, named after the hetjob.
        (leader,) = leaders
        assert [m["id"] for m in group["members"]] == [f"slurm-{leader}-{i}" for i in range(2)]
        # The member of component 1 released alone: its component ends, component 0 runs on.
        second = group["members"][1]
        assert (
            client.delete(f"/v1/reservations/{second['id']}", params={"podUid": second["podUid"]}).status_code
            == 204
        )
        _until(
            lambda: [row["id"] for row in _running(slurm_bed, "gang")] == [f"{leader}+0"],
            30,
            "only component 0 running after its other member's release",
        )
        got = client.get(f"/v1/reservation-groups/{group['id']}").json()
        assert [m["state"] for m in got["members"]] == ["reserved", "released"]
        assert client.delete(f"/v1/reservation-groups/{group['id']}").status_code == 204
    _until(lambda: not _running(slurm_bed, "gang"), 30, "no component of the released group running")


def test_a_group_whose_members_share_a_node_is_a_job_per_member_started_all_or_none(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """Slurm 22.05 cannot put two components of one hetjob on one node (see server.py): such a
    group is a job per member, all started within the wait or all cancelled."""
    with slurm_adapter.client() as client:
        placed = client.post("/v1/reservation-groups", json=_group("crowd", [1, 1, 1]))
        assert placed.status_code == 201, placed.text
        rows = [row for row in slurm_bed.squeue() if row["name"].startswith("bindery:ns/crowd-")]
        assert sorted(row["state"] for row in rows) == ["RUNNING"] * 3, rows
        assert not [row for row in rows if "+" in row["id"]], rows
        assert client.delete(f"/v1/reservation-groups/{placed.json()['id']}").status_code == 204
    _until(
        lambda: (
            not [
                r
                for r in slurm_bed.squeue()
                if r["name"].startswith("bindery:ns/crowd-") and r["state"] == "RUNNING"
            ]
        ),
        30,
        "no job of the released group running",
    )


def test_a_group_that_does_not_fit_waits_in_slurms_queue_whole_then_starts_whole(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """slurm-1 is full with a site job: a group needing both nodes is submitted anyway and waits,
    every component PENDING (nothing of it half-started); the same key later finds the same job."""
    blocker = _blocker(slurm_bed, "slurm-1", 4)
    _until(
        lambda: any(r["id"] == str(blocker) and r["state"] == "RUNNING" for r in slurm_bed.squeue()),
        30,
        "site job",
    )
    body = _group("queued", [3, 3])
    with slurm_adapter.client() as client:
        refused = client.post("/v1/reservation-groups", json=body)
        assert refused.status_code == 409, refused.text
        problem = refused.json()
        assert problem["type"].endswith(":unschedulable")
        assert "keeps its place in Slurm's queue" in problem["reason"], problem["reason"]
        assert problem["retryAfterSeconds"] == 5
        rows = _rows(slurm_bed, "queued")
        assert sorted(row["state"] for row in rows) == ["PENDING", "PENDING"], rows
        again = client.post("/v1/reservation-groups", json=body)
        assert again.status_code == 409, again.text
        assert [(r["id"], r["state"]) for r in _rows(slurm_bed, "queued")] == [
            (r["id"], "PENDING") for r in rows
        ]  # the same job, not another
        slurm_bed.run_client("scancel", str(blocker))

        def started() -> dict[str, Any] | None:
            answer = client.post("/v1/reservation-groups", json=body)
            return answer.json() if answer.status_code == 201 else None

        group = _until(started, 60, "the queued group's reserve answered 201")
    leader = rows[0]["id"].partition("+")[0]
    assert [m["id"] for m in group["members"]] == [f"slurm-{leader}-0", f"slurm-{leader}-1"]
    assert sorted(m["node"] for m in group["members"]) == ["slurm-0", "slurm-1"]
    assert sorted(row["state"] for row in _rows(slurm_bed, "queued")) == ["RUNNING", "RUNNING"]


def test_an_administrator_cancelling_one_component_revokes_only_the_members_on_its_node(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    with slurm_adapter.client() as client:
        placed = client.post("/v1/reservation-groups", json=_group("split", [3, 3]))
        assert placed.status_code == 201, placed.text
        members = placed.json()["members"]
        for member in members:
            assert client.post(f"/v1/reservations/{member['id']}/commit").status_code == 200
        rows = _rows(slurm_bed, "split")
        second = next(row for row in rows if row["id"].endswith("+1"))
        slurm_bed.run_client("scancel", second["id"])
        victim = next(m for m in members if m["node"] == second["nodes"])

        def states() -> dict[str, str] | None:
            got = {m["id"]: client.get(f"/v1/reservations/{m['id']}", headers=SHOWN).json() for m in members}
            return got if got[victim["id"]]["state"] == "revoked" else None

        seen = _until(states, 30, "the member on the cancelled component reads revoked")
    assert {i: r["state"] for i, r in seen.items()} == {
        m["id"]: "revoked" if m is victim else "committed" for m in members
    }
    assert "CANCELLED" in seen[victim["id"]]["revokedReason"]
    assert [row["state"] for row in _running(slurm_bed, "split")] == ["RUNNING"]


def test_component_0_keeps_its_released_members_share_until_the_group_ends_and_the_count_says_so(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """Slurm ends component 0 only with the whole hetjob: after its member's release its CPUs stay
    allocated while another member lives, so the adapter must not promise them to another pod."""
    slurm_adapter.kill(signal.SIGTERM)
    slurm_adapter.options = ("--queue-hold-seconds", "0")
    slurm_adapter.start()
    with slurm_adapter.client() as client:
        placed = client.post("/v1/reservation-groups", json=_group("kept", [3, 3]))
        assert placed.status_code == 201, placed.text
        first = placed.json()["members"][0]
        assert (
            client.delete(f"/v1/reservations/{first['id']}", params={"podUid": first["podUid"]}).status_code
            == 204
        )
        refused = client.post("/v1/reservations", json=_body("after-release", cpu="3"))
        assert refused.status_code == 409, refused.text
        assert refused.json()["detail"] == "no mapped Slurm node has room for this pod now", refused.text
        assert not [r for r in slurm_bed.squeue() if r["name"] == "bindery:ns/after-release"]
        rows = _rows(slurm_bed, "kept")
        assert sorted((r["id"].partition("+")[2], r["state"]) for r in rows) == [
            ("0", "RUNNING"),
            ("1", "RUNNING"),
        ]
        assert client.delete(f"/v1/reservation-groups/{placed.json()['id']}").status_code == 204
    _until(lambda: not _running(slurm_bed, "kept"), 30, "the whole hetjob ends with its last member")


def _limits(bed: SlurmBed, leader: str) -> dict[str, float]:
    """Each component's Slurm time limit in minutes (``inf`` for UNLIMITED), by offset."""
    limits = {}
    for line in bed.run_client("squeue", "--noheader", "-o", "%i|%l").splitlines():
        job_id, limit = line.strip().split("|")
        head, _, offset = job_id.partition("+")
        if head != leader:
            continue
        if limit in ("UNLIMITED", "INFINITE"):
            limits[offset] = float("inf")
            continue
        days, _, clock = limit.rpartition("-")
        parts = [int(part) for part in clock.split(":")]
        while len(parts) < 3:
            parts.insert(0, 0)
        hours, minutes, seconds = parts
        limits[offset] = int(days or 0) * 1440 + hours * 60 + minutes + seconds / 60
    return limits


def test_a_member_renewed_on_another_node_is_not_cut_short_by_component_0s_time_limit(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """Slurm ends the WHOLE hetjob when component 0 reaches its time limit. A member's own renew
    (a slow cycle renews its pod's reservation alone) moved only its component's limit, so the
    member lost its room at component 0's older limit, long before the lease the renew answered.
    Component 0's limit must reach at least as far as any other component's."""
    with slurm_adapter.client() as client:
        placed = client.post("/v1/reservation-groups", json=_group("renewed", [1, 1]))
        assert placed.status_code == 201, placed.text
        group = placed.json()
        (leader,) = {row["id"].partition("+")[0] for row in _rows(slurm_bed, "renewed")}
        on_component_1 = {row["nodes"] for row in _rows(slurm_bed, "renewed") if row["id"] == f"{leader}+1"}
        (member,) = [m for m in group["members"] if m["node"] in on_component_1]
        renewed = client.post(
            f"/v1/reservations/{member['id']}/renew", json={"podUid": member["podUid"], "ttlSeconds": 3600}
        )
        assert renewed.status_code == 200, renewed.text
        limits = _limits(slurm_bed, leader)
        assert limits["1"] >= 60, limits
        assert limits["0"] >= limits["1"], limits
        # Component 0's own member renewed for a minute does not pull its limit back under that.
        (first,) = [m for m in group["members"] if m is not member]
        again = client.post(
            f"/v1/reservations/{first['id']}/renew", json={"podUid": first["podUid"], "ttlSeconds": 60}
        )
        assert again.status_code == 200, again.text
        after = _limits(slurm_bed, leader)
        assert after["0"] >= after["1"] >= 60, after
        assert client.delete(f"/v1/reservation-groups/{group['id']}").status_code == 204


def test_a_member_too_long_for_one_slurm_comment_is_refused_saying_what_to_shorten(
    slurm_bed: SlurmBed, slurm_adapter: AdapterProcess
) -> None:
    """Names at the contract's limits do not fit one Slurm comment (1024 characters), where the
    adapter keeps a member's state. Each member of a hetjob group is alone on its component, so
    splitting the group (what the refusal used to advise) changes nothing: it says what to shorten."""
    body = _group("x" * 200, [1, 1])
    body["idempotencyKey"] = "k" * 253
    body["clusterId"] = "c" * 253
    for i, member in enumerate(body["members"]):
        member["pod"]["name"] = f"{i}" * 253
    with slurm_adapter.client() as client:
        refused = client.post("/v1/reservation-groups", json=body)
    assert refused.status_code == 409, refused.text
    reason = refused.json()["reason"]
    assert "slurmctld keeps at most 1024" in reason, reason
    assert "split the group" not in reason, reason
    assert "shorten" in reason, reason
    assert not _rows(slurm_bed, "x" * 200)
