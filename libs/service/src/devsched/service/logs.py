"""Structured logs: one JSON object per line on stderr, carrying the ids of what is being handled.

`bind(task_id=..., attempt=..., lease_id=...)` puts ids in a context variable for the rest of the block,
so every line logged meanwhile (by us, by the store, by a library) carries them without threading them
through each call; `extra={...}` adds fields to one line. A line logged while a span is current carries
its `trace_id` and `span_id` (hex, as trace backends show them), so logs and traces find each other.

A service logs a few lines per unit of work on its hot path, so a line is cheap to make: the static fields
are rendered once, the timestamp's date and time to the second once a second, one shared encoder writes
the rest, and the records carry none of the fields the formatter never writes (thread, process, caller).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import Any, TextIO

from opentelemetry.trace import get_current_span

#: Fields bound to the current task (asyncio copies the context into every task it starts).
_BOUND: ContextVar[Mapping[str, Any] | None] = ContextVar("devsched_log_fields", default=None)

#: Attributes every LogRecord has; anything else on a record came from `extra=` and is logged.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()) | {"message", "asctime"}

#: One encoder for every line (`json.dumps` with options builds a new one per call).
_encode = json.JSONEncoder(default=str).encode


class bind:  # noqa: N801 - used as a function: `with bind(task_id=...):`
    """Add `fields` (None values skipped) to every log line written inside the block.

    A class rather than a `@contextmanager` generator: it runs twice on every request (issue 10), and a
    generator's frame, its `__enter__`/`__exit__` wrappers and its `next` calls cost several times the
    context variable's own set and reset.
    """

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any) -> None:
        self._fields = fields
        self._token: Token[Mapping[str, Any] | None] | None = None

    def __enter__(self) -> None:
        fields = self._fields
        bound = _BOUND.get()
        self._token = _BOUND.set(
            {**(bound or {}), **{k: v for k, v in fields.items() if v is not None}} if fields else bound
        )

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _BOUND.reset(self._token)
            self._token = None


def bound_fields() -> Mapping[str, Any]:
    """The fields currently bound."""
    return _BOUND.get() or {}


def _plain(value: Any) -> Any:
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str | int | float | bool):
        return value
    return str(value)


class _Clock:
    """`2026-01-02T03:04:05.123456Z` of a record's time: the part to the second is rendered once a second."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def iso(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._prefix}.{int((created - second) * 1_000_000):06d}Z"


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", <static>, "trace_id"?, "span_id"?, <bound>, <extra>, "exc"?}` on one line.

    A field named like an earlier one replaces its value (an extra field replaces a bound one of the same name).
    """

    def __init__(self, static: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._static = dict(static or {})
        self._clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        """Render `record` as one line of JSON."""
        line: dict[str, Any] = {
            "ts": self._clock.iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self._static:
            line.update(self._static)
        span = get_current_span().get_span_context()
        if span.is_valid:
            line["trace_id"] = f"{span.trace_id:032x}"
            line["span_id"] = f"{span.span_id:016x}"
        bound = _BOUND.get()
        if bound:
            for key, value in bound.items():
                line[key] = _plain(value)
        fields = record.__dict__
        extra = fields.keys() - _RECORD_ATTRS
        if extra:
            for key in fields:  # in the order given
                if key in extra and key[0] != "_":
                    line[key] = _plain(fields[key])
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return _encode(line)


def configure_logging(level: str = "INFO", *, stream: TextIO | None = None, **static: Any) -> None:
    """Send every logger's records to `stream` (stderr) as JSON lines, with `static` fields on each.

    Records stop collecting the thread, process and multiprocessing names: no line carries them.
    """
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(static))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
