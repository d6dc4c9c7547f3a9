"""Granted lease requests in one statement each: renew, claim and report without a transaction around them.

Nearly every lease request is granted: a live lease renewed by its own host. Each function here runs one
statement that applies the request only where core would grant it (`devsched.core.leases`, whose
conditions `_granted` renders from core's constants), records the host's sign of life (when
`liveness.RecentSigns` says it is due) and writes the request's event, and returns what was granted; None
when the statement matched nothing. The caller then runs the locked path (`devsched.store.leasing`), which
runs the same statement under the task's lock, and where it still matches nothing, core's `decide_*` name
the conflict. A report's statement covers the plain report only (`_plain`); one that needs more (a retry,
a device's failure count, a health check's verdict) is the locked path's, which does the device's part and
then the same statement without that condition (`report_decided`). One statement is one round trip, where
the locked path takes four to ten; `tests/integration/store/test_grants.py` checks that they agree with
core on generated states.

Concurrency. A renewal without progress takes no task lock: it changes only the attempt's expiry, with a
compare-and-set on the attempt row, and every writer that ends a lease compares-and-sets that row too
(the sweeper re-checks the expiry, a report the status and lease): whichever writes first, the other's
conditions are evaluated again on the row it waited for, with the clock read again (`NOW`). Its
`cancel_requested` is as of the statement's start; a cancellation committed while it ran is on the next
renewal, which the cancellation's nudge makes immediate.

A claim, a renewal with progress and a report may change the task row and write an event (a renewal
only at a new step). They lock the task row first, in the locked path's order (host, task, attempt; the
host's row only when its sign of life is written, and only a statement that writes it waits for it), and
apply only if the task row they locked is the version their snapshot holds (`xmin`). Every writer of a
lease's state, of a cancellation request or of progress also updates the task row (it takes an event
number), so an unchanged task row means nothing the statement read from its snapshot changed before it
held the lock; otherwise nothing is applied and the locked path runs, with statements that see the
current rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from devsched.core.events import StepProgress, TaskEvent
from devsched.core.leases import (
    DISPATCHING,
    ENDED_TASK,
    LIVE_ATTEMPT,
    NEEDS_CANCEL_REQUEST,
    REPORT_TRIGGER,
    Extension,
)
from devsched.core.lifecycle import Trigger
from devsched.core.records import LeaseRef
from devsched.core.retrying import Retry
from devsched.core.status import EventKind, Outcome, TaskStatus
from devsched.core.timeouts import ATTEMPT_TIMEOUT, DEADLINE_EXCEEDED
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.driver import Driver, Row, Sql
from devsched.store.inline import (
    INSERTED,
    PLACEHOLDER_SEQ,
    PLACEHOLDER_TIME,
    Slot,
    event_params,
    insert_event,
    insert_events,
)
from devsched.store.liveness import TOUCH
from devsched.store.outbox import inserted
from devsched.store.statuses import entering, leaving, sql_list
from devsched.store.views import OutboxMessage, ReportReceipt


def _granted(lease_id: str = ":lease_id") -> str:
    """SQL over the named attempt `a` (`a.attempt = :attempt`) and its task `t`: none of core's conflicts.

    `_check_identity`: the attempt is the asking host's, the task's current one, with the lease named
    (`lease_id`, the parameter or a column of the renewals' list); `_check_live`: the task has not ended,
    the attempt is live and `NOW` is before its expiry.
    """
    return f"""
        a.host_id = :host_id AND a.lease_id = {lease_id} AND a.attempt = t.attempt_count
        AND t.status NOT IN {sql_list(ENDED_TASK)}
        AND a.status = '{LIVE_ATTEMPT.value}' AND {NOW} < a.expires_at
    """


#: Whether a cancellation was requested on the attempt `a`.
_CANCEL_REQUESTED = "EXISTS (SELECT 1 FROM cancel_requests c WHERE c.task_id = a.task_id AND c.attempt = a.attempt)"

#: Whether the host must stop the attempt `a` of task `t` for a time limit (`devsched.core.timeouts.stop_reason`).
_STOP = f"""CASE WHEN t.deadline <= {NOW} THEN '{DEADLINE_EXCEEDED}'
                 WHEN COALESCE(a.dispatched_at, a.assigned_at) + make_interval(secs => t.attempt_timeout_s) <= {NOW}
                 THEN '{ATTEMPT_TIMEOUT}' END"""

#: Referenced from the first row a statement reads, so the host row is locked before the task and attempt
#: rows (as in the locked path); a data-modifying CTE nobody references would run after the main query.
_AFTER_TOUCH = "(SELECT count(*) FROM touched) >= 0"

_EXTEND = f"{NOW} + make_interval(secs => t.lease_ttl_s)"


#: Whether a statement records the host's sign of life (`TOUCH`), which `liveness.RecentSigns` decides.
TOUCHING = (True, False)


def _renew_sql(*, touch: bool) -> str:
    """The lock-free renewal; `touch`: it records the host's sign of life too."""
    touched = f"WITH touched AS ({TOUCH} RETURNING 1)" if touch else ""
    after_touch = f"AND {_AFTER_TOUCH}" if touch else ""
    return f"""
    {touched}
    UPDATE attempts a SET expires_at = {_EXTEND}
    FROM tasks t
    WHERE a.task_id = :task_id AND a.attempt = :attempt AND t.task_id = a.task_id {after_touch}
      AND {_granted()}
    RETURNING a.expires_at, t.lease_ttl_s, {_CANCEL_REQUESTED} AS cancel_requested, {_STOP} AS stop
    """


#: By `touch`.
_RENEW = {touch: Sql(_renew_sql(touch=touch)) for touch in TOUCHING}


def _renewals_sql(*, touch: bool) -> str:
    """The lock-free renewal of several leases of one host: `_renew_sql` over a list.

    The attempt rows are locked in one order (task id, attempt), so two lists that share leases (a
    host's retry while its first request still runs) wait on each other instead of deadlocking.
    """
    touched = f"touched AS ({TOUCH} RETURNING 1)," if touch else ""
    after_touch = f"WHERE {_AFTER_TOUCH}" if touch else ""
    return f"""
    WITH {touched}
    r AS (
        SELECT * FROM unnest(CAST(:task_ids AS uuid[]), CAST(:attempts AS int[]), CAST(:lease_ids AS uuid[]))
            AS r(task_id, attempt, lease_id)
        {after_touch}
    ),
    held AS MATERIALIZED (
        SELECT a.task_id, a.attempt FROM attempts a JOIN r ON a.task_id = r.task_id AND a.attempt = r.attempt
        ORDER BY a.task_id, a.attempt
        FOR UPDATE OF a
    )
    UPDATE attempts a SET expires_at = {_EXTEND}
    FROM tasks t, r, held
    WHERE held.task_id = a.task_id AND held.attempt = a.attempt
      AND r.task_id = a.task_id AND r.attempt = a.attempt AND t.task_id = a.task_id
      AND {_granted("r.lease_id")}
    RETURNING a.task_id, a.attempt, a.expires_at, t.lease_ttl_s, {_CANCEL_REQUESTED} AS cancel_requested,
              {_STOP} AS stop
    """


#: By `touch`.
_RENEWALS = {touch: Sql(_renewals_sql(touch=touch)) for touch in TOUCHING}


#: What decides whether a report needs more than its task's and attempt's rows (`_plain`), as columns of a
#: task row.
_TASK_FLAGS = """retry IS NULL AS no_retry, kind = 'user' AS user_task,
               NOT jsonb_path_exists(plan, '$.steps[*] ? (@.infra == true)') AS no_infra"""


def _locked(*, touch: bool) -> str:
    """CTEs: the task row locked first (after the host's, with `touch`), and `seen`, its version.

    `seen` is the task row's version in the statement's snapshot (see the module doc).
    """
    touched = f"touched AS ({TOUCH} RETURNING 1)," if touch else ""
    after_touch = f"AND {_AFTER_TOUCH}" if touch else ""
    return f"""
    {touched}
    seen AS (SELECT xmin AS version FROM tasks WHERE task_id = :task_id),
    t AS MATERIALIZED (
        SELECT task_id, status, attempt_count, lease_ttl_s, deadline, attempt_timeout_s, {_TASK_FLAGS},
               xmin AS version
        FROM tasks
        WHERE task_id = :task_id {after_touch}
        FOR UPDATE
    )
    """


_LOCKED_ATTEMPT = "a.task_id = t.task_id AND a.attempt = :attempt AND t.version = seen.version"

#: The events a claim or a renewal may write, in this order: `dispatched` (a first claim), then `progress`
#: (a change of step), numbered consecutively up to the task's new `event_seq`.
_DISPATCHED_SLOT = Slot("dispatched", wanted="ext.dispatch", seq="moved.event_seq - CAST(ext.progressed AS int)")
_PROGRESS_SLOT = Slot("progress", wanted="ext.progressed", seq="moved.event_seq")


def _advance_sql(*, claim: bool, touch: bool) -> str:
    """A claim, or a renewal with progress, under the task's lock: what the locked path's `extend` does.

    The attempt's lease is extended and it keeps the progress sent (if any); a first claim moves the task
    to dispatched (`dispatch`), a change of step (`progressed`: the progress differs from the one the
    attempt held, read from the same snapshot the task row's version vouches for) takes the next event
    number, and each writes its event.
    """
    dispatch = f"t.status IN {sql_list(DISPATCHING)}" if claim else "FALSE"
    slots = [_DISPATCHED_SLOT, _PROGRESS_SLOT] if claim else [_PROGRESS_SLOT]
    events = insert_events("ext, moved", slots, at="moved.updated_at", device_id="ext.device_id", status="moved.status")
    return f"""
    WITH {_locked(touch=touch)},
    held AS (SELECT progress FROM attempts WHERE task_id = :task_id AND attempt = :attempt),
    ext AS (
        UPDATE attempts a
        SET expires_at = {_EXTEND},
            dispatched_at = CASE WHEN {dispatch} THEN COALESCE(a.dispatched_at, {NOW}) ELSE a.dispatched_at END,
            progress = COALESCE(CAST(:progress AS jsonb), a.progress)
        FROM t, seen, held
        WHERE {_LOCKED_ATTEMPT} AND {_granted()}
        RETURNING a.task_id, a.device_id, a.expires_at, t.lease_ttl_s, {dispatch} AS dispatch,
                  {_CANCEL_REQUESTED} AS cancel_requested, {_STOP} AS stop,
                  held.progress IS DISTINCT FROM COALESCE(CAST(:progress AS jsonb), held.progress) AS progressed
    ),
    moved AS (
        UPDATE tasks
        SET status = CASE WHEN ext.dispatch THEN {entering(Trigger.CLAIM)} ELSE tasks.status END,
            updated_at = {NOW},
            event_seq = tasks.event_seq + CAST(ext.dispatch AS int) + CAST(ext.progressed AS int)
        FROM ext WHERE tasks.task_id = ext.task_id AND (ext.dispatch OR ext.progressed)
        RETURNING tasks.event_seq, tasks.status, tasks.updated_at
    ),
    event AS ({events})
    SELECT ext.expires_at, ext.lease_ttl_s, ext.cancel_requested, ext.stop, ext.dispatch, {INSERTED} AS inserted
    FROM ext
    """


#: By `touch`.
_CLAIM = {touch: Sql(_advance_sql(claim=True, touch=touch)) for touch in TOUCHING}
_PROGRESS = {touch: Sql(_advance_sql(claim=False, touch=touch)) for touch in TOUCHING}


_REPORT_EVENT = insert_event(
    "ended, finished", at="ended.ended_at", seq="finished.event_seq", device_id="ended.device_id"
)


def _plain(outcome: Outcome) -> str:
    """SQL over a task row `t` with `_TASK_FLAGS`: a report of `outcome` ends its attempt and task, nothing more.

    Not so: a failure of a task with a retry policy may queue it again, a failing infra step counts against
    the device, a health task's outcome returns or keeps out its device. The locked path does the device's
    part and then the transition core decided (`leasing.report`, `report_decided`).
    """
    if outcome is Outcome.CANCELLED:
        return "TRUE"
    if outcome is Outcome.DONE:
        return "t.user_task"
    return "t.user_task AND t.no_retry AND t.no_infra"


#: By outcome: SQL reading task `:task_id`'s `plan` and `kind`, and whether a report of the outcome on it is
#: plain (`_plain`), as `plain`.
PLAIN: Mapping[Outcome, str] = {
    outcome: f"""SELECT t.plan, t.kind, {_plain(outcome)} AS plain
                 FROM (SELECT plan, kind, {_TASK_FLAGS} FROM tasks WHERE task_id = :task_id) t"""
    for outcome in Outcome
}


def _report_sql(outcome: Outcome, *, touch: bool, plain: bool = True, requeue: bool = False) -> str:
    """A report under the task's lock: the attempt ends with `outcome`, the task with it, and its event.

    `plain`: only where nothing else is due (`_plain`). Without it, the transition core decided for a report
    it accepted (the locked path, once it did the device's part): `requeue`, the retry it decided (the task
    queued again, not before `:not_before`, avoiding `:avoid`; it keeps its reason and result).
    """
    trigger = Trigger.REPORT_RETRY if requeue else REPORT_TRIGGER[outcome]
    status = outcome.attempt_status.value
    conditions = f"AND {_CANCEL_REQUESTED}" if outcome in NEEDS_CANCEL_REQUEST else ""
    if plain:
        conditions += f" AND {_plain(outcome)}"
    # a success resets its device's consecutive infrastructure failures (`devsched.store.quarantine`)
    healthy = (
        "healthy AS (UPDATE devices d SET infra_failures = 0 FROM ended"
        " WHERE d.device_id = ended.device_id AND d.infra_failures > 0),"
        if outcome is Outcome.DONE
        else ""
    )
    task = (
        "not_before = CAST(:not_before AS timestamptz), avoid_device_id = CAST(:avoid AS text)"
        if requeue
        else "reason = :reason, result = CAST(:result AS jsonb)"
    )
    return f"""
    WITH {_locked(touch=touch)},
    ended AS (
        UPDATE attempts a
        SET status = '{status}', end_reason = '{status}', ended_at = {NOW}, report_reason = :reason,
            result = CAST(:result AS jsonb)
        FROM t, seen
        WHERE {_LOCKED_ATTEMPT} AND {_granted()} AND t.status IN {leaving(trigger)} {conditions}
        RETURNING a.task_id, a.device_id, a.ended_at
    ),
    finished AS (
        UPDATE tasks SET status = {entering(trigger)}, {task},
                         updated_at = ended.ended_at, event_seq = tasks.event_seq + 1
        FROM ended WHERE tasks.task_id = ended.task_id
        RETURNING tasks.event_seq
    ),
    {healthy}
    event AS ({_REPORT_EVENT})
    SELECT ended.ended_at, {INSERTED} AS inserted FROM ended
    """


#: By outcome and `touch`.
_REPORT = {(outcome, touch): Sql(_report_sql(outcome, touch=touch)) for outcome in Outcome for touch in TOUCHING}
#: By outcome and whether core's decision queues the task again (under the lock: no sign of life to write).
_DECIDED = {
    (outcome, requeue): Sql(_report_sql(outcome, touch=False, plain=False, requeue=requeue))
    for outcome in Outcome
    for requeue in (False, True)
    if outcome is Outcome.FAILED or not requeue
}


def _params(ref: LeaseRef, now: datetime | None, **extra: Any) -> dict[str, Any]:
    """The lease's parameters, with `now` for `NOW` (a clock's `bound()`)."""
    return {
        "host_id": ref.host_id,
        "task_id": ref.task_id,
        "attempt": ref.attempt,
        "lease_id": ref.lease_id,
        CLOCK_PARAM: now,
        **extra,
    }


def _template(ref: LeaseRef, kind: EventKind, status: TaskStatus, **fields: Any) -> TaskEvent:
    """The request's event with what the statement fills in (seq, at, device) left as placeholders."""
    return TaskEvent(
        event=kind, task_id=ref.task_id, seq=PLACEHOLDER_SEQ, status=status, at=PLACEHOLDER_TIME, attempt=ref.attempt,
        host_id=ref.host_id, **fields,
    )  # fmt: skip


def _collect(row: Row | None, written: list[OutboxMessage] | None) -> None:
    """Add the outbox messages the statement of `row` inserted to `written` (when given)."""
    if row is not None and written is not None:
        written += inserted(row.get("inserted"))


def _extension(row: Row | None, written: list[OutboxMessage] | None) -> Extension | None:
    _collect(row, written)
    if row is None:
        return None
    dispatch = bool(row.get("dispatch", False))  # only a claim's statement says
    return Extension(
        row["expires_at"], row["lease_ttl_s"], row["cancel_requested"], dispatch=dispatch, stop=row["stop"]
    )


async def renew(
    db: Driver,
    clock: Clock,
    ref: LeaseRef,
    progress: Mapping[str, Any] | None,
    written: list[OutboxMessage] | None = None,
    *,
    touch: bool = True,
) -> Extension | None:
    """Extend a live lease by its ttl from the clock, if core grants it; None if not.

    One statement. Without `progress` (a periodic renewal), the lock-free one. With it (a step boundary,
    the retry of one whose reply was lost, or an older agent that repeats the progress it sent), the
    locked advance: the attempt keeps `progress`, and a new step is a `progress` event under the task's
    lock; unchanged progress only extends. `written`, here and below, receives the outbox messages the
    statement inserted (to publish them). `touch`, here and below: the statement records the host's sign
    of life (`liveness.RecentSigns` says when it may leave it out).
    """
    if progress is None:
        row = await db.row(_RENEW[touch], _params(ref, clock.bound()))
    else:
        params = _params(ref, clock.bound(), **_progress_params(ref, progress, _encoded(progress)))
        row = await db.row(_PROGRESS[touch], params)
    return _extension(row, written)


async def renewals(
    db: Driver, clock: Clock, host_id: str, refs: Sequence[LeaseRef], *, touch: bool = True
) -> dict[tuple[str, int], Extension]:
    """Extend each live lease of `refs` (all of `host_id`) that core grants, in one statement.

    Returns the grants by (task id as text, attempt); a lease missing from them was not granted (the locked path
    names why). No lease of another host is ever extended: the statement matches `host_id`'s attempts only.
    """
    params = {
        "host_id": host_id,
        "task_ids": [r.task_id for r in refs],
        "attempts": [r.attempt for r in refs],
        "lease_ids": [r.lease_id for r in refs],
        CLOCK_PARAM: clock.bound(),
    }
    return {
        (str(row["task_id"]), int(row["attempt"])): Extension(
            row["expires_at"], row["lease_ttl_s"], row["cancel_requested"], stop=row["stop"]
        )
        for row in await db.rows(_RENEWALS[touch], params)
    }


async def claim(
    db: Driver,
    clock: Clock,
    ref: LeaseRef,
    progress: Mapping[str, Any] | None = None,
    written: list[OutboxMessage] | None = None,
    *,
    touch: bool = True,
) -> Extension | None:
    """Start an assigned attempt (a `dispatched` event), or extend a dispatched one, if core grants it.

    With `progress`, it also does what a renewal carrying it would, in the same statement: the attempt
    keeps it, and a change of step is a `progress` event right after the `dispatched` one.
    """
    event = _template(ref, EventKind.DISPATCHED, TaskStatus.DISPATCHED)
    progressed = _progress_params(ref, progress, _encoded(progress))
    params = _params(ref, clock.bound(), **progressed, **event_params(event, _DISPATCHED_SLOT.name))
    return _extension(await db.row(_CLAIM[touch], params), written)


def _encoded(progress: Mapping[str, Any] | None) -> str | None:
    return json.dumps(dict(progress)) if progress is not None else None


def _progress_params(ref: LeaseRef, progress: Mapping[str, Any] | None, encoded: str | None) -> dict[str, Any]:
    """The parameters of `_advance_sql` for `progress` (None: the attempt keeps its own, and no event)."""
    if progress is None:
        return {"progress": None, **event_params(None, _PROGRESS_SLOT.name)}
    step = StepProgress(step=progress["step"], index=progress["index"], of=progress["of"])
    # the status is the task's, filled in by the statement
    event = _template(ref, EventKind.PROGRESS, TaskStatus.DISPATCHED, progress=step)
    return {"progress": encoded, **event_params(event, _PROGRESS_SLOT.name)}


async def report(
    db: Driver,
    clock: Clock,
    ref: LeaseRef,
    outcome: Outcome,
    reason: str | None,
    result: Mapping[str, Any] | None,
    written: list[OutboxMessage] | None = None,
    *,
    touch: bool = True,
) -> ReportReceipt | None:
    """Record the outcome of a live lease and end its task, if core grants it and nothing more is due (`_plain`).

    A repeat is never granted: the locked path answers it.
    """
    status = outcome.task_status
    event = _template(ref, EventKind(status.value), status, reason=reason)
    row = await db.row(_REPORT[outcome, touch], _report_params(ref, clock.bound(), reason, result, event))
    _collect(row, written)
    return None if row is None else ReportReceipt(ref.task_id, ref.attempt, status, row["ended_at"], False)


async def report_decided(
    db: Driver,
    now: datetime,
    ref: LeaseRef,
    outcome: Outcome,
    reason: str | None,
    result: Mapping[str, Any] | None,
    again: Retry | None,
    written: list[OutboxMessage] | None = None,
) -> ReportReceipt | None:
    """The report core accepted at `now` under the task's lock, as it decided: the task ends, or is queued `again`.

    The same statement as `report` without its `_plain` condition, judged at `now` (the time core decided
    with), so it matches exactly what core accepted; None would be a disagreement between the two.
    """
    if again is None:
        status = outcome.task_status
        event = _template(ref, EventKind(status.value), status, reason=reason)
        retry_params: dict[str, Any] = {}
    else:
        status = TaskStatus.QUEUED
        event = _template(ref, EventKind.REQUEUED, status, reason=again.cause.value)
        retry_params = {"not_before": again.not_before, "avoid": again.avoid_device_id}
    params = _report_params(ref, now, reason, result, event, **retry_params)
    row = await db.row(_DECIDED[outcome, again is not None], params)
    _collect(row, written)
    return None if row is None else ReportReceipt(ref.task_id, ref.attempt, status, row["ended_at"], False)


def _report_params(
    ref: LeaseRef,
    now: datetime | None,
    reason: str | None,
    result: Mapping[str, Any] | None,
    event: TaskEvent,
    **extra: Any,
) -> dict[str, Any]:
    """The parameters of `_report_sql`; `now` as in `_params`."""
    encoded = json.dumps(dict(result)) if result is not None else None
    return _params(ref, now, reason=reason, result=encoded, **event_params(event), **extra)
