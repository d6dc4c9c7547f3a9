"""Health checks: the operators' plans per label selector, and the pass that runs them on devices.

A check (`health_checks`, keyed by name) applies to the devices whose labels contain its selector's; of
several, the most recently set one. The health pass, periodic in the scheduler (whose role submits
tasks: the sweeper's cannot), does two things, each one statement:

- `create_due`: a health task (`tasks.kind = 'health'`, pinned to its device, the check's plan, one
  attempt, the highest priority) for every registered, online, undrained device a check applies to that
  is quarantined, or was never checked, or was last checked longer ago than the check's interval, and
  has no open health task. Devices are locked with SKIP LOCKED, so replicas take different ones, and the
  partial unique index `uq_tasks_open_health` (at most one open health task per device) is the last
  word: a second pass creates nothing (`ON CONFLICT DO NOTHING`).
- `place_one`: a queued health task onto its device when the device is idle, quarantined or not
  (`candidates.free()` keeps quarantined devices from every other assigner, and user tasks never take
  this path), as a hand-over does (`pairing`). A never-checked device's check thus goes first as soon as
  the device is idle, ahead of user tasks (its priority is the highest in any case).

Their outcome is applied where a report ends the attempt (`leasing.report`): done returns the device to
service and stamps `health_checked_at`, failed keeps (or puts) it out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.errors import NotFound
from devsched.core.events import TaskEvent
from devsched.core.health import HEALTH_LEASE_TTL_S, HEALTH_MAX_ATTEMPTS, HEALTH_PRIORITY, health_task_name
from devsched.core.records import Selector
from devsched.core.status import EventKind, TaskKind, TaskStatus
from devsched.core.views import HealthCheckView
from devsched.store.clock import CLOCK_PARAM, NOW, Clock
from devsched.store.driver import Driver, Sql
from devsched.store.hosts import device_busy
from devsched.store.inline import INSERTED, PLACEHOLDER_ID, PLACEHOLDER_TIME, event_params, insert_event
from devsched.store.liveness import host_online
from devsched.store.outbox import inserted
from devsched.store.placement import candidates, pairing
from devsched.store.views import OutboxMessage

_HEALTH = TaskKind.HEALTH.value
#: The open statuses of the partial unique index `uq_tasks_open_health` (migration 0010).
_OPEN = "('queued', 'assigned', 'dispatched')"

# -- the checks ------------------------------------------------------------------------------------------

_SET = text(
    """
    INSERT INTO health_checks (name, selector_labels, plan, interval_s, created_at, updated_at, deleted_at)
    VALUES (:name, CAST(:labels AS jsonb), CAST(:plan AS jsonb), :interval_s, :now, :now, NULL)
    ON CONFLICT (name) DO UPDATE
    SET selector_labels = EXCLUDED.selector_labels, plan = EXCLUDED.plan, interval_s = EXCLUDED.interval_s,
        updated_at = EXCLUDED.updated_at, deleted_at = NULL,
        created_at = CASE WHEN health_checks.deleted_at IS NULL THEN health_checks.created_at
                          ELSE EXCLUDED.created_at END
    RETURNING name, selector_labels, plan, interval_s, created_at, updated_at
    """
)
_LIST = text(
    """
    SELECT name, selector_labels, plan, interval_s, created_at, updated_at FROM health_checks
    WHERE deleted_at IS NULL ORDER BY name
    """
)
_DELETE = text(
    """
    UPDATE health_checks SET deleted_at = :now, updated_at = :now WHERE name = :name AND deleted_at IS NULL
    RETURNING name, selector_labels, plan, interval_s, created_at, updated_at
    """
)


def _view(row: Any) -> HealthCheckView:
    return HealthCheckView(
        name=row.name,
        selector=Selector(labels=dict(row.selector_labels)),
        plan=row.plan,
        interval_s=row.interval_s,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


async def set_check(
    conn: AsyncConnection,
    now: datetime,
    name: str,
    labels: Mapping[str, str],
    plan: Mapping[str, Any],
    interval_s: float,
) -> HealthCheckView:
    """Create or replace the check `name` (a removed one comes back)."""
    params = {"name": name, "labels": json.dumps(dict(labels)), "plan": json.dumps(dict(plan))}
    row = (await conn.execute(_SET, {**params, "interval_s": interval_s, "now": now})).one()
    return _view(row)


async def list_checks(conn: AsyncConnection) -> tuple[HealthCheckView, ...]:
    """Every check in force, by name."""
    return tuple(_view(r) for r in (await conn.execute(_LIST)).all())


async def delete_check(conn: AsyncConnection, now: datetime, name: str) -> HealthCheckView:
    """Remove the check `name` (a row update: `deleted_at`); its open health tasks run to their end.

    Raises:
        NotFound: no check of that name in force.
    """
    row = (await conn.execute(_DELETE, {"name": name, "now": now})).one_or_none()
    if row is None:
        raise NotFound(f"no health check {name!r}")
    return _view(row)


# -- the pass ---------------------------------------------------------------------------------------------

#: The check that applies to the device `d`: of those in force whose selector its labels contain, the
#: most recently set.
_CHECK_OF_D = """
    SELECT k.name, k.plan, k.interval_s FROM health_checks k
    WHERE k.deleted_at IS NULL AND d.labels @> k.selector_labels
    ORDER BY k.updated_at DESC, k.name
    LIMIT 1
