"""The pure decisions of DRA devices through the RM: claims of a pod, the plan, the claim writes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bindery.rm.models import ClaimAllocation
from bindery.scheduling.devices import (
    RESERVED_FOR_MAX,
    ClaimWait,
    DevicePlan,
    PodClaim,
    allocated_status,
    claim_wait,
    plan_devices,
    pod_claims,
    reserved,
    unreserved,
)
from bindery.scheduling.devices.allocation import DELETE_PROTECTION, with_finalizer, without_finalizer

_POD: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "p", "uid": "pod-uid"},
    "spec": {
        "resourceClaims": [
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
            {"name": "shared", "resourceClaimName": "team-gpu"},
        ]
    },
}
_GPU_CLASS: dict[str, Any] = {
    "metadata": {"name": "gpu.example.com"},
    "spec": {
        "selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}],
        "config": [{"opaque": {"driver": "gpu.example.com", "parameters": {"mode": "class"}}}],
    },
}


def _claim(
    name: str, *, uid: str = "c1", status: dict[str, Any] | None = None, **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid, **meta},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.example.com",
                            "selectors": [
                                {"cel": {"expression": "device.capacity['gpu.example.com'].memory >= 1"}}
                            ],
                        },
                    }
                ],
                "config": [
                    {"requests": ["gpu"], "opaque": {"driver": "gpu.example.com", "parameters": {"x": 1}}}
                ],
            }
        },
        "status": status or {},
    }


def test_a_template_claim_not_created_yet_makes_the_pod_wait() -> None:
    waiting = pod_claims(_POD)
    assert isinstance(waiting, ClaimWait)
    assert 'pod claim "gpu"' in waiting.message
    assert "resourceclaim controller" in waiting.message


def test_claims_by_name_and_from_a_template_resolve_through_the_pod_status() -> None:
    pod = {**_POD, "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7k2p"}]}}
    assert pod_claims(pod) == (
        PodClaim(pod_claim="gpu", name="p-gpu-x7k2p", generated=True),
        PodClaim(pod_claim="shared", name="team-gpu", generated=False),
    )
    # The controller decided no claim is needed: the entry is skipped, as upstream does.
    skipped = {**_POD, "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": None}]}}
    assert pod_claims(skipped) == (PodClaim(pod_claim="shared", name="team-gpu", generated=False),)


def test_a_generated_claim_must_be_the_pods_and_a_deleted_one_waits() -> None:
    generated = PodClaim(pod_claim="gpu", name="p-gpu", generated=True)
    mine = _claim("p-gpu", ownerReferences=[{"uid": "pod-uid", "controller": True, "kind": "Pod"}])
    other = _claim("p-gpu", ownerReferences=[{"uid": "someone", "controller": True, "kind": "Pod"}])
    assert claim_wait(pod_uid="pod-uid", pod_key="ns/p", claim=generated, body=mine) is None
    assert (
        "pod is not owner"
        in (
            claim_wait(pod_uid="pod-uid", pod_key="ns/p", claim=generated, body=other) or ClaimWait("")
        ).message
    )
    gone = claim_wait(pod_uid="pod-uid", pod_key="ns/p", claim=generated, body=None)
    assert gone is not None
    assert gone.claim == "p-gpu"
    assert "not found" in gone.message
    deleting = _claim("p-gpu", deletionTimestamp="2026-12-08T00:00:00Z")
    named = PodClaim(pod_claim="shared", name="p-gpu", generated=False)
    assert (
        "being deleted"
        in (
            claim_wait(pod_uid="pod-uid", pod_key="ns/p", claim=named, body=deleting) or ClaimWait("")
        ).message
    )


def test_an_unallocated_claim_is_sent_with_its_class_selectors_resolved() -> None:
    claim = PodClaim(pod_claim="gpu", name="p-gpu", generated=True)
    plan = plan_devices(
        pod_uid="pod-uid", claims=[(claim, _claim("p-gpu"))], classes={"gpu.example.com": _GPU_CLASS}
    )
    assert isinstance(plan, DevicePlan)
    assert plan.reused == ()
    assert plan.node_terms == ()
    [entry] = plan.to_allocate
    assert entry.model_dump(by_alias=True, exclude_none=True, mode="json") == {
        "claim": {"namespace": "ns", "name": "p-gpu", "uid": "c1"},
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.example.com",
                    "classSelectors": ["device.driver == 'gpu.example.com'"],
                    "selectors": ["device.capacity['gpu.example.com'].memory >= 1"],
                    "allocationMode": "ExactCount",
                    "count": 1,
                    "adminAccess": False,
                    "tolerations": [],
                },
            }
        ],
        "constraints": [],
    }


def test_an_allocated_claim_is_reused_and_narrows_the_nodes() -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n3"]}]}
    body = _claim("team-gpu", status={"allocation": {"nodeSelector": {"nodeSelectorTerms": [term]}}})
    plan = plan_devices(
        pod_uid="pod-uid",
        claims=[(PodClaim(pod_claim="shared", name="team-gpu", generated=False), body)],
        classes={},
    )
    assert plan == DevicePlan(to_allocate=(), reused=("team-gpu",), node_terms=((term,),))


def test_a_full_claim_a_missing_class_and_a_claim_in_flight_make_the_pod_wait() -> None:
    claim = PodClaim(pod_claim="shared", name="team-gpu", generated=False)
    full = [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(RESERVED_FOR_MAX)]
    allocated = _claim("team-gpu", status={"allocation": {}, "reservedFor": full})
    allocated["status"]["allocation"] = {"devices": {"results": []}}
    in_use = plan_devices(pod_uid="pod-uid", claims=[(claim, allocated)], classes={})
    assert isinstance(in_use, ClaimWait)
    assert "is in use" in in_use.message
    # Already among the consumers, the pod may use it still.
    assert isinstance(plan_devices(pod_uid="u0", claims=[(claim, allocated)], classes={}), DevicePlan)
    missing = plan_devices(
        pod_uid="pod-uid", claims=[(claim, _claim("team-gpu"))], classes={"gpu.example.com": None}
    )
    assert isinstance(missing, ClaimWait)
    assert 'device class "gpu.example.com" does not exist' in missing.message
    busy = plan_devices(
        pod_uid="pod-uid",
        claims=[(claim, _claim("team-gpu"))],
        classes={"gpu.example.com": _GPU_CLASS},
        in_flight={"c1"},
    )
    assert isinstance(busy, ClaimWait)
    assert "being allocated for another pod" in busy.message


def test_the_allocation_carries_class_then_claim_then_rm_config_and_the_node() -> None:
    answer = ClaimAllocation.model_validate(
        {
            "claim": {"namespace": "ns", "name": "p-gpu", "uid": "c1"},
            "results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "n3", "device": "gpu-0"}],
            "config": [
                {"requests": ["gpu"], "opaque": {"driver": "gpu.example.com", "parameters": {"rm": 1}}}
            ],
        }
    )
    allocation = allocated_status(
        claim=_claim("p-gpu"), answer=answer, classes={"gpu.example.com": _GPU_CLASS}, node="n3"
    )
    assert allocation["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "n3", "device": "gpu-0"}
    ]
    assert [
        (entry["source"], entry["opaque"]["parameters"]) for entry in allocation["devices"]["config"]
    ] == [
        ("FromClass", {"mode": "class"}),
        ("FromClaim", {"x": 1}),
        ("FromClaim", {"rm": 1}),
    ]
    assert allocation["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n3"]}]}]
    }


def test_the_finalizer_is_added_once_and_removed_once() -> None:
    added = with_finalizer({"name": "c", "finalizers": ["other"]})
    assert added is not None
    assert added["finalizers"] == ["other", DELETE_PROTECTION]
    assert with_finalizer(added) is None
    removed = without_finalizer(added)
    assert removed is not None
    assert removed["finalizers"] == ["other"]
    assert without_finalizer(removed) is None


def test_a_claim_allocated_by_someone_else_meanwhile_is_not_overwritten() -> None:
    theirs = {"allocation": {"devices": {"results": [{"device": "gpu-1"}]}}}
    with pytest.raises(ValueError, match="allocated by someone else"):
        reserved(
            status=theirs,
            pod_name="p",
            pod_uid="u",
            allocation={"devices": {"results": [{"device": "gpu-0"}]}},
        )


_CONSUMERS = st.lists(st.sampled_from([f"u{i}" for i in range(12)]), unique=True, max_size=10)


@given(others=_CONSUMERS, allocated_before=st.booleans())
def test_unreserve_undoes_exactly_what_reserve_did(others: list[str], allocated_before: bool) -> None:
    """Whatever the claim's consumers, reserving the pod and unreserving it leaves the claim as it was,
    except that an allocation this cycle wrote goes when no one else reserved it."""
    allocation = {"devices": {"results": [{"device": "gpu-0"}]}, "nodeSelector": {}}
    before: dict[str, Any] = {}
    if others:
        before["reservedFor"] = [
            {"resource": "pods", "name": uid, "uid": uid} for uid in others if uid != "me"
        ]
    if allocated_before:
        before["allocation"] = allocation
    after = reserved(
        status=before, pod_name="me", pod_uid="me", allocation=None if allocated_before else allocation
    )
    assert after is not None
    assert after["allocation"] == allocation
    assert [entry["uid"] for entry in after["reservedFor"]][-1] == "me"
    undone, finalizer_goes = unreserved(status=after, pod_uid="me", allocated_here=not allocated_before)
    assert undone is not None
    if allocated_before or before.get("reservedFor"):
        expected = dict(before)
        if not allocated_before:
            expected["allocation"] = allocation  # others reserved it meanwhile: it stays theirs
        assert undone == expected
        assert not finalizer_goes
    else:
        assert undone == {}
        assert finalizer_goes
