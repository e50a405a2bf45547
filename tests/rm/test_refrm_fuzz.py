"""Fuzz the reference RM against its own OpenAPI document with schemathesis.

Schemathesis generates requests from the contract (valid and invalid ones) and checks every answer
against it: no 5xx, only documented status codes and content types, bodies that match the schemas,
invalid data rejected.  The RM runs in its own thread and event loop because schemathesis calls it
synchronously.  Example counts are small so this stays well under a minute.
"""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

from bindery.reference_rm import InventoryNode, serve_reference_rm
from bindery.rm.contract import load_openapi

from .conftest import TOKEN


def fuzzable_contract() -> dict[str, Any]:
    """The contract with two things a JSON schema cannot express taken out, so that schemathesis
    does not count their rightful 400s as "valid data rejected":

    * the opaque pagination cursor (a random string was never issued); paging is covered by the
      conformance kit;
    * the 2^63-1 bound on quantities: the regex allows ``9e99``; positive examples stay in range
      here, and out-of-range values are tested explicitly in test_refrm_server.py;
    * (v1.1) a batch's malformed operation is answered by its own 400 result inside a 200, not by a
      4xx for the request; so here an operation may be anything (the envelope stays checked), and
      the per-operation 400s are tested in test_refrm_batch_server.py and by the conformance kit;
    * (v1.3) `devices`: this RM runs without a device allocator, so it does not list the feature
      and refuses the field as a v1.2 RM does (a client sends it only to an RM listing `devices`);
      that refusal is tested in test_refrm_devices_request.py.
    """
    document = load_openapi()
    listing = document["paths"]["/v1/reservations"]["get"]
    listing["parameters"] = [p for p in listing["parameters"] if p["name"] != "cursor"]
    document["components"]["schemas"]["Quantity"]["pattern"] = (
        r"^\+?([0-9]{1,9}(\.[0-9]*)?|\.[0-9]+)([KMG]i|[numkMG]|[eE][+-]?[0-9])?$"
    )
    # A group's members are distinct pods in the group's namespace with its scheduler name (v1.1):
    # generate one member whose pod shares the group's fixed namespace and scheduler name.
    schemas = document["components"]["schemas"]
    pinned = {"type": "string", "enum": ["fuzz"]}
    schemas["FuzzPod"] = {
        **schemas["PodIdentity"],
        "properties": {**schemas["PodIdentity"]["properties"], "namespace": pinned, "schedulerName": pinned},
    }
    schemas["GroupMemberRequest"]["properties"]["pod"] = {"$ref": "#/components/schemas/FuzzPod"}
    schemas["GroupIdentity"]["properties"].update(namespace=pinned, schedulerName=pinned)
    schemas["ReservationGroupRequest"]["properties"]["members"]["maxItems"] = 1
    schemas["BatchRequest"]["properties"]["operations"]["items"] = {}
    for name in ("ReservationRequest", "GroupMemberRequest"):
        schemas[name]["properties"].pop("devices", None)
    return document


# Declared as the contract's bearer scheme, so schemathesis knows which requests it made
# unauthenticated on purpose (and expects 401 for those).
schema = schemathesis.openapi.from_dict(
    fuzzable_contract(),
    config=SchemathesisConfig.from_dict({"auth": {"openapi": {"bearerAuth": {"bearer": TOKEN}}}}),
)


@pytest.fixture(scope="module")
def fuzzed_rm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("fuzz") / "rm.sqlite"
    inventory = [
        InventoryNode(
            name=f"n{i}", allocatable={"cpu": Decimal(64), "memory": Decimal(2**40), "pods": Decimal(10**6)}
        )
        for i in range(3)
    ]
    started = threading.Event()
    url: list[str] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        # A body limit far above what the schema's maxLength/maxItems allow: oversized *schema-invalid*
        # bodies must get 400 here, not 413 (the limit itself is tested in test_refrm_server.py).
        async with serve_reference_rm(
            db_path=db, inventory=inventory, token=TOKEN, max_body_bytes=64 * 1024 * 1024
        ) as server:
            url.append(server.url)
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(timeout=30), "the reference RM did not start"
    yield url[0]
    loop.call_soon_threadsafe(stop.set)
    thread.join(timeout=30)
    loop.close()


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_reference_rm_matches_its_contract(case: schemathesis.Case[Any], fuzzed_rm: str) -> None:
    case.call_and_validate(base_url=fuzzed_rm)


def test_fuzzing_can_fail(fuzzed_rm: str, tmp_path: pathlib.Path) -> None:
    """A contract that contradicts the server (commit answers 201 only) makes validation fail."""
    document = load_openapi()
    commit = document["paths"]["/v1/reservations/{id}/commit"]["post"]
    commit["responses"] = {"201": commit["responses"]["200"]}
    broken = schemathesis.openapi.from_dict(document)
    operation = broken["/v1/reservations/{id}/commit"]["POST"]
    case = operation.Case(path_parameters={"id": "no-such-id"}, body={})
    with pytest.raises(FailureGroup, match="Undocumented status code"):
        case.call_and_validate(base_url=fuzzed_rm, headers={"Authorization": f"Bearer {TOKEN}"})
