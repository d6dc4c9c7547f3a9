"""OpenTelemetry setup for the services: one trace follows a task across processes.

Without a tracer provider every span is a no-op and nothing is propagated. With one, a request's
`traceparent` is continued by the scheduler, stored on the outbox rows it causes, published with the
assignment, and continued again by the agent that runs it. Spans are exported as the standard `OTEL_*`
variables say (`setup_tracing`); without an exporter they only carry the trace context.

A periodic pass that found nothing to do (a sweep, an assignment pass) marks its span idle (`mark_idle`) and
its trace is not exported (`SkipIdle`): an idle control plane exports no spans, a pass that did work is
exported whole.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.util.types import Attributes

from devsched.service.version import service_version

log = logging.getLogger("devsched.tracing")

_installed = False


class PropagatingTracer(trace.Tracer):
    """Makes spans that carry trace context and record nothing; see `PropagatingTracerProvider`."""

    def __init__(self) -> None:
        self._ids = RandomIdGenerator()

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        """A span of its own id in its parent's trace, sampled as the parent is; a new sampled trace without one."""
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
        else:
            trace_id, flags, state = self._ids.generate_trace_id(), TraceFlags(TraceFlags.SAMPLED), TraceState()
        span_id = self._ids.generate_span_id()
        return NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state))

    @contextmanager  # the API's own decorator is private; devsched uses it as a context manager only
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        """`start_span`, current for the block."""
        with trace.use_span(self.start_span(name, context), end_on_exit=end_on_exit) as span:
            yield span


class PropagatingTracerProvider(trace.TracerProvider):
    """Trace context without spans, for a service that exports none.

    The SDK's spans cost a good part of a renewal's CPU in the scheduler (about 100 us of 420 measured under
    load), and made but never exported they serve only to continue or start a trace in `traceparent`.
    These spans do only that: each has a span id of its own and continues its parent's trace, sampled as
    the parent is, or starts a new sampled trace, as the SDK's default sampler would; attributes, events
    and status are dropped with the span.
    """

    def __init__(self) -> None:
        self._tracer = PropagatingTracer()

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        """The one tracer, whoever asks."""
        return self._tracer


#: The attribute `mark_idle` sets: on the root span of a trace, the trace is not exported (`SkipIdle`).
IDLE = "devsched.idle"


def mark_idle(span: trace.Span) -> None:
    """Say that the pass whose root span is `span` found no work: its trace is then not exported (`SkipIdle`).

    Only a root span (one that started a trace in this process) is honoured; a no-op when spans are not recorded.
    """
    span.set_attribute(IDLE, True)


class SkipIdle(SpanProcessor):
    """Passes on the spans of every trace but those whose root span is marked idle (`mark_idle`).

    A trace started in this process (a span without a parent: a periodic pass, a request that carried no
    trace context) is held here until its root span ends, then passed on whole or, when the root is marked
    idle, dropped whole: the pass's own database operations go with it. Spans of traces that came from
    elsewhere, or that end after their root, are passed on at once.
    """

    def __init__(self, *processors: SpanProcessor) -> None:
        self._processors = processors
        self._lock = threading.Lock()
        #: The ended spans of each trace whose root span is still open, by trace id.
        self._held: dict[int, list[ReadableSpan]] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Hold the trace a root span starts; tell the processors of the span."""
        if span.parent is None:
            with self._lock:
                self._held[span.context.trace_id] = []
        for processor in self._processors:
            processor.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        """Hold a span of a trace whose root is open; at its root's end, pass the trace on unless idle."""
        trace_id = span.context.trace_id if span.context is not None else 0
        with self._lock:
            held = self._held.get(trace_id)
            if held is None:
                ended = [span]
            elif span.parent is not None:
                held.append(span)
                return
            else:
                del self._held[trace_id]
                if span.attributes is not None and span.attributes.get(IDLE):
                    return
                ended = [*held, span]
        for done in ended:
            for processor in self._processors:
                processor.on_end(done)

    def shutdown(self) -> None:
        """Shut the processors down (a trace still open is not exported: its root never ended)."""
        for processor in self._processors:
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the processors."""
        return all(processor.force_flush(timeout_millis) for processor in self._processors)


#: What `OTEL_TRACES_EXPORTER` may name (a comma-separated list); `none` alone exports nothing.
EXPORTERS = ("otlp", "console", "none")


def setup_tracing(service_name: str) -> TracerProvider | None:
    """Install a tracer provider for `service_name` (once per process); the SDK's when spans are exported.

    Configured by the standard variables only. `OTEL_TRACES_EXPORTER` (`otlp`, `console`, `none`, or a list)
    chooses the exporters; unset, it is `otlp` when `OTEL_EXPORTER_OTLP_ENDPOINT` or
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, else `none`. The OTLP exporter speaks OTLP/HTTP (protobuf)
    and reads its own `OTEL_EXPORTER_OTLP_*` variables, the batch processor its `OTEL_BSP_*`; the resource
    is `OTEL_RESOURCE_ATTRIBUTES` with `service.name` from `OTEL_SERVICE_NAME`, else `service_name`.
    Without an exporter, trace context is still continued, started and propagated, by a
    `PropagatingTracerProvider` that records no spans (returns None). `OTEL_SDK_DISABLED=true` turns it
    all off. Call `shutdown_tracing` at the service's stop, so the last spans are exported.
    """
    global _installed
    if _installed or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    _installed = True
    exporters = _span_exporters()
    if not exporters:
        trace.set_tracer_provider(PropagatingTracerProvider())
        return None
    provider = TracerProvider(resource=service_resource(service_name))
    provider.add_span_processor(SkipIdle(*(BatchSpanProcessor(exporter) for exporter in exporters)))
    trace.set_tracer_provider(provider)
    log.info(
        "exporting spans",
        extra={"exporters": ",".join(type(e).__name__ for e in exporters), "service_name": service_name},
    )
    return provider


def shutdown_tracing() -> None:
    """Export the spans still buffered and stop the exporters (at the service's stop); else nothing."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def exporting_spans() -> bool:
    """Whether spans are recorded for export (an SDK provider is installed): worth building their details."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


def service_resource(service_name: str) -> Resource:
    """`OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` (the SDK's detector), `service_name` if neither names it.

    `service.version` is the installed version of the distribution `service_name` unless those variables set it.
    """
    detected = Resource.create()
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        detected = detected.merge(Resource({SERVICE_NAME: service_name}))
    return Resource({SERVICE_VERSION: service_version(service_name)}).merge(detected)


def _span_exporters() -> list[SpanExporter]:
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not names:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        names = "otlp" if endpoint else "none"
    exporters: list[SpanExporter] = []
    for name in (n.strip() for n in names.split(",")):
        if name == "otlp":
            exporters.append(_otlp_exporter())
        elif name == "console":
            exporters.append(ConsoleSpanExporter(out=sys.stderr))
        elif name not in ("none", ""):
            log.warning("OTEL_TRACES_EXPORTER names an unknown exporter; ignored", extra={"exporter": name})
    return exporters


def _otlp_exporter() -> SpanExporter:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    )
    if protocol.strip() not in ("", "http/protobuf"):
        log.warning("only OTLP over http/protobuf is supported; using it", extra={"protocol": protocol})
    # imported here: it brings requests and protobuf, which a service exporting nothing need not load
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()
