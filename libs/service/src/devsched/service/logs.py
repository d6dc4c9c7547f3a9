"""Structured logs: one JSON object per line on stderr, carrying the ids of what is being handled.

`bind(task_id=..., attempt=..., lease_id=...)` puts ids in a context variable for the rest of the block,
so every line logged meanwhile (by us, by the store, by a library) carries them without threading them
through each call; `extra={...}` adds fields to one line. A line logged while a span is current carries
its `trace_id` and `span_id` (hex, as trace backends show them), so logs and traces find each other.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry.trace import get_current_span

#: Fields bound to the current task (asyncio copies the context into every task it starts).
_BOUND: ContextVar[Mapping[str, Any] | None] = ContextVar("devsched_log_fields", default=None)

#: Attributes every LogRecord has; anything else on a record came from `extra=` and is logged.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()) | {"message", "asctime"}


@contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add `fields` (None values skipped) to every log line written inside the block."""
    token = _BOUND.set({**(_BOUND.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _BOUND.reset(token)


def bound_fields() -> Mapping[str, Any]:
    """The fields currently bound."""
    return _BOUND.get() or {}


def _plain(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", <static>, "trace_id"?, "span_id"?, <bound>, <extra>, "exc"?}` on one line."""

    def __init__(self, static: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        """Render `record` as one line of JSON."""
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(self._static)
        span = get_current_span().get_span_context()
        if span.is_valid:
            line["trace_id"] = f"{span.trace_id:032x}"
            line["span_id"] = f"{span.span_id:016x}"
        line.update({k: _plain(v) for k, v in bound_fields().items()})
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                line[key] = _plain(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(level: str = "INFO", *, stream: TextIO | None = None, **static: Any) -> None:
    """Send every logger's records to `stream` (stderr) as JSON lines, with `static` fields on each."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(static))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
