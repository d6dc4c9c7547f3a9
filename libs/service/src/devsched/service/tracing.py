"""OpenTelemetry setup for the services: one trace follows a task across processes.

Without a tracer provider every span is a no-op and nothing is propagated. With one, a request's
`traceparent` is continued by the scheduler, stored on the outbox rows it causes, published with the
assignment, and continued again by the agent that runs it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.util.types import Attributes

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


def setup_tracing(service_name: str) -> TracerProvider | None:
    """Install a tracer provider for `service_name` (once per process); the SDK's when spans are exported.

    Exporters: OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set and an OTLP exporter package is installed
    (`opentelemetry-exporter-otlp-proto-http`); spans as JSON on stderr when `DEVSCHED_TRACE_CONSOLE=1`.
    With neither, trace context is still continued, started and propagated, by a `PropagatingTracerProvider`
    that records no spans (returns None). `OTEL_SDK_DISABLED=true` turns it all off.
    """
    global _installed
    if _installed or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    _installed = True
    processors = _span_processors()
    if not processors:
        trace.set_tracer_provider(PropagatingTracerProvider())
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    return provider


def _span_processors() -> list[SpanProcessor]:
    processors: list[SpanProcessor] = []
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError:
            log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but no OTLP exporter is installed; spans not exported")
        else:
            processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    if os.environ.get("DEVSCHED_TRACE_CONSOLE") == "1":
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    return processors
