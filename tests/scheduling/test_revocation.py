"""The pure decision about a reservation the RM revoked (contract v1.2 feature revocation)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from bindery.config.resourcemanager import ConfigError, parse_resource_manager
from bindery.rm.models import Reservation, ReservationState
from bindery.scheduling.framework import RESERVATION_ANNOTATION
from bindery.scheduling.revocation import OnRevoked, RevokedAction, revoked_action, revoked_note

REVOKED = Reservation(
    id="rsv-1",
    node="n1",
    state=ReservationState.REVOKED,
    pod_uid="uid-1",
    scheduler_name="s",
    namespace="ns",
    name="p",
    revoked_reason="CANCELLED by root",
    revoked_at=datetime.datetime(2026, 12, 4, 15, 0, tzinfo=datetime.UTC),
)


def pod(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"uid": "uid-1", "name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    for key, value in changes.items():
        section, field = key.split("__")
        body[section][field] = value
    return body


@pytest.mark.parametrize(
    ("body", "policy", "expected"),
    [
        (pod(), OnRevoked.EVICT, RevokedAction.EVICT),
        (pod(), OnRevoked.WARN, RevokedAction.WARN),
        (pod(status__phase="Pending"), OnRevoked.EVICT, RevokedAction.EVICT),  # bound, not started yet
        (None, OnRevoked.EVICT, RevokedAction.ACKNOWLEDGE),
        (pod(metadata__uid="uid-2"), OnRevoked.EVICT, RevokedAction.ACKNOWLEDGE),  # replaced under its name
        (pod(spec__nodeName="n2"), OnRevoked.EVICT, RevokedAction.ACKNOWLEDGE),
        (pod(status__phase="Succeeded"), OnRevoked.EVICT, RevokedAction.ACKNOWLEDGE),
        (pod(status__phase="Failed"), OnRevoked.WARN, RevokedAction.ACKNOWLEDGE),
        (pod(metadata__deletionTimestamp="2026-12-04T15:00:00Z"), OnRevoked.EVICT, RevokedAction.ACKNOWLEDGE),
    ],
)
def test_only_the_running_pod_of_the_reservation_is_evicted_or_warned(
    body: dict[str, Any] | None, policy: OnRevoked, expected: RevokedAction
) -> None:
    assert revoked_action(reservation=REVOKED, pod=body, policy=policy) is expected


def test_the_note_names_the_rm_its_reason_and_what_follows() -> None:
    note = revoked_note(reservation=REVOKED, resource_manager="slurm", action=RevokedAction.EVICT)
    assert "ResourceManager slurm revoked reservation rsv-1 on node n1" in note
    assert "CANCELLED by root" in note
    assert "evicted" in note
    warned = revoked_note(reservation=REVOKED, resource_manager="slurm", action=RevokedAction.WARN)
    assert "keeps running" in warned


def _rm(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "rm", "uid": "u", "generation": 1},
        "spec": {"schedulerNames": ["s"], "endpoint": "https://rm.example", **spec},
    }


def test_on_revoked_defaults_to_evict_and_refuses_other_values() -> None:
    assert parse_resource_manager(body=_rm()).on_revoked is OnRevoked.EVICT
    assert parse_resource_manager(body=_rm(onRevoked="Warn")).on_revoked is OnRevoked.WARN
    with pytest.raises(ConfigError, match=r"spec\.onRevoked"):
        parse_resource_manager(body=_rm(onRevoked="Delete"))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # Not bound yet: a Binding may still land on the reservation (a cycle between reserve and
        # bind, a pod group waiting for its members); acknowledging now would leave that pod
        # running on capacity the RM took back, with nothing left to evict it.
        (pod(spec__nodeName=""), RevokedAction.WAIT),
        # Bound on the same node with another reservation (its next cycle reserved again): this
        # revoked one is not what it runs on.
        (pod(metadata__annotations={RESERVATION_ANNOTATION: "rsv-2"}), RevokedAction.ACKNOWLEDGE),
        (pod(metadata__annotations={RESERVATION_ANNOTATION: "rsv-1"}), RevokedAction.EVICT),
    ],
)
def test_a_pod_not_bound_yet_keeps_the_revocation_for_later_and_another_reservation_is_not_it(
    body: dict[str, Any], expected: RevokedAction
) -> None:
    assert revoked_action(reservation=REVOKED, pod=body, policy=OnRevoked.EVICT) is expected


def test_a_revoked_reservation_made_after_the_named_one_was_lost_is_the_one_the_pod_runs_on() -> None:
    """The pod's annotation names rsv-2, which the RM no longer holds (lost: a reconcile pass made
    rsv-1 for the pod on its node, and may not rewrite the annotation): revoking rsv-1 takes the
    pod's room, so the pod is evicted, not the revocation acknowledged silently."""
    body = pod(metadata__annotations={RESERVATION_ANNOTATION: "rsv-2"})
    for policy, expected in ((OnRevoked.EVICT, RevokedAction.EVICT), (OnRevoked.WARN, RevokedAction.WARN)):
        assert revoked_action(reservation=REVOKED, pod=body, policy=policy, named_active=False) is expected
    assert revoked_action(reservation=REVOKED, pod=body, policy=OnRevoked.EVICT, named_active=True) is (
        RevokedAction.ACKNOWLEDGE
    )
