"""The spans of what the scheduler does on its own: publications (relay, resync) and assignment passes.

A publication's span is built only when spans are exported (`devsched.service.exporting_spans`): it needs
its stored trace context parsed and a context of its own injected, work that a service exporting nothing
would do for every message for nothing (its messages carry the stored context as it is).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from devsched.protocol.subjects import MSG_ID_HEADER
from devsched.protocol.tracing import extract, inject, messaging_attributes, span_name, tracer

#: The tracer of the scheduler's own spans (a proxy: it follows the provider `main` installs).
TRACER = trace.get_tracer("devsched.scheduler")


def publish_span(subject: str, size: int, stored: Mapping[str, str]) -> trace.Span:
    """The PRODUCER span `publish <subject template>` of one publication, in the trace `stored` names.

    `stored` is the trace context the outbox row (or the task) was stored with: the request that caused
    the message, or the task's submit, so an assignment continues the submit's trace.
    """
    return tracer().start_span(
        span_name("publish", subject),
        context=extract(stored),
        kind=SpanKind.PRODUCER,
        attributes=messaging_attributes(subject, "send", size, operation_name="publish"),
    )


def publish_headers(stored: Mapping[str, str], msg_id: str, span: trace.Span | None) -> dict[str, str]:
    """A publication's headers: its message id and trace context (the span's, else the stored one)."""
    headers = {**stored, MSG_ID_HEADER: msg_id}
    return headers if span is None else inject(headers, trace.set_span_in_context(span))


def end_span(span: trace.Span, error: BaseException | None) -> None:
    """End `span`, as failed when `error` is given."""
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.end()
