"""The tests' OTLP receiver decodes what the real OTLP/HTTP exporter sends, compressed or not."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from support.otlp_receiver import otlp_receiver

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_spans_exported_over_otlp_http_are_received_whole(compression: Compression) -> None:
    with otlp_receiver() as receiver:
        exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces", compression=compression)
        provider = TracerProvider(resource=Resource({"service.name": "probe"}), shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("probe-scope")
        with (
            tracer.start_as_current_span("parent") as parent,
            tracer.start_as_current_span("child", kind=SpanKind.PRODUCER, attributes={"n": 3, "s": "x"}),
        ):
            pass
        provider.shutdown()
        spans = {s.name: s for s in receiver.spans()}
    assert set(spans) == {"parent", "child"}
    child, context = spans["child"], parent.get_span_context()
    assert child.trace_id == f"{context.trace_id:032x}"
    assert child.parent_span_id == f"{context.span_id:016x}"
    assert (child.service, child.scope, child.kind) == ("probe", "probe-scope", "SPAN_KIND_PRODUCER")
    assert child.attributes == {"n": 3, "s": "x"}
