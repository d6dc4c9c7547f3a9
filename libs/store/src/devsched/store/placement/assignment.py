"""Assignment: queued tasks, by priority then age, onto free matching devices of online hosts.

`assign` is the assignment loop's batched pass over every free device. The requests assign one pair each
in a statement of their own, in their transactions, so that the common case costs no transaction of its
own: the device a report frees (`handover`), a submitted task (`placement`); each says whether it was
conclusive, and when it was not the caller leaves the rest to the loop's pass (`Outcome`).

Safe with any number of concurrent assigners: free devices and queued tasks are read without locks,
matched, and only the chosen ones locked with SKIP LOCKED (a pair another assigner took meanwhile is
dropped and the rest matched again), so assigners never wait on each other and one that finds nothing
holds nothing; the partial unique index on the active attempts' devices (an active attempt is its device's
reservation) is the last word if two ever pick one device (the loser's transaction runs again).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.events import AttemptAssigned
from devsched.core.ids import new_lease_id
from devsched.core.matching import plan_assignments
from devsched.core.records import DeviceRecord, QueuedTask, Selector
from devsched.store.clock import Clock
from devsched.store.faults import point
from devsched.store.hosts import device_busy
from devsched.store.inline import INSERTED
from devsched.store.outbox import Outbox, inserted
from devsched.store.placement import candidates, pairing

#: Rounds of choosing again when another assigner locked a chosen device or task first.
_ROUNDS = 3

_QUEUED = candidates.QUEUED


#: The chosen devices and tasks, locked; those another transaction holds (or took meanwhile) are left out.
#: Busy is checked again, as of this statement: a device another assigner took since it was read is skipped
#: here rather than failing the insert of its attempt (and the whole transaction) later.
_LOCK = text(
    f"""
    WITH d AS (
        SELECT d.device_id FROM devices d
        WHERE d.device_id = ANY(CAST(:device_ids AS text[])) AND d.registered AND NOT d.drained
          AND d.quarantined_at IS NULL
          AND NOT {device_busy("d")}
        FOR UPDATE OF d SKIP LOCKED
    ),
    t AS (
        SELECT task_id FROM tasks
        WHERE task_id = ANY(CAST(:task_ids AS uuid[])) AND (status IN {_QUEUED}) IS TRUE
        FOR UPDATE SKIP LOCKED
    )
    SELECT d.device_id, NULL::uuid AS task_id FROM d
    UNION ALL
    SELECT NULL, t.task_id FROM t
    """
)

#: The new attempts (each its device's reservation), the tasks' move to `assigned` and their events, in one
#: statement: the pairing's (`pairing.apply`, as a hand-over and a placement apply theirs), over the pairs the
#: pass chose and locked (the tasks found by id, still queued: this transaction holds them). Here and in
#: `_LOCK`, `IS TRUE` keeps the status a filter, never a scan of the status index, which a planner whose
#: statistics lag behind the queue would otherwise choose (and read every queued task's entry). The clock is
#: the one read after the locks.
_APPLY = text(
    f"""
    WITH c AS MATERIALIZED (SELECT CAST(:now AS timestamptz) AS now),
    chosen AS MATERIALIZED (
        SELECT t.task_id, t.attempt_count + 1 AS attempt, u.lease_id, u.host_id, u.device_id, t.lease_ttl_s, t.plan,
               t.trace_headers, u.n
        FROM unnest(CAST(:task_ids AS uuid[]), CAST(:lease_ids AS uuid[]), CAST(:host_ids AS text[]),
                    CAST(:device_ids AS text[])) WITH ORDINALITY AS u(task_id, lease_id, host_id, device_id, n)
        JOIN tasks t ON t.task_id = u.task_id
        WHERE (t.status IN {_QUEUED}) IS TRUE
    ),
    {pairing.apply("chosen", "chosen", lease="chosen.lease_id", order="chosen.n")}
    SELECT (SELECT count(*) FROM moved) AS moved, {INSERTED} AS inserted
    """
)


def _device(row: Any) -> DeviceRecord:
    return DeviceRecord(row.device_id, row.host_id, row.labels)


def _queued(row: Any) -> QueuedTask:
    selector = Selector(labels=row.selector_labels, device_id=row.selector_device_id)
    return QueuedTask(row.task_id, selector, row.avoid_device_id)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an assignment did: the new attempts, and whether it was the last word.

    `settled` is False when an assignment pass may still find work this one did not take: devices or
    tasks it could not lock, a queue longer than it looked at, free devices it did not look at.
    """

    assigned: list[AttemptAssigned]
    settled: bool


