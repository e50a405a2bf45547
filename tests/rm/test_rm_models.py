"""The contract models validate requests strictly and read responses leniently."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from bindery.rm.models import (
    Placement,
    PodIdentity,
    Reservation,
    ReservationRequest,
    ReservationState,
    is_qualified_name,
)


def body(**overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "pod": {"uid": "u1", "namespace": "ns", "name": "p", "schedulerName": "bindery", "priority": 0},
        "resources": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"},
        "placement": {
            "nodeSelector": {"zone": "a"},
            "requiredNodeAffinity": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}],
            "tolerations": [{"operator": "Exists"}],
        },
        "idempotencyKey": "u1",
        "ttlSeconds": 30,
    }
    request.update(overrides)
    return request


def test_camel_case_json_and_snake_case_python() -> None:
    request = ReservationRequest.model_validate(body())
    assert request.pod.scheduler_name == "bindery"
    assert request.requested()["cpu"] == Decimal("0.5")
    assert request.placement.affinity_terms() == [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}], "matchFields": []}
    ]
    built = ReservationRequest(
        pod=PodIdentity(uid="u1", namespace="ns", name="p", scheduler_name="bindery"),
        resources={"cpu": "1"},
        placement=Placement(node_selector={"a": "b"}),
        idempotency_key="u1",
        ttl_seconds=10,
    )
    dumped = built.model_dump(by_alias=True)
    assert dumped["idempotencyKey"] == "u1"
    assert dumped["placement"]["nodeSelector"] == {"a": "b"}


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"resources": {"cpu": "-1"}}, "negative"),
        ({"resources": {"memory": "1e400"}}, "out of range"),
        ({"resources": {"cpu": "lots"}}, "not a Kubernetes quantity"),
        ({"resources": {"Not A Name!": "1"}}, "not a valid resource name"),
        ({"resources": {"cpu": 1}}, "string"),
        ({"ttlSeconds": 0}, "greater than or equal"),
        ({"ttlSeconds": "30"}, "integer"),
        ({"surprise": 1}, "Extra inputs"),
        ({"idempotencyKey": ""}, "at least 1"),
    ],
)
def test_bad_requests_rejected(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        ReservationRequest.model_validate(body(**overrides))


def test_unknown_nested_field_rejected() -> None:
    request = body()
    request["pod"]["color"] = "red"
    with pytest.raises(ValidationError, match="Extra inputs"):
        ReservationRequest.model_validate(request)


def test_fingerprint_compares_quantities_by_value() -> None:
    a = ReservationRequest.model_validate(body(resources={"cpu": "1000m"}))
    b = ReservationRequest.model_validate(body(resources={"cpu": "1"}))
    c = ReservationRequest.model_validate(body(resources={"cpu": "2"}))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_response_ignores_unknown_fields() -> None:
    reservation = Reservation.model_validate(
        {"id": "r1", "node": "n1", "state": "reserved", "podUid": "u1", "schedulerName": "s", "groupId": "g"}
    )
    assert reservation.state is ReservationState.RESERVED
    assert reservation.state.active


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("cpu", True),
        ("nvidia.com/gpu", True),
        ("hugepages-2Mi", True),
        ("example.com/foo_bar.baz", True),
        ("", False),
        ("/gpu", False),
        ("Example.com/gpu", False),
        ("a/b/c", False),
        ("-cpu", False),
        ("x" * 64, False),
        ("x" * 63, True),
        ("has space", False),
    ],
)
def test_qualified_names(name: str, valid: bool) -> None:
    assert is_qualified_name(name) is valid
