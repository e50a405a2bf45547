"""The pure decisions of pod groups (bindery.scheduling.podgroups), without I/O."""

from __future__ import annotations

import datetime

from bindery.scheduling.podgroups import (
    SCHEDULED_CONDITION,
    GroupStep,
    PodGroupInfo,
    decide_group,
    group_request,
    scheduled_conditions,
    unsupported,
)
from bindery.scheduling.podspec import PodInfo

NOW = datetime.datetime(2026, 12, 3, 6, 0, tzinfo=datetime.UTC)


def pod(name: str, *, group: str = "pg") -> PodInfo:
    return PodInfo.from_body(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {
                "schedulerName": "bindery",
                "schedulingGroup": {"podGroupName": group},
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
            },
        }
    )


def gang(min_count: int | None = 3, *, topology: tuple[str, ...] = ()) -> PodGroupInfo:
    spec: dict[str, object] = {
        "schedulingPolicy": {"gang": {"minCount": min_count}} if min_count else {"basic": {}}
    }
    if topology:
        spec["schedulingConstraints"] = {"topology": [{"key": key} for key in topology]}
    return PodGroupInfo.from_body(
        {"metadata": {"name": "pg", "namespace": "ns", "uid": "pg-uid", "generation": 1}, "spec": spec}
    )


def test_a_pod_names_its_group() -> None:
    assert pod("a").scheduling_group == "pg"
    assert PodInfo.from_body({"metadata": {"name": "x"}, "spec": {}}).scheduling_group is None


def test_no_member_is_placed_before_min_count_exist() -> None:
    decision = decide_group(namespace="ns", name="pg", group=gang(3), pending=[pod("a"), pod("b")], placed=0)
    assert decision.step is GroupStep.WAIT_FOR_MEMBERS
    assert "minCount=3" in decision.message
    assert "waiting for 1 more" in decision.message
    assert {p.name for p in decision.members} == {"a", "b"}


def test_min_count_reached_places_every_pending_member_at_once() -> None:
    decision = decide_group(
        namespace="ns", name="pg", group=gang(3), pending=[pod("c"), pod("a"), pod("b")], placed=0
    )
    assert decision.step is GroupStep.PLACE
    assert not decision.each_alone
    assert [p.name for p in decision.members] == ["a", "b", "c"]


def test_members_placed_already_count_so_a_late_member_goes_alone() -> None:
    decision = decide_group(namespace="ns", name="pg", group=gang(3), pending=[pod("d")], placed=3)
    assert decision.step is GroupStep.PLACE
    assert [p.name for p in decision.members] == ["d"]


def test_a_missing_pod_group_keeps_the_members_waiting_with_the_reason() -> None:
    decision = decide_group(namespace="ns", name="pg", group=None, pending=[pod("a")], placed=0)
    assert decision.step is GroupStep.WAIT_FOR_GROUP
    assert '"pg"' in decision.message
    assert "create the PodGroup" in decision.message


def test_the_wait_message_says_when_kube_schedulers_wait_would_have_ended() -> None:
    early = decide_group(
        namespace="ns", name="pg", group=gang(3), pending=[pod("a")], placed=0, waited_seconds=10
    )
    late = decide_group(
        namespace="ns", name="pg", group=gang(3), pending=[pod("a")], placed=0, waited_seconds=301
    )
    assert "still waiting" not in early.message
    assert "still waiting after 5m1s" in late.message


def test_basic_policy_places_each_member_alone() -> None:
    decision = decide_group(
        namespace="ns", name="pg", group=gang(None), pending=[pod("a"), pod("b")], placed=0
    )
    assert decision.step is GroupStep.PLACE
    assert decision.each_alone


def test_the_group_request_carries_every_member_the_topology_and_one_key() -> None:
    members = [pod("a"), pod("b")]
    request = group_request(
        group=gang(2, topology=("zone",)),
        members=members,
        scheduler_name="bindery",
        ttl_seconds=30,
        attempt=0,
    )
    assert [m.pod.uid for m in request.members] == ["uid-a", "uid-b"]
    assert [t.key for t in request.topology] == ["zone"]
    again = group_request(
        group=gang(2, topology=("zone",)),
        members=members[::-1],
        scheduler_name="bindery",
        ttl_seconds=30,
        attempt=0,
    )
    retry = group_request(
        group=gang(2, topology=("zone",)),
        members=members,
        scheduler_name="bindery",
        ttl_seconds=30,
        attempt=1,
    )
    assert request.idempotency_key == again.idempotency_key != retry.idempotency_key


def test_the_condition_is_written_as_kube_scheduler_writes_it() -> None:
    info = gang(2)
    false = scheduled_conditions(
        group=info, scheduled=False, reason="Unschedulable", message="no room", now=NOW
    )
    assert false is not None
    assert false[0]["type"] == SCHEDULED_CONDITION
    assert false[0]["status"] == "False"
    assert false[0]["observedGeneration"] == 1
    unchanged = PodGroupInfo.from_body(
        {
            "metadata": {"name": "pg", "namespace": "ns", "generation": 1},
            "spec": {},
            "status": {"conditions": false},
        }
    )
    assert (
        scheduled_conditions(
            group=unchanged, scheduled=False, reason="Unschedulable", message="no room", now=NOW
        )
        is None
    )
    true = scheduled_conditions(
        group=unchanged, scheduled=True, reason="Scheduled", message="2 bound", now=NOW
    )
    assert true is not None
    assert true[0]["status"] == "True"
    placed = PodGroupInfo.from_body(
        {
            "metadata": {"name": "pg", "namespace": "ns", "generation": 1},
            "spec": {},
            "status": {"conditions": true},
        }
    )
    # Never regressed from True to False (a late member failing does not unschedule the group).
    assert (
        scheduled_conditions(group=placed, scheduled=False, reason="Unschedulable", message="x", now=NOW)
        is None
    )


def test_members_with_volume_claims_are_refused_not_bound_without_their_volumes() -> None:
    plain = pod("a")
    body = {
        "metadata": {"name": "b", "namespace": "ns", "uid": "uid-b"},
        "spec": {
            "schedulerName": "bindery",
            "schedulingGroup": {"podGroupName": "pg"},
            "containers": [{"name": "c"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-b"}}],
        },
    }
    with_claim = PodInfo.from_body(body)
    assert unsupported(group=gang(2), members=[plain]) is None
    message = unsupported(group=gang(2), members=[plain, with_claim])
    assert message is not None
    assert "ns/b" in message
