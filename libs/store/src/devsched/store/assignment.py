"""Batched assignment: queued tasks, by priority then age, onto free matching devices of online hosts.

Safe with any number of concurrent schedulers: free devices and queued tasks are locked with SKIP
LOCKED, so two assigners never wait on each other, and the partial unique index on active reservations
is the last word if two ever pick one device (the loser's transaction runs again).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.events import AttemptAssigned, TaskEvent
from devsched.core.ids import new_lease_id
from devsched.core.lifecycle import Trigger
from devsched.core.matching import matches, plan_assignments
from devsched.core.records import DeviceRecord, QueuedTask, Selector
from devsched.core.status import EventKind, TaskStatus
from devsched.store.clock import Clock
from devsched.store.faults import point
from devsched.store.hosts import device_busy
from devsched.store.liveness import host_online
from devsched.store.outbox import Outbox
from devsched.store.statuses import entering, leaving

_SELECTORS = text(
    f"SELECT DISTINCT selector_labels, selector_device_id FROM tasks WHERE status IN {leaving(Trigger.ASSIGN)}"
)

_FREE_DEVICES = text(
    f"""
    SELECT d.device_id, d.host_id, d.labels
    FROM devices d JOIN hosts h ON h.host_id = d.host_id
    WHERE d.registered AND NOT d.drained
      AND (d.available_after IS NULL OR d.available_after <= :now)
      AND {host_online("h")}
      AND NOT {device_busy("d")}
    ORDER BY d.updated_at, d.device_id
    LIMIT :limit
    FOR UPDATE OF d SKIP LOCKED
    """
)

_QUEUED = text(
    f"""
    SELECT t.task_id, t.selector_labels, t.selector_device_id, t.lease_ttl_s, t.attempt_count, t.plan,
           t.trace_headers
    FROM tasks t
    WHERE t.status IN {leaving(Trigger.ASSIGN)}
      AND (t.selector_labels, COALESCE(t.selector_device_id, '')) IN (
          SELECT l, d FROM unnest(CAST(:labels AS jsonb[]), CAST(:device_ids AS text[])) AS u(l, d))
    ORDER BY t.priority DESC, t.created_at, t.task_id
    LIMIT :limit
    FOR UPDATE OF t SKIP LOCKED
    """
)

_INSERT_ATTEMPTS = text(
    """
    INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at, expires_at)
    SELECT t, a, l, h, d, 'active', :now, e
    FROM unnest(CAST(:task_ids AS uuid[]), CAST(:attempts AS int[]), CAST(:lease_ids AS uuid[]),
                CAST(:host_ids AS text[]), CAST(:device_ids AS text[]), CAST(:expires AS timestamptz[]))
         AS u(t, a, l, h, d, e)
    """
)

_INSERT_RESERVATIONS = text(
    """
    INSERT INTO reservations (task_id, attempt, device_id, attempt_status, created_at)
    SELECT t, a, d, 'active', :now
    FROM unnest(CAST(:task_ids AS uuid[]), CAST(:attempts AS int[]), CAST(:device_ids AS text[])) AS u(t, a, d)
    """
)

_MARK_ASSIGNED = text(
    f"""
    UPDATE tasks t
    SET status = {entering(Trigger.ASSIGN)}, attempt_count = u.a, updated_at = :now, event_seq = t.event_seq + 1
    FROM unnest(CAST(:task_ids AS uuid[]), CAST(:attempts AS int[])) AS u(id, a)
    WHERE t.task_id = u.id AND t.status IN {leaving(Trigger.ASSIGN)} AND t.attempt_count = u.a - 1
    RETURNING t.task_id, t.event_seq
    """
)


def _selector(labels: Mapping[str, str], device_id: str | None) -> Selector:
    return Selector(labels=labels, device_id=device_id)


async def assign(
    conn: AsyncConnection, now: datetime, outbox: Outbox, *, limit: int, device_limit: int, clock: Clock
) -> list[AttemptAssigned]:
    """Assign up to `limit` queued tasks; returns the new attempts (also written to the outbox).

    The attempts' `assigned_at` and expiry come from the clock read after the device and task locks, so
    a device's new attempt never starts before the end its previous one recorded.
    """
    selectors = (await conn.execute(_SELECTORS)).all()
    if not selectors:
        return []
    free = [
        DeviceRecord(r.device_id, r.host_id, r.labels)
        for r in (await conn.execute(_FREE_DEVICES, {"now": now, "limit": device_limit})).all()
    ]
    usable = [s for s in selectors if any(matches(_selector(s.selector_labels, s.selector_device_id), d) for d in free)]
    if not usable:
        return []
    rows = (
        await conn.execute(
            _QUEUED,
            {
                "labels": [json.dumps(s.selector_labels) for s in usable],
                "device_ids": [s.selector_device_id or "" for s in usable],
                "limit": limit,
            },
        )
    ).all()
    by_id: dict[uuid.UUID, Any] = {r.task_id: r for r in rows}
    queued = [QueuedTask(r.task_id, _selector(r.selector_labels, r.selector_device_id)) for r in rows]
    plan = plan_assignments(queued, free)
    if not plan:
        return []
    now = await clock.now(conn)
    messages = [
        AttemptAssigned(
            task_id=task.task_id,
            attempt=by_id[task.task_id].attempt_count + 1,
            lease_id=new_lease_id(),
            host_id=device.host_id,
            device_id=device.device_id,
            plan=by_id[task.task_id].plan,
            ttl_s=by_id[task.task_id].lease_ttl_s,
            expires_at=now + timedelta(seconds=by_id[task.task_id].lease_ttl_s),
        )
        for task, device in plan
    ]
    cols = {
        "task_ids": [m.task_id for m in messages],
        "attempts": [m.attempt for m in messages],
        "lease_ids": [m.lease_id for m in messages],
        "host_ids": [m.host_id for m in messages],
        "device_ids": [m.device_id for m in messages],
        "expires": [m.expires_at for m in messages],
        "now": now,
    }
    await conn.execute(_INSERT_ATTEMPTS, cols)
    await conn.execute(
        _INSERT_RESERVATIONS,
        {k: cols[k] for k in ("task_ids", "attempts", "device_ids", "now")},
    )
    point("assign.after_reserve")
    seqs = {
        r.task_id: r.event_seq
        for r in (
            await conn.execute(_MARK_ASSIGNED, {"task_ids": cols["task_ids"], "attempts": cols["attempts"], "now": now})
        ).all()
    }
    if len(seqs) != len(messages):  # a task moved under our lock: impossible unless the schema changed
        raise RuntimeError("assignment lost a task it had locked")
    for m in messages:
        trace = by_id[m.task_id].trace_headers
        outbox.add(
            TaskEvent(
                kind=EventKind.ASSIGNED,
                task_id=m.task_id,
                seq=seqs[m.task_id],
                status=TaskStatus.ASSIGNED,
                at=now,
                attempt=m.attempt,
                host_id=m.host_id,
                device_id=m.device_id,
            ),
            trace=trace,
        )
        outbox.add(m, trace=trace)
    await outbox.flush(conn, now)
    return messages
