"""`bindery explain`'s verdicts as pure functions of what was read (the real run: tests/operator)."""

from __future__ import annotations

import json
from typing import Any

from bindery.explain.facts import ReservationView, attempts_of, explain, group_state, render


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"schedulerName": "bindery", **spec},
        "status": {"phase": "Pending"},
    }


def test_attempts_are_newest_first_and_count_repeats() -> None:
    events: list[dict[str, Any]] = [
        {"reason": "FailedScheduling", "message": "no room", "eventTime": "2026-01-01T00:00:01Z"},
        {"reason": "Pulled", "message": "image", "eventTime": "2026-01-01T00:00:05Z"},
        {
            "reason": "FailedScheduling",
            "message": "no room",
            "eventTime": "2026-01-01T00:00:02Z",
            "series": {"count": 4, "lastObservedTime": "2026-01-01T00:00:09Z"},
        },
        {"reason": "Scheduled", "message": "assigned", "eventTime": "2026-01-01T00:00:10Z"},
    ]
    assert [(a.reason, a.count) for a in attempts_of(events)] == [
        ("Scheduled", 1),
        ("FailedScheduling", 4),
        ("FailedScheduling", 1),
    ]


def test_a_pod_waiting_for_its_volume_says_so() -> None:
    claim = {
        "metadata": {"name": "data", "annotations": {"volume.kubernetes.io/selected-node": "n2"}},
        "spec": {},
        "status": {"phase": "Pending"},
    }
    answer = explain(
        pod=pod(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]),
        resource_manager="pool",
        events=[],
        reservations=[ReservationView(id="r1", state="reserved", node="n2", expires_at=None)],
        claims=[("data", claim)],
    )
    assert answer.verdict == "reserved on n2; waiting for its volume(s) to be provisioned: data (on n2)"
    assert "selected node n2" in render(answer)


def test_missing_claims_gates_and_names_nobody_serves() -> None:
    missing = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], claims=[("data", None)])
    assert missing.verdict == "waiting for claim(s) data, which do not exist"
    gated = explain(
        pod=pod(schedulingGates=[{"name": "quota"}]), resource_manager="pool", events=[], reservations=[]
    )
    assert gated.verdict == "held by scheduling gates (quota): Bindery schedules it once they are removed"
    stray = explain(
        pod=pod(schedulerName="default-scheduler"), resource_manager=None, events=[], reservations=None
    )
    assert stray.verdict.endswith("Bindery does not schedule this pod; kube-scheduler does")


def test_the_operators_queue_says_when_the_next_attempt_is_due() -> None:
    served = {
        "pod": "ns/p",
        "uid": "u1",
        "leading": True,
        "resource_manager": "pool",
        "queue": "unschedulable",
        "attempts": 3,
        "next_attempt_in_seconds": 4.25,
        "next_attempt_at": "2026-01-01T00:00:09+00:00",
        "waits_for_capacity": True,
    }
    answer = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=served)
    assert answer.next_attempt == (
        "parked as unschedulable after 3 failed attempts: next attempt in 4.2 s "
        "(at 2026-01-01T00:00:09+00:00), or sooner when capacity is released or a Node changes"
    )
    assert answer.queue == served
    assert not any("next attempt" in u for u in answer.unseen)
    assert "Operator queue:    parked as unschedulable" in render(answer)
    backoff = explain(
        pod=pod(),
        resource_manager="pool",
        events=[],
        reservations=[],
        queue={**served, "queue": "backoff", "attempts": 1, "leading": False},
    )
    assert backoff.next_attempt is not None
    assert backoff.next_attempt.startswith("backing off after 1 failed attempt: next attempt in 4.2 s")
    assert backoff.next_attempt.endswith("(a standby replica's view: the leader's queue was not reached)")
    missing = {"pod": "ns/p", "uid": "u1", "leading": True, "message": "the operator holds no unbound pod"}
    gone = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=missing)
    assert gone.next_attempt == "in no queue of the operator: the operator holds no unbound pod"


