"""bindery.tracing off costs nothing on the cycle's path; on, each plugin call of a cycle is a span."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bindery import tracing
from bindery.scheduling.cycle import plugin_chain
from bindery.scheduling.decisions import Outcome
from bindery.scheduling.traced import traced
from tests.scheduling.test_cycle import World, world  # noqa: F401 (the fixture)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for one test (as `tracing.configure` does with an OTLP exporter)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.state.on, tracing.state.tracer = True, provider.get_tracer("test")
    try:
        yield exporter
    finally:
        tracing.state.on, tracing.state.tracer = False, None
        provider.shutdown()


def test_off_the_chain_and_the_helpers_are_left_alone(world: World) -> None:  # noqa: F811
    assert not tracing.state.on
    chain = plugin_chain(profile=world.profile())
    assert traced(chain) is chain  # no wrapper, no allocation
    assert tracing.span("a", {"k": "v"}) is tracing.span("b") is tracing.NO_SPAN  # one shared no-op
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}
    assert tracing.current_trace_id() is None


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_tracing_is_on_only_when_the_otel_variables_name_an_endpoint(
    environ: dict[str, str], wanted: bool
) -> None:
    assert tracing.wanted(environ) is wanted
    if not wanted:
        assert tracing.configure(service_name="t", environ=environ) is False


async def test_on_a_failed_cycle_has_a_span_per_plugin_call_and_the_release(
    world: World,  # noqa: F811
    spans: InMemorySpanExporter,
) -> None:
    world.nodes.nodes = {}  # the RM's node is unknown: NodeCheck fails after the reservation
    with tracing.span("Schedule pod", {"k8s.pod.uid": world.pod.uid}):
        trace_id = tracing.current_trace_id()
        headers: dict[str, str] = {}
        tracing.inject(headers)
        result = await world.run()
    assert result.outcome is Outcome.ERROR
    assert trace_id is not None
    assert headers["traceparent"].split("-")[1] == trace_id
    finished = spans.get_finished_spans()
    names = [s.name for s in finished]
    for name in (
        "PreFilter VolumeBinding",
        "Reserve ResourceManagerReservation",
        "PreBind PodStillPending",
        "PreBind NodeCheck",
        "Unreserve ResourceManagerReservation",
        "Unreserve VolumeBinding",
    ):
        assert name in names, names
    assert "Bind DefaultBinder" not in names
    assert {f"{s.context.trace_id:032x}" for s in finished} == {trace_id}
    by_name = {s.name: s for s in finished}
    reserve = by_name["Reserve ResourceManagerReservation"]
    assert reserve.attributes is not None
    assert reserve.attributes["bindery.reservation"] == "r1"
    assert reserve.attributes["k8s.node.name"] == "n1"
    check = by_name["PreBind NodeCheck"]
    assert check.attributes is not None
    assert check.attributes["bindery.status"] == "error"
    assert world.calls.count("rm.release") == 1
