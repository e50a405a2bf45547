"""The ResourceManager CRD refuses bad specs at admission time, with messages that say what to fix."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client

from tests.operator.conftest import create_rm, delete_rm

pytestmark = pytest.mark.controlplane


async def _refusal(api: client.ApiClient, **spec: Any) -> str:
    name = "bad-" + str(abs(hash(repr(spec))))[:8]
    try:
        with pytest.raises(client.ApiException) as refused:
            await create_rm(api, name=name, **spec)
    finally:
        await delete_rm(api, name=name)  # only exists if the apiserver wrongly accepted it
    assert refused.value.status == 422, refused.value.body
    return str(json.loads(refused.value.body)["message"])


HTTPS = "https://rm.example"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"scheduler_names": ["bindery"], "endpoint": "http://rm.example", "allowInsecureHTTP": False},
            "uses plain http://, which sends the bearer token",
        ),
        ({"scheduler_names": [], "endpoint": HTTPS}, "should have at least 1 items"),
        ({"scheduler_names": ["Not_A_Name"], "endpoint": HTTPS}, "lowercase DNS name"),
        ({"scheduler_names": ["a", "a"], "endpoint": HTTPS}, "Duplicate value"),
        ({"scheduler_names": ["a"], "endpoint": "ftp://rm.example"}, "absolute http:// or https:// URL"),
        (
            {
                "scheduler_names": ["a"],
                "endpoint": HTTPS,
                "backoff": {"initialSeconds": 5, "maxSeconds": 2},
            },
            "maxSeconds must be greater than or equal to spec.backoff.initialSeconds",
        ),
        (
            {"scheduler_names": ["a"], "endpoint": HTTPS, "nodeCheck": "Sometimes"},
            'supported values: "Full", "Basic", "Off"',
        ),
        (
            {
                "scheduler_names": ["a"],
                "endpoint": HTTPS,
                "tls": {"caBundle": "x", "caSecretRef": {"namespace": "n", "name": "s"}},
            },
            "set at most one of spec.tls.caSecretRef and spec.tls.caBundle",
        ),
        (
            {"scheduler_names": ["a"], "endpoint": HTTPS, "maxInFlight": 0},
            "should be greater than or equal to 1",
        ),
        (
            {
                "scheduler_names": ["a"],
                "endpoint": HTTPS,
                "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]},
            },
            "In and NotIn need at least one value",
        ),
        (
            {
                "scheduler_names": ["a"],
                "endpoint": HTTPS,
                "namespaceSelector": {
                    "matchExpressions": [{"key": "team", "operator": "Gt", "values": ["1"]}]
                },
            },
            'supported values: "In", "NotIn", "Exists", "DoesNotExist"',
        ),
    ],
)
async def test_invalid_specs_are_refused_with_clear_messages(
    kube_api: client.ApiClient, crd: None, spec: dict[str, Any], message: str
) -> None:
    refusal = await _refusal(kube_api, **spec)
    assert message in refusal


async def test_a_valid_spec_gets_defaults(kube_api: client.ApiClient, crd: None) -> None:
    created = await create_rm(
        kube_api, name="defaults-check", scheduler_names=["x"], endpoint="https://rm.example"
    )
    try:
        spec = created["spec"]
        assert spec["allowInsecureHTTP"] is False
        assert spec["nodeCheck"] == "Full"
        assert spec["reservationTTLSeconds"] == 60
        assert spec["maxInFlight"] == 256
    finally:
        await delete_rm(kube_api, name="defaults-check")
