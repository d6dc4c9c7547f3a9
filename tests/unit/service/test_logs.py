"""JSON log lines carry the current span's trace and span ids, so logs and traces find each other."""

from __future__ import annotations

import io
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devsched.core.status import Outcome
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


def test_a_line_carries_its_time_static_bound_and_extra_fields() -> None:
    with bind(task_id="t1", attempt=1):
        line = _logged(lambda log: log.info("ended %s", "now", extra={"attempt": 2, "outcome": Outcome.DONE}))
    assert list(line) == ["ts", "level", "logger", "msg", "service", "task_id", "attempt", "outcome"]
    assert (line["msg"], line["level"], line["attempt"], line["outcome"]) == ("ended now", "info", 2, "done")
    ts = datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - ts).total_seconds()) < 60, line["ts"]
    assert len(line["ts"]) == len("2026-01-02T03:04:05.123456Z")


def test_times_in_the_same_second_and_the_next_render_apart() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord("x", logging.INFO, "x.py", 1, "m", None, None)
    for created in (1_767_323_045.000001, 1_767_323_045.5, 1_767_323_046.25):
        record.created = created
        rendered = json.loads(formatter.format(record))["ts"]
        expected = datetime.fromtimestamp(created, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        assert rendered[:20] == expected[:20]
        assert abs(int(rendered[20:26]) - int(expected[20:26])) <= 1


def test_an_exception_is_logged_with_its_traceback() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed", extra={"path": Path("/tmp/x")})

    line = _logged(emit)
    assert line["level"] == "error"
    assert line["path"] == "/tmp/x"
    assert "ValueError: boom" in line["exc"]
