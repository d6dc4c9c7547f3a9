from __future__ import annotations

import pytest
from opentelemetry import trace

from devsched.protocol.tracing import TRACEPARENT, TRACESTATE, extract, inject, messaging_attributes, use_context

pytestmark = pytest.mark.unit

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
PARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"


def test_no_span_no_headers() -> None:
    assert inject() == {}
    assert inject({"a": "b"}) == {"a": "b"}


def test_extract_then_inject_round_trips() -> None:
    context = extract({TRACEPARENT: PARENT, TRACESTATE: "vendor=x"})
    assert inject(context=context) == {TRACEPARENT: PARENT, TRACESTATE: "vendor=x"}


def test_extracted_context_names_the_remote_span() -> None:
    span_context = trace.get_current_span(extract({TRACEPARENT: PARENT})).get_span_context()
    assert span_context.is_valid
    assert span_context.is_remote
    assert format(span_context.trace_id, "032x") == TRACE_ID
    assert format(span_context.span_id, "016x") == SPAN_ID


def test_use_context_makes_it_current() -> None:
    with use_context(extract({TRACEPARENT: PARENT})):
        assert inject()[TRACEPARENT] == PARENT
    assert inject() == {}


def test_inject_copies_and_keeps_other_headers() -> None:
    headers = {"Nats-Msg-Id": "x"}
    out = inject(headers, context=extract({TRACEPARENT: PARENT}))
    assert out == {"Nats-Msg-Id": "x", TRACEPARENT: PARENT}
    assert headers == {"Nats-Msg-Id": "x"}


def test_extract_ignores_header_case() -> None:
    assert inject(context=extract({"Traceparent": PARENT})) == {TRACEPARENT: PARENT}


@pytest.mark.parametrize("headers", [None, {}, {TRACEPARENT: "garbage"}, {TRACEPARENT: f"00-{'0' * 32}-{SPAN_ID}-01"}])
def test_missing_or_bad_headers_start_a_new_trace(headers: dict[str, str] | None) -> None:
    assert not trace.get_current_span(extract(headers)).get_span_context().is_valid
    assert inject(context=extract(headers)) == {}


def test_messaging_attributes() -> None:
    assert messaging_attributes("devsched.api.tasks.get", "send", 12) == {
        "messaging.system": "nats",
        "messaging.destination.name": "devsched.api.tasks.get",
        "messaging.operation.type": "send",
        "messaging.message.body.size": 12,
    }
