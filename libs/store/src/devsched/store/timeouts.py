"""The sweeper's time limits: queued tasks past their queue timeout or deadline, attempts past theirs.

Rules are core's (`devsched.core.timeouts`); this module finds the tasks that may be due through the partial
indexes of migration 0008 (only tasks with a limit are ever read), locks them with SKIP LOCKED (several
sweepers take different tasks), decides each with the clock read after the locks, and applies the batch in
a few statements. An attempt ended here keeps its device out of use for the post-expiry grace, as after a
lease expiry: its host may still be running a step on it.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.events import TaskEvent
from devsched.core.lifecycle import Trigger
from devsched.core.status import EndReason, EventKind, TaskStatus
from devsched.core.timeouts import decide_timeout, overdue, queue_timed_out
from devsched.store.clock import Clock
from devsched.store.outbox import Outbox
from devsched.store.rows import REREAD_TASKS, task_record
from devsched.store.statuses import IN_FLIGHT, entering, leaving
from devsched.store.sweeping import end_tasks
from devsched.store.views import ExpiredLease

_QUEUED = leaving(Trigger.QUEUE_TIMEOUT)

#: Queued tasks that may be past a limit at `:now`, locked; the predicate of `ix_tasks_queued_limits` first.
_QUEUED_DUE = text(
    f"""
    SELECT t.task_id, t.updated_at, t.not_before, t.queue_timeout_s, t.deadline
    FROM tasks t
    WHERE t.status IN {_QUEUED} AND (t.queue_timeout_s IS NOT NULL OR t.deadline IS NOT NULL)
      AND (t.deadline <= :now
           OR GREATEST(t.updated_at, t.not_before) + make_interval(secs => t.queue_timeout_s) <= :now)
    ORDER BY t.task_id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)

_FAIL_QUEUED = text(
    f"""
    UPDATE tasks t SET status = {entering(Trigger.QUEUE_TIMEOUT)}, reason = u.r, updated_at = :now,
                       event_seq = t.event_seq + 1
    FROM unnest(CAST(:task_ids AS uuid[]), CAST(:reasons AS text[])) AS u(id, r)
    WHERE t.task_id = u.id AND t.status IN {_QUEUED}
    RETURNING t.task_id, t.event_seq, t.reason, t.trace_headers
    """
)

#: In-flight tasks whose current attempt may be past a limit and a lease ttl at `:now`, locked; the
#: predicate of `ix_tasks_in_flight_limits` first.
_IN_FLIGHT_DUE = text(
    f"""
    SELECT t.task_id
    FROM tasks t JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt_count
    WHERE t.status IN {IN_FLIGHT} AND (t.attempt_timeout_s IS NOT NULL OR t.deadline IS NOT NULL)
      AND a.status = 'active'
      AND (t.deadline + make_interval(secs => t.lease_ttl_s) <= :now
           OR COALESCE(a.dispatched_at, a.assigned_at)
              + make_interval(secs => t.attempt_timeout_s + t.lease_ttl_s) <= :now)
    ORDER BY t.task_id
    LIMIT :limit
    FOR UPDATE OF t SKIP LOCKED
    """
)

#: The attempts end as `expired` with the limit as their end reason; compare-and-set on the live lease.
_END_ATTEMPTS = text(
    """
    UPDATE attempts a SET status = 'expired', end_reason = u.why, ended_at = :now
    FROM unnest(CAST(:task_ids AS uuid[]), CAST(:attempts AS int[]), CAST(:whys AS text[])) AS u(t, n, why)
    WHERE a.task_id = u.t AND a.attempt = u.n AND a.status = 'active'
    RETURNING a.task_id
    """
)


async def fail_queued(
    conn: AsyncConnection, now: datetime, outbox: Outbox, *, limit: int, clock: Clock
) -> list[uuid.UUID]:
    """Fail up to `limit` queued tasks past their queue timeout or deadline; the tasks it failed.

    Their reason is `queue_timeout` or `deadline_exceeded`.
    """
    rows = (await conn.execute(_QUEUED_DUE, {"now": now, "limit": limit})).all()
    if not rows:
        return []
    now = await clock.now(conn)  # after the locks
    reasons = {
        r.task_id: why
        for r in rows
        if (why := queue_timed_out(entered=r.updated_at, not_before=r.not_before, queue_timeout_s=r.queue_timeout_s,
                                   deadline=r.deadline, now=now))
    }  # fmt: skip
    if not reasons:
        return []
    params = {"task_ids": list(reasons), "reasons": [r.value for r in reasons.values()], "now": now}
    for row in (await conn.execute(_FAIL_QUEUED, params)).all():
        outbox.add(
            TaskEvent(
                event=EventKind.FAILED, task_id=row.task_id, seq=row.event_seq, status=TaskStatus.FAILED, at=now,
                reason=row.reason,
            ),
            trace=row.trace_headers,
        )  # fmt: skip
    await outbox.flush(conn, now)
    return list(reasons)


async def end_overdue(
    conn: AsyncConnection, now: datetime, outbox: Outbox, *, limit: int, device_grace_s: float | None, clock: Clock
) -> list[ExpiredLease]:
    """End up to `limit` attempts past their attempt timeout or their task's deadline (and a lease ttl more).

    Each task fails with the limit as its reason, is queued again when its retry policy retries attempt
    timeouts and attempts are left, or is cancelled when a cancellation is pending.
    """
    ids = list((await conn.execute(_IN_FLIGHT_DUE, {"now": now, "limit": limit})).scalars())
    if not ids:
        return []
    now = await clock.now(conn)  # after the locks
    tasks = [task_record(r) for r in (await conn.execute(REREAD_TASKS, {"ids": ids})).all()]
    stops = {t.task_id: stop for t in tasks if (stop := overdue(t, now)) is not None}
    due = [t for t in tasks if t.task_id in stops]
    if not due:
        return []
    ended = set(
        (
            await conn.execute(
                _END_ATTEMPTS,
                {
                    "task_ids": [t.task_id for t in due],
                    "attempts": [t.attempt_count for t in due],
                    "whys": [EndReason(stops[t.task_id]).value for t in due],
                    "now": now,
                },
            )
        ).scalars()
    )
    due = [t for t in due if t.task_id in ended]
    decisions = {t.task_id: decide_timeout(t, stops[t.task_id], now) for t in due}
    out = await end_tasks(conn, now, outbox, due, decisions, device_grace_s=device_grace_s, stops=stops)
    await outbox.flush(conn, now)
    return out
