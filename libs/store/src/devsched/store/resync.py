"""Assignments to publish again: attempts assigned and not yet claimed whose lease still runs.

An assignment reaches its host once, through JetStream. If the stream loses it (purged, its store gone,
its deliveries spent while the host was away), the attempt would wait for its lease to run out and the
sweeper would spend one of the task's attempts. The scheduler reads these attempts back, in one read-only
statement, and publishes their assignments again; the agent drops a copy of an attempt it already took.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.events import AttemptAssigned
from devsched.core.status import AttemptStatus
from devsched.store.liveness import host_online
from devsched.store.views import Unclaimed

#: Oldest first, after the keyset `(:after_at, :after_task)` when given. An attempt is unclaimed while it
#: is active and its host has not dispatched it (`dispatched_at` is set by the first claim).
_UNCLAIMED = text(
    f"""
    SELECT a.task_id, a.attempt, a.lease_id, a.host_id, a.device_id, a.expires_at, a.assigned_at,
           t.plan, t.lease_ttl_s, t.trace_headers
    FROM attempts a
    JOIN tasks t ON t.task_id = a.task_id
    JOIN hosts h ON h.host_id = a.host_id
    WHERE a.status = '{AttemptStatus.ACTIVE.value}' AND a.dispatched_at IS NULL AND a.expires_at > :now
      AND (CAST(:host_id AS text) IS NULL OR a.host_id = :host_id)
      AND (CAST(:before AS timestamptz) IS NULL OR a.assigned_at <= :before)
      AND (NOT :online OR {host_online("h")})
      AND (CAST(:after_at AS timestamptz) IS NULL
           OR (a.assigned_at, a.task_id) > (CAST(:after_at AS timestamptz), CAST(:after_task AS uuid)))
    ORDER BY a.assigned_at, a.task_id
    LIMIT :limit
    """
)


def _unclaimed(row: Any) -> Unclaimed:
    return Unclaimed(
        assignment=AttemptAssigned(
            task_id=row.task_id,
            attempt=row.attempt,
            lease_id=row.lease_id,
            host_id=row.host_id,
            device_id=row.device_id,
            plan=row.plan,
            ttl_s=row.lease_ttl_s,
            expires_at=row.expires_at,
        ),
        headers=dict(row.trace_headers or {}),
        assigned_at=row.assigned_at,
    )


async def unclaimed(
    conn: AsyncConnection,
    now: datetime,
    *,
    host_id: str | None,
    older_than_s: float | None,
    online: bool,
    after: Unclaimed | None,
    limit: int,
) -> list[Unclaimed]:
    """Up to `limit` unclaimed attempts at `now`, oldest first (after `after`, for the next page).

    `host_id` keeps one host's; `older_than_s` those assigned at least that long ago; `online` those whose
    host is online.
    """
    params = {
        "now": now,
        "host_id": host_id,
        "before": None if older_than_s is None else now - timedelta(seconds=older_than_s),
        "online": online,
        "after_at": None if after is None else after.assigned_at,
        "after_task": None if after is None else after.assignment.task_id,
        "limit": limit,
    }
    return [_unclaimed(r) for r in (await conn.execute(_UNCLAIMED, params)).all()]