"""

_CREATE_DUE = Sql(
    f"""
    WITH c AS MATERIALIZED (SELECT {NOW} AS now),
    due AS MATERIALIZED (
        SELECT d.device_id, k.name, k.plan
        FROM devices d JOIN hosts h ON h.host_id = d.host_id CROSS JOIN c
             CROSS JOIN LATERAL ({_CHECK_OF_D}) k
        WHERE d.registered AND NOT d.drained AND {host_online("h", "c.now")}
          AND (d.quarantined_at IS NOT NULL OR d.health_checked_at IS NULL
               OR d.health_checked_at <= c.now - make_interval(secs => k.interval_s))
          AND NOT EXISTS (SELECT FROM tasks t WHERE t.health_device_id = d.device_id AND t.kind = '{_HEALTH}'
                                                AND t.status IN {_OPEN})
        ORDER BY d.device_id
        LIMIT :limit
        FOR UPDATE OF d SKIP LOCKED
    ),
    ins AS (
        INSERT INTO tasks (task_id, name, kind, health_device_id, status, priority, max_attempts, lease_ttl_s,
                           selector_labels, selector_device_id, plan, metadata, created_at, updated_at, event_seq)
        SELECT gen_random_uuid(), :name_prefix || due.name, '{_HEALTH}', due.device_id, 'queued', :priority,
               :max_attempts, :lease_ttl_s, '{{}}', due.device_id, due.plan,
               jsonb_build_object('health_check', due.name), c.now, c.now, 1
        FROM due CROSS JOIN c
        ORDER BY due.device_id
        ON CONFLICT DO NOTHING
        RETURNING task_id, created_at
    ),
    event AS ({insert_event("ins", at="ins.created_at", task_id="ins.task_id")})
    SELECT (SELECT count(*) FROM due) AS due, {INSERTED} AS inserted
    """
)

#: The event each new health task starts with, as a submitted task's.
_SUBMITTED = TaskEvent(
    event=EventKind.SUBMITTED, task_id=PLACEHOLDER_ID, seq=1, status=TaskStatus.QUEUED, at=PLACEHOLDER_TIME
)


async def create_due(db: Driver, clock: Clock, written: list[OutboxMessage], *, limit: int) -> int:
    """Submit the health tasks of up to `limit` devices that are due one; how many devices were due.

    `written` receives their `submitted` events. Devices another transaction holds wait for a later pass.
    """
    params = {
        "limit": limit,
        "name_prefix": health_task_name(""),
        "priority": HEALTH_PRIORITY,
        "max_attempts": HEALTH_MAX_ATTEMPTS,
        "lease_ttl_s": HEALTH_LEASE_TTL_S,
        CLOCK_PARAM: clock.bound(),
        **event_params(_SUBMITTED),
    }
    row = await db.row(_CREATE_DUE, params)
    assert row is not None, "the statement returns one row"
    written += inserted(row["inserted"])
    return int(row["due"])


_PLACE_ONE = Sql(
    f"""
    WITH c AS MATERIALIZED (SELECT {NOW} AS now),
    -- the oldest queued health task whose device is idle and may work but for a quarantine; both locked
    chosen AS MATERIALIZED (
        SELECT t.task_id, t.attempt_count + 1 AS attempt, t.lease_ttl_s, t.plan, t.trace_headers, d.device_id,
               d.host_id
        FROM tasks t JOIN devices d ON d.device_id = t.health_device_id
             JOIN hosts h ON h.host_id = d.host_id CROSS JOIN c
        WHERE t.kind = '{_HEALTH}' AND t.status IN {_OPEN} AND t.status IN {candidates.QUEUED}
          AND d.registered AND NOT d.drained
          AND (d.available_after IS NULL OR d.available_after <= c.now)
          AND {host_online("h", "c.now")}
          AND NOT {device_busy("d")}
        ORDER BY t.created_at, t.task_id
        LIMIT 1
        FOR UPDATE OF t, d SKIP LOCKED
    ),
    {pairing.apply("chosen", "chosen")}
    SELECT (SELECT task_id FROM moved) AS placed, {INSERTED} AS inserted
    """
)


async def place_one(db: Driver, clock: Clock, written: list[OutboxMessage]) -> bool:
    """Assign one queued health task to its idle device (quarantined or not); whether one was placed.

    `written` receives the two outbox messages of the assignment.
    """
    row = await db.row(_PLACE_ONE, {**pairing.params(), CLOCK_PARAM: clock.bound()})
    assert row is not None, "the statement returns one row"
    written += inserted(row["inserted"])
    return row["placed"] is not None
