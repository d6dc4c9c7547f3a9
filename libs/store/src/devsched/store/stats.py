"""What the metrics read from the database: counts and ages (`gauges`), and the times latencies start at.

`gauges` is a handful of aggregate statements over indexed columns, meant to run every few seconds in one
process loop (the scheduler's), never once per scrape. The tasks' count by status reads every task kept
(an index-only scan of `ix_tasks_status_listing` while the visibility map is fresh): its cost follows the
retention (`devsched-sweeper`'s pruning), not the traffic.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.status import DeviceState, TaskStatus
from devsched.store.hosts import HELD, device_busy, device_state
from devsched.store.liveness import host_online

#: A task's priority band, by the sign of its priority (the default, 0, is `normal`).
PRIORITY_BANDS = ("low", "normal", "high")

_QUEUE = text(
    f"""
    SELECT CASE WHEN priority < 0 THEN '{PRIORITY_BANDS[0]}' WHEN priority > 0 THEN '{PRIORITY_BANDS[2]}'
                ELSE '{PRIORITY_BANDS[1]}' END AS band,
           count(*) AS n, min(created_at) AS oldest
    FROM tasks WHERE status = '{TaskStatus.QUEUED.value}' GROUP BY 1
    """
)
_STATUSES = text("SELECT status, count(*) AS n FROM tasks GROUP BY status")
#: Offline hosts count only while they list devices: a host that withdrew (or was retired) is not missing.
_HOSTS = text(
    f"""
    SELECT count(*) FILTER (WHERE {host_online("h")}) AS online,
           count(*) FILTER (WHERE NOT {host_online("h")} AND EXISTS (
               SELECT 1 FROM devices d WHERE d.host_id = h.host_id AND d.registered)) AS offline
    FROM hosts h
    """
)
_DEVICES = text(
    f"""
    SELECT d.drained, d.quarantined_at IS NOT NULL AS quarantined, {device_busy("d")} AS busy,
           {host_online("h")} AS online, count(*) AS n
    FROM devices d JOIN hosts h ON h.host_id = d.host_id
    WHERE {HELD}
    GROUP BY 1, 2, 3, 4
    """
)
_OUTBOX = text("SELECT count(*) AS n, min(created_at) AS oldest FROM outbox WHERE sent_at IS NULL")


@dataclass(frozen=True, slots=True)
class Gauges:
    """The database's state at `at`, as the metrics show it.

    Every key is present (zero when nothing is in it): a priority band in `queued`, a status in `tasks`,
    a state in `devices`. Ages are seconds, 0 when nothing waits.
    """

    at: datetime
    queued: Mapping[str, int]
    oldest_queued_s: Mapping[str, float]
    tasks: Mapping[str, int]
    hosts_online: int
    hosts_offline: int
    devices: Mapping[str, int]
    outbox_unsent: int
    outbox_oldest_unsent_s: float


def _age(now: datetime, then: datetime | None) -> float:
    return max(0.0, (now - then).total_seconds()) if then is not None else 0.0


async def gauges(conn: AsyncConnection, now: datetime) -> Gauges:
    """Read every gauge of `Gauges` (five statements)."""
    queued = dict.fromkeys(PRIORITY_BANDS, 0)
    oldest = dict.fromkeys(PRIORITY_BANDS, 0.0)
    for row in (await conn.execute(_QUEUE)).all():
        queued[row.band] = int(row.n)
        oldest[row.band] = _age(now, row.oldest)
    tasks = {status.value: 0 for status in TaskStatus}
    for row in (await conn.execute(_STATUSES)).all():
        tasks[row.status] = int(row.n)
    hosts = (await conn.execute(_HOSTS, {"now": now})).one()
    devices = {state.value: 0 for state in DeviceState}
    for row in (await conn.execute(_DEVICES, {"now": now})).all():
        state = device_state(drained=row.drained, busy=row.busy, online=row.online, quarantined=row.quarantined)
        devices[state.value] += int(row.n)
    outbox = (await conn.execute(_OUTBOX)).one()
    return Gauges(
        at=now,
        queued=queued,
        oldest_queued_s=oldest,
        tasks=tasks,
        hosts_online=int(hosts.online),
        hosts_offline=int(hosts.offline),
        devices=devices,
        outbox_unsent=int(outbox.n),
        outbox_oldest_unsent_s=_age(now, outbox.oldest),
    )


_CREATED = text("SELECT task_id, created_at FROM tasks WHERE task_id = ANY(CAST(:ids AS uuid[]))")
_ASSIGNED = text(
    """
    SELECT a.task_id, a.attempt, a.assigned_at
    FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS int[])) AS u(t, n)
    JOIN attempts a ON a.task_id = u.t AND a.attempt = u.n
    """
)


@dataclass(frozen=True, slots=True)
class Starts:
    """When tasks were submitted, and when attempts were assigned (for the latencies that end later)."""

    created: Mapping[uuid.UUID, datetime]
    assigned: Mapping[tuple[uuid.UUID, int], datetime]


async def starts(
    conn: AsyncConnection, task_ids: Sequence[uuid.UUID], attempts: Sequence[tuple[uuid.UUID, int]]
) -> Starts:
    """The submission times of `task_ids` and the assignment times of `attempts` (those that exist)."""
    created = {}
    if task_ids:
        created = {r.task_id: r.created_at for r in (await conn.execute(_CREATED, {"ids": list(task_ids)})).all()}
    assigned = {}
    if attempts:
        params = {"ids": [t for t, _ in attempts], "attempts": [n for _, n in attempts]}
        assigned = {(r.task_id, r.attempt): r.assigned_at for r in (await conn.execute(_ASSIGNED, params)).all()}
    return Starts(created, assigned)
