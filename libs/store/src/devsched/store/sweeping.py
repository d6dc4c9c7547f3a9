"""The lease sweep: end expired attempts and requeue, fail or cancel their tasks.

Safe with several sweepers and with racing reports: tasks are locked with SKIP LOCKED, re-read after
the lock, and the attempt is ended by a compare-and-set that re-checks, at write time, that it is still
active and expired (River's issue 1302: a sweeper that trusted its earlier read overwrote a report).

A batch is four statements whatever its size: the candidates locked; their attempts ended with their tasks
re-read (one statement, after the locks); their devices locked and read (`devsched.store.quarantine`), whose
failures core's rule counts; the decisions (core's `decide_expiry`, per task) applied with the events
(rendered by SQL from a template event) and the devices' counts and grace, in one statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.events import TaskEvent
from devsched.core.expiry import ExpiryDecision, decide_expiry
from devsched.core.records import TaskRecord
from devsched.core.status import AttemptStatus, EndReason, EventKind, TaskStatus
from devsched.store import quarantine
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.eventrows import filled
from devsched.store.faults import point
from devsched.store.inline import INSERTED, PLACEHOLDER_ID, PLACEHOLDER_SEQ, event_params
from devsched.store.outbox import Outbox, inserted
from devsched.store.rows import task_columns, task_record
from devsched.store.statuses import IN_FLIGHT
from devsched.store.views import ExpiredLease

#: Any `limit` of the expired leases, not the oldest first: the expiry is not indexed (renewals are HOT
#: updates, migration 0013), so an order would read and sort every active attempt for each batch, where
#: this stops at the `limit`-th it finds; a pass ends every expired lease anyway, batch after batch.
#: Each task is looked up (and locked) by its id, one at a time (the `OFFSET 0` keeps the lookup its own
#: step): joined, the planner merged the active attempts with every task in id order, so that each batch
#: read again all the tasks the earlier batches had ended (9,000 rows to lock the last 500 of 10,000).
_CANDIDATES = text(
    """
    SELECT t.task_id
    FROM attempts a
    CROSS JOIN LATERAL (SELECT t.task_id FROM tasks t
                        WHERE t.task_id = a.task_id AND t.attempt_count = a.attempt
                        OFFSET 0 FOR UPDATE SKIP LOCKED) AS t
    WHERE a.status = 'active' AND a.expires_at <= :now
    LIMIT :limit
    """
)

#: After the locks, in a statement of its own (a fresh snapshot: see `devsched.store.rows`): read the clock once,
#: end the attempts still active and expired at it (the compare-and-set: a renewal or report that committed
#: first wins, its row re-checked after the wait) and return their tasks as they were read.
_EXPIRE = text(
    f"""
    WITH c AS MATERIALIZED (SELECT {NOW} AS now)
    UPDATE attempts a SET status = 'expired', end_reason = 'lease_expired', ended_at = c.now
    FROM c, tasks t
    WHERE t.task_id = ANY(CAST(:ids AS uuid[])) AND a.task_id = t.task_id AND a.attempt = t.attempt_count
      AND a.status = '{AttemptStatus.ACTIVE.value}' AND a.expires_at <= c.now
    RETURNING c.now, {task_columns(f"'{AttemptStatus.ACTIVE.value}'")}
    """
)


#: Chubby's lock-delay: the agent that lost the lease may still be running a step on the device.
_GRACE = """
    grace AS (
        UPDATE devices d SET available_after = GREATEST(COALESCE(d.available_after, g.until), g.until)
        FROM (SELECT device, max(CAST(:now AS timestamptz) + make_interval(secs => grace)) AS until
              FROM u GROUP BY device) AS g
        WHERE d.device_id = g.device
    ),
