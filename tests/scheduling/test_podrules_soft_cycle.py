"""The soft inter-pod rules inside schedule_one, against the reference RM over HTTP: an RM with
contract v1.2's ``node-preferences`` receives them as ``placement.preferredNodeAffinity`` and places
by them; a v1.1 RM receives none (it answers 400 to the field) and still places the pod.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from bindery.adapters.placed import PlacedPodCache
from bindery.reference_rm import RunningServer, serve_reference_rm
from bindery.reference_rm.placement import InventoryNode, Policy
from bindery.rm.client import ResourceManagerClient
from bindery.rm.models import Placement
from bindery.scheduling.cycle import schedule_one
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.framework import Ports, Profile
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection
from tests.scheduling.fakes import Calls, FakeBinder, FakeConditions, FakeEvents, FakeNodes, FakePods

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
TOKEN = "soft-rules-token"
NODES = [NodeProjection(name=f"{z}1", labels={HOST: f"{z}1", ZONE: z}) for z in ("a", "b", "c")]


class RecordingClient(ResourceManagerClient):
    """The real client; records each placement as it leaves negotiation, i.e. as the RM receives it."""

    sent: list[Placement]

    async def negotiated_placement(self, placement: Placement, *, pod: str) -> tuple[Placement, bool]:
        result = await super().negotiated_placement(placement, pod=pod)
        self.sent.append(result[0])
        return result


def web(name: str, *, node: str | None = None, spread: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "bindery",
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
    }
    if node:
        spec["nodeName"] = node
    if spread:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app": "web"}},
            }
        ]
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"app": "web"}},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


async def _serve(tmp_path: pathlib.Path, **kwargs: Any) -> AsyncIterator[RunningServer]:
    inventory = [
        InventoryNode(name=n.name, labels=n.labels, allocatable={"cpu": Decimal(8), "pods": Decimal(110)})
        for n in NODES
    ]
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=inventory, token=TOKEN, policy=Policy.BINPACK, **kwargs
    ) as server:
        yield server


@pytest.fixture
async def v1_2(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async for server in _serve(tmp_path):
        yield server


@pytest.fixture
async def v1_1(tmp_path: pathlib.Path) -> AsyncIterator[RunningServer]:
    async for server in _serve(tmp_path, cluster_ids=False):
        yield server


async def _schedule(
    url: str, *, learn: bool = False, spread: bool = True, services: tuple[dict[str, str], ...] = ()
) -> tuple[Any, list[Placement]]:
    """Two web pods already run on a1 (zone a); a third with a ScheduleAnyway zone spread comes
    (`spread`; else a bare pod, selected by `services` if any). Binpack alone picks a1 (equal nodes,
    first name)."""
    cache = PlacedPodCache(nodes=lambda: NODES, service_selectors=lambda namespace: services)
    for name in ("w1", "w2"):
        cache.on_event("ADDED", web(name, node="a1"))
    calls = Calls()
    pods = FakePods(calls)
    pod = PodInfo.from_body(web("new", spread=spread))
    pods.pods[pod.uid] = pod
    ports = Ports(
        nodes=FakeNodes(calls, {n.name: n for n in NODES}),
        pods=pods,
        binder=FakeBinder(calls),
        events=FakeEvents(calls),
        conditions=FakeConditions(calls),
        placed=cache,
    )
    async with RecordingClient(base_url=url, token=TOKEN, allow_insecure_http=True, batching=False) as client:
        client.sent = []
        if learn:  # as after an earlier pod: the client has read GET /v1/info
            await client.contract_info()
        profile = Profile(name="pool", scheduler_names=frozenset({"bindery"}), client=client)
        outcome = await schedule_one(pod=pod, profile=profile, ports=ports)
    return outcome, client.sent


async def test_an_rm_with_node_preferences_is_sent_the_soft_spread_and_avoids_the_crowded_zone(
    v1_2: RunningServer,
) -> None:
    outcome, sent = await _schedule(v1_2.url)
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    [placement] = sent
    preferred = placement.preference_dicts()
    assert preferred == [
        (
            100,
            {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["b", "c"]}], "matchFields": []},
        )
    ], preferred
    assert outcome.node in ("b1", "c1"), outcome.node


async def test_a_bare_pod_a_service_selects_is_spread_as_kube_scheduler_spreads_it(
    v1_2: RunningServer,
) -> None:
    """kube-scheduler's default spreading (hostname maxSkew 3, zone maxSkew 5) with the Service's
    selector, for a pod with no owner and no constraints of its own."""
    outcome, sent = await _schedule(v1_2.url, spread=False, services=({"app": "db"}, {"app": "web"}))
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    [placement] = sent
    assert placement.preference_dicts(), "no preferences sent for a pod a Service selects"
    assert outcome.node in ("b1", "c1"), outcome.node


async def test_a_bare_pod_no_service_selects_gets_no_default_spreading(v1_2: RunningServer) -> None:
    outcome, sent = await _schedule(v1_2.url, spread=False, services=({"app": "db"}, {}))
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    assert [p.preference_dicts() for p in sent] == [[]]
    assert outcome.node == "a1"


async def test_a_v1_1_rm_is_sent_no_preferences_and_still_places_the_pod(v1_1: RunningServer) -> None:
    outcome, sent = await _schedule(v1_1.url)
    # A v1.1 RM answers 400 to preferredNodeAffinity: bound means the field was left out.
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    [placement] = sent
    assert placement.preferred_node_affinity is None
    assert outcome.node == "a1"  # its policy alone: binpack's first node


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from bindery.scheduling import placementrules

    calls: list[str] = []
    real = placementrules.rules_preferences

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append("scored")
        return real(*args, **kwargs)

    monkeypatch.setattr(placementrules, "rules_preferences", counted)
    return calls


async def test_soft_rules_are_not_scored_for_an_rm_known_to_take_no_preferences(
    v1_1: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring costs milliseconds per pod on a large cluster, and a burst's pods wait for each other
    on its account: for an RM whose GET /v1/info lacks node-preferences both bought nothing."""
    calls = _counting(monkeypatch)
    outcome, _ = await _schedule(v1_1.url, learn=True)
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    assert calls == []


async def test_soft_rules_are_scored_for_an_rm_that_takes_preferences(
    v1_2: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting(monkeypatch)
    outcome, _ = await _schedule(v1_2.url, learn=True)
    assert outcome.outcome is Outcome.BOUND, outcome.failure
    assert calls == ["scored"]
