"""A submitted task placed on a free device it could use, in one statement after the submit's own.

In the submit's transaction (`Store.submit`, `assign_inline`): one statement looks at up to
`candidates.SUBMIT_DEVICES` free devices the new task could use and at the head of the queue
(`candidates.HEAD` tasks, by priority then age, the new task among them), takes the first pair of a
matching task and device in that order (the queue's, then the devices' as the loop orders them) whose task
and device no other transaction holds, locks both (SKIP LOCKED, checked again on the versions locked),
and applies it as a hand-over does (`pairing`). So a task ahead of the new one that matches one of those
devices takes it first, as the loop's greedy plan (`devsched.core.matching`) would; the new task then
waits for the loop's pass, which the outcome asks for.

One pair at most: a free device and a task it could take both queued is the loop's business, and only
arises while a pass is on its way. Locking a pair locks its task first: when the task is free but the
device is held, the task stays locked (unused) until the commit, and assigners that meet it skip it and
leave it to a pass. The partial unique indexes stay the last word, as in `assignment`.
"""

from __future__ import annotations

import json
import uuid

from devsched.core.events import AttemptAssigned
from devsched.core.records import Selector
from devsched.store import candidates, pairing
from devsched.store.assignment import Outcome
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.driver import Driver, Sql
from devsched.store.faults import point
from devsched.store.hosts import device_busy
from devsched.store.inline import INSERTED
from devsched.store.outbox import inserted
from devsched.store.views import OutboxMessage

#: Matching tasks of the head the statement may pair in turn when other transactions hold the first ones.
_CANDIDATES = 4 * candidates.SUBMIT_DEVICES

_PLACE = Sql(
    f"""
    WITH c AS MATERIALIZED (SELECT {NOW} AS now),
    {candidates.SUBMITTED_FREE},
    {candidates.QUEUE_HEAD},
    {candidates.MATCHED},
    -- the first pair still queued and free (checked again on the versions locked) that no other transaction
    -- holds; the task found by id: `IS TRUE` keeps the status a filter, never a scan of the status index,
    -- which a planner whose statistics lag behind the queue would otherwise choose
    chosen AS MATERIALIZED (
        SELECT t.task_id, t.attempt_count + 1 AS attempt, t.lease_ttl_s, t.plan, t.trace_headers, d.device_id,
               d.host_id
        FROM m JOIN f ON {candidates.matching("m", "f")}
             JOIN tasks t ON t.task_id = m.task_id
             JOIN devices d ON d.device_id = f.device_id
        WHERE (t.status IN {candidates.QUEUED}) IS TRUE AND d.registered AND NOT d.drained
          AND d.quarantined_at IS NULL
          AND NOT {device_busy("d")}
        -- a retried task prefers another device than the one it failed on, and takes that one if it is the only
        ORDER BY m.priority DESC, m.created_at, m.task_id, f.device_id IS NOT DISTINCT FROM m.avoid_device_id,
                 f.updated_at, f.device_id
        LIMIT 1
        FOR UPDATE OF t, d SKIP LOCKED
    ),
    -- the task and the device are locked, still queued and free, by this statement
    {pairing.apply("chosen", "chosen")}
    SELECT (SELECT count(*) FROM f) AS free, (SELECT task_id FROM moved) AS placed, {INSERTED} AS inserted
    """
)


async def place(
    db: Driver, clock: Clock, task_id: uuid.UUID, selector: Selector, written: list[OutboxMessage]
) -> Outcome:
    """The submitted `task_id` (queued in this transaction), or a task ahead of it, onto a free device.

    `written` receives the two outbox messages of an assignment. Settled when the new task was placed, or
    no device it could use is left free (there was none, or a task ahead took the only one); otherwise (a
    task ahead took one of several, others held them, the new task is past the head) the loop's pass may
    place it.
    """
    params = {
        "labels": json.dumps(dict(selector.labels)),
        "device_id": selector.device_id,
        "devices": candidates.SUBMIT_DEVICES,
        "scan": candidates.HEAD,
        "limit": _CANDIDATES,
        **pairing.params(),
        CLOCK_PARAM: clock.bound(),
    }
    row = await db.row(_PLACE, params)
    assert row is not None, "the statement returns one row"
    messages = inserted(row["inserted"])
    if messages:
        point("placement.after_reserve")  # the task and its reservation are written, not yet committed
    written += messages
    assigned = [m.event for m in messages if isinstance(m.event, AttemptAssigned)]
    left = row["free"] - len(assigned)
    return Outcome(assigned, settled=row["placed"] == task_id or left == 0)
