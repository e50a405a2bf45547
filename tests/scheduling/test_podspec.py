"""PodInfo.from_body, effective_requests (init containers, sidecars, overhead, pod level), RM request."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bindery.rm.models import Placement
from bindery.scheduling.devices import ClaimWait, PodClaim
from bindery.scheduling.podspec import (
    PodInfo,
    PodSpecError,
    beyond_contract,
    effective_requests,
    reservation_request,
)


def container(name: str = "c", *, restart: str | None = None, **requests: str) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "resources": {"requests": dict(requests)}}
    if restart:
        body["restartPolicy"] = restart
    return body


def cpu(spec: dict[str, Any]) -> Decimal:
    return effective_requests(spec=spec)["cpu"]


POD_BODY: dict[str, Any] = {
    "metadata": {
        "uid": "u-1",
        "namespace": "team",
        "name": "web-0",
        "creationTimestamp": "2026-03-04T05:06:07Z",
        "labels": {"app": "web"},
    },
    "spec": {
        "schedulerName": "bindery",
        "priority": 1000,
        "containers": [container(cpu="250m", memory="1Gi")],
        "nodeSelector": {"zone": "a"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
                }
            }
        },
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "web", "effect": "NoSchedule"}],
    },
    "status": {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no room"}
        ],
    },
}


def test_from_body_projects_every_field() -> None:
    info = PodInfo.from_body(POD_BODY)
    assert info.uid == "u-1"
    assert info.key == "team/web-0"
    assert info.scheduler_name == "bindery"
    assert info.priority == 1000
    assert info.created == datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert info.node_name is None
    assert info.schedulable
    assert info.requests == {"cpu": Decimal("0.25"), "memory": Decimal(2**30)}
    assert info.node_selector == {"zone": "a"}
    assert info.affinity_terms == ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},)
    assert info.tolerations[0]["value"] == "web"
    assert info.labels == {"app": "web"}
    assert info.unschedulable_condition == ("Unschedulable", "no room")


def test_from_body_defaults_and_flags() -> None:
    info = PodInfo.from_body(
        {
            "metadata": {
                "uid": "u",
                "namespace": "n",
                "name": "p",
                "deletionTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"nodeName": "n1", "schedulingGates": [{"name": "wait"}], "containers": []},
        }
    )
    assert info.scheduler_name == "default-scheduler"
    assert info.priority == 0
    assert info.node_name == "n1"
    assert info.deleting
    assert info.gated
    assert not info.schedulable
    assert info.requests == {}
    assert info.unschedulable_condition is None


def test_status_changes_do_not_change_placement_inputs() -> None:
    before = PodInfo.from_body(POD_BODY)
    after = PodInfo.from_body({**POD_BODY, "status": {"phase": "Pending"}})
    assert before.placement_inputs() == after.placement_inputs()
    moved = PodInfo.from_body({**POD_BODY, "spec": {**POD_BODY["spec"], "nodeSelector": {"zone": "b"}}})
    assert moved.placement_inputs() != before.placement_inputs()


def test_regular_containers_add_up() -> None:
    assert cpu({"containers": [container(cpu="100m"), container(cpu="1")]}) == Decimal("1.1")


def test_init_containers_run_one_at_a_time_and_the_peak_wins() -> None:
    spec = {
        "initContainers": [container("i1", cpu="2"), container("i2", cpu="500m", memory="4Gi")],
        "containers": [container(cpu="1", memory="1Gi")],
    }
    assert effective_requests(spec=spec) == {"cpu": Decimal(2), "memory": Decimal(4 * 2**30)}


def test_sidecar_started_before_an_init_container_runs_alongside_it_and_the_app() -> None:
    # Kubernetes docs example: sidecar (1) + init (2) peak at 3; app (1) + sidecar (1) = 2.
    spec = {
        "initContainers": [container("sidecar", restart="Always", cpu="1"), container("init", cpu="2")],
        "containers": [container(cpu="1")],
    }
    assert cpu(spec) == Decimal(3)


def test_sidecar_started_after_an_init_container_does_not_overlap_it() -> None:
    spec = {
        "initContainers": [container("init", cpu="2"), container("sidecar", restart="Always", cpu="1")],
        "containers": [container(cpu="1")],
    }
    assert cpu(spec) == Decimal(2)


def test_sidecars_accumulate() -> None:
    spec = {
        "initContainers": [
            container("s1", restart="Always", cpu="1"),
            container("s2", restart="Always", cpu="1"),
            container("init", cpu="1500m"),
        ],
        "containers": [container(cpu="100m")],
    }
    # init phase: s1 + s2 + init = 3.5; running: app + s1 + s2 = 2.1
    assert cpu(spec) == Decimal("3.5")


def test_overhead_is_added_and_extended_resources_default_to_their_limit() -> None:
    spec = {
        "containers": [
            {
                "name": "c",
                "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "2", "cpu": "4"}},
            }
        ],
        "overhead": {"cpu": "250m", "memory": "64Mi"},
    }
    assert effective_requests(spec=spec) == {
        "cpu": Decimal("1.25"),
        "nvidia.com/gpu": Decimal(2),
        "memory": Decimal(64 * 2**20),
    }


def test_pod_level_requests_override_cpu_and_memory_only() -> None:
    spec = {
        "resources": {"requests": {"cpu": "3", "memory": "1Gi", "example.com/foo": "9"}},
        "containers": [container(cpu="1", **{"example.com/foo": "1"})],
        "overhead": {"cpu": "100m"},
    }
    assert effective_requests(spec=spec) == {
        "cpu": Decimal("3.1"),
        "memory": Decimal(2**30),
        "example.com/foo": Decimal(1),
    }


def test_pod_level_hugepages_are_counted() -> None:
    """Issue 19: kube-scheduler's PodRequests takes pod-level hugepages-* too (IsSupportedPodLevelResource
    in component-helpers/resource, v1.34+); a pod asking for 1Gi of 2Mi pages at pod level only
    occupied nothing of them here, so the RM could put it on a node without the pages."""
    spec = {
        "resources": {"requests": {"cpu": "1", "hugepages-2Mi": "1Gi"}, "limits": {"hugepages-2Mi": "1Gi"}},
        "containers": [container(cpu="500m"), container("d", **{"hugepages-2Mi": "2Mi"})],
    }
    assert effective_requests(spec=spec) == {"cpu": Decimal(1), "hugepages-2Mi": Decimal(2**30)}


def test_dra_resource_claims_go_to_the_devices_plugin_not_refused() -> None:
    """Before: refused by field (Bindery allocated no claims). Now the pod is carried, with its
    claims resolved for the DynamicResources plugin, or why it waits for one."""
    spec = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}
    body = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec}
    assert beyond_contract(body) is None
    waiting = PodInfo.from_body(body).device_claims
    assert isinstance(waiting, ClaimWait)
    made = {**body, "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}}
    assert PodInfo.from_body(made).device_claims == (
        PodClaim(pod_claim="gpu", name="p-gpu-x", generated=True),
    )
    # The claim's creation changes the pod's placement inputs: it is retried at once.
    assert PodInfo.from_body(made).placement_inputs() != PodInfo.from_body(body).placement_inputs()


def test_invalid_quantity_is_reported_with_the_container() -> None:
    with pytest.raises(PodSpecError, match=r"container 'app' has an invalid quantity for cpu"):
        effective_requests(spec={"containers": [container("app", cpu="lots")]})


millicores = st.integers(min_value=0, max_value=10_000).map(lambda m: f"{m}m")


@given(
    apps=st.lists(millicores, min_size=1, max_size=4),
    inits=st.lists(st.tuples(millicores, st.booleans()), max_size=4),
)
def test_requests_cover_every_phase(apps: list[str], inits: list[tuple[str, bool]]) -> None:
    spec = {
        "containers": [container(f"a{i}", cpu=q) for i, q in enumerate(apps)],
        "initContainers": [
            container(f"i{i}", restart="Always" if sidecar else None, cpu=q)
            for i, (q, sidecar) in enumerate(inits)
        ],
    }
    total = cpu(spec)
    millis = [Decimal(q.removesuffix("m")) / 1000 for q in apps]
    sidecars = [Decimal(q.removesuffix("m")) / 1000 for q, is_sidecar in inits if is_sidecar]
    assert total >= sum(millis) + sum(sidecars)
    running: Decimal = Decimal(0)
    for q, is_sidecar in inits:
        own = Decimal(q.removesuffix("m")) / 1000
        running += own if is_sidecar else 0
        assert total >= (running if is_sidecar else running + own)


def test_reservation_request_carries_identity_requests_and_placement() -> None:
    info = PodInfo.from_body(
        {
            **POD_BODY,
            "spec": {
                **POD_BODY["spec"],
                "tolerations": [
                    {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
                ],
            },
        }
    )
    request = reservation_request(pod=info, ttl_seconds=60)
    body = request.model_dump(by_alias=True, exclude_none=True)
    assert body["pod"] == {
        "uid": "u-1",
        "namespace": "team",
        "name": "web-0",
        "schedulerName": "bindery",
        "priority": 1000,
        "labels": {"app": "web"},
    }
    assert body["resources"] == {"cpu": "250m", "memory": "1Gi"}
    assert body["idempotencyKey"] == "u-1"
    assert body["ttlSeconds"] == 60
    assert body["placement"]["nodeSelector"] == {"zone": "a"}
    assert body["placement"]["requiredNodeAffinity"] == [
        {"matchExpressions": [{"key": "gpu", "operator": "Exists", "values": []}], "matchFields": []}
    ]
    assert body["placement"]["tolerations"] == [
        {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
    ]


def test_preferred_node_affinity_becomes_weighted_preferences() -> None:
    """Issue 19: soft node affinity reaches the RM (contract v1.2) instead of being dropped."""
    ssd = {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
    zone = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 80, "preference": ssd},
                {"weight": 5, "preference": zone},
            ]
        }
    }
    info = PodInfo.from_body({**POD_BODY, "spec": {**POD_BODY["spec"], "affinity": affinity}})
    body = reservation_request(pod=info, ttl_seconds=60).model_dump(by_alias=True, exclude_none=True)
    assert body["placement"]["preferredNodeAffinity"] == [
        {"weight": 80, "preference": {**ssd, "matchFields": []}},
        {"weight": 5, "preference": {"matchExpressions": [], **zone}},
    ]
    plain = reservation_request(pod=PodInfo.from_body(POD_BODY), ttl_seconds=60)
    assert "preferredNodeAffinity" not in plain.model_dump(by_alias=True)  # absent, as for a v1.1 RM
    assert info.placement_inputs() != PodInfo.from_body(POD_BODY).placement_inputs()


def test_a_gt_toleration_is_carried() -> None:
    toleration = {"key": "example.com/sla", "operator": "Gt", "value": "900", "effect": "NoSchedule"}
    info = PodInfo.from_body({**POD_BODY, "spec": {**POD_BODY["spec"], "tolerations": [toleration]}})
    request = reservation_request(pod=info, ttl_seconds=60)
    assert request.placement.compares_tolerations()
    assert request.model_dump(by_alias=True, exclude_none=True)["placement"]["tolerations"] == [toleration]


def test_preferences_past_the_contracts_caps_are_refused() -> None:
    term = {"weight": 1, "preference": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}}

    def pod(preferred: list[dict[str, Any]]) -> dict[str, Any]:
        affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
        return {"spec": {"affinity": affinity}}

    assert beyond_contract(pod([term] * 64)) is None
    refusal = beyond_contract(pod([term] * 65)) or ""
    assert refusal.startswith(
        "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution has 65 entries, "
        "more than the 64"
    )
    wide = {
        "weight": 1,
        "preference": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"] * 300}]},
    }
    deep = beyond_contract(pod([wide])) or ""
    assert "[0].preference.matchExpressions[0].values has 300 entries, more than the 256" in deep


def test_a_pod_past_the_contracts_caps_is_refused_by_field_and_cap() -> None:
    """Only counts are read (nothing copied): the caps are the contract models' own max_length."""
    many = [{"key": f"k{i}", "operator": "Exists"} for i in range(300)]
    assert beyond_contract({"spec": {"tolerations": many[:256]}}) is None
    refusal = beyond_contract({"spec": {"tolerations": many}})
    assert refusal is not None
    assert refusal.startswith("spec.tolerations has 300 entries, more than the 256")
    labels = {f"l{i}": "v" for i in range(257)}
    assert (beyond_contract({"metadata": {"labels": labels}}) or "").startswith("metadata.labels has 257")
    terms = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"] * 300}]}]
    }
    deep = beyond_contract(
        {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}}}
    )
    assert deep is not None
    assert ".nodeSelectorTerms[0].matchExpressions[0].values has 300 entries, more than the 256" in deep
    with pytest.raises(pydantic.ValidationError):  # the same cap, as the contract's model applies it
        Placement.model_validate({"tolerations": many})


def test_a_refused_pod_is_projected_without_its_spec() -> None:
    body = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "3",
            "labels": {"a": "b"},
        },
        "spec": {"schedulerName": "s", "tolerations": [{"operator": "Exists"}] * 300},
    }
    slim = PodInfo.slim(body)
    assert (slim.uid, slim.key, slim.scheduler_name, slim.resource_version) == ("u", "ns/p", "s", "3")
    assert slim.tolerations == ()
    assert slim.labels == {}
    assert slim.schedulable