def test_a_preemption_back_off_is_said_with_until_when_and_why() -> None:
    served = {
        "pod": "ns/p",
        "uid": "u1",
        "leading": True,
        "resource_manager": "pool",
        "queue": "unschedulable",
        "attempts": 2,
        "next_attempt_in_seconds": 9.5,
        "next_attempt_at": "2026-01-01T00:00:10+00:00",
        "waits_for_capacity": True,
        "preemption_backoff": {
            "seconds": 9.5,
            "until": "2026-01-01T00:00:10+00:00",
            "reason": "evicting victim ns/low on node a would exceed PodDisruptionBudget ns/keep",
        },
    }
    answer = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=served)
    assert answer.preemption == (
        "backed off until 2026-01-01T00:00:10+00:00 (in 9.5 s): no victims are asked for it before "
        "then, because evicting victim ns/low on node a would exceed PodDisruptionBudget ns/keep"
    )
    assert "Preemption:        backed off until 2026-01-01T00:00:10+00:00" in render(answer)
    del served["preemption_backoff"]
    plain = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=served)
    assert plain.preemption is None
    assert "Preemption:" not in render(plain)


def test_a_pending_preemption_plan_is_said_with_its_victims_and_what_it_waits_for() -> None:
    plan: dict[str, Any] = {
        "id": "p-1",
        "node": "a",
        "victims": [{"pod": "ns/low-0", "state": "terminating"}],
        "waits_for": "victims",
        "lease_until": "2026-01-01T00:01:00+00:00",
        "lease_seconds": 60.0,
    }
    served = {"pod": "ns/p", "uid": "u1", "leading": True, "queue": "unschedulable", "preemption_plan": plan}
    answer = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=served)
    assert answer.preemption_plan == (
        "plan p-1 on node a, victims ns/low-0 (terminating); waits for its victims to terminate; the "
        "RM holds the room until 2026-01-01T00:01:00+00:00 (in 60.0 s)"
    )
    assert "Preemption plan:   plan p-1 on node a" in render(answer)
    plan.update(victims=[{"pod": "ns/low-0", "state": "gone"}], waits_for="reserve")
    gone = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=served)
    assert gone.preemption_plan is not None
    assert "its victims are gone; waits for its next reserve" in gone.preemption_plan
    del served["preemption_plan"]
    plain = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=served)
    assert plain.preemption_plan is None
    assert "Preemption plan:" not in render(plain)


def test_an_unreachable_operator_is_said_with_what_could_not_be_seen() -> None:
    answer = explain(
        pod=pod(),
        resource_manager="pool",
        events=[],
        reservations=[],
        queue_problem=(
            "service bindery-system/bindery-metrics:metrics is not reachable (HTTP 503: no endpoints)"
        ),
    )
    assert answer.next_attempt is None
    [unseen] = answer.unseen
    assert unseen.startswith("the operator's queue: service bindery-system/bindery-metrics:metrics is not")
    assert "when the next attempt is due is not visible" in unseen
    assert "Not seen:          the operator's queue: service" in render(answer)


def test_queue_answers_and_refusals_are_told_apart() -> None:
    from bindery.explain.collect import OperatorAddress, _queue_answer

    active = {"pod": "ns/p", "queue": "active"}
    assert _queue_answer(200, json.dumps(active).encode(), where="w") == (active, None)
    none = {"pod": "ns/p", "message": "none"}
    assert _queue_answer(404, json.dumps(none).encode(), where="w") == (none, None)
    status = {"kind": "Status", "apiVersion": "v1", "message": 'services "m" not found', "code": 404}
    assert _queue_answer(404, json.dumps(status).encode(), where="svc") == (
        None,
        'svc: the apiserver answered HTTP 404: services "m" not found',
    )
    view, problem = _queue_answer(503, b"no endpoints available for service", where="svc")
    assert view is None
    assert problem is not None
    assert problem.startswith("svc is not reachable (HTTP 503: no endpoints available for service)")
    _, refused = _queue_answer(403, b"forbidden", where="svc")
    assert refused is not None
    assert "needs get on services/proxy" in refused
    # The metrics port no longer carries the queue views (they stay on loopback): say how to reach them.
    _, unserved = _queue_answer(404, b"404: Not Found", where="svc")
    assert unserved is not None
    assert "kubectl port-forward" in unserved
    assert "--operator-url http://127.0.0.1:9091" in unserved
    assert OperatorAddress.parse_service("ns/svc") == OperatorAddress(service=("ns", "svc", "metrics"))
    assert OperatorAddress.parse_service("ns/svc:9090").service == ("ns", "svc", "9090")


def _member(name: str, *, group: str, node: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"schedulingGroup": {"podGroupName": group}, **({"nodeName": node} if node else {})},
        "status": {"phase": phase},
    }


