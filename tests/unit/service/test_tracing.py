"""The propagation-only tracer a service uses when it exports no spans: trace context as the SDK makes it."""

from __future__ import annotations

import pytest

from devsched.protocol.tracing import extract, inject, use_context
from devsched.service.tracing import PropagatingTracerProvider

pytestmark = pytest.mark.unit

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


def _parts(traceparent: str) -> tuple[str, str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id, flags


@pytest.mark.parametrize("flags", ["01", "00"])
def test_a_span_continues_its_parents_trace_with_an_id_of_its_own(flags: str) -> None:
    tracer = PropagatingTracerProvider().get_tracer("test")
    parent = extract({"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-{flags}"})
    with use_context(parent), tracer.start_as_current_span("process x") as span:
        assert not span.is_recording()
        trace_id, span_id, sent_flags = _parts(inject({})["traceparent"])
    assert trace_id == TRACE_ID
    assert span_id not in (PARENT_SPAN, "0" * 16)
    assert sent_flags == flags, "sampled as the parent is"


def test_without_a_parent_a_span_starts_a_new_sampled_trace() -> None:
    tracer = PropagatingTracerProvider().get_tracer("test")
    seen = set()
    for _ in range(2):
        with use_context(extract(None)), tracer.start_as_current_span("process x"):
            trace_id, span_id, flags = _parts(inject({})["traceparent"])
        assert trace_id != "0" * 32
        assert span_id != "0" * 16
        assert flags == "01"
        seen.add(trace_id)
    assert len(seen) == 2, "each root span starts a trace of its own"
    assert inject({}) == {}, "nothing is current after the block"
