"""How a domain event is laid out in an outbox row, for Python and for the SQL that fills rows in itself.

A row holds its kind (`TASK_EVENT`, ...) and, as `data`, the event's JSON shape (`devsched.core.eventjson`)
with times as `row_time` writes them; `iso_time` is that format in SQL, so a row a statement fills in is
the row the outbox would write for the same event. The name of a task or device event is kept under
`kind`, as every release has stored it: rows outlive the process that wrote them, and a relay of another
release may read them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from devsched.core.eventjson import Shape, shape
from devsched.core.events import AttemptAssigned, DeviceEvent, DomainEvent, TaskEvent

#: `outbox.kind` of each domain value (the table's check constraint lists the same names).
TASK_EVENT = "task_event"
ASSIGNMENT = "assignment"
DEVICE_EVENT = "device_event"

#: The row layout of each kind.
_SHAPES: dict[str, Shape[Any]] = {
    TASK_EVENT: shape(TaskEvent).renamed(event="kind"),
    ASSIGNMENT: shape(AttemptAssigned),
    DEVICE_EVENT: shape(DeviceEvent).renamed(event="kind"),
}
_KIND_OF: dict[type[Any], str] = {s.cls: kind for kind, s in _SHAPES.items()}
#: Per message on the relay's path: a type's kind and writer, a kind's reader.
_WRITERS = {s.cls: (kind, s.write) for kind, s in _SHAPES.items()}
_READERS = {kind: s.read for kind, s in _SHAPES.items()}

#: The kinds this release reads: the relay claims only these, so a row of a kind a later release adds
#: waits for a relay of that release instead of failing this one's batches.
KINDS = tuple(_SHAPES)


def row_time(value: datetime) -> str:
    """A time as rows hold it: ISO 8601 with microseconds and the value's offset (`iso_time` in SQL)."""
    return value.isoformat(timespec="microseconds")


def iso_time(expr: str) -> str:
    """SQL: the timestamptz `expr` as `row_time` writes a UTC time (`2026-12-01T10:00:00.000001+00:00`)."""
    return f"""to_char(({expr}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""


def row_of(event: DomainEvent) -> tuple[str, dict[str, Any]]:
    """`(kind, data)` of a domain value."""
    kind, write = _WRITERS[type(event)]
    return kind, write(event, row_time)


def event_of(kind: str, data: dict[str, Any]) -> DomainEvent:
    """The domain value of a row (`row_of` reversed).

    Raises:
        ValueError: a kind this release does not know, or a value not of its field's kind.
    """
    read = _READERS.get(kind)
    if read is None:
        raise ValueError(f"unknown outbox kind {kind!r}")
    event: DomainEvent = read(data)
    return event


def filled(cls: type[DomainEvent], **sql: str) -> str:
    """SQL: the `jsonb_build_object` arguments that set fields of a `cls` row to SQL values (`'key', value, ...`).

    Each keyword is a field of `cls` by its core name and the SQL of its value; a time field's SQL is a
    timestamptz, written as `row_time` would write it.

    Raises:
        ValueError: a keyword that is not a field of `cls`.
    """
    layout = _SHAPES[_KIND_OF[cls]]
    fields = [layout.field(name) for name in sql]
    return ", ".join(f"'{f.key}', {iso_time(sql[f.name]) if f.time else sql[f.name]}" for f in fields)
