"""The propagation-only tracer a service uses when it exports no spans: trace context as the SDK makes it."""

from __future__ import annotations

import pytest

from devsched.protocol.tracing import extract, inject, use_context
from devsched.service.tracing import PropagatingTracerProvider, _span_exporters, service_resource

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


# -- what the standard OTEL_* variables select ---------------------------------------------------------

OTEL_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No OTEL_* variable of the environment the tests run in."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _exporters() -> list[str]:
    return [type(e).__name__ for e in _span_exporters()]


def test_nothing_is_exported_without_an_endpoint_or_an_exporter(otel_env: pytest.MonkeyPatch) -> None:
    assert _exporters() == []


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_an_otlp_endpoint_alone_selects_otlp(otel_env: pytest.MonkeyPatch, variable: str) -> None:
    otel_env.setenv(variable, "http://127.0.0.1:4318")
    assert _exporters() == ["OTLPSpanExporter"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("none", []),
        ("console", ["ConsoleSpanExporter"]),
        ("otlp", ["OTLPSpanExporter"]),
        ("otlp, console", ["OTLPSpanExporter", "ConsoleSpanExporter"]),
        ("zipkin", []),
    ],
)
def test_otel_traces_exporter_decides(otel_env: pytest.MonkeyPatch, value: str, expected: list[str]) -> None:
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    otel_env.setenv("OTEL_TRACES_EXPORTER", value)
    assert _exporters() == expected


def test_the_resource_is_named_for_the_service_unless_otel_service_name_says(otel_env: pytest.MonkeyPatch) -> None:
    otel_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=lab,service.namespace=devsched")
    attributes = service_resource("devsched-agent").attributes
    assert attributes["service.name"] == "devsched-agent"
    assert attributes["deployment.environment.name"] == "lab"
    assert attributes["service.namespace"] == "devsched"
    otel_env.setenv("OTEL_SERVICE_NAME", "agent-bench-07")
    assert service_resource("devsched-agent").attributes["service.name"] == "agent-bench-07"
    otel_env.delenv("OTEL_SERVICE_NAME")
    otel_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    assert service_resource("devsched-agent").attributes["service.name"] == "from-attributes"
