"""A real OTLP/HTTP trace receiver on a free loopback port: what a collector would be sent, decoded.

`POST /v1/traces` with an `ExportTraceServiceRequest` (protobuf, gzip-compressed or not, as the exporter
chooses) is decoded with `opentelemetry-proto` and each span kept, with its resource's `service.name`;
anything else is answered 404 or 415, so an exporter speaking another encoding fails visibly.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as exported: ids in hex, its kind's name (`SPAN_KIND_SERVER`), attributes as Python values."""

    service: str
    resource: dict[str, Any]
    scope: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status: str


def _value(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    return None if field is None else getattr(value, field)


def _spans(request: ExportTraceServiceRequest) -> Iterator[ReceivedSpan]:
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield ReceivedSpan(
                    service=str(resource.get("service.name", "")),
                    resource=resource,
                    scope=scope_spans.scope.name,
                    name=span.name,
                    kind=Span.SpanKind.Name(span.kind),
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    status=span.status.StatusCode.Name(span.status.code),
                )


class OtlpReceiver:
    """The spans received so far (thread-safe), and where to send them (`endpoint`)."""

    def __init__(self) -> None:
        #: The base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it (the exporter adds `/v1/traces`).
        self.endpoint = ""
        self.requests = 0
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()

    def add(self, request: ExportTraceServiceRequest) -> None:
        """Keep the spans of one export request."""
        spans = list(_spans(request))
        with self._lock:
            self.requests += 1
            self._spans.extend(spans)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            return list(self._spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of one trace received so far."""
        return [s for s in self.spans() if s.trace_id == trace_id]


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            if self.headers.get("Content-Type", "").split(";")[0].strip() != PROTOBUF:
                self.send_error(415)
                return
            receiver.add(ExportTraceServiceRequest.FromString(body))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", PROTOBUF)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: a test's output is for its failures

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Serve `POST /v1/traces` on a free loopback port in a thread for the block."""
    receiver = OtlpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
