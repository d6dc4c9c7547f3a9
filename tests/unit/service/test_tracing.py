"""The propagation-only tracer a service uses when it exports no spans: trace context as the SDK makes it."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from devsched.protocol.tracing import extract, inject, unsampled, use_context
from devsched.service.tracing import (
    PropagatingTracerProvider,
    SkipIdle,
    _span_exporters,
    mark_idle,
    service_resource,
)

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


def test_the_resource_carries_the_services_version_unless_the_variables_set_it(otel_env: pytest.MonkeyPatch) -> None:
    assert service_resource("devsched-scheduler").attributes["service.version"] == version("devsched-scheduler")
    otel_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.version=9.9.9-lab")
    assert service_resource("devsched-scheduler").attributes["service.version"] == "9.9.9-lab"


# -- idle passes are not exported ----------------------------------------------------------------------


def _skipping() -> tuple[Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SkipIdle(SimpleSpanProcessor(exporter)))
    return provider.get_tracer("test"), exporter


def test_a_trace_whose_root_is_marked_idle_is_dropped_whole() -> None:
    tracer, exporter = _skipping()
    with tracer.start_as_current_span("sweep batch") as root:
        with tracer.start_as_current_span("sweep_expired"):
            pass
        assert exporter.get_finished_spans() == (), "held until the root ends"
        mark_idle(root)
    assert exporter.get_finished_spans() == ()


def test_a_pass_that_did_work_is_exported_whole_children_first() -> None:
    tracer, exporter = _skipping()
    with tracer.start_as_current_span("sweep batch"), tracer.start_as_current_span("sweep_expired"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["sweep_expired", "sweep batch"]


def test_only_a_root_marked_idle_drops_a_trace() -> None:
    tracer, exporter = _skipping()
    with tracer.start_as_current_span("process x"), tracer.start_as_current_span("child") as child:
        mark_idle(child)
    assert [s.name for s in exporter.get_finished_spans()] == ["child", "process x"]


def test_a_trace_continued_from_elsewhere_is_passed_on_at_once() -> None:
    tracer, exporter = _skipping()
    remote = extract({"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"})
    with use_context(remote), tracer.start_as_current_span("process x") as span:
        with tracer.start_as_current_span("claim"):
            pass
        assert [s.name for s in exporter.get_finished_spans()] == ["claim"]
        mark_idle(span)  # a span with a remote parent is no root of this process: not honoured
    assert [s.name for s in exporter.get_finished_spans()] == ["claim", "process x"]


def test_idle_and_busy_passes_interleaved_keep_their_own_traces() -> None:
    tracer, exporter = _skipping()
    idle = tracer.start_span("assign batch")
    busy = tracer.start_span("sweep batch")
    for name, parent in (("assign batch", idle), ("sweep batch", busy)):
        with use_context(trace.set_span_in_context(parent)):
            tracer.start_span(f"op of {name}").end()
    mark_idle(idle)
    idle.end()
    busy.end()
    assert sorted(s.name for s in exporter.get_finished_spans()) == ["op of sweep batch", "sweep batch"]


def test_an_unsampled_block_records_no_span_and_says_so_downstream() -> None:
    tracer, exporter = _skipping()
    with unsampled(), tracer.start_as_current_span("send heartbeat") as span:
        assert not span.is_recording()
        trace_id, _, flags = _parts(inject({})["traceparent"])
    assert flags == "00", "the scheduler's parent-based sampler records nothing of it either"
    assert trace_id != "0" * 32
    assert exporter.get_finished_spans() == ()
    downstream = extract({"traceparent": f"00-{trace_id}-{PARENT_SPAN}-00"})
    with use_context(downstream), tracer.start_as_current_span("process heartbeat") as served:
        assert not served.is_recording()
