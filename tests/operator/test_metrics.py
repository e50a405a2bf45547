"""Prometheus metrics scraped over real HTTP from an operator scheduling real pods."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from bindery.adapters.counters import WriteCounter
from bindery.clock import DEFAULT_TOLERANCE_SECONDS
from bindery.controller.metrics import _StateCollector, parse_address, rm_outcome_label
from bindery.controller.startup.entry import EmbeddedOperator
from bindery.controller.startup.options import OperatorOptions
from bindery.devcluster.nodes import node_status
from bindery.devcluster.plane import ControlPlane
from bindery.rm.errors import RMConflict, RMUnavailable, RMUnschedulable
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.queue import SchedulingQueue, Touch, WakeOn
from tests.operator.conftest import eventually, real_stage_of
from tests.scheduling.fakes import pod

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
async def measured(operator_kubeconfig: pathlib.Path) -> AsyncIterator[EmbeddedOperator]:
    operator = EmbeddedOperator(
        options=OperatorOptions(
            kubeconfig=operator_kubeconfig, probe_interval=2.0, metrics_address="127.0.0.1:0"
        )
    )
    await operator.start()
    try:
        yield operator
    finally:
        await operator.stop()


async def scrape_text(operator: EmbeddedOperator) -> str:
    server = operator.runtime.metrics_server
    assert server is not None
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{server.port}/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return answer.text


async def scrape(operator: EmbeddedOperator) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(await scrape_text(operator)):  # also proves it parses
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


async def families(operator: EmbeddedOperator) -> set[str]:
    """The metric families served (a family with no labelled child yet has no sample line)."""
    return {family.name for family in text_string_to_metric_families(await scrape_text(operator))}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value, 0 while it is missing: only for polling, where missing means "not yet"."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def present(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; a missing line fails, so an assertion on it cannot pass by absence."""
    key = (name, frozenset(labels.items()))
    if key not in samples:
        served = sorted(f"{n}{dict(sorted(ls))}" for n, ls in samples if n == name)
        raise AssertionError(f"no sample {name}{labels} in /metrics; {name} has: {served}")
    return samples[key]


