"""Claim, renew and report: the owning host's side of a lease."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import Conflict
from devsched.core.health import HEALTH_CHECK_FAILED, QUARANTINE_AFTER_DEFAULT, outcome_of
from devsched.core.leases import Extension, ReportKind, decide_claim, decide_renew, decide_report
from devsched.core.records import LeaseRef
from devsched.core.retrying import failure_cause
from devsched.core.status import Outcome, TaskKind
from devsched.store import grants, quarantine
from devsched.store.clock import Clock
from devsched.store.driver import in_transaction
from devsched.store.liveness import Rejected, touch_host
from devsched.store.outbox import Outbox
from devsched.store.rows import lock_task, named_attempt
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


#: By outcome: the task's plan and kind, and whether the report is plain (`grants.PLAIN`).
_PLAN = {outcome: text(sql) for outcome, sql in grants.PLAIN.items()}

_RECORDED_AT = text("SELECT ended_at FROM attempts WHERE task_id = :task_id AND attempt = :attempt")


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
    """A report the one statement did not grant, under the task's lock: grant it, or answer a repeat or a conflict.

    First the grant's own statement (`grants.report`), run again while this transaction holds the task row,
    as in `extend`. It covers the plain report only, on purpose; when it matches nothing, core's
    `decide_report` names the conflict or recognises an identical repeat (answered with the first answer)
    from the rows as locked. A report core accepts here is one that needs more (`grants.PLAIN` says which):
    its device's part is done first (a health task's outcome returns its device to service or keeps it out;
    another's counts against the device, `devsched.store.quarantine`), then the transition core decided, in
    the same statement without its plain condition (`grants.report_decided`): the task ends, or its retry
    policy queues it again.

    Raises:
        NotFound: no such task or host.
        RuntimeError: the statements refused what core accepts (a bug: they must agree).
    """
    await touch_host(conn, ref.host_id, now)
    task = await lock_task(conn, ref.task_id)
    db = await in_transaction(conn)
    written: list[OutboxMessage] = []
    receipt = await grants.report(db, clock, ref, outcome, reason, result, written, touch=False)
    if receipt is not None:
        outbox.took(written)
        return receipt
    now = await clock.now(conn)  # after the statement: see `extend`
    named, cancel_for_attempt = await named_attempt(conn, task, ref.attempt)
    failure = cause = None
    own = (await conn.execute(_PLAN[outcome], {"task_id": ref.task_id})).one()
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
    if named is None or own.plain:
        raise RuntimeError("the report statement refused a report core accepts")
    # not plain: a health task's done or failed, or another task's failure (a cancelled report is plain). The
    # device's row is locked before the attempt's here; whoever holds an attempt's row without the task's
    # (a renewal) waits for no device.
    device_id = named.device_id
    if own.kind == TaskKind.HEALTH.value:
        if outcome is Outcome.DONE:
            await quarantine.return_device(conn, now, outbox, device_id, checked=True)
        else:
            await quarantine.quarantine(conn, now, outbox, device_id, HEALTH_CHECK_FAILED)
    else:
        device = outcome_of(cause, done=outcome is Outcome.DONE)
        await quarantine.record(conn, now, outbox, device_id, device, str(cause), threshold=quarantine_after)
    await outbox.flush(conn, now)
    await outbox.write(conn, now)  # the device's events before the report's, as they happened
    receipt = await grants.report_decided(db, now, ref, outcome, reason, result, decision.retry, written)
    if receipt is None:
        raise RuntimeError("the report statement refused the transition core decided")
    outbox.took(written)
    return receipt
