"""Release: the owning host gives an attempt back (agent shutdown, drain, restart) instead of failing it.

The attempt ends `released` and its reservation with it (the reservation follows the attempt's status
through its foreign key), so the device is free at once: the host vouches that nothing runs on it, which
is what the post-expiry grace guards against when a lease runs out instead. The task is queued again
without spending one of its `max_attempts` (`tasks.releases` counts the attempts given back), or ends
`cancelled` if a cancellation is pending, or `failed` (`released_too_often`) past the bound on releases.
The rule is core's `decide_release`; this module applies it under the task lock, like a report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import Conflict, LeaseExpired
from devsched.core.events import TaskEvent
from devsched.core.health import DEVICE_FAULT, QUARANTINE_AFTER_DEFAULT, DeviceOutcome, is_device_fault
from devsched.core.leases import ReportKind, decide_release
from devsched.core.lifecycle import Trigger
from devsched.core.records import LeaseRef
from devsched.core.status import AttemptStatus, EndReason, EventKind, TaskStatus
from devsched.store import quarantine
from devsched.store.clock import Clock
from devsched.store.liveness import Rejected, touch_host
from devsched.store.outbox import Outbox
from devsched.store.rows import lock_task, named_attempt
from devsched.store.statuses import leaving
from devsched.store.views import ReleaseReceipt

#: The `reason` of the `requeued` event a release emits (an expiry's is `lease_expired`).
REQUEUED_REASON = EndReason.RELEASED.value

_END_ATTEMPT = text(
    f"""
    UPDATE attempts
    SET status = '{AttemptStatus.RELEASED.value}', end_reason = '{EndReason.RELEASED.value}', ended_at = :now,
        report_reason = :reason, result = CAST(:result AS jsonb)
    WHERE task_id = :task_id AND attempt = :attempt AND lease_id = :lease_id AND status = 'active'
    RETURNING device_id
    """
)

#: The task's `result` is the release's only when the release ends the task (cancelled, failed).
_MOVE_TASK = text(
    f"""
    UPDATE tasks
    SET status = :status, reason = :task_reason,
        result = CASE WHEN :ends THEN CAST(:result AS jsonb) ELSE result END,
        releases = releases + 1, updated_at = :now, event_seq = event_seq + 1,
        not_before = COALESCE(CAST(:not_before AS timestamptz), not_before),
        avoid_device_id = COALESCE(CAST(:avoid AS text), avoid_device_id)
    WHERE task_id = :task_id AND status IN {leaving(Trigger.RELEASE)}
    RETURNING event_seq
    """
)

_RECORDED_AT = text("SELECT ended_at FROM attempts WHERE task_id = :task_id AND attempt = :attempt")

#: The event of each status a release leads to.
_EVENT_OF = {
    TaskStatus.QUEUED: EventKind.REQUEUED,
    TaskStatus.CANCELLED: EventKind.CANCELLED,
    TaskStatus.FAILED: EventKind.FAILED,
}


async def release(
    conn: AsyncConnection,
    now: datetime,
    outbox: Outbox,
    ref: LeaseRef,
    reason: str | None,
    result: Mapping[str, Any] | None,
    clock: Clock,
    *,
    max_releases: int,
    quarantine_after: int = QUARANTINE_AFTER_DEFAULT,
) -> ReleaseReceipt | Rejected:
    """End the live lease's attempt as released and requeue (or cancel, or fail) its task.

    A release for a device fault (its reason starts with `device_fault`) counts against the device.

    An identical repeat is answered with the first release's `recorded_at` and the task's status now.
    """
    await touch_host(conn, ref.host_id, now)
    task = await lock_task(conn, ref.task_id)
    now = await clock.now(conn)  # after the lock: a lease that ran out while this waited is expired
    named, _ = await named_attempt(conn, task, ref.attempt)
    try:
        decision = decide_release(task, named, ref, now, max_releases=max_releases)
    except Conflict as exc:
        return Rejected(exc)
    if decision.kind is ReportKind.DUPLICATE:
        recorded = (await conn.execute(_RECORDED_AT, {"task_id": ref.task_id, "attempt": ref.attempt})).scalar_one()
        return ReleaseReceipt(ref.task_id, ref.attempt, task.status, recorded, duplicate=True)
    params = {
        "task_id": ref.task_id,
        "attempt": ref.attempt,
        "lease_id": ref.lease_id,
        "now": now,
        "reason": reason,
        "result": json.dumps(dict(result)) if result is not None else None,
    }
    device_id = (await conn.execute(_END_ATTEMPT, params)).scalar_one_or_none()
    if device_id is None:  # cannot happen under the task lock; the compare-and-set makes sure
        raise LeaseExpired()
    if is_device_fault(reason):
        await quarantine.record(
            conn, now, outbox, device_id, DeviceOutcome.INFRA_FAILURE, DEVICE_FAULT, threshold=quarantine_after
        )
    task_reason = decision.reason.value if decision.reason is not None else None
    seq = (
        await conn.execute(
            _MOVE_TASK,
            {
                **params,
                "status": decision.task_status.value,
                "task_reason": task_reason,
                "ends": decision.task_status is not TaskStatus.QUEUED,
                "not_before": decision.retry.not_before if decision.retry else None,
                "avoid": decision.retry.avoid_device_id if decision.retry else None,
            },
        )
    ).scalar_one()
    outbox.add(
        TaskEvent(
            event=_EVENT_OF[decision.task_status],
            task_id=ref.task_id,
            seq=seq,
            status=decision.task_status,
            at=now,
            attempt=ref.attempt,
            host_id=ref.host_id,
            device_id=device_id,
            reason=task_reason or REQUEUED_REASON,
        )
    )
    await outbox.flush(conn, now)
    return ReleaseReceipt(ref.task_id, ref.attempt, decision.task_status, now, duplicate=False)