@pytest.mark.controlplane
async def test_scheduling_moves_the_counters_served_at_metrics(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    measured: EmbeddedOperator,
    tmp_path: pathlib.Path,
) -> None:
    """The reference RM first has no room (a 1-CPU node, a 2-CPU pod), then the node grows: one
    unschedulable attempt, one bind, one commit, and one release when the pod goes, each in /metrics.

    The node grows rather than another pod leaving, so no other pod's cycles move the counters.
    """
    async with real_stage_of(
        controlplane=controlplane,
        api=kube_api,
        namespace=namespace,
        directory=tmp_path / "rm",
        capacity={"cpu": "1", "memory": "8Gi", "pods": "20"},
    ) as stage:
        node, rm = stage.node, stage.rm_name
        before = await scrape(measured)
        # A fresh operator has written nothing: the family is served, with no `binding` child yet (a
        # counter child appears with its first increment), so "before" is a known 0, not a missing line.
        assert "bindery_apiserver_writes" in await families(measured)
        assert not [key for key in before if key[0] == "bindery_apiserver_writes_total"], before
        async with stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
            created = await stage.create("p", cpu="2")
            uid = created["metadata"]["uid"]

            async def unschedulable() -> Samples | None:
                samples = await scrape(measured)
                found = value(
                    samples, "bindery_schedule_attempts_total", resource_manager=rm, result="unschedulable"
                )
                return samples if found else None

            samples = await eventually(unschedulable, within=30, what="an unschedulable attempt in /metrics")
            assert (
                present(
                    samples,
                    "bindery_rm_request_duration_seconds_count",
                    resource_manager=rm,
                    verb="reserve",
                    outcome="unschedulable",
                )
                >= 1
            )
            assert await stage.node_of("p") is None
            await client.CoreV1Api(kube_api).patch_node_status(
                name=node, body={"status": node_status(capacity={"cpu": "4", "memory": "8Gi", "pods": "20"})}
            )

            async def bound() -> Samples | None:
                samples = await scrape(measured)
                found = value(
                    samples,
                    "bindery_rm_request_duration_seconds_count",
                    resource_manager=rm,
                    verb="commit",
                    outcome="ok",
                )
                return samples if found else None

            samples = await eventually(bound, within=30, what="the bind and its commit in /metrics")
            assert await stage.node_of("p") == node
            assert await stage.states_are(uid, "committed")
            scheduled = present(
                samples, "bindery_schedule_attempts_total", resource_manager=rm, result="scheduled"
            )
            assert scheduled == 1
            assert present(samples, "bindery_pod_scheduling_duration_seconds_count", resource_manager=rm) == 1
            # first seen → bound spans the unschedulable attempt, so it is longer than the last attempt
            assert present(
                samples, "bindery_pod_scheduling_duration_seconds_sum", resource_manager=rm
            ) > present(
                samples,
                "bindery_scheduling_attempt_duration_seconds_sum",
                resource_manager=rm,
                result="scheduled",
            )
            assert (
                present(
                    samples,
                    "bindery_rm_request_duration_seconds_count",
                    resource_manager=rm,
                    verb="reserve",
                    outcome="ok",
                )
                == 1
            )
            assert present(samples, "bindery_apiserver_writes_total", kind="binding") == 1
            # FailedScheduling + Scheduled
            assert present(samples, "bindery_apiserver_writes_total", kind="event") >= 2
            for queue in ("active", "backoff", "unschedulable", "in_flight", "binding"):
                assert present(samples, "bindery_queue_pods", resource_manager=rm, queue=queue) == 0
            for queue in ("active", "backoff", "unschedulable"):
                assert present(samples, "bindery_pending_pods", resource_manager=rm, queue=queue) == 0
            # kube-scheduler's attempts-per-pod: one unschedulable attempt or more, then the bind
            assert present(samples, "bindery_pod_scheduling_attempts_count", resource_manager=rm) == 1
            assert present(samples, "bindery_pod_scheduling_attempts_sum", resource_manager=rm) >= 2
            reservations = {
                outcome: value(samples, "bindery_reservations_total", resource_manager=rm, outcome=outcome)
                for outcome in ("reserved", "unschedulable", "committed", "released", "reserve_failed")
            }
            assert reservations["reserved"] == reservations["committed"] == 1, reservations
            assert reservations["unschedulable"] >= 1, reservations
            assert reservations["released"] == reservations["reserve_failed"] == 0, reservations
            breaker = {
                state: present(samples, "bindery_rm_circuit_breaker_state", resource_manager=rm, state=state)
                for state in ("closed", "open", "half-open")
            }
            assert breaker == {"closed": 1, "open": 0, "half-open": 0}
            # without leader election this replica always leads, and renews no Lease
            assert present(samples, "bindery_leader_election_master_status") == 1
            assert "bindery_leader_lease_renewals" in await families(measured)

            await client.CoreV1Api(kube_api).delete_namespaced_pod(
                name="p", namespace=namespace, grace_period_seconds=0
            )

            async def released() -> float:
                samples = await scrape(measured)
                return value(
                    samples, "bindery_reservations_released_total", resource_manager=rm, reason="pod_departed"
                )

            assert await eventually(released, what="the departed pod's release in /metrics") == 1
            samples = await scrape(measured)
            released_total = present(
                samples, "bindery_reservations_total", resource_manager=rm, outcome="released"
            )
            assert released_total == 1
            assert await stage.states_are(uid, "released")
            await stage.settled()
            assert await stage.active() == []


def test_rm_outcome_labels_name_the_most_specific_error() -> None:
    assert rm_outcome_label(None) == "ok"
    assert rm_outcome_label(RMUnschedulable("full", reason="full")) == "unschedulable"
    assert rm_outcome_label(RMConflict("taken", status=409)) == "conflict"
    assert rm_outcome_label(RMUnavailable("down")) == "unavailable"
    assert rm_outcome_label(ValueError("bug")) == "error"


def test_metrics_addresses_are_host_and_port() -> None:
    assert parse_address("0.0.0.0:9090") == ("0.0.0.0", 9090)
    assert parse_address(":9090") == ("0.0.0.0", 9090)
    assert parse_address("[::]:9090") == ("::", 9090)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address("9090x")


# -- the chart's Grafana dashboard against a live scrape ------------------------------------------

