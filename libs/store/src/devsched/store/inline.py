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
from datetime import UTC, datetime
from typing import Any

from devsched.core.events import TaskEvent
from devsched.store.outbox import event_row

#: What a template event carries where the statement fills in the value (never written as is).
PLACEHOLDER_TIME = datetime(1970, 1, 1, tzinfo=UTC)
PLACEHOLDER_SEQ = 1
PLACEHOLDER_ID = uuid.UUID(int=0)


def iso_time(expr: str) -> str:
    """SQL: the timestamptz `expr` as the outbox writes times (`isoformat(timespec="microseconds")`, UTC)."""
    return f"""to_char(({expr}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""


def insert_event(source: str, *, at: str, **fields: str) -> str:
    """SQL: insert the event bound by `event_params` once per row of `source` (a CTE or a join of them).

    `at` is the SQL of its time (also the row's `created_at`); `fields` name the SQL of other fields of
    the event to fill in (`seq`, `device_id`, `status`), in the outbox's row layout.
    """
    filled = ", ".join(f"'{name}', {sql}" for name, sql in {"at": iso_time(at), **fields}.items())
    return f"""
        INSERT INTO outbox (kind, data, headers, created_at)
        SELECT :event_kind, CAST(:event_data AS jsonb) || jsonb_build_object({filled}),
               CAST(:event_headers AS jsonb), {at}
        FROM {source}
        RETURNING id, kind, data, headers
    """


#: SQL: the rows the CTE `event` (an `insert_event`) wrote, as JSON text for `devsched.store.outbox.inserted`,
#: so the committed messages can be published at once (`Store.on_commit`); NULL when it wrote none.
INSERTED = """(SELECT CAST(json_agg(json_build_object('id', id, 'kind', kind, 'data', data, 'headers', headers)
                                ORDER BY id) AS text) FROM event)"""


def event_params(template: TaskEvent) -> dict[str, Any]:
    """The parameters of `insert_event` for `template` (its filled-in fields may hold anything)."""
    kind, data, headers = event_row(template)
    return {"event_kind": kind, "event_data": data, "event_headers": headers}
