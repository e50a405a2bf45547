"""Unit tests for the operator's pure pieces: request bodies, status, settling leftovers and
unconfirmed Bindings."""

from __future__ import annotations

import datetime

import pytest

from bindery.adapters.binder import assigned_node, binding_body
from bindery.adapters.conditions import KubeConditionWriter, condition_patch
from bindery.adapters.events import event_body, micro_time
from bindery.controller.reservations.fate import Settle
from bindery.controller.reservations.reconcile import reconcile_action
from bindery.controller.reservations.unconfirmed import UnconfirmedBind, fate
from bindery.controller.status import Observation, compute_status, status_changed
from bindery.rm.models import Reservation
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.podspec import PodInfo

POD = PodInfo(uid="u-1", namespace="ns", name="p", scheduler_name="bindery")
NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)


def test_binding_carries_the_uid_precondition_and_the_annotations() -> None:
    body = binding_body(pod=POD, node="n1", annotations={"bindery.dev/reservation-id": "r-1"})
    assert body["metadata"] == {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "annotations": {"bindery.dev/reservation-id": "r-1"},
    }
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}


def test_the_current_node_is_parsed_from_the_apiservers_conflict_message() -> None:
    assert assigned_node('pod p is already assigned to node "n-7"') == "n-7"
    assert assigned_node("Precondition failed: UID in precondition: a, UID in object meta: b") is None


def test_events_have_kube_schedulers_shape() -> None:
    body = event_body(
        pod=POD,
        resource_version="42",
        scheduler_name="bindery",
        hostname="host-a",
        type_="Normal",
        reason="Scheduled",
        action="Binding",
        note="Successfully assigned ns/p to n1",
        now=NOW,
    )
    assert body["eventTime"] == "2026-01-02T03:04:05.678901Z"
    assert body["reportingController"] == "bindery"
    assert body["reportingInstance"] == "bindery-host-a"
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "u-1",
        "resourceVersion": "42",
    }
    assert body["metadata"]["name"].startswith("p.")
    assert micro_time(NOW) == body["eventTime"]


def test_condition_patch_touches_only_pod_scheduled() -> None:
    patch = condition_patch(uid="u-1", reason="Unschedulable", message="no room", now=NOW)
    assert patch["metadata"] == {"uid": "u-1"}
    (cond,) = patch["status"]["conditions"]
    assert cond["type"] == "PodScheduled"
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", "no room")


def _reservation(**overrides: object) -> Reservation:
    fields: dict[str, object] = {
        "id": "r-1",
        "node": "n1",
        "state": "reserved",
        "podUid": "u-1",
        "schedulerName": "bindery",
        "namespace": "ns",
        "name": "p",
    }
    fields.update(overrides)
    return Reservation.model_validate(fields)


def test_leftover_reservations_are_committed_only_if_the_pod_is_bound_to_their_node() -> None:
    reservation = _reservation()
    bound_here = {
        "metadata": {"uid": "u-1", "annotations": {RESERVATION_ANNOTATION: "r-1"}},
        "spec": {"nodeName": "n1"},
    }
    assert reconcile_action(reservation=reservation, pod=bound_here) is Settle.COMMIT
    assert reconcile_action(reservation=reservation, pod=None) is Settle.RELEASE
    pending = {"metadata": {"uid": "u-1"}, "spec": {}}
    assert reconcile_action(reservation=reservation, pod=pending) is None  # a late Binding may land
    elsewhere = {"metadata": {"uid": "u-1"}, "spec": {"nodeName": "n2"}}
    assert reconcile_action(reservation=reservation, pod=elsewhere) is Settle.RELEASE
    recreated = {"metadata": {"uid": "u-2"}, "spec": {"nodeName": "n1"}}
    assert reconcile_action(reservation=reservation, pod=recreated) is Settle.RELEASE


def _ready(status: dict[str, object]) -> dict[str, object]:
    conditions = status["conditions"]
    assert isinstance(conditions, list)
    return next(c for c in conditions if c["type"] == "Ready")