def test_a_group_counts_its_unfinished_members_and_shows_the_podgroup_condition() -> None:
    podgroup = {
        "metadata": {"name": "g", "namespace": "ns", "uid": "g1"},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 3}},
            "schedulingConstraints": {"topology": [{"key": "zone"}]},
        },
        "status": {
            "conditions": [
                {"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable", "message": "no"}
            ]
        },
    }
    pods = [
        _member("a", group="g", node="n1"),
        _member("b", group="g"),
        _member("c", group="g", phase="Succeeded"),  # finished: not counted toward minCount
        _member("d", group="other"),
    ]
    state = group_state(name="g", podgroup=podgroup, pods=pods)
    assert (state.min_count, state.members, state.bound, state.topology) == (3, 2, 1, ("zone",))
    assert state.condition == {"status": "False", "reason": "Unschedulable", "message": "no"}
    answer = explain(pod=pod(), resource_manager="rm", events=[], reservations=[], group=state)
    text = render(answer)
    assert "Pod group:         g: minCount 3, 2 member(s) exist, 1 bound, all on one value of zone" in text
    assert "PodGroupScheduled: False Unschedulable no" in text


def test_a_group_whose_podgroup_is_missing_says_so() -> None:
    state = group_state(name="g", podgroup=None, pods=[_member("a", group="g")])
    assert not state.found
    answer = explain(pod=pod(), resource_manager="rm", events=[], reservations=[], group=state)
    assert "no PodGroup of that name (yet); 1 member(s) exist, 0 bound" in render(answer)


def test_a_pod_preempting_others_says_where_and_what_it_waits_for() -> None:
    """Issue 21: a preemptor nominated to a node is pending by design, not stuck."""
    preemptor = pod(priority=100_000)
    preemptor["status"] = {
        "phase": "Pending",
        "nominatedNodeName": "n1",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no room"}
        ],
    }
    answer = explain(pod=preemptor, resource_manager="pool", events=[], reservations=[], queue={})
    assert answer.verdict.startswith("preempting lower-priority pods on n1:")
    assert "Nominated node:    n1" in render(answer)
    assert json.loads(json.dumps(answer.as_json()))["nominated_node"] == "n1"


def test_a_group_members_explain_shows_its_groups_preemption_back_off_and_plan() -> None:
    """The queue view answers 404 for a member (no per-pod queue holds it) with its group's
    back-off or plan: explain says whose they are."""
    served: dict[str, Any] = {
        "pod": "ns/a",
        "uid": "u1",
        "leading": True,
        "message": 'the pod is a member of pod group "g": its group is placed as a whole',
        "preemption_group": "ns/g",
        "preemption_backoff": {"seconds": 9.5, "until": "2026-01-01T00:00:10+00:00", "reason": "a budget"},
    }
    answer = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=served)
    assert answer.preemption == (
        "its pod group ns/g (it preempts as a whole): backed off until 2026-01-01T00:00:10+00:00 "
        "(in 9.5 s): no victims are asked for it before then, because a budget"
    )
    del served["preemption_backoff"]
    served["preemption_plan"] = {
        "id": "p-g",
        "node": "a",
        "victims": [{"pod": "ns/low-0", "state": "running"}],
        "waits_for": "victims",
        "lease_until": "2026-01-01T00:01:00+00:00",
        "lease_seconds": 60.0,
    }
    answer = explain(pod=pod(), resource_manager="pool", events=[], reservations=[], queue=served)
    assert "Preemption plan:   its pod group ns/g (it preempts as a whole): plan p-g on node a" in render(
        answer
    )


def test_the_devices_chosen_for_each_claim_are_shown() -> None:
    allocated = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.example.com", "pool": "n3", "device": "gpu-0"}
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
        }
    }
    answer = explain(
        pod=pod(),
        resource_manager="pool",
        events=[],
        reservations=[],
        device_claims=[("p-gpu", allocated), ("team", {"status": {}}), ("gone", None)],
    )
    text = render(answer)
    assert "Device claims:" in text
    assert "  p-gpu  Allocated, devices gpu.example.com/n3/gpu-0, reserved for 1 pod(s)" in text
    assert "  team  Pending" in text
    assert "  gone  Missing" in text
    assert json.loads(json.dumps(answer.as_json()))["device_claims"][0]["devices"] == [
        "gpu.example.com/n3/gpu-0"
    ]
