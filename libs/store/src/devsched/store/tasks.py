"""Submit and cancel: the user's side of a task."""

from __future__ import annotations

import json
import uuid
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.cancellation import CancelKind, decide_cancel
from devsched.core.events import TaskEvent
from devsched.core.lifecycle import Trigger
from devsched.core.status import EventKind, TaskReason, TaskStatus
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.driver import Driver, Sql
from devsched.store.inline import INSERTED, PLACEHOLDER_TIME, event_params, insert_event
from devsched.store.outbox import Outbox, current_trace, inserted
from devsched.store.placement import candidates
from devsched.store.rows import bump_seq, lock_task
from devsched.store.statuses import entering, leaving
from devsched.store.views import CancelReceipt, NewTask, OutboxMessage, Submitted


def _submit_sql(*, looking: bool) -> Sql:
    """The submit's one statement: the task, its `submitted` event, or the task that exists instead.

    The existing task is the one of a repeated idempotency key, or of a repeat of this very statement
    whose answer was lost (the same task id). `looking`: the new task's row also counts the free devices
    it could use (`candidates.SUBMITTED_FREE`, at most `:devices`, in the statement's snapshot), so that a
    submit that finds none needs no placement (`Store.submit`); the existing task's row has no count.
    """
    free_cte = f",{candidates.SUBMITTED_FREE}" if looking else ""
    free = ", (SELECT count(*) FROM f) AS free" if looking else ""
    no_free = ", NULL" if looking else ""
    return Sql(
        f"""
    WITH c AS MATERIALIZED (SELECT {NOW} AS now),
    ins AS (
        INSERT INTO tasks (task_id, name, status, priority, max_attempts, lease_ttl_s, selector_labels,
                           selector_device_id, plan, metadata, idempotency_key, created_at, updated_at, event_seq,
                           trace_headers, retry, queue_timeout_s, attempt_timeout_s, deadline)
        SELECT :task_id, :name, {entering(Trigger.SUBMIT)}, :priority, :max_attempts, :lease_ttl_s,
               CAST(:labels AS jsonb), :device_id, CAST(:plan AS jsonb), CAST(:metadata AS jsonb), :key, c.now, c.now,
               1, CAST(:trace AS jsonb), CAST(:retry AS jsonb), CAST(:queue_timeout_s AS double precision),
               CAST(:attempt_timeout_s AS double precision), CAST(:deadline AS timestamptz)
        FROM c
        ON CONFLICT DO NOTHING
        RETURNING task_id, status, created_at
    ),
    event AS ({insert_event("ins", at="ins.created_at")}){free_cte}
    SELECT task_id, status, {INSERTED} AS inserted{free} FROM ins
    UNION ALL
    SELECT task_id, status, NULL{no_free} FROM tasks
    WHERE (idempotency_key = :key OR task_id = :task_id) AND NOT EXISTS (SELECT FROM ins)
    """
    )


_SUBMIT = _submit_sql(looking=False)
_SUBMIT_LOOKING = _submit_sql(looking=True)
#: The task of a key whose first submit committed after `_SUBMIT`'s snapshot was taken (it waited for it).
_BY_KEY = Sql("SELECT task_id, status FROM tasks WHERE idempotency_key = :key")


async def submit(
    db: Driver, clock: Clock, new: NewTask, task_id: uuid.UUID, written: list[OutboxMessage] | None = None
) -> Submitted:
    """Queue a new task as `task_id`, or return the one already submitted with the same idempotency key.

    One statement, run without a transaction around it (`Transactor.statements`) or as the first of a
    transaction that also assigns (`Store.assign_inline`). `written` receives the `submitted` event's
    outbox message, to publish it once committed.
    """
    done, _ = await _submit(db, clock, new, task_id, written, _SUBMIT)
    return done


async def submit_looking(
    db: Driver, clock: Clock, new: NewTask, task_id: uuid.UUID, written: list[OutboxMessage] | None = None
) -> tuple[Submitted, int | None]:
    """`submit`, and how many free devices the new task could use (at most `candidates.SUBMIT_DEVICES`).

    The count is None when no task was created (a repeated key) or the statement is a repeat of itself
    whose first answer was lost (the task exists: whether it still waits is not known here).
    """
    return await _submit(db, clock, new, task_id, written, _SUBMIT_LOOKING)


