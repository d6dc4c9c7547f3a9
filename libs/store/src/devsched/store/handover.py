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

import uuid

from devsched.core.events import AttemptAssigned
from devsched.store import candidates, pairing
from devsched.store.assignment import Outcome
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.driver import Driver, Sql
from devsched.store.faults import point
from devsched.store.hosts import device_busy
from devsched.store.inline import INSERTED
from devsched.store.outbox import inserted
from devsched.store.views import OutboxMessage

#: Matching tasks the statement may try in turn when other transactions hold the first ones (concurrent
#: reports all look at the same head); they are read from the head, and only the one taken is locked.
_CANDIDATES = 16

_HAND_OVER = Sql(
    f"""
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
          AND NOT {device_busy("d")}
        FOR UPDATE OF d SKIP LOCKED
    ),
    {candidates.QUEUE_HEAD},
    {candidates.MATCHED},
    -- the first of those still queued (checked again on the version locked) that no other transaction
    -- holds; found by id: `IS TRUE` keeps the status a filter, never a scan of the status index, which a
    -- planner whose statistics lag behind the queue would otherwise choose
    chosen AS MATERIALIZED (
        SELECT t.task_id, t.attempt_count + 1 AS attempt, t.lease_ttl_s, t.plan, t.trace_headers
        FROM m JOIN tasks t ON t.task_id = m.task_id
        WHERE (t.status IN {candidates.QUEUED}) IS TRUE
        ORDER BY m.priority DESC, m.created_at, m.task_id
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED
    ),
    -- the task is locked, still queued, by this statement
    {pairing.apply("chosen, f", "f")}
    -- how much of the queue was looked at matters only when the device was there and nothing matched
    SELECT EXISTS (SELECT FROM free) AS free, EXISTS (SELECT FROM f) AS locked, EXISTS (SELECT FROM m) AS matched,
           CASE WHEN EXISTS (SELECT FROM f) AND NOT EXISTS (SELECT FROM m) THEN (SELECT count(*) FROM head) END AS seen,
           {INSERTED} AS inserted
    """
)


async def hand_over(
    db: Driver, clock: Clock, task_id: uuid.UUID, attempt: int, written: list[OutboxMessage]
) -> Outcome:
    """The device that attempt `attempt` of `task_id` held (ended in this transaction) to the next queued task.

    `written` receives the two outbox messages of an assignment. Not settled when another transaction
    holds the device or the tasks it matched, or when the head of the queue held no match and is not the
    whole queue: the loop's pass may then find what this did not.
    """
    params = {
        "task_id": task_id,
        "attempt": attempt,
        "scan": candidates.HEAD,
        "limit": _CANDIDATES,
        **pairing.params(),
        CLOCK_PARAM: clock.bound(),
    }
    row = await db.row(_HAND_OVER, params)
    assert row is not None, "the statement returns one row"
    messages = inserted(row["inserted"])
    if messages:
        point("handover.after_reserve")  # the report and the reservation are written, not yet committed
    written += messages
    assigned = [m.event for m in messages if isinstance(m.event, AttemptAssigned)]
    if assigned or not row["free"]:
        return Outcome(assigned, settled=True)  # the device took work, or may not take any
    if not row["locked"] or row["matched"]:
        return Outcome([], settled=False)  # another transaction holds the device, or every task it matched
    return Outcome([], settled=row["seen"] < candidates.HEAD)  # nothing matched: was that the whole queue?