def test_status_ready_needs_a_valid_spec_no_conflicts_and_a_reachable_rm() -> None:
    ok = compute_status(observation=Observation(generation=2, reachable=True), previous=None, now=NOW)
    assert _ready(ok)["status"] == "True"
    assert ok["observedGeneration"] == 2
    conflict = Observation(generation=2, reachable=True, conflicts={"bindery": ("other",)})
    status = compute_status(observation=conflict, previous=ok, now=NOW)
    assert _ready(status)["reason"] == "SchedulerNameConflict"
    assert "other" in str(_ready(status)["message"])
    assert status["conflicts"] == ["other"]
    invalid = compute_status(
        observation=Observation(generation=3, config_error="bad"), previous=None, now=NOW
    )
    assert _ready(invalid)["reason"] == "InvalidSpec"
    assert invalid["lastError"] == "bad"


def test_a_refused_token_is_its_own_reason_not_a_generic_unreachable() -> None:
    refused = Observation(
        generation=1, reachable=False, reach_message="refused the bearer token", token_refused=True
    )
    status = compute_status(observation=refused, previous=None, now=NOW)
    assert (_ready(status)["status"], _ready(status)["reason"]) == ("False", "TokenRefused")
    assert _ready(status)["message"] == "refused the bearer token"
    assert status["lastError"] == "refused the bearer token"


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = compute_status(observation=Observation(generation=1, reachable=True), previous=None, now=NOW)
    later = NOW + datetime.timedelta(minutes=5)
    again = compute_status(observation=Observation(generation=1, reachable=True), previous=first, now=later)
    assert _ready(again)["lastTransitionTime"] == _ready(first)["lastTransitionTime"]
    assert not status_changed(new=again, previous=first)
    down = compute_status(
        observation=Observation(generation=1, reachable=False, reach_message="refused"),
        previous=first,
        now=later,
    )
    assert _ready(down)["lastTransitionTime"] != _ready(first)["lastTransitionTime"]
    assert status_changed(new=down, previous=first)


UNCONFIRMED = UnconfirmedBind(reservation_id="r-1", pod=POD, node="n1", deadline=60.0)


def _pod(
    *, uid: str = "u-1", node: str | None = None, phase: str = "Pending", reservation: str | None = "r-1"
) -> dict[str, object]:
    annotations = {"bindery.dev/reservation-id": reservation} if reservation else {}
    return {
        "metadata": {"uid": uid, "annotations": annotations},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_pod(node="n1", phase="Running"), Settle.COMMIT),  # the Binding landed
        (_pod(node="n1"), Settle.COMMIT),  # landed, containers not started yet
        (_pod(), None),  # still pending: its next cycle reuses the reservation
        (None, Settle.RELEASE),  # deleted
        (_pod(uid="u-2", node="n1"), Settle.RELEASE),  # replaced: the UID precondition refused ours
        (_pod(node="n2", phase="Running"), Settle.RELEASE),  # someone else bound it elsewhere
        (_pod(node="n1", phase="Succeeded"), Settle.RELEASE),  # bound by us, and already finished
        (_pod(node="n1", phase="Failed"), Settle.RELEASE),
        # The annotation is not authority: the pod that runs there is the one the reservation is for
        # (its owner may have overwritten the annotation; a stale cycle's Binding put it there).
        (_pod(node="n1", reservation="r-0"), Settle.COMMIT),
        (_pod(node="n1", reservation=None), Settle.COMMIT),
    ],
    ids=[
        "running",
        "bound",
        "pending",
        "gone",
        "replaced",
        "elsewhere",
        "succeeded",
        "failed",
        "other-annotation",
        "no-annotation",
    ],
)
def test_an_unconfirmed_binding_is_settled_by_the_pods_fate(
    pod: dict[str, object] | None, expected: Settle | None
) -> None:
    assert fate(bind=UNCONFIRMED, pod=pod) is expected


async def test_the_sweep_drops_conditions_recorded_for_pods_it_no_longer_knows() -> None:
    """A PodScheduled write in flight when its pod is forgotten records the pod after `forget`; seen
    in CI as `conditions_written: 1` left after 5,000 pods came and went (test_ghosts)."""
    from kubernetes_asyncio import client

    async with client.ApiClient() as api:
        writer = KubeConditionWriter(api=api)
        writer._written.update({"kept": ("Unschedulable", "no room"), "late": ("Unschedulable", "no room")})
        assert writer.retain(uids={"kept"}) == 1
        assert set(writer._written) == {"kept"}
