"""`bindery explain`'s verdicts as pure functions of what was read (the real run: tests/operator)."""

from __future__ import annotations

from typing import Any

from bindery.explain.facts import ReservationView, attempts_of, explain, render


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