DASHBOARD = pathlib.Path(__file__).parents[2] / "charts" / "bindery" / "dashboards" / "bindery.json"
#: PromQL words that are not metric names: functions (followed by "("), aggregation modifiers, keywords.
_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
}
_PROMQL_WORDS |= {"unless", "inf", "nan"}
_NOT_A_NAME = re.compile(
    r'"(?:[^"\\]|\\.)*"'  # string literals (label values, regexes)
    r"|\{[^}]*\}"  # label matchers
    r"|\[[^\]]*\]"  # range selectors ($__rate_interval)
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"  # label lists
)
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?![A-Za-z0-9_:])(?!\s*\()")


def promql_metric_names(expr: str) -> set[str]:
    """Pure: the metric names an expression reads (not its functions, labels, literals or keywords)."""
    bare = _NOT_A_NAME.sub(" ", expr)
    return {w for w in _WORD.findall(bare) if w.lower() not in _PROMQL_WORDS and not w.startswith("$")}


def dashboard_queries(node: Any) -> Iterator[str]:
    """Every PromQL expression in a dashboard: panel targets and template-variable queries."""
    if isinstance(node, Mapping):
        for key, item in node.items():
            if key in ("expr", "definition") and isinstance(item, str):
                yield item
            else:
                yield from dashboard_queries(item)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_queries(item)


def test_promql_names_are_found_in_expressions() -> None:
    expr = (
        'sum by (le, verb) (rate(bindery_rm_request_duration_seconds_bucket{resource_manager=~"$rm",'
        'outcome!="ok"}[$__rate_interval])) / on (verb) group_left max(other_metric) > bool 0'
    )
    assert promql_metric_names(expr) == {"bindery_rm_request_duration_seconds_bucket", "other_metric"}
    assert promql_metric_names("label_values(bindery_pending_pods, resource_manager)") == {
        "bindery_pending_pods",
        "resource_manager",  # a label argument reads as a name: the check below only keeps bindery_*
    }


def _family_of(sample_name: str, served: Mapping[str, str]) -> str | None:
    """The served family a sample name belongs to (a counter's _total, a histogram's _bucket/_count/_sum)."""
    if served.get(sample_name) in ("gauge", "unknown"):
        return sample_name
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    for family, kind in served.items():
        for suffix in suffixes.get(kind, ()):
            if sample_name == family + suffix:
                return family
    return None


@pytest.mark.controlplane
async def test_every_metric_the_dashboard_queries_is_served(
    *, controlplane: ControlPlane, measured: EmbeddedOperator
) -> None:
    """The chart's dashboard reads only metrics a running operator serves, each with the suffix its
    type has (a histogram's _bucket, a counter's _total), so no panel is empty for a typo or a rename."""
    dashboard = json.loads(DASHBOARD.read_text())
    names = set()
    for expr in dashboard_queries(dashboard):
        names |= {n for n in promql_metric_names(expr) if n.startswith("bindery_")}
    assert len(names) >= 10, names  # the parse found the queries
    served = {
        family.name: family.type for family in text_string_to_metric_families(await scrape_text(measured))
    }
    missing = sorted(n for n in names if _family_of(n, served) is None)
    assert not missing, f"the dashboard queries metrics /metrics does not serve: {missing}; served: {served}"
    print(f"\nthe dashboard's {len(names)} metrics, all served: {sorted(names)}")
    # Beside the open /metrics, the queue view `bindery explain` reads, to a token RBAC allows only
    # (answered in tests/operator/test_debug_queue.py).
    server = measured.runtime.metrics_server
    assert server is not None
    async with httpx.AsyncClient() as http:
        queues = await http.get(f"http://127.0.0.1:{server.port}/debug/queue")
        nobody = await http.get(f"http://127.0.0.1:{server.port}/debug/queue/default/nobody")
    assert (queues.status_code, nobody.status_code) == (401, 401)


async def test_the_apiserver_and_rm_clocks_are_compared_and_exported(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    crd: None,
    namespace: str,
    measured: EmbeddedOperator,
    tmp_path: pathlib.Path,
) -> None:
    """The operator reads the apiserver's and each RM's clock from their Date headers (issue 20,
    item 13) and serves the offsets: here all run on this host, so neither is past the warning
    threshold (an offset's bound includes the request's round trip, which a loaded host stretches)."""
    async with (
        real_stage_of(
            controlplane=controlplane, api=kube_api, namespace=namespace, directory=tmp_path / "rm"
        ) as stage,
        stage.served(),
    ):

        async def both() -> Samples | None:
            samples = await scrape(measured)
            names = {
                dict(labels).get("peer") for name, labels in samples if name == "bindery_clock_skew_seconds"
            }
            return samples if {"apiserver", f"rm/{stage.rm_name}"} <= names else None

        samples = await eventually(both, within=30, what="both clocks in /metrics")
        limit = DEFAULT_TOLERANCE_SECONDS
        assert abs(present(samples, "bindery_clock_skew_seconds", peer="apiserver")) < limit
        assert abs(present(samples, "bindery_clock_skew_seconds", peer=f"rm/{stage.rm_name}")) < limit
        assert not measured.runtime.apiserver_clock.off


def test_queue_moves_are_served_as_a_counter_by_event() -> None:
    """A pod the placement rules refused, woken by a placed pod: one ``placed-pod`` move."""
    queue = SchedulingQueue()
    queue.add(pod("a"))
    popped = queue.pop_nowait()
    assert popped is not None
    wake_on = WakeOn(namespaces=frozenset({"ns"}))
    queue.done(popped.uid, outcome=Outcome.UNSCHEDULABLE, until_event=False, wake_on=wake_on)
    queue.wake(Touch(namespace="ns"))
    collector = _StateCollector(writes=WriteCounter(), queues=lambda: {"rm-a": queue.stats()})
    (moved,) = [f for f in collector.collect() if f.name == "bindery_queue_moved_pods"]
    assert [(s.name, s.labels, s.value) for s in moved.samples] == [
        ("bindery_queue_moved_pods_total", {"resource_manager": "rm-a", "event": "placed-pod"}, 1.0)
    ]