async def _submit(
    db: Driver, clock: Clock, new: NewTask, task_id: uuid.UUID, written: list[OutboxMessage] | None, sql: Sql
) -> tuple[Submitted, int | None]:
    event = TaskEvent(event=EventKind.SUBMITTED, task_id=task_id, seq=1, status=TaskStatus.QUEUED, at=PLACEHOLDER_TIME)
    params = {
        "task_id": task_id,
        "name": new.name,
        "priority": new.priority,
        "max_attempts": new.max_attempts,
        "lease_ttl_s": new.lease_ttl_s,
        "labels": json.dumps(dict(new.selector.labels)),
        "device_id": new.selector.device_id,
        "plan": json.dumps(dict(new.plan)),
        "metadata": json.dumps(dict(new.metadata)) if new.metadata else "{}",
        "key": new.idempotency_key,
        "trace": json.dumps(dict(trace)) if (trace := current_trace()) else "{}",
        "retry": json.dumps(new.retry.to_json()) if new.retry is not None else None,
        "queue_timeout_s": new.queue_timeout_s,
        "attempt_timeout_s": new.attempt_timeout_s,
        "deadline": new.deadline,
        "devices": candidates.SUBMIT_DEVICES,
        CLOCK_PARAM: clock.bound(),
        **event_params(event),
    }
    row = await db.row(sql, params) or await db.row(_BY_KEY, {"key": new.idempotency_key})
    if row is None:
        raise AssertionError(f"submit of {task_id} found neither its task nor the one of its key")
    inserted_rows = row.get("inserted")
    if written is not None:
        written += inserted(inserted_rows)
    free = row.get("free") if inserted_rows is not None else None
    return Submitted(row["task_id"], TaskStatus(row["status"]), created=row["task_id"] == task_id), free


_CANCEL_QUEUED = text(
    f"""
    UPDATE tasks
    SET status = {entering(Trigger.CANCEL)}, reason = :reason, updated_at = :now, event_seq = event_seq + 1
    WHERE task_id = :task_id AND status IN {leaving(Trigger.CANCEL)}
    RETURNING event_seq
    """
)
_RECORD_REQUEST = text(
    """
    INSERT INTO cancel_requests (task_id, attempt, requested_at, reason)
    VALUES (:task_id, :attempt, :now, :reason)
    """
)


async def request_cancel(
    conn: AsyncConnection, now: datetime, outbox: Outbox, task_id: uuid.UUID, reason: str | None
) -> CancelReceipt:
    """Cancel a queued task now; record a durable request against an in-flight task's attempt."""
    task = await lock_task(conn, task_id)
    kind = decide_cancel(task)
    if kind is CancelKind.TERMINAL:
        return CancelReceipt(task_id, task.status, cancel_requested=False)
    if kind is CancelKind.CANCEL_NOW:
        why = TaskReason.CANCELLED_WHILE_QUEUED.value
        seq = (await conn.execute(_CANCEL_QUEUED, {"task_id": task_id, "reason": why, "now": now})).scalar_one()
        outbox.add(
            TaskEvent(
                event=EventKind.CANCELLED, task_id=task_id, seq=seq, status=TaskStatus.CANCELLED, at=now, reason=why
            )
        )
        await outbox.flush(conn, now)
        return CancelReceipt(task_id, TaskStatus.CANCELLED, cancel_requested=False)
    current = task.current
    assert current is not None
    nudge = (current.host_id, current.attempt)
    if kind is CancelKind.ALREADY_REQUESTED:
        return CancelReceipt(task_id, task.status, cancel_requested=True, nudge=nudge)
    await conn.execute(_RECORD_REQUEST, {"task_id": task_id, "attempt": current.attempt, "now": now, "reason": reason})
    outbox.add(
        TaskEvent(
            event=EventKind.CANCEL_REQUESTED,
            task_id=task_id,
            seq=await bump_seq(conn, task_id, now),
            status=task.status,
            at=now,
            attempt=current.attempt,
            host_id=current.host_id,
            device_id=current.device_id,
            reason=reason,
        )
    )
    await outbox.flush(conn, now)
    return CancelReceipt(task_id, task.status, cancel_requested=True, nudge=nudge)
