"""Prometheus metrics scraped over real HTTP from an operator scheduling real pods."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import httpx
import pytest
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from bindery.controller.embedded import EmbeddedOperator
from bindery.controller.metrics import parse_address, rm_outcome_label
from bindery.controller.options import OperatorOptions
from bindery.rm.errors import RMConflict, RMUnavailable, RMUnschedulable
from tests.operator.conftest import Stage, eventually
from tests.operator.fakerm import FakeRM

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


async def scrape(operator: EmbeddedOperator) -> Samples:
    server = operator.runtime.metrics_server
    assert server is not None
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{server.port}/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.text):  # also proves the format parses
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.mark.controlplane
async def test_scheduling_moves_the_counters_served_at_metrics(
    *,
    kube_api: client.ApiClient,
    namespace: str,
    measured: EmbeddedOperator,
    fake_rm: FakeRM,
    stage: Stage,
) -> None:
    node, rm = stage.node, stage.rm_name
    before = await scrape(measured)
    assert value(before, "bindery_apiserver_writes_total", kind="binding") == 0
    fake_rm.slots[node] = 0  # first no room: an unschedulable attempt
    async with stage.served(backoff={"initialSeconds": 0.2, "maxSeconds": 0.5}):
        await stage.create("p")

        async def unschedulable() -> Samples | None:
            samples = await scrape(measured)
            found = value(
                samples, "bindery_schedule_attempts_total", resource_manager=rm, result="unschedulable"
            )
            return samples if found else None

        samples = await eventually(unschedulable, what="an unschedulable attempt in /metrics")
        assert (
            value(
                samples,
                "bindery_rm_request_duration_seconds_count",
                resource_manager=rm,
                verb="reserve",
                outcome="unschedulable",
            )
            >= 1
        )
        fake_rm.slots[node] = 1

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

        samples = await eventually(bound, what="a scheduled attempt and its commit in /metrics")
        assert value(samples, "bindery_schedule_attempts_total", resource_manager=rm, result="scheduled") == 1
        assert value(samples, "bindery_pod_scheduling_duration_seconds_count", resource_manager=rm) == 1
        # first seen → bound spans the unschedulable attempt, so it is longer than the last attempt
        assert value(samples, "bindery_pod_scheduling_duration_seconds_sum", resource_manager=rm) > value(
            samples,
            "bindery_scheduling_attempt_duration_seconds_sum",
            resource_manager=rm,
            result="scheduled",
        )
        assert (
            value(
                samples,
                "bindery_rm_request_duration_seconds_count",
                resource_manager=rm,
                verb="reserve",
                outcome="ok",
            )
            == 1
        )
        assert value(samples, "bindery_apiserver_writes_total", kind="binding") == 1
        assert (
            value(samples, "bindery_apiserver_writes_total", kind="event") >= 2
        )  # FailedScheduling + Scheduled
        for queue in ("active", "backoff", "unschedulable", "in_flight"):
            assert ("bindery_queue_pods", frozenset({("resource_manager", rm), ("queue", queue)})) in samples
        assert value(samples, "bindery_queue_pods", resource_manager=rm, queue="active") == 0

        await client.CoreV1Api(kube_api).delete_namespaced_pod(
            name="p", namespace=namespace, grace_period_seconds=0
        )

        async def released() -> float:
            samples = await scrape(measured)
            return value(
                samples, "bindery_reservations_released_total", resource_manager=rm, reason="pod_departed"
            )

        assert await eventually(released, what="the departed pod's release in /metrics") == 1


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
