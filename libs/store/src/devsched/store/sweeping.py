"""The lease sweep: end expired attempts and requeue, fail or cancel their tasks.

Safe with several sweepers and with racing reports: tasks are locked with SKIP LOCKED, re-read after
the lock, and the attempt is ended by a compare-and-set that re-checks, at write time, that it is still
active and expired (River's issue 1302: a sweeper that trusted its earlier read overwrote a report).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.events import TaskEvent
from devsched.core.expiry import ExpiryDecision, decide_expiry, is_expired
from devsched.core.records import TaskRecord
from devsched.core.status import EndReason
from devsched.store import quarantine
from devsched.store.clock import Clock
from devsched.store.faults import point
from devsched.store.outbox import Outbox
from devsched.store.rows import REREAD_TASKS, task_record
from devsched.store.statuses import IN_FLIGHT
from devsched.store.views import ExpiredLease

_CANDIDATES = text(
    """
    SELECT t.task_id
    FROM attempts a JOIN tasks t ON t.task_id = a.task_id AND t.attempt_count = a.attempt
    WHERE a.status = 'active' AND a.expires_at <= :now
    ORDER BY a.expires_at
    LIMIT :limit
    FOR UPDATE OF t SKIP LOCKED
    """
)

_EXPIRE_ATTEMPTS = text(
    """
    UPDATE attempts a SET status = 'expired', end_reason = 'lease_expired', ended_at = :now
    FROM unnest(CAST(:task_ids AS uuid[]), CAST(:attempts AS int[])) AS u(t, n)
    WHERE a.task_id = u.t AND a.attempt = u.n AND a.status = 'active' AND a.expires_at <= :now
    RETURNING a.task_id
    """
)

_END_TASKS = text(
    f"""
    UPDATE tasks t SET status = u.s, reason = u.r, updated_at = :now, event_seq = t.event_seq + 1,
                       not_before = COALESCE(u.nb, t.not_before), avoid_device_id = COALESCE(u.av, t.avoid_device_id)
    FROM unnest(CAST(:task_ids AS uuid[]), CAST(:statuses AS text[]), CAST(:reasons AS text[]),
                CAST(:not_before AS timestamptz[]), CAST(:avoid AS text[])) AS u(id, s, r, nb, av)
    WHERE t.task_id = u.id AND t.status IN {IN_FLIGHT}
    RETURNING t.task_id, t.event_seq, t.trace_headers
    """
)

#: Chubby's lock-delay: the agent that lost the lease may still be running a step on the device.
_GRACE = text(
    """
    UPDATE devices d SET available_after = GREATEST(COALESCE(d.available_after, u.g), u.g)
    FROM unnest(CAST(:device_ids AS text[]), CAST(:until AS timestamptz[])) AS u(id, g)
    WHERE d.device_id = u.id
    """
)


async def sweep_expired(
    conn: AsyncConnection,
    now: datetime,
    outbox: Outbox,
    *,
    limit: int,
    device_grace_s: float | None,
    clock: Clock,
    quarantine_after: int = 0,
) -> list[ExpiredLease]:
    """End up to `limit` expired leases (oldest expiry first) and decide each task's fate.

    Each expiry is an infrastructure failure of its device (`devsched.store.quarantine`).
    """
    ids = list((await conn.execute(_CANDIDATES, {"now": now, "limit": limit})).scalars())
    if not ids:
        return []
    now = await clock.now(conn)  # after the locks: the end recorded is when the attempt really ended
    tasks = [task_record(r) for r in (await conn.execute(REREAD_TASKS, {"ids": ids})).all()]
    expired = [t for t in tasks if is_expired(t, now)]
    if not expired:
        return []
    ended = set(
        (
            await conn.execute(
                _EXPIRE_ATTEMPTS,
                {
                    "task_ids": [t.task_id for t in expired],
                    "attempts": [t.attempt_count for t in expired],
                    "now": now,
                },
            )
        ).scalars()
    )
    expired = [t for t in expired if t.task_id in ended]
    point("sweep.after_expire")
    decisions = {t.task_id: decide_expiry(t, now) for t in expired}
    out = await end_tasks(conn, now, outbox, expired, decisions, device_grace_s=device_grace_s)
    devices = [t.current.device_id for t in expired if t.current is not None]
    last = EndReason.LEASE_EXPIRED.value
    await quarantine.record_failures(conn, now, outbox, devices, last, threshold=quarantine_after)
    await outbox.flush(conn, now)
    return out


async def end_tasks(
    conn: AsyncConnection,
    now: datetime,
    outbox: Outbox,
    ended: Sequence[TaskRecord],
    decisions: Mapping[uuid.UUID, ExpiryDecision],
    *,
    device_grace_s: float | None,
    stops: Mapping[uuid.UUID, str] | None = None,
) -> list[ExpiredLease]:
    """Apply each decision to its task whose attempt the sweeper just ended, with its event and device grace.

    The tail of both sweeps: an expiry (`sweep_expired`) and a time limit (`timeouts.end_overdue`, whose
    `stops` name each task's limit, the event's reason when the decision gives none). The device of each
    ended attempt gets its grace (the host may still be running a step on it).
    """
    params = {
        "task_ids": [t.task_id for t in ended],
        "statuses": [decisions[t.task_id].task_status.value for t in ended],
        "reasons": [d.reason.value if (d := decisions[t.task_id]).reason else None for t in ended],
        "not_before": [r.not_before if (r := decisions[t.task_id].retry) else None for t in ended],
        "avoid": [r.avoid_device_id if (r := decisions[t.task_id].retry) else None for t in ended],
        "now": now,
    }
    rows = {r.task_id: r for r in (await conn.execute(_END_TASKS, params)).all()}
    out: list[ExpiredLease] = []
    grace_until: dict[str, datetime] = {}
    for t in ended:
        cur, d = t.current, decisions[t.task_id]
        assert cur is not None
        grace = device_grace_s if device_grace_s is not None else float(t.lease_ttl_s)
        until = now + timedelta(seconds=grace)
        grace_until[cur.device_id] = max(until, grace_until.get(cur.device_id, until))
        reason = d.reason.value if d.reason else None
        fallback = stops[t.task_id] if stops is not None else EndReason.LEASE_EXPIRED.value
        outbox.add(
            TaskEvent(
                kind=d.event, task_id=t.task_id, seq=rows[t.task_id].event_seq, status=d.task_status, at=now,
                attempt=cur.attempt, host_id=cur.host_id, device_id=cur.device_id, reason=reason or fallback,
            ),
            trace=rows[t.task_id].trace_headers,
        )  # fmt: skip
        out.append(
            ExpiredLease(t.task_id, cur.attempt, cur.lease_id, cur.host_id, cur.device_id, d.task_status, reason)
        )
    await conn.execute(_GRACE, {"device_ids": list(grace_until), "until": list(grace_until.values())})
    return out
