"""The contract document is valid OpenAPI 3.1 and agrees with the Python models on the essentials."""

from __future__ import annotations

from openapi_spec_validator import validate

from bindery.rm.contract import load_openapi
from bindery.rm.errors import PROBLEM_BASE, ProblemType
from bindery.rm.models import (
    CONTRACT_VERSION,
    MAX_BATCH_OPERATIONS,
    MAX_GROUP_MEMBERS,
    BatchOperation,
    BatchOperationResult,
    BatchRequest,
    BatchResult,
    GroupIdentity,
    GroupMemberRequest,
    GroupRenewRequest,
    RenewRequest,
    Reservation,
    ReservationGroup,
    ReservationGroupRequest,
    ReservationRef,
    ReservationRequest,
    ReservationState,
    TopologyConstraint,
)


def test_document_validates_as_openapi_3_1() -> None:
    document = load_openapi()
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_version_matches_models() -> None:
    assert load_openapi()["info"]["version"] == CONTRACT_VERSION


def test_required_paths_present() -> None:
    paths = load_openapi()["paths"]
    assert set(paths["/v1/reservations"]) >= {"post", "get"}
    assert "post" in paths["/v1/reservations/{id}/commit"]
    assert "delete" in paths["/v1/reservations/{id}"]
    assert {"/healthz", "/readyz"} <= set(paths)


def test_request_fields_match_model() -> None:
    schema = load_openapi()["components"]["schemas"]["ReservationRequest"]
    aliases = {field.alias for field in ReservationRequest.model_fields.values()}
    assert set(schema["properties"]) == aliases
    assert schema["additionalProperties"] is False


def test_states_and_problem_types_match() -> None:
    schemas = load_openapi()["components"]["schemas"]
    assert schemas["ReservationState"]["enum"] == [state.value for state in ReservationState]
    assert PROBLEM_BASE in schemas["Problem"]["description"].replace("`", "").replace("\n", " ")


def test_v1_1_additions_match_the_models() -> None:
    """Renew's body mirrors RenewRequest; commit and release take the optional podUid parameter."""
    document = load_openapi()
    paths = document["paths"]
    assert "post" in paths["/v1/reservations/{id}/renew"]
    schema = document["components"]["schemas"]["RenewRequest"]
    assert set(schema["properties"]) == {field.alias for field in RenewRequest.model_fields.values()}
    assert set(schema["required"]) == {"podUid", "ttlSeconds"}
    assert schema["additionalProperties"] is False
    pod_uid = {"$ref": "#/components/parameters/PodUid"}
    assert pod_uid in paths["/v1/reservations/{id}/commit"]["post"]["parameters"]
    assert pod_uid in paths["/v1/reservations/{id}"]["delete"]["parameters"]
    assert document["components"]["parameters"]["PodUid"]["required"] is False
    kinds = document["components"]["schemas"]["Problem"]["description"].replace("\n", " ")
    assert ProblemType.POD_MISMATCH.removeprefix(PROBLEM_BASE) in kinds


def test_v1_1_groups_match_the_models() -> None:
    """The group paths exist, and every group schema has exactly the fields of its model."""
    document = load_openapi()
    paths = document["paths"]
    assert "post" in paths["/v1/reservation-groups"]
    assert {"get", "delete"} <= set(paths["/v1/reservation-groups/{groupId}"])
    assert "post" in paths["/v1/reservation-groups/{groupId}/renew"]
    schemas = document["components"]["schemas"]
    for name, model in (
        ("GroupIdentity", GroupIdentity),
        ("TopologyConstraint", TopologyConstraint),
        ("GroupMemberRequest", GroupMemberRequest),
        ("ReservationGroupRequest", ReservationGroupRequest),
        ("GroupRenewRequest", GroupRenewRequest),
    ):
        fields = {field.alias for field in model.model_fields.values()}
        assert set(schemas[name]["properties"]) == fields, name
        assert schemas[name]["additionalProperties"] is False, name
        required = {f.alias for f in model.model_fields.values() if f.is_required()}
        assert set(schemas[name].get("required", [])) == required, name
    assert schemas["ReservationGroupRequest"]["properties"]["members"]["maxItems"] == MAX_GROUP_MEMBERS
    assert set(schemas["ReservationGroup"]["properties"]) == {
        f.alias for f in ReservationGroup.model_fields.values()
    }
    assert set(schemas["Reservation"]["properties"]) == {f.alias for f in Reservation.model_fields.values()}
    listing = {p["name"] for p in paths["/v1/reservations"]["get"]["parameters"]}
    assert "groupId" in listing


def test_v1_1_batch_matches_the_models() -> None:
    """POST /v1/batch exists, each batch schema has exactly the fields of its model, request schemas
    forbid unknown fields, and the operation limit is the models' one."""
    document = load_openapi()
    operation = document["paths"]["/v1/batch"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BatchRequest"
    }
    assert {"200", "400", "404", "405", "413"} <= set(operation["responses"])
    schemas = document["components"]["schemas"]
    for name, model in (
        ("ReservationRef", ReservationRef),
        ("BatchOperation", BatchOperation),
        ("BatchRequest", BatchRequest),
        ("BatchOperationResult", BatchOperationResult),
        ("BatchResult", BatchResult),
    ):
        fields = {field.alias for field in model.model_fields.values()}
        assert set(schemas[name]["properties"]) == fields, name
        required = {f.alias for f in model.model_fields.values() if f.is_required()}
        assert set(schemas[name].get("required", [])) == required, name
    for name in ("ReservationRef", "BatchOperation", "BatchRequest"):
        assert schemas[name]["additionalProperties"] is False, name
    assert schemas["BatchRequest"]["properties"]["operations"]["maxItems"] == MAX_BATCH_OPERATIONS
    assert schemas["BatchRequest"]["properties"]["operations"]["minItems"] == 1
    refs = {
        kind: schemas["BatchOperation"]["properties"][kind]["$ref"]
        for kind in ("reserve", "commit", "release")
    }
    assert refs == {
        "reserve": "#/components/schemas/ReservationRequest",
        "commit": "#/components/schemas/ReservationRef",
        "release": "#/components/schemas/ReservationRef",
    }
