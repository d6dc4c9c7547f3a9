"""Events written by the one statement that causes them, with the fields only that statement knows.

An operation done in a single statement (submit, and the lease requests of `devsched.store.grants`)
inserts its outbox row in that statement, so it commits with the change, as every event does. The row
is rendered by the outbox (`event_row`) from what is known before the statement runs; the statement
fills in what only it knows: the time it read from the clock, the task's event number, the attempt's
device, the task's status. The statement returns the rows it inserted (`INSERTED`), so they are
published right after the commit like every other operation's.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from devsched.core.events import TaskEvent
from devsched.store.eventrows import filled
from devsched.store.outbox import event_row

#: What a template event carries where the statement fills in the value (never written as is).
PLACEHOLDER_TIME = datetime(1970, 1, 1, tzinfo=UTC)
PLACEHOLDER_SEQ = 1
PLACEHOLDER_ID = uuid.UUID(int=0)


def _filled(at: str, fields: dict[str, str]) -> str:
    """The `jsonb_build_object` arguments of the task event fields a statement fills in: `at` and `fields`."""
    return filled(TaskEvent, at=at, **fields)


def insert_event(source: str, *, at: str, **fields: str) -> str:
    """SQL: insert the event bound by `event_params` once per row of `source` (a CTE or a join of them).

    `at` is the SQL of its time (also the row's `created_at`); `fields` name the SQL of other fields of
    the event to fill in (`seq`, `device_id`, `status`), by their names in `TaskEvent`.
    """
    return f"""
        INSERT INTO outbox (kind, data, headers, created_at)
        SELECT :event_kind, CAST(:event_data AS jsonb) || jsonb_build_object({_filled(at, fields)}),
               CAST(:event_headers AS jsonb), {at}
        FROM {source}
        RETURNING id, kind, data, headers
    """


@dataclass(frozen=True, slots=True)
class Slot:
    """One of the events a statement may insert (`insert_events`)."""

    #: Its parameters' prefix: bound by `event_params(template, name)`.
    name: str
    #: SQL over the source row: whether this event is written.
    wanted: str
    #: SQL over the source row: its event number.
    seq: str


def insert_events(source: str, slots: Sequence[Slot], *, at: str, **fields: str) -> str:
    """SQL: insert, for the one row of `source`, the events of `slots` that are wanted, in that order.

    One INSERT, so the ids the outbox's sequence hands out ascend in the order of `slots` (the order the
    events are published in), which separate inserts in one statement's CTEs would not promise. `at` and
    `fields` as in `insert_event`; each slot fills in its own `seq`.
    """
    values = ", ".join(
        f"({n}, {slot.wanted}, {slot.seq}, CAST(:{slot.name}_kind AS text), CAST(:{slot.name}_data AS text),"
        f" CAST(:{slot.name}_headers AS text))"
        for n, slot in enumerate(slots)
    )
    return f"""
        INSERT INTO outbox (kind, data, headers, created_at)
        SELECT e.kind, CAST(e.data AS jsonb) || jsonb_build_object({_filled(at, {"seq": "e.seq", **fields})}),
               CAST(e.headers AS jsonb), {at}
        FROM {source}, LATERAL (VALUES {values}) AS e(n, wanted, seq, kind, data, headers)
        WHERE e.wanted
        ORDER BY e.n
        RETURNING id, kind, data, headers
    """


#: SQL: the rows the CTE `event` (an `insert_event` or `insert_events`) wrote, as JSON text for
#: `devsched.store.outbox.inserted`, so the committed messages can be published at once (`Store.on_commit`);
#: NULL when it wrote none.
INSERTED = """(SELECT CAST(json_agg(json_build_object('id', id, 'kind', kind, 'data', data, 'headers', headers)
                                ORDER BY id) AS text) FROM event)"""


def event_params(template: TaskEvent | None, name: str = "event") -> dict[str, Any]:
    """The parameters of `insert_event` (or of the `insert_events` slot `name`) for `template`.

    Its filled-in fields may hold anything. None binds NULLs, for a slot the statement cannot want.
    """
    kind, data, headers = (None, None, None) if template is None else event_row(template)
    return {f"{name}_kind": kind, f"{name}_data": data, f"{name}_headers": headers}
