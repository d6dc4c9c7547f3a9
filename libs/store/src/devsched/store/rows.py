"""Reading rows into the domain's records, taking the task row lock first (one lock order everywhere)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import NotFound
from devsched.core.records import AttemptRecord, TaskRecord
from devsched.core.retrying import RetryPolicy
from devsched.core.status import AttemptStatus, TaskStatus


def task_columns(attempt_status: str = "a.status") -> str:
    """SQL: the columns `task_record` reads, of task `t` and its current attempt `a`.

    `attempt_status` is the SQL of the attempt's status as read (a statement that just changed it, such as
    the sweep's compare-and-set, returns the status it matched).
    """
    return f"""
    t.task_id, t.status, t.attempt_count, t.max_attempts, t.lease_ttl_s, t.releases,
    t.retry, t.attempt_timeout_s, t.deadline,
    a.attempt, a.lease_id, a.host_id, a.device_id, {attempt_status} AS attempt_status, a.expires_at,
    a.dispatched_at, a.assigned_at,
    EXISTS (SELECT 1 FROM cancel_requests c
            WHERE c.task_id = t.task_id AND c.attempt = t.attempt_count) AS cancel_requested
"""


TASK_COLUMNS = task_columns()

_LOCK = text("SELECT 1 FROM tasks WHERE task_id = :task_id FOR UPDATE")

#: Read in a statement of its own AFTER the lock: a locking read that waited re-checks only the locked
#: row, so a join in the same statement could pair the task's new version with its attempt's old one.
_READ_TASK = text(
    f"""
    SELECT {TASK_COLUMNS}
    FROM tasks t LEFT JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt_count
    WHERE t.task_id = :task_id
    """
)

#: The locked tasks of a sweep, with their current attempts, read after the lock (as `_READ_TASK`).
REREAD_TASKS = text(
    f"""
    SELECT {TASK_COLUMNS}
    FROM tasks t JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt_count
    WHERE t.task_id = ANY(CAST(:ids AS uuid[]))
    """
)

_ATTEMPT = text(
    """
    SELECT attempt, lease_id, host_id, device_id, status, expires_at, dispatched_at, assigned_at,
           EXISTS (SELECT 1 FROM cancel_requests c
                   WHERE c.task_id = a.task_id AND c.attempt = a.attempt) AS cancel_requested
    FROM attempts a WHERE task_id = :task_id AND attempt = :attempt
    """
)


def attempt_record(row: Any) -> AttemptRecord:
    """An AttemptRecord from a row with the attempt columns."""
    return AttemptRecord(
        attempt=row.attempt,
        lease_id=row.lease_id,
        host_id=row.host_id,
        device_id=row.device_id,
        status=AttemptStatus(row.attempt_status if hasattr(row, "attempt_status") else row.status),
        expires_at=row.expires_at,
        dispatched=row.dispatched_at is not None,
        started_at=row.dispatched_at or row.assigned_at,
    )


def task_record(row: Row[Any]) -> TaskRecord:
    """A TaskRecord from a row of `TASK_COLUMNS`."""
    return TaskRecord(
        task_id=row.task_id,
        status=TaskStatus(row.status),
        attempt_count=row.attempt_count,
        max_attempts=row.max_attempts,
        lease_ttl_s=row.lease_ttl_s,
        current=attempt_record(row) if row.attempt is not None else None,
        cancel_requested=bool(row.cancel_requested),
        releases=row.releases,
        retry=RetryPolicy.from_json(row.retry) if row.retry is not None else None,
        attempt_timeout_s=row.attempt_timeout_s,
        deadline=row.deadline,
    )


async def lock_task(conn: AsyncConnection, task_id: uuid.UUID) -> TaskRecord:
    """Lock the task row and read it with its current attempt.

    Raises:
        NotFound: no such task.
    """
    if (await conn.execute(_LOCK, {"task_id": task_id})).first() is None:
        raise NotFound(f"no task {task_id}", task_id=str(task_id))
    return task_record((await conn.execute(_READ_TASK, {"task_id": task_id})).one())


async def named_attempt(conn: AsyncConnection, task: TaskRecord, attempt: int) -> tuple[AttemptRecord | None, bool]:
    """The attempt numbered `attempt` of a locked task, and whether a cancellation was requested on it."""
    if task.current is not None and attempt == task.current.attempt:
        return task.current, task.cancel_requested
    row = (await conn.execute(_ATTEMPT, {"task_id": task.task_id, "attempt": attempt})).one_or_none()
    if row is None:
        return None, False
    return attempt_record(row), bool(row.cancel_requested)


async def bump_seq(conn: AsyncConnection, task_id: uuid.UUID, now: datetime) -> int:
    """Take the task's next event number (for events that change nothing else on the task row)."""
    stmt = text("UPDATE tasks SET event_seq = event_seq + 1, updated_at = :now WHERE task_id = :id RETURNING event_seq")
    return int((await conn.execute(stmt, {"id": task_id, "now": now})).scalar_one())
