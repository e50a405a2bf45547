"""One pod's scheduling attempt is one trace across the operator and the reference RM.

Both run as their own processes with OpenTelemetry's real OTLP/HTTP exporter, configured by the
standard OTEL_* variables only, and send to a receiver in this test that decodes the protobuf with
opentelemetry-proto, as a collector would. The RM's spans must continue the operator's trace (W3C
`traceparent` on the RM call), and the JSON log line of the bind must carry the same trace id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bindery.devcluster.nodes import create_node
from bindery.devcluster.plane import ControlPlane
from tests.operator.conftest import create_pod, delete_rm, eventually, node_of, pod_body
from tests.realrm import RMProcess, operator_process, serve_with

pytestmark = pytest.mark.controlplane


@dataclasses.dataclass(frozen=True)
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    start_ns: int
    attributes: dict[str, Any]


class OTLPReceiver:
    """`POST /v1/traces` (OTLP/HTTP, protobuf), as an OpenTelemetry collector receives it."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf", request.content_type
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.requests += 1
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name")),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            start_ns=span.start_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def __aenter__(self) -> OTLPReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host="127.0.0.1", port=0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
async def receiver() -> AsyncIterator[OTLPReceiver]:
    async with OTLPReceiver() as running:
        yield running


async def test_one_pods_reserve_is_one_trace_across_the_operator_and_the_rm(
    *,
    controlplane: ControlPlane,
    kube_api: client.ApiClient,
    namespace: str,
    operator_kubeconfig: pathlib.Path,
    tmp_path: pathlib.Path,
    receiver: OTLPReceiver,
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    token = uuid.uuid4().hex[:8]
    node, scheduler, rm_name = f"trace-{token}", f"sched-{token}", f"rm-{token}"
    await create_node(kube_api, name=node, labels={"bindery.dev/test-pool": token})
    try:
        async with (
            RMProcess(
                kubeconfig=controlplane.kubeconfig,
                directory=tmp_path,
                node_selector=f"bindery.dev/test-pool={token}",
                env=env,
            ) as rm,
            operator_process(
                kubeconfig=operator_kubeconfig, directory=tmp_path, args=["--log-format", "json"], env=env
            ) as operator,
        ):
            await serve_with(
                api=kube_api, rm=rm, name=rm_name, scheduler_names=[scheduler], namespace=namespace
            )
            created = await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name=scheduler)
            )
            uid = created["metadata"]["uid"]
            await eventually(
                lambda: node_of(kube_api, namespace=namespace, name="p"), within=60, what="bound"
            )

            async def whole_trace() -> list[ReceivedSpan] | None:
                roots = [
                    s
                    for s in receiver.spans
                    if s.name == "Schedule pod"
                    and s.attributes.get("k8s.pod.uid") == uid
                    and s.attributes.get("bindery.result") == "scheduled"
                ]
                if not roots:
                    return None
                trace = [s for s in receiver.spans if s.trace_id == roots[0].trace_id]
                names = {(s.service, s.name) for s in trace}
                done = ("bindery-rm", "POST /v1/reservations/{id}/commit") in names
                return trace if done else None

            trace = await eventually(whole_trace, within=60, what="the attempt's trace, RM spans included")
            await operator.wait_for_log('"bound pod ', within=30)

            # A pod the RM has no room for: its attempt's trace holds the RM's refusal and the event.
            await create_pod(
                kube_api, namespace=namespace, body=pod_body(name="big", scheduler_name=scheduler, cpu="100")
            )

            async def refused() -> list[ReceivedSpan] | None:
                roots = [
                    s
                    for s in receiver.spans
                    if s.name == "Schedule pod"
                    and s.attributes.get("k8s.pod.name") == "big"
                    and s.attributes.get("bindery.result") == "unschedulable"
                ]
                for root in roots:
                    spans = [s for s in receiver.spans if s.trace_id == root.trace_id]
                    names = {(s.service, s.name) for s in spans}
                    if {
                        ("bindery-rm", "POST /v1/reservations"),
                        ("bindery-operator", "Event FailedScheduling"),
                    } <= (names):
                        return spans
                return None

            no_room = await eventually(refused, within=60, what="the unschedulable attempt's trace")
            log = operator.log()

        print("\n--- one attempt's trace (service: span) ---\n" + _tree(trace))
        by_name = {(s.service, s.name): s for s in trace}
        root = by_name["bindery-operator", "Schedule pod"]
        assert root.parent_id == "", "the attempt is the root of its own trace"
        assert root.attributes["k8s.namespace.name"] == namespace
        assert root.attributes["k8s.pod.name"] == "p"
        assert root.attributes["bindery.resource_manager"] == rm_name
        assert root.attributes["k8s.node.name"] == node
        for name in (
            "Queue wait",
            "Reserve ResourceManagerReservation",
            "PreBind PodStillPending",
            "PreBind NodeCheck",
            "Bind DefaultBinder",
            "PostBind ScheduledEvent",
            "PostBind CommitReservation",
            "RM reserve",
            "RM commit",
        ):
            assert ("bindery-operator", name) in by_name, (name, sorted(by_name))
        # The RM continued the trace: its server span's parent is the operator's client span.
        reserve_call = by_name["bindery-operator", "RM reserve"]
        served = by_name["bindery-rm", "POST /v1/reservations"]
        assert served.parent_id == reserve_call.span_id
        assert reserve_call.kind == 3
        assert served.kind == 2
        assert served.attributes["http.response.status_code"] == 201
        assert any(s.service == "bindery-rm" and s.parent_id == served.span_id for s in trace), (
            "the RM's own spans (its store) hang under its server span"
        )
        reservation = by_name["bindery-operator", "Reserve ResourceManagerReservation"].attributes[
            "bindery.reservation"
        ]
        assert by_name["bindery-rm", "POST /v1/reservations/{id}/commit"].attributes[
            "bindery.reservation"
        ] == (reservation)
        [rm_refusal] = [s for s in no_room if s.service == "bindery-rm" and s.name == "POST /v1/reservations"]
        assert rm_refusal.attributes["http.response.status_code"] >= 400
        # The token never leaves in a span, and the bind's JSON log line names the trace.
        assert rm.token not in json.dumps([dataclasses.asdict(s) for s in receiver.spans])
        assert rm.token not in log
        [bound] = [e for e in map(json.loads, log.splitlines()) if e["message"].startswith("bound pod ")]
        assert bound["trace_id"] == root.trace_id
        assert bound["pod_uid"] == uid
    finally:
        await delete_rm(kube_api, name=rm_name)
        await client.CoreV1Api(kube_api).delete_node(node)
        await asyncio.sleep(0)


def _tree(spans: list[ReceivedSpan]) -> str:
    """The spans of one trace as an indented tree, children in start order."""
    children: dict[str, list[ReceivedSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        children.setdefault(span.parent_id, []).append(span)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in children.get(parent, []):
            lines.append(f"{'  ' * depth}{span.service}: {span.name}")
            walk(span.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)