async def _choose(
    conn: AsyncConnection, queued: list[QueuedTask], free: list[DeviceRecord]
) -> tuple[list[tuple[QueuedTask, DeviceRecord]], bool]:
    """Plan, then lock the chosen devices and tasks; plan again without those another assigner took first.

    Returns the locked (task, device) pairs, and whether every device and task it chose could be locked.
    """
    chosen: list[tuple[QueuedTask, DeviceRecord]] = []
    held_devices: set[str] = set()
    held_tasks: set[uuid.UUID] = set()
    complete = True
    for _ in range(_ROUNDS):
        plan = plan_assignments(queued, free)
        if not plan:
            break
        devices = [d.device_id for _, d in plan if d.device_id not in held_devices]
        tasks = [t.task_id for t, _ in plan if t.task_id not in held_tasks]
        for row in (await conn.execute(_LOCK, {"device_ids": devices, "task_ids": tasks})).all():
            if row.device_id is not None:
                held_devices.add(row.device_id)
            else:
                held_tasks.add(row.task_id)
        paired = [(t, d) for t, d in plan if d.device_id in held_devices and t.task_id in held_tasks]
        chosen += paired
        if len(paired) == len(plan):
            break
        complete = False
        # what is chosen is done; what another transaction holds is out; the rest is planned again
        lost_devices = {d.device_id for _, d in plan if d.device_id not in held_devices}
        lost_tasks = {t.task_id for t, _ in plan if t.task_id not in held_tasks}
        used = {d.device_id for _, d in paired}
        placed = {t.task_id for t, _ in paired}
        queued = [t for t in queued if t.task_id not in lost_tasks and t.task_id not in placed]
        free = [d for d in free if d.device_id not in lost_devices and d.device_id not in used]
    return chosen, complete


async def _apply(
    conn: AsyncConnection, outbox: Outbox, chosen: list[tuple[QueuedTask, DeviceRecord]], clock: Clock
) -> list[AttemptAssigned]:
    """Create the chosen attempts and reservations, move the tasks to `assigned`, record the events.

    The attempts' `assigned_at` and expiry come from the clock read after the device and task locks, so
    a device's new attempt never starts before the end its previous one recorded.
    """
    if not chosen:
        return []
    now = await clock.now(conn)
    row = (
        await conn.execute(
            _APPLY,
            {
                "task_ids": [task.task_id for task, _ in chosen],
                "lease_ids": [new_lease_id() for _ in chosen],
                "host_ids": [device.host_id for _, device in chosen],
                "device_ids": [device.device_id for _, device in chosen],
                "now": now,
                **pairing.params(),
            },
        )
    ).one()
    point("assign.after_reserve")  # the reservations are written, not yet committed
    if row.moved != len(chosen):  # a task moved under our lock: impossible unless the schema changed
        raise RuntimeError("assignment lost a task it had locked")
    messages = inserted(row.inserted)
    outbox.took(messages)
    return [m.event for m in messages if isinstance(m.event, AttemptAssigned)]


async def assign(
    conn: AsyncConnection, now: datetime, outbox: Outbox, *, limit: int, device_limit: int, clock: Clock
) -> Outcome:
    """The loop's pass: up to `limit` queued tasks onto any of up to `device_limit` free devices."""
    free = [_device(r) for r in (await conn.execute(candidates.ALL_FREE, {"now": now, "limit": device_limit})).all()]
    if not free:
        return Outcome([], settled=True)
    subsets, wide = candidates.label_keys(free)
    params = {
        "subsets": subsets, "wide": wide, "device_ids": [d.device_id for d in free], "limit": limit, "now": now,
    }  # fmt: skip
    rows = (await conn.execute(candidates.CANDIDATES, params)).all()
    chosen, complete = await _choose(conn, [_queued(r) for r in rows], free)
    assigned = await _apply(conn, outbox, chosen, clock)
    # a full batch may leave more to do; so may tasks another assigner held
    return Outcome(assigned, settled=complete and len(assigned) < limit)
