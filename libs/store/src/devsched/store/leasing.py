"""Claim, renew and report: the owning host's side of a lease."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import Conflict, LeaseExpired
from devsched.core.events import TaskEvent
from devsched.core.health import HEALTH_CHECK_FAILED, QUARANTINE_AFTER_DEFAULT, outcome_of
from devsched.core.leases import Extension, ReportKind, decide_claim, decide_renew, decide_report
from devsched.core.lifecycle import Trigger
from devsched.core.records import LeaseRef
from devsched.core.retrying import failure_cause
from devsched.core.status import EventKind, Outcome, TaskStatus
from devsched.store import grants, quarantine
from devsched.store.clock import Clock
from devsched.store.driver import in_transaction
from devsched.store.liveness import Rejected, touch_host
from devsched.store.outbox import Outbox
from devsched.store.rows import lock_task, named_attempt
from devsched.store.statuses import IN_FLIGHT, entering, leaving
from devsched.store.views import OutboxMessage, ReportReceipt


async def extend(
    conn: AsyncConnection,
    now: datetime,
    written: list[OutboxMessage],
    ref: LeaseRef,
    *,
    claim: bool,
    clock: Clock,
    progress: Mapping[str, Any] | None = None,
) -> Extension | Rejected:
    """A claim or renewal the one statement did not grant, under the task's lock: grant it, or name why not.

    The grant is the same statement (`grants.claim`, `grants.renew`), run again while this transaction
    holds the task row: its optimistic check (the task row's version) cannot fail here, so a request
    that lost a race to another writer is granted now if core grants it. When it still matches nothing,
    core's `decide_*` name the conflict from the rows as locked, with the clock read after the statement
    (an expiry only moves further into the past). `written` receives the events the statement inserted.

    Raises:
        NotFound: no such task or host.
        RuntimeError: the statement refused what core grants (a bug: the two must agree).
    """
    await touch_host(conn, ref.host_id, now)
    task = await lock_task(conn, ref.task_id)
    db = await in_transaction(conn)
    grant_of = grants.claim if claim else grants.renew
    grant = await grant_of(db, clock, ref, progress, written, touch=False)
    if grant is not None:
        return grant
    named, _ = await named_attempt(conn, task, ref.attempt)
    decide = decide_claim if claim else decide_renew
    try:
        decide(task, named, ref, await clock.now(conn))
    except Conflict as exc:
        return Rejected(exc)
    raise RuntimeError(f"the {'claim' if claim else 'renewal'} statement refused a request core grants")


_END_ATTEMPT = text(
    """
    UPDATE attempts
    SET status = :status, end_reason = :status, ended_at = :now, report_reason = :reason,
        result = CAST(:result AS jsonb)
    WHERE task_id = :task_id AND attempt = :attempt AND lease_id = :lease_id AND status = 'active'
    RETURNING device_id
    """
)

_END_TASK = text(
    f"""
    UPDATE tasks
    SET status = :status, reason = :reason, result = CAST(:result AS jsonb), updated_at = :now,
        event_seq = event_seq + 1
    WHERE task_id = :task_id AND status IN {IN_FLIGHT}
    RETURNING event_seq
    """
)

_RECORDED_AT = text("SELECT ended_at FROM attempts WHERE task_id = :task_id AND attempt = :attempt")

#: A failed run the retry policy retries: the task waits out its backoff in the queue (keeping its place by
#: submit time), preferring another device; the failed attempt keeps the report's reason and result.
_REQUEUE_TASK = text(
    f"""
    UPDATE tasks
    SET status = {entering(Trigger.REPORT_RETRY)}, updated_at = :now, event_seq = event_seq + 1,
        not_before = :not_before, avoid_device_id = :avoid
    WHERE task_id = :task_id AND status IN {leaving(Trigger.REPORT_RETRY)}
    RETURNING event_seq
    """
)

_PLAN = text("SELECT plan, kind, health_device_id FROM tasks WHERE task_id = :task_id")


async def report(
    conn: AsyncConnection,
    now: datetime,
    outbox: Outbox,
    ref: LeaseRef,
    outcome: Outcome,
    reason: str | None,
    result: Mapping[str, Any] | None,
    clock: Clock,
    *,
    quarantine_after: int = QUARANTINE_AFTER_DEFAULT,
) -> ReportReceipt | Rejected:
    """Record the terminal outcome of the live lease, or answer an identical repeat with the first answer.

    The attempt's outcome is counted against its device (`devsched.store.quarantine`); a health task's
    outcome returns its device to service (done) or keeps it out (failed).
    """
    await touch_host(conn, ref.host_id, now)
    task = await lock_task(conn, ref.task_id)
    now = await clock.now(conn)  # after the lock: see `extend`
    named, cancel_for_attempt = await named_attempt(conn, task, ref.attempt)
    failure = cause = None
    own = (await conn.execute(_PLAN, {"task_id": ref.task_id})).one()
    if outcome is Outcome.FAILED:
        cause = failure_cause(own.plan, result, reason)
        failure = cause if task.retry is not None else None
    try:
        decision = decide_report(
            task, named, ref, outcome, now, cancel_requested_for_attempt=cancel_for_attempt, failure=failure
        )
    except Conflict as exc:
        return Rejected(exc)
    if decision.kind is ReportKind.DUPLICATE:
        recorded = (await conn.execute(_RECORDED_AT, {"task_id": ref.task_id, "attempt": ref.attempt})).scalar_one()
        return ReportReceipt(ref.task_id, ref.attempt, task.status, recorded, duplicate=True)
    params = {
        "task_id": ref.task_id,
        "attempt": ref.attempt,
        "lease_id": ref.lease_id,
        "now": now,
        "reason": reason,
        "result": json.dumps(dict(result)) if result is not None else None,
    }
    device_id = (
        await conn.execute(_END_ATTEMPT, {**params, "status": decision.attempt_status.value})
    ).scalar_one_or_none()
    if device_id is None:
        raise LeaseExpired()
    if own.kind == "health" and outcome is not Outcome.CANCELLED:
        if outcome is Outcome.DONE:
            await quarantine.return_device(conn, now, outbox, device_id, checked=True)
        else:
            await quarantine.quarantine(conn, now, outbox, device_id, HEALTH_CHECK_FAILED)
    elif outcome is not Outcome.CANCELLED:
        device = outcome_of(cause, done=outcome is Outcome.DONE)
        await quarantine.record(conn, now, outbox, device_id, device, str(cause), threshold=quarantine_after)
    if decision.retry is not None:
        again = decision.retry
        requeue = {"task_id": ref.task_id, "now": now, "not_before": again.not_before, "avoid": again.avoid_device_id}
        seq = (await conn.execute(_REQUEUE_TASK, requeue)).scalar_one()
        outbox.add(
            TaskEvent(
                event=EventKind.REQUEUED, task_id=ref.task_id, seq=seq, status=TaskStatus.QUEUED, at=now,
                attempt=ref.attempt, host_id=ref.host_id, device_id=device_id, reason=again.cause.value,
            )
        )  # fmt: skip
        await outbox.flush(conn, now)
        return ReportReceipt(ref.task_id, ref.attempt, TaskStatus.QUEUED, now, duplicate=False)
    seq = (await conn.execute(_END_TASK, {**params, "status": decision.task_status.value})).scalar_one()
    outbox.add(
        TaskEvent(
            event=EventKind(decision.task_status.value),
            task_id=ref.task_id,
            seq=seq,
            status=decision.task_status,
            at=now,
            attempt=ref.attempt,
            host_id=ref.host_id,
            device_id=device_id,
            reason=reason,
        )
    )
    await outbox.flush(conn, now)
    return ReportReceipt(ref.task_id, ref.attempt, decision.task_status, now, duplicate=False)
