"""JSON log lines carry the current span's trace and span ids, so logs and traces find each other."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest

from devsched.protocol.tracing import extract, use_context
from devsched.service.logs import JsonFormatter, bind
from devsched.service.tracing import PropagatingTracerProvider
from support.spans import MemorySpans

pytestmark = pytest.mark.unit


def _logged(emit: Any) -> dict[str, Any]:
    """What one record logged by `emit(logger)` looks like through the formatter."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter({"service": "test"}))
    logger = logging.getLogger("devsched.test.logs")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    line = json.loads(out.getvalue())
    assert isinstance(line, dict)
    return line


def test_a_line_logged_in_a_recorded_span_carries_its_ids() -> None:
    spans = MemorySpans()
    with spans.tracer().start_as_current_span("process x") as span, bind(task_id="t1"):
        line = _logged(lambda log: log.info("claimed", extra={"attempt": 1}))
        context = span.get_span_context()
    assert line["trace_id"] == f"{context.trace_id:032x}"
    assert line["span_id"] == f"{context.span_id:016x}"
    assert (line["msg"], line["task_id"], line["attempt"], line["service"]) == ("claimed", "t1", 1, "test")
    assert spans.finished()[0].context.span_id == context.span_id, "the ids of the span that was exported"


def test_a_line_carries_the_ids_of_the_innermost_span() -> None:
    tracer = MemorySpans().tracer()
    with tracer.start_as_current_span("outer") as outer, tracer.start_as_current_span("inner") as inner:
        line = _logged(lambda log: log.warning("inner"))
    assert line["span_id"] == f"{inner.get_span_context().span_id:016x}"
    assert line["trace_id"] == f"{outer.get_span_context().trace_id:032x}"


def test_without_an_exporter_lines_still_carry_the_propagated_trace() -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    tracer = PropagatingTracerProvider().get_tracer("test")
    with (
        use_context(extract({"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})),
        tracer.start_as_current_span("process x") as span,
    ):
        line = _logged(lambda log: log.info("handled"))
    assert line["trace_id"] == trace_id
    assert line["span_id"] == f"{span.get_span_context().span_id:016x}"
    assert line["span_id"] != "00f067aa0ba902b7", "the service's own span, not its caller's"


def test_a_line_outside_any_span_has_no_trace_fields() -> None:
    line = _logged(lambda log: log.info("idle"))
    assert "trace_id" not in line
    assert "span_id" not in line
