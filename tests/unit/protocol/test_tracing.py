from __future__ import annotations

import pytest
from opentelemetry import trace

from devsched.protocol.tracing import (
    TRACEPARENT,
    TRACESTATE,
    destination_template,
    extract,
    inject,
    messaging_attributes,
    span_name,
    use_context,
)

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
        "messaging.destination.template": "devsched.api.tasks.get",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.body.size": 12,
    }


def test_a_publication_is_named_publish_and_typed_send() -> None:
    attributes = messaging_attributes("devsched.assign.h1", "send", 3, operation_name="publish")
    assert attributes["messaging.operation.name"] == "publish"
    assert attributes["messaging.operation.type"] == "send"
    assert attributes["messaging.destination.template"] == "devsched.assign.{host_id}"


TASK = "0b7e9b1e-5d7e-4a57-9a52-2f3c1c2d4e5f"


@pytest.mark.parametrize(
    ("subject", "template"),
    [
        ("devsched.api.tasks.submit", "devsched.api.tasks.submit"),
        ("devsched.host.bench-07.claim", "devsched.host.{host_id}.claim"),
        ("devsched.host.*.renew", "devsched.host.{host_id}.renew"),
        (f"lab-2.host.h1.log.{TASK}.3", "lab-2.host.{host_id}.log.{task_id}.{attempt}"),
        ("devsched.assign.h1", "devsched.assign.{host_id}"),
        (f"devsched.events.task.{TASK}", "devsched.events.task.{task_id}"),
        ("devsched.internal.wake", "devsched.internal.wake"),
    ],
)
def test_span_names_carry_the_subject_template_not_the_concrete_subject(subject: str, template: str) -> None:
    assert destination_template(subject) == template
    assert span_name("process", subject) == f"process {template}"
