"""Many queued tasks at once: copies of one task submitted through the API, made by one INSERT.

Submitting 100,000 tasks one by one takes minutes; the sweep and memory figures only need them queued.
Each copy is the template's row with a new `task_id` and no idempotency key (the client gives every submit
one, and keys are unique) (`jsonb_populate_record` over the row itself), so the
copies follow the schema whatever columns it gains, and they carry exactly what a real submit writes
(the template's `submitted` event is its own: the copies have none). A copy is queued as the template was
right after its submit, even when the submit already placed the template on a free device: a copy of an
`assigned` row would be a task in flight without an attempt, which no pass ever assigns.
"""

from __future__ import annotations

import uuid

_COPY = """
INSERT INTO tasks
SELECT (jsonb_populate_record(t, jsonb_build_object(
    'task_id', gen_random_uuid(), 'idempotency_key', NULL, 'status', 'queued', 'attempt_count', 0,
    'releases', 0, 'event_seq', 1, 'reason', NULL, 'result', NULL))).*
FROM tasks t, generate_series(1, $2)
WHERE t.task_id = $1
RETURNING task_id::text
"""


async def copy_task(admin_dsn: str, template_id: str, count: int) -> list[str]:
    """Insert `count` copies of task `template_id` (as the superuser); returns their ids."""
    import asyncpg  # type: ignore[import-untyped]

    if count <= 0:
        return []
    conn = await asyncpg.connect(admin_dsn, timeout=15)
    try:
        rows = await conn.fetch(_COPY, uuid.UUID(template_id), count, timeout=600)
        await conn.execute("ANALYZE tasks")
    finally:
        await conn.close()
    return [str(r[0]) for r in rows]
