"""The transactional outbox: messages written with the change that caused them, published after commit.

Nothing is published for a change that rolled back, and nothing committed is lost: the relay claims
unsent rows with SKIP LOCKED (never by a high-water mark: ids commit out of order), publishes them with
their `Nats-Msg-Id`, and marks them sent; a crash in between republishes, and JetStream's duplicate
window drops the copy.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.status import EventKind, TaskStatus
from devsched.store.views import AssignmentMessage, OutboxMessage

#: Trace headers (W3C traceparent) of the request being handled; stored with every message it causes so
#: the trace follows the task through the relay.
trace_headers: ContextVar[Mapping[str, str] | None] = ContextVar("devsched_outbox_trace_headers", default=None)


def iso(ts: datetime | None) -> str | None:
    """RFC 3339 UTC with microseconds, as the protocol writes timestamps."""
    return None if ts is None else ts.isoformat(timespec="microseconds").replace("+00:00", "Z")


_INSERT = text(
    """
    INSERT INTO outbox (subject, msg_id, payload, headers, created_at)
    SELECT s, m, p::jsonb, h::jsonb, :now
    FROM unnest(CAST(:subjects AS text[]), CAST(:msg_ids AS text[]), CAST(:payloads AS text[]),
                CAST(:headers AS text[])) AS u(s, m, p, h)
    """
)


def current_trace() -> Mapping[str, str]:
    """The trace headers of the request being handled (empty outside a request)."""
    return trace_headers.get() or {}


class Outbox:
    """Collects the messages of one transaction and writes them in one statement."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._rows: list[tuple[str, str, str, str]] = []

    def event(
        self,
        *,
        task_id: uuid.UUID,
        seq: int,
        kind: EventKind,
        status: TaskStatus,
        at: datetime,
        attempt: int | None = None,
        host_id: str | None = None,
        device_id: str | None = None,
        reason: str | None = None,
        progress: Mapping[str, Any] | None = None,
        trace: Mapping[str, str] | None = None,
    ) -> None:
        """Queue a task event for `P.events.task.<task_id>`; `seq` comes from the task row's counter.

        `trace` is the task's own trace context, for events no request caused (assignment, expiry);
        by default the current request's.
        """
        body: dict[str, Any] = {
            "event": kind.value,
            "task_id": str(task_id),
            "seq": seq,
            "attempt": attempt,
            "status": status.value,
            "at": iso(at),
            "host_id": host_id,
            "device_id": device_id,
            "reason": reason,
        }
        if kind is EventKind.PROGRESS:
            body["progress"] = dict(progress or {})
        headers = json.dumps(dict(current_trace() if trace is None else trace))
        self._rows.append((f"{self.prefix}.events.task.{task_id}", f"{task_id}:{seq}", json.dumps(body), headers))

    def assignment(self, msg: AssignmentMessage, trace: Mapping[str, str] | None = None) -> None:
        """Queue the assignment of a new attempt for `P.assign.<host_id>`, in the task's trace."""
        body = {
            "task_id": str(msg.task_id),
            "attempt": msg.attempt,
            "lease_id": str(msg.lease_id),
            "device_id": msg.device_id,
            "plan": msg.plan,
            "ttl_s": msg.ttl_s,
            "expires_at": iso(msg.expires_at),
        }
        headers = json.dumps(dict(current_trace() if trace is None else trace))
        self._rows.append(
            (f"{self.prefix}.assign.{msg.host_id}", f"{msg.task_id}.{msg.attempt}", json.dumps(body), headers)
        )

    async def flush(self, conn: AsyncConnection, now: datetime) -> None:
        """Write the queued messages in the caller's transaction."""
        if not self._rows:
            return
        subjects, msg_ids, payloads, headers = (list(col) for col in zip(*self._rows, strict=True))
        await conn.execute(
            _INSERT,
            {"subjects": subjects, "msg_ids": msg_ids, "payloads": payloads, "headers": headers, "now": now},
        )
        self._rows.clear()


Publish = Callable[[OutboxMessage], Awaitable[None]]

_CLAIM = text(
    """
    SELECT id, subject, msg_id, payload, headers FROM outbox
    WHERE sent_at IS NULL ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED
    """
)
_MARK = text("UPDATE outbox SET sent_at = :now WHERE id = ANY(CAST(:ids AS bigint[]))")


async def relay(conn: AsyncConnection, now: datetime, publish: Publish, limit: int) -> tuple[int, Exception | None]:
    """Publish up to `limit` unsent messages in id order and mark the ones that were published.

    Stops at the first failed publish and returns it instead of raising, so that the marks of the
    messages already published still commit with the caller's transaction (the failed one and those
    after it stay unsent and are tried again by the next pass).
    """
    rows = (await conn.execute(_CLAIM, {"limit": limit})).all()
    sent: list[int] = []
    error: Exception | None = None
    for row in rows:
        message = OutboxMessage(
            id=row.id, subject=row.subject, msg_id=row.msg_id, payload=row.payload, headers=row.headers
        )
        try:
            await publish(message)
        except Exception as exc:  # any transport failure: keep what was sent, retry the rest later
            error = exc
            break
        sent.append(row.id)
    if sent:
        await conn.execute(_MARK, {"ids": sent, "now": now})
    return len(sent), error


async def unsent_count(conn: AsyncConnection) -> int:
    """How many messages wait to be published (for metrics and tests)."""
    return int((await conn.execute(text("SELECT count(*) FROM outbox WHERE sent_at IS NULL"))).scalar_one())
