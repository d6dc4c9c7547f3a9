"""Read-only views: one task with its attempts, and task listings (each queued task with why it waits)."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.actions import visible_labels
from devsched.core.errors import InvalidRequest, NotFound
from devsched.core.limits import LIST_LIMIT_MAX, LIST_LIMIT_MIN
from devsched.core.records import Selector
from devsched.core.status import AttemptStatus, EndReason, TaskKind, TaskStatus
from devsched.core.views import AttemptView, TaskPage, TaskView
from devsched.store.pending import pending_reasons
from devsched.store.statuses import IN_FLIGHT

_TASK_SELECT = f"""
    SELECT t.*, (t.status IN {IN_FLIGHT} AND EXISTS (
        SELECT 1 FROM cancel_requests c WHERE c.task_id = t.task_id AND c.attempt = t.attempt_count
    )) AS cancel_pending
    FROM tasks t
"""


def _task_view(row: Any, attempts: tuple[AttemptView, ...] = (), pending: str | None = None) -> TaskView:
    return TaskView(
        task_id=row.task_id,
        name=row.name,
        status=TaskStatus(row.status),
        priority=row.priority,
        max_attempts=row.max_attempts,
        attempt_count=row.attempt_count,
        lease_ttl_s=row.lease_ttl_s,
        cancel_requested=bool(row.cancel_pending),
        selector=Selector(labels=visible_labels(row.selector_labels), device_id=row.selector_device_id),
        plan=row.plan,
        metadata=row.metadata,
        idempotency_key=row.idempotency_key,
        created_at=row.created_at,
        updated_at=row.updated_at,
        reason=row.reason,
        result=row.result,
        releases=row.releases,
        pending_reason=pending,
        attempts=attempts,
        retry=row.retry,
        queue_timeout_s=row.queue_timeout_s,
        attempt_timeout_s=row.attempt_timeout_s,
        deadline=row.deadline,
        not_before=row.not_before if row.status == TaskStatus.QUEUED else None,
        kind=TaskKind(row.kind),
        health_device_id=row.health_device_id,
    )


def _attempt_view(row: Any) -> AttemptView:
    return AttemptView(
        attempt=row.attempt,
        lease_id=row.lease_id,
        host_id=row.host_id,
        device_id=row.device_id,
        status=AttemptStatus(row.status),
        assigned_at=row.assigned_at,
        dispatched_at=row.dispatched_at,
        expires_at=row.expires_at,
        ended_at=row.ended_at,
        end_reason=EndReason(row.end_reason) if row.end_reason else None,
        progress=row.progress,
        cancel_requested=bool(row.cancel_requested),
        report_reason=row.report_reason,
        result=row.result,
    )


_ATTEMPTS = text(
    """
    SELECT a.*, EXISTS (SELECT 1 FROM cancel_requests c
                        WHERE c.task_id = a.task_id AND c.attempt = a.attempt) AS cancel_requested
    FROM attempts a WHERE a.task_id = :task_id ORDER BY a.attempt
    """
)


async def get_task(conn: AsyncConnection, now: datetime, task_id: uuid.UUID) -> TaskView:
    """The task view with every attempt, in order.

    Raises:
        NotFound: no such task.
    """
    row = (await conn.execute(text(_TASK_SELECT + " WHERE t.task_id = :id"), {"id": task_id})).one_or_none()
    if row is None:
        raise NotFound(f"no task {task_id}", task_id=str(task_id))
    attempts = tuple(_attempt_view(a) for a in (await conn.execute(_ATTEMPTS, {"task_id": task_id})).all())
    return _task_view(row, attempts, (await pending_reasons(conn, [row], now)).get(row.task_id))


def task_cursor(created_at: datetime, task_id: uuid.UUID) -> str:
    """The `after` cursor that continues a listing after the task created at `created_at` with `task_id`.

    A page may end before its `limit` (the scheduler cuts it to fit a reply): it continues after its last task.
    """
    raw = f"{created_at.isoformat()}|{task_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        ts, tid = raw.split("|")
        return datetime.fromisoformat(ts), uuid.UUID(tid)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest(
            "invalid cursor", errors=[{"path": "after", "message": "not a cursor returned by this endpoint"}]
        ) from exc


def _id_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The first and last UUID that start with `prefix` (hex digits, hyphens ignored)."""
    digits = prefix.replace("-", "")
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


async def list_tasks(
    conn: AsyncConnection,
    now: datetime,
    status: TaskStatus | None,
    limit: int,
    after: str | None,
    kind: TaskKind | None = None,
    device_id: str | None = None,
    id_prefix: str | None = None,
) -> TaskPage:
    """Tasks newest first, `limit` per page, continuing after the cursor of the previous page.

    `kind` keeps one kind; `device_id` keeps the tasks that had an attempt on that device (its history);
    `id_prefix` (the start of an id as written) keeps the tasks whose id starts with it.
    Each queued task says why it waits, worked out for the whole page in one more statement.
    """
    if not LIST_LIMIT_MIN <= limit <= LIST_LIMIT_MAX:
        message = f"must be {LIST_LIMIT_MIN}..{LIST_LIMIT_MAX}"
        raise InvalidRequest("limit out of range", errors=[{"path": "limit", "message": message}])
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit + 1}
    if status is not None:
        where.append("t.status = :status")
        params["status"] = status.value
    if kind is not None:
        where.append("t.kind = :kind")
        params["kind"] = kind.value
    if device_id is not None:
        where.append("EXISTS (SELECT 1 FROM attempts a WHERE a.task_id = t.task_id AND a.device_id = :device_id)")
        params["device_id"] = device_id
    if id_prefix is not None:
        # A prefix is a range of UUIDs (Postgres orders them as their hex digits): the primary key's index finds it.
        where.append("t.task_id BETWEEN :id_low AND :id_high")
        params.update(zip(("id_low", "id_high"), _id_range(id_prefix), strict=True))
    if after is not None:
        created_at, task_id = _decode_cursor(after)
        where.append("(t.created_at, t.task_id) < (:c_at, :c_id)")
        params.update({"c_at": created_at, "c_id": task_id})
    sql = _TASK_SELECT + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY t.created_at DESC, t.task_id DESC LIMIT :limit"
    rows = (await conn.execute(text(sql), params)).all()
    page = rows[:limit]
    nxt = task_cursor(page[-1].created_at, page[-1].task_id) if len(rows) > limit else None
    pending = await pending_reasons(conn, page, now)
    return TaskPage(tuple(_task_view(r, pending=pending.get(r.task_id)) for r in page), nxt)
