"""A pod group's soft rules (issue 19 item 3): each member's preferences go with its part of the
group reserve (the reference RM's side: tests/rm/test_group_preferences.py).

Why: a group is reserved in one request, so its members never pass PodPlacementRules' PreFilter,
which is where a single pod's ScheduleAnyway spread, default spreading and preferred pod
(anti-)affinity become contract v1.2 ``preferredNodeAffinity``. A gang was therefore placed by the
RM's policy alone (binpack: stacked in the busiest zone).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from typing import Any, cast

import pytest

from bindery.adapters.placed import PlacedPodCache
from bindery.controller.metrics import Metrics
from bindery.controller.podgroups.placement import Placement
from bindery.rm.errors import RMError
from bindery.rm.models import ReservationGroupRequest
from bindery.scheduling import placementrules
from bindery.scheduling.podgroups import PodGroupInfo
from bindery.scheduling.podspec import PodInfo
from bindery.scheduling.ports import NodeProjection

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
NODES = [NodeProjection(name=f"{z}1", labels={HOST: f"{z}1", ZONE: z}) for z in ("a", "b", "c")]
#: kube-scheduler's PodTopologySpread score, as Bindery sends it: zones b and c over the crowded a.
AWAY_FROM_A = (
    100,
    {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["b", "c"]}], "matchFields": []},
)


def web(name: str, *, node: str | None = None, spread: bool = False, own: bool = False) -> dict[str, Any]:
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
    if own:  # a preferred node affinity of its own, sent first
        spec["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 7,
                        "preference": {
                            "matchExpressions": [{"key": HOST, "operator": "In", "values": ["c1"]}]
                        },
                    }
                ]
            }
        }
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"app": "web"}},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


class _Stop(RMError):
    """Ends the placement after the request is seen: nothing past the reserve is under test."""


class _RecordingRM:
    def __init__(self) -> None:
        self.sent: list[ReservationGroupRequest] = []

    async def reserve_group(self, request: ReservationGroupRequest) -> Any:
        self.sent.append(request)
        raise _Stop("stop here")


class _Reporter:
    async def fail(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Client:
    def __init__(self, takes: bool) -> None:
        self.takes = takes
        self.asked = 0

    def takes_node_preferences(self) -> bool:
        self.asked += 1
        return self.takes


async def _group_request(members: Sequence[PodInfo], *, takes: bool = True) -> ReservationGroupRequest:
    """The request Placement.place sends for `members`, with two web pods already on a1 (zone a)."""
    cache = PlacedPodCache(nodes=lambda: NODES)
    for name in ("w1", "w2"):
        cache.on_event("ADDED", web(name, node="a1"))
    rm = _RecordingRM()
    profile = types.SimpleNamespace(
        name="pool",
        client=_Client(takes),
        reservation_ttl_seconds=60,
        clock=lambda: 0.0,
        backoff_max_seconds=5.0,
    )
    placement = Placement(
        profile=lambda: cast(Any, profile),
        ports=lambda: cast(Any, types.SimpleNamespace(placed=cache)),
        rm=lambda: cast(Any, rm),
        logger=logging.getLogger("test"),
        metrics=Metrics(),
        reporter=cast(Any, _Reporter()),
        backoff=lambda group: 1.0,
        on_released=lambda: None,
        on_outcome=lambda pod, outcome: None,
    )
    group = types.SimpleNamespace(attempt=0, waits_for_capacity=False)
    assert await placement.place(PodGroupInfo(namespace="ns", name="crew"), cast(Any, group), members) == 1.0
    [request] = rm.sent
    return request


def _preferences(request: ReservationGroupRequest) -> list[list[tuple[int, dict[str, Any]]]]:
    return [member.placement.preference_dicts() for member in request.members]


async def test_each_member_of_a_group_is_sent_its_soft_spread_as_preferences() -> None:
    members = [PodInfo.from_body(web(f"crew-{i}", spread=True)) for i in range(2)]
    request = await _group_request(members)
    assert _preferences(request) == [[AWAY_FROM_A], [AWAY_FROM_A]]


async def test_a_members_own_preferred_node_affinity_comes_first_and_others_get_only_theirs() -> None:
    """Default spreading needs an owner or a Service; a member with neither and no spread of its
    own keeps only its own preferred terms."""
    members = [
        PodInfo.from_body(web("crew-0", spread=True, own=True)),
        PodInfo.from_body(web("crew-1", own=True)),
    ]
    request = await _group_request(members)
    own = (7, {"matchExpressions": [{"key": HOST, "operator": "In", "values": ["c1"]}], "matchFields": []})
    assert _preferences(request) == [[own, AWAY_FROM_A], [own]]


async def test_a_group_for_an_rm_without_node_preferences_has_no_soft_rules_scored() -> None:
    """Its own preferred terms stay in the request (the client drops them for such an RM); the
    soft rules are not scored at all."""
    members = [PodInfo.from_body(web(f"crew-{i}", spread=True)) for i in range(2)]
    request = await _group_request(members, takes=False)
    assert _preferences(request) == [[], []]


async def test_members_alike_are_scored_once_and_unlike_ones_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scoring a member costs milliseconds on a large cluster (a 1000-member gang: seconds in one
    pass); a gang's members are usually alike. A member with other labels is scored on its own."""
    calls: list[str] = []
    real = placementrules.rules_preferences

    def counting(pod: PodInfo, *args: Any, **kwargs: Any) -> Any:
        calls.append(pod.name)
        return real(pod, *args, **kwargs)

    monkeypatch.setattr(placementrules, "rules_preferences", counting)
    members = [PodInfo.from_body(web(f"crew-{i}", spread=True)) for i in range(40)]
    other = web("crew-other", spread=True)
    other["metadata"]["labels"]["tier"] = "x"
    request = await _group_request([*members, PodInfo.from_body(other)])
    assert calls == ["crew-0", "crew-other"]
    assert _preferences(request) == [[AWAY_FROM_A]] * 41
