"""OpenTelemetry tracing, off unless configured, and then one trace per scheduling attempt.

Configured by the standard environment variables, read by OpenTelemetry's own SDK and exporter:
tracing is on when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set
(spans go there over OTLP/HTTP), unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*` and the
rest apply as usual. The SDK is an optional extra (`pip install 'kube-bindery[tracing]'`); configured
without it, the process says so once and runs untraced.

Off, the cost on the per-pod path is one read of a module global: callers test :data:`state.on`
before building anything, and every helper here returns a shared no-op object without allocating.

What a span may carry is fixed here: the pod's namespace, name and UID, the node, the
ResourceManager, the reservation id, the outcome. Never a header, a body or a token.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

__all__ = ["NO_SPAN", "configure", "current_trace_id", "extract", "inject", "span", "state"]

log = logging.getLogger(__name__)

#: The one no-op context manager every disabled `span(...)` returns: entering it allocates nothing.
NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class _State:
    """Whether tracing is on, and the tracer; a class attribute read is the whole disabled cost."""

    on: bool = False
    tracer: Any = None
    provider: Any = None


state = _State()


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Pure: do the OTEL_* variables ask for traces to be exported?"""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(*, service_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on if the environment asks for it and the SDK is installed; returns whether on.

    `service_name` is the default for `OTEL_SERVICE_NAME` (bindery-operator, bindery-rm).
    """
    if state.on or not wanted(environ):
        return state.on
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed (%s): tracing is off; "
            "install it with pip install 'kube-bindery[tracing]'",
            exc,
        )
        return False
    env = os.environ if environ is None else environ
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name}).merge(
        OTELResourceDetector().detect()
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    state.provider = provider
    state.tracer = provider.get_tracer("bindery")
    state.on = True
    atexit.register(shutdown)  # export what is still buffered when the process ends
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    log.info("tracing on: spans of %s go to %s over OTLP/HTTP", resource.attributes["service.name"], endpoint)
    return True


def shutdown() -> None:
    """Export what is buffered and stop (at exit; spans started later are dropped)."""
    if state.provider is not None:
        state.provider.shutdown()
    state.on, state.tracer, state.provider = False, None, None


def span(
    name: str,
    attributes: Mapping[str, str | int | float | bool] | None = None,
    *,
    kind: str = "internal",
    start_ns: int | None = None,
) -> contextlib.AbstractContextManager[Any]:
    """A span around a block (the current span is its parent); a shared no-op when tracing is off.

    `kind`: internal, client (a call to the RM) or server (the RM answering). `start_ns`: an earlier
    start (epoch nanoseconds), for a span that covers time spent before the block.
    """
    if not state.on:
        return NO_SPAN
    from opentelemetry.trace import SpanKind

    kinds = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER}
    return state.tracer.start_as_current_span(  # type: ignore[no-any-return]
        name, kind=kinds[kind], attributes=dict(attributes or {}), start_time=start_ns
    )


def set_attributes(attributes: Mapping[str, str | int | float | bool | None]) -> None:
    """Add attributes to the current span (those that are None are left out)."""
    if not state.on:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(key, value)


def record_span(name: str, *, start_ns: int, end_ns: int, attributes: Mapping[str, str | int]) -> None:
    """A finished span with explicit times (the queue wait, measured after the fact)."""
    if not state.on:
        return
    state.tracer.start_span(name, start_time=start_ns, attributes=dict(attributes)).end(end_time=end_ns)


def inject(headers: MutableMapping[str, str]) -> None:
    """Add W3C `traceparent` (and `tracestate`) of the current span to outgoing request headers."""
    if not state.on:
        return
    from opentelemetry.propagate import inject as otel_inject

    otel_inject(headers)


@contextlib.contextmanager
def extract(headers: Mapping[str, str]) -> Iterator[None]:
    """Make the trace context of incoming `headers` (W3C `traceparent`) current for the block."""
    if not state.on:
        yield
        return
    from opentelemetry import context
    from opentelemetry.propagate import extract as otel_extract

    token = context.attach(otel_extract(headers))
    try:
        yield
    finally:
        context.detach(token)


def current_trace_id() -> str | None:
    """The current trace's id as 32 hex digits (for log lines), or None outside a trace or when off."""
    if not state.on:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None