"""


#: What `_end` fills in of each task's event (the template gives `at`).
_FILLED = filled(
    TaskEvent, event="u.kind", task_id="e.task_id", seq="e.event_seq", status="u.s", attempt="u.n", host_id="u.host",
    device_id="u.device", reason="u.why",
)  # fmt: skip


def _end(*, returning: bool, devices: str) -> str:
    """SQL: each task's decision applied, its device kept out of use for its grace, its event written.

    The event is the outbox row of a template event (`event_row`) with each task's fields filled in, in the
    order given. `returning`: the rows written are read back (the sweeper's role may not read the outbox);
    `devices`: what is written to the devices here: `grace` (their grace, from each task's), or `counted`
    (their failure counts with their grace, `quarantine.Failures`).
    """
    written = {"grace": _GRACE, "counted": f"counted AS ({quarantine.COUNTED}),"}[devices]
    back = "RETURNING id, kind, data, headers" if returning else ""
    return f"""
    WITH u AS (
        SELECT * FROM unnest(CAST(:task_ids AS uuid[]), CAST(:statuses AS text[]), CAST(:reasons AS text[]),
                             CAST(:not_before AS timestamptz[]), CAST(:avoid AS text[]), CAST(:kinds AS text[]),
                             CAST(:why AS text[]), CAST(:attempts AS int[]), CAST(:hosts AS text[]),
                             CAST(:devices AS text[]), CAST(:grace AS float8[]))
                 WITH ORDINALITY AS u(id, s, r, nb, av, kind, why, n, host, device, grace, o)
    ),
    ended AS (
        UPDATE tasks t SET status = u.s, reason = u.r, updated_at = :now, event_seq = t.event_seq + 1,
                           not_before = COALESCE(u.nb, t.not_before),
                           avoid_device_id = COALESCE(u.av, t.avoid_device_id)
        FROM u
        WHERE t.task_id = u.id AND t.status IN {IN_FLIGHT}
        RETURNING t.task_id, t.event_seq, t.trace_headers
    ),
    {written}
    event AS (
        INSERT INTO outbox (kind, data, headers, created_at)
        SELECT :event_kind,
               CAST(:event_data AS jsonb) || jsonb_build_object({_FILLED}),
               e.trace_headers, :now
        FROM ended e JOIN u ON u.id = e.task_id
        ORDER BY u.o
        {back}
    )
    SELECT array_agg(task_id) AS ids{f", {INSERTED} AS inserted" if returning else ""} FROM ended
    """


#: By (returning, devices); returning: with the events written (`INSERTED`), for an outbox that hands them
#: over after the commit.
_END = {(r, d): text(_end(returning=r, devices=d)) for r in (False, True) for d in ("grace", "counted")}


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
    """End up to `limit` expired leases and decide each task's fate.

    Each expiry is an infrastructure failure of its device (`devsched.store.quarantine`).
    """
    ids = list((await conn.execute(_CANDIDATES, {"now": now, "limit": limit})).scalars())
    if not ids:
        return []
    rows = (await conn.execute(_EXPIRE, {"ids": ids, CLOCK_PARAM: clock.bound()})).all()
    if not rows:
        return []
    now = rows[0].now  # read after the locks: the end recorded is when the attempt really ended
    expired = [task_record(r) for r in rows]
    point("sweep.after_expire")
    decisions = {t.task_id: decide_expiry(t, now) for t in expired}
    # the devices locked and their failures counted (core's rule), then written once with their grace by
    # the tasks' statement (the events' order is unchanged: the task events go in with the tasks'
    # statement, the devices' when the outbox is written)
    devices = [t.current.device_id for t in expired if t.current is not None]
    grace = grace_until(now, expired, device_grace_s)
    failures = quarantine.tally_failures(
        await quarantine.lock(conn, devices), devices, EndReason.LEASE_EXPIRED.value, threshold=quarantine_after,
        grace=grace,
    )  # fmt: skip
    failures.queue(now, outbox)
    out = await end_tasks(conn, now, outbox, expired, decisions, device_grace_s=device_grace_s, failures=failures)
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
    failures: quarantine.Failures | None = None,
) -> list[ExpiredLease]:
    """Apply each decision to its task whose attempt the sweeper just ended, with its event and device grace.

    The tail of both sweeps: an expiry (`sweep_expired`) and a time limit (`timeouts.end_overdue`, whose
    `stops` name each task's limit, the event's reason when the decision gives none). The device of each
    ended attempt gets its grace (the host may still be running a step on it): from each task, or with the
    devices' `failures` (`quarantine.tally_failures`, given the grace of `grace_until`), written here.
    """
    attempts = [t.current for t in ended]
    chosen = [decisions[t.task_id] for t in ended]
    fallback = EndReason.LEASE_EXPIRED.value
    template = TaskEvent(event=EventKind.REQUEUED, task_id=PLACEHOLDER_ID, seq=PLACEHOLDER_SEQ,
                         status=TaskStatus.QUEUED, at=now)  # fmt: skip
    params = {
        "task_ids": [t.task_id for t in ended],
        "statuses": [d.task_status.value for d in chosen],
        "reasons": [d.reason.value if d.reason else None for d in chosen],
        "not_before": [d.retry.not_before if d.retry else None for d in chosen],
        "avoid": [d.retry.avoid_device_id if d.retry else None for d in chosen],
        "kinds": [d.event.value for d in chosen],
        "why": [
            d.reason.value if d.reason else stops[t.task_id] if stops is not None else fallback
            for t, d in zip(ended, chosen, strict=True)
        ],
        "attempts": [a.attempt if a else None for a in attempts],
        "hosts": [a.host_id if a else None for a in attempts],
        "devices": [a.device_id if a else None for a in attempts],
        "grace": [float(t.lease_ttl_s) if device_grace_s is None else device_grace_s for t in ended],
        "now": now,
        **event_params(template),
        **(failures.params() if failures is not None else {}),
    }
    row = (await conn.execute(_END[outbox.returning, "grace" if failures is None else "counted"], params)).one()
    if outbox.returning:
        outbox.took(inserted(row.inserted))
    done = set(row.ids or ())
    return [
        ExpiredLease(t.task_id, a.attempt, a.lease_id, a.host_id, a.device_id, d.task_status,
                     d.reason.value if d.reason else None)
        for t, a, d in zip(ended, attempts, chosen, strict=True)
        if a is not None and t.task_id in done
    ]  # fmt: skip


def grace_until(now: datetime, ended: Sequence[TaskRecord], device_grace_s: float | None) -> dict[str, datetime]:
    """When each device of the ended attempts may be used again: `device_grace_s`, or its task's lease ttl."""
    until: dict[str, datetime] = {}
    for t in ended:
        if t.current is not None:
            at = now + timedelta(seconds=t.lease_ttl_s if device_grace_s is None else device_grace_s)
            device = t.current.device_id
            until[device] = max(at, until.get(device, at))
    return until
