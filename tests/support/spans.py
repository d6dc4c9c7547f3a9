"""An SDK tracer provider of a test's own, its spans kept in memory (the global provider is left alone).

`set_tracer_provider` takes effect once per process, so a test never installs one: it hands this
provider's tracer to what it tests, or starts its own spans with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer


@dataclass
class MemorySpans:
    """A recording provider and what it finished."""

    exporter: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    provider: TracerProvider = field(default_factory=lambda: TracerProvider(shutdown_on_exit=False))

    def __post_init__(self) -> None:
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def tracer(self, name: str = "test") -> Tracer:
        """A tracer of this provider."""
        return self.provider.get_tracer(name)

    def finished(self) -> tuple[ReadableSpan, ...]:
        """The spans ended so far."""
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        """The ended spans called `name`."""
        return [s for s in self.finished() if s.name == name]
