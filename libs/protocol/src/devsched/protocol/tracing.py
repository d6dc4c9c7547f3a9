"""W3C trace context in NATS headers, so one trace follows a task across processes.

Only the API is used: without an SDK configured every call here is a cheap no-op. The W3C propagator
is used explicitly rather than the global one, because the protocol fixes the header names
(`traceparent`, `tracestate`) whatever propagator an application configures for its other traffic.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: Header names of the W3C trace context.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_PROPAGATOR = TraceContextTextMapPropagator()

#: The instrumentation scope of the spans devsched.protocol starts.
TRACER_NAME = "devsched.protocol"


def inject(headers: MutableMapping[str, str] | None = None, context: Context | None = None) -> dict[str, str]:
    """Add `traceparent`/`tracestate` for `context` (default: the current one) to a copy of `headers`.

    Nothing is added when there is no valid span, so messages from untraced senders carry no headers.
    """
    carrier: dict[str, str] = dict(headers or {})
    _PROPAGATOR.inject(carrier, context=context)
    return carrier


def extract(headers: Mapping[str, str] | None) -> Context:
    """The trace context carried by `headers` (header names compared case-insensitively).

    Returns an empty context (so a new trace starts) when there are no or malformed trace headers.
    """
    if not headers:
        return Context()
    lowered = {key.lower(): value for key, value in headers.items()}
    return _PROPAGATOR.extract(lowered, context=Context())


@contextmanager
def use_context(context: Context) -> Iterator[None]:
    """Make `context` current for the block (spans started inside become its children)."""
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def tracer() -> trace.Tracer:
    """The tracer of devsched.protocol (resolved per call, so an SDK configured later is picked up)."""
    return trace.get_tracer(TRACER_NAME)


def messaging_attributes(subject: str, operation: str, body_size: int) -> dict[str, str | int]:
    """OpenTelemetry `messaging.*` attributes of a NATS message."""
    return {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.operation.type": operation,
        "messaging.message.body.size": body_size,
    }
