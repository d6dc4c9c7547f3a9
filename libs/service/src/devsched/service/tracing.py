"""OpenTelemetry setup for the services: real spans, so one trace follows a task across processes.

Without an SDK every span is a no-op and nothing is propagated. With it, a request's `traceparent` is
continued by the scheduler, stored on the outbox rows it causes, published with the assignment, and
continued again by the agent that runs it.
"""

from __future__ import annotations

import logging
import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

log = logging.getLogger("devsched.tracing")

_installed = False


def setup_tracing(service_name: str) -> TracerProvider | None:
    """Install an SDK tracer provider named `service_name` (once per process).

    Exporters: OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set and an OTLP exporter package is installed
    (`opentelemetry-exporter-otlp-proto-http`); spans as JSON on stderr when `DEVSCHED_TRACE_CONSOLE=1`.
    With neither, spans are still made and propagated, just not exported. `OTEL_SDK_DISABLED=true`
    turns it all off.
    """
    global _installed
    if _installed or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError:
            log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but no OTLP exporter is installed; spans not exported")
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if os.environ.get("DEVSCHED_TRACE_CONSOLE") == "1":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    trace.set_tracer_provider(provider)
    _installed = True
    return provider
