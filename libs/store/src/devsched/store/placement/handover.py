"""The device a report frees, handed to the next queued task it can run, in one statement.

Right after a report's own statement, in its transaction (`Store.report`, `assign_inline`): one statement
locks the device, takes the first queued task of the head of the queue (`candidates.HEAD` tasks, by
priority then age) that the device matches, locks it, moves it to `assigned` with its new attempt, lease
and reservation, and inserts the `assigned` event and the `AttemptAssigned` message into the outbox itself
(`devsched.store.inline`). Where `assignment` plans in Python and locks what it chose in a second
statement, one device needs no plan: the first matching task it can lock is the one the loop would give it.

Concurrency as in `assignment`: the device and the task are locked with SKIP LOCKED, so a report never waits
for another assigner, and the rows are checked again on the version it locked (a drain, or an assignment
committed since the statement began, takes them out). What another transaction holds is left to the loop's
pass (`Outcome.settled` False); the partial unique indexes stay the last word.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime

from devsched.core.events import AttemptAssigned
from devsched.core.status import AttemptStatus
from devsched.core.timeouts import ATTEMPT_TIMEOUT, DEADLINE_EXCEEDED
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.driver import Driver, Sql
from devsched.store.eventrows import iso_time
from devsched.store.faults import point
from devsched.store.hosts import device_busy
from devsched.store.inline import INSERTED
from devsched.store.outbox import inserted
from devsched.store.placement import candidates, pairing
from devsched.store.placement.assignment import Outcome
from devsched.store.views import Handed, OutboxMessage

_ACTIVE = AttemptStatus.ACTIVE.value

#: Matching tasks the statement may try in turn when other transactions hold the first ones (concurrent
#: reports all look at the same head); they are read from the head, and only the one taken is locked.
_CANDIDATES = 16


def _hand_over_sql(*, dispatch: bool) -> str:
    handed = (
        f"""(SELECT CAST(json_build_object('task_id', task_id, 'attempt', attempt, 'device_id', device_id,
                      'plan', plan, 'ttl_s', lease_ttl_s, 'expires_at', {iso_time("expires_at")}, 'stop', stop)
                      AS text) FROM moved)"""
        if dispatch
        else "NULL"
    )
    # handed to the reporting host only while the device is still that host's (a device registered by
    # another host meanwhile is left to the loop)
    own = (
        "\n          AND d.host_id = (SELECT a.host_id FROM attempts a WHERE a.task_id = :task_id"
        " AND a.attempt = :attempt)"
        if dispatch
        else ""
    )
    return f"""
    WITH c AS MATERIALIZED (SELECT {NOW} AS now),
    -- the device the attempt held, if it may take work (read as the statement began)
    free AS MATERIALIZED (
        SELECT d.device_id
        FROM devices d JOIN hosts h ON h.host_id = d.host_id, c
        WHERE d.device_id = (SELECT a.device_id FROM attempts a WHERE a.task_id = :task_id AND a.attempt = :attempt)
          AND {candidates.free("c.now")}
    ),
    -- and locked, checked again on the version locked; none when another transaction holds it
    f AS MATERIALIZED (
        SELECT d.device_id, d.host_id, d.labels FROM devices d
        WHERE d.device_id = (SELECT device_id FROM free) AND d.registered AND NOT d.drained
          AND d.quarantined_at IS NULL
          AND NOT {device_busy("d")}{own}
        FOR UPDATE OF d SKIP LOCKED
    ),
    {candidates.QUEUE_HEAD},
    {candidates.MATCHED},
    -- the first of those still queued (checked again on the version locked) that no other transaction
    -- holds; found by id: `IS TRUE` keeps the status a filter, never a scan of the status index, which a
    -- planner whose statistics lag behind the queue would otherwise choose
    chosen AS MATERIALIZED (
        SELECT t.task_id, t.attempt_count + 1 AS attempt, t.lease_ttl_s, t.plan, t.trace_headers, t.deadline
        FROM m JOIN tasks t ON t.task_id = m.task_id
        WHERE (t.status IN {candidates.QUEUED}) IS TRUE
        ORDER BY m.priority DESC, m.created_at, m.task_id
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED
    ),
    -- the task is locked, still queued, by this statement
    {pairing.apply("chosen, f", "f", dispatch=dispatch)}
    -- how much of the queue was looked at matters only when the device was there and nothing matched
    SELECT EXISTS (SELECT FROM free) AS free, EXISTS (SELECT FROM f) AS locked, EXISTS (SELECT FROM m) AS matched,
           CASE WHEN EXISTS (SELECT FROM f) AND NOT EXISTS (SELECT FROM m) THEN (SELECT count(*) FROM head) END AS seen,
           {INSERTED} AS inserted, {handed} AS handed
    """


#: The hand-over, and the hand-over straight to the reporting host (`take_next`: dispatched, no assignment message).
_HAND_OVER = Sql(_hand_over_sql(dispatch=False))
_HAND_OVER_DISPATCHED = Sql(_hand_over_sql(dispatch=True))

#: A duplicate report's hand-over: the attempt its first answer handed to the host, while it is live. The
#: attempt handed over is the first on the device assigned once the report's attempt ended (by the
#: statement after the report's, in its transaction), dispatched as it was assigned (a claim dispatches
#: later, in a statement of its own) and the reporting host's. Its `ttl_s` is what is left of the lease
#: (whole seconds, at least one): the host's lease clock counts from this answer's request, so it must
#: not count a whole ttl from there.
_HANDED_AGAIN = Sql(
    f"""
    WITH e AS (
        SELECT device_id, host_id, ended_at FROM attempts
        WHERE task_id = :task_id AND attempt = :attempt AND host_id = :host_id AND ended_at IS NOT NULL
    ),
    -- the device's active attempt (none ended while it ran), if no other came between (read on the
    -- device's index: one assigned after the report ended after it)
    following AS (
        SELECT a.* FROM attempts a, e
        WHERE a.device_id = e.device_id AND a.ended_at IS NULL AND a.assigned_at >= e.ended_at
          AND NOT EXISTS (
              SELECT 1 FROM attempts b
              WHERE b.device_id = e.device_id AND b.ended_at >= e.ended_at AND b.assigned_at >= e.ended_at
                AND b.assigned_at <= a.assigned_at AND NOT (b.task_id = :task_id AND b.attempt = :attempt))
    )
    SELECT a.task_id, a.attempt, a.lease_id, a.device_id, t.plan, a.expires_at,
           CAST(floor(extract(epoch FROM a.expires_at - {NOW})) AS int) AS ttl_s,
           EXISTS (SELECT 1 FROM cancel_requests r WHERE r.task_id = a.task_id AND r.attempt = a.attempt)
               AS cancel_requested,
           CASE WHEN t.deadline <= {NOW} THEN '{DEADLINE_EXCEEDED}'
                WHEN a.dispatched_at + make_interval(secs => t.attempt_timeout_s) <= {NOW}
                THEN '{ATTEMPT_TIMEOUT}' END AS stop
    FROM following a
    JOIN e ON a.host_id = e.host_id
    JOIN tasks t ON t.task_id = a.task_id AND t.attempt_count = a.attempt
    WHERE a.status = '{_ACTIVE}' AND a.dispatched_at = a.assigned_at AND a.expires_at >= {NOW} + interval '1 second'
    """
)


async def hand_over(
    db: Driver,
    clock: Clock,
    task_id: uuid.UUID,
    attempt: int,
    written: list[OutboxMessage],
    *,
    dispatch: bool = False,
) -> tuple[Outcome, Handed | None]:
    """The device that attempt `attempt` of `task_id` held (ended in this transaction) to the next queued task.

    `written` receives the outbox messages of an assignment. Not settled when another transaction holds
    the device or the tasks it matched, or when the head of the queue held no match and is not the whole
    queue: the loop's pass may then find what this did not. With `dispatch`, the attempt is handed to the
    device's host already dispatched (see `pairing`), and returned for the report's reply.
    """
    params = {
        "task_id": task_id,
        "attempt": attempt,
        "scan": candidates.HEAD,
        "limit": _CANDIDATES,
        **(pairing.dispatch_params() if dispatch else pairing.params()),
        CLOCK_PARAM: clock.bound(),
    }
    row = await db.row(_HAND_OVER_DISPATCHED if dispatch else _HAND_OVER, params)
    assert row is not None, "the statement returns one row"
    messages = inserted(row["inserted"])
    if messages:
        point("handover.after_reserve")  # the report and the reservation are written, not yet committed
    written += messages
    assigned = [m.event for m in messages if isinstance(m.event, AttemptAssigned)]
    handed = _handed(row["handed"], params["lease_id"])
    if assigned or handed is not None or not row["free"]:
        return Outcome(assigned, settled=True), handed  # the device took work, or may not take any
    if not row["locked"] or row["matched"]:
        return Outcome([], settled=False), None  # another transaction holds the device, or every task it matched
    return Outcome([], settled=row["seen"] < candidates.HEAD), None  # nothing matched: was that the whole queue?


def _handed(text: str | None, lease_id: uuid.UUID) -> Handed | None:
    if text is None:
        return None
    h = json.loads(text)
    return Handed(
        task_id=uuid.UUID(h["task_id"]), attempt=h["attempt"], lease_id=lease_id, device_id=h["device_id"],
        plan=h["plan"], ttl_s=h["ttl_s"], expires_at=datetime.fromisoformat(h["expires_at"]), stop=h["stop"],
    )  # fmt: skip


async def handed_again(db: Driver, clock: Clock, host_id: str, task_id: uuid.UUID, attempt: int) -> Handed | None:
    """For a duplicate report: the attempt the first one handed to `host_id`, if still to run (`_HANDED_AGAIN`)."""
    params = {"host_id": host_id, "task_id": task_id, "attempt": attempt, CLOCK_PARAM: clock.bound()}
    row = await db.row(_HANDED_AGAIN, params)
    if row is None:
        return None
    plan = row["plan"]
    return Handed(
        task_id=row["task_id"], attempt=row["attempt"], lease_id=row["lease_id"], device_id=row["device_id"],
        plan=json.loads(plan) if isinstance(plan, str) else plan, ttl_s=row["ttl_s"], expires_at=row["expires_at"],
        cancel_requested=row["cancel_requested"], stop=row["stop"],
    )  # fmt: skip
