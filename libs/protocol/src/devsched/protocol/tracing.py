"""W3C trace context in NATS headers, so one trace follows a task across processes.

Only the API is used: without an SDK configured every call here is a cheap no-op. The W3C propagator
is used explicitly rather than the global one, because the protocol fixes the header names
(`traceparent`, `tracestate`) whatever propagator an application configures for its other traffic.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from functools import lru_cache

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
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


@contextmanager
def unsampled() -> Iterator[None]:
    """Run the block in a new trace that is not sampled: no span of it is recorded, here or where it is sent.

    For routine traffic with nothing to follow, such as a host's heartbeats: the `traceparent` its requests
    carry says "not sampled" (flags 00), which the services' samplers follow (parent-based by default).
    """
    ids = random.SystemRandom()
    parent = SpanContext(ids.getrandbits(128) or 1, ids.getrandbits(64) or 1, is_remote=False,
                         trace_flags=TraceFlags(TraceFlags.DEFAULT))  # fmt: skip
    with use_context(trace.set_span_in_context(NonRecordingSpan(parent), Context())):
        yield


def tracer() -> trace.Tracer:
    """The tracer of devsched.protocol (resolved per call, so an SDK configured later is picked up)."""
    return trace.get_tracer(TRACER_NAME)


@lru_cache(maxsize=4096)
def destination_template(subject: str) -> str:
    """The subject with its variable tokens named, as span names want it (low cardinality).

    `P.host.<host_id>.<verb>` -> `P.host.{host_id}.<verb>`, `P.host.<host_id>.log.<task_id>.<attempt>` ->
    `P.host.{host_id}.log.{task_id}.{attempt}`, `P.assign.<host_id>` -> `P.assign.{host_id}`,
    `P.events.task.<task_id>` -> `P.events.task.{task_id}`, `P.events.device.<device_id>` ->
    `P.events.device.{device_id}`; a wildcard token reads the same. Any other
    subject (`P.api.tasks.submit`) names no variable and is its own template.
    """
    parts = subject.split(".")
    if len(parts) >= 4 and parts[1] == "host":
        parts[2] = "{host_id}"
        if len(parts) == 6 and parts[3] == "log":
            parts[4:] = ["{task_id}", "{attempt}"]
    elif len(parts) == 3 and parts[1] == "assign":
        parts[2] = "{host_id}"
    elif len(parts) == 4 and parts[1:3] == ["events", "task"]:
        parts[3] = "{task_id}"
    elif len(parts) == 4 and parts[1:3] == ["events", "device"]:
        parts[3] = "{device_id}"
    else:
        return subject
    return ".".join(parts)


def span_name(operation: str, subject: str) -> str:
    """`<operation> <destination template>`: the messaging span name (`publish P.assign.{host_id}`)."""
    return f"{operation} {destination_template(subject)}"


def messaging_attributes(
    subject: str, operation: str, body_size: int, *, operation_name: str | None = None
) -> dict[str, str | int]:
    """OpenTelemetry `messaging.*` attributes of a NATS message.

    `operation` is the `messaging.operation.type` (`send`, `process`), `operation_name` the operation's
    own name when it differs (`publish`, a JetStream publication whose type is `send`).
    """
    return {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.destination.template": destination_template(subject),
        "messaging.operation.type": operation,
        "messaging.operation.name": operation_name or operation,
        "messaging.message.body.size": body_size,
    }


def send_span(subject: str, body_size: int) -> AbstractContextManager[trace.Span]:
    """The CLIENT span `send <subject template>` of a request, current for the block."""
    return tracer().start_as_current_span(
        span_name("send", subject), kind=SpanKind.CLIENT, attributes=messaging_attributes(subject, "send", body_size)
    )
