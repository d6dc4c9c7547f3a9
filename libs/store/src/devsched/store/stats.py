"""What the metrics read from the database: counts and ages (`gauges`), and the times latencies start at.

`gauges` is a handful of aggregate statements over indexed columns, meant to run every few seconds in one
process loop (the scheduler's), never once per scrape. The tasks' count by status reads every task kept
(an index-only scan of `ix_tasks_status_listing` while the visibility map is fresh): its cost follows the
retention (`devsched-sweeper`'s pruning), not the traffic. With a `Grouping`, the same statement counts the
queue and the devices by the value of one label too (a selector's, a device's): at most `limit` values and
`other`, ranked and folded in the database so that the rows read stay few whatever the labels hold.
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
#: The group of a queued task whose selector, or of a device whose labels, do not have the grouping label.
UNGROUPED = ""
#: The group that counts the values of the grouping label past its limit.
OTHER = "other"

# The queue and the devices in one statement, by group: `:label` is the grouping label (NULL when not
# grouping: every row is then `UNGROUPED`). The ranking and the folding into `OTHER` happen here, so the
# rows returned stay few however many values the label has (`kept` is at most `:limit` values).
_FOLDED = f"CASE WHEN grp = '{UNGROUPED}' OR grp IN (SELECT grp FROM kept) THEN grp ELSE '{OTHER}' END"
_COUNTS = text(
    f"""
    WITH queue AS (
        SELECT CASE WHEN priority < 0 THEN '{PRIORITY_BANDS[0]}' WHEN priority > 0 THEN '{PRIORITY_BANDS[2]}'
                    ELSE '{PRIORITY_BANDS[1]}' END AS band,
               COALESCE(selector_labels ->> CAST(:label AS text), '{UNGROUPED}') AS grp,
               count(*) AS n, min(created_at) AS oldest
        FROM tasks WHERE status = '{TaskStatus.QUEUED.value}' GROUP BY 1, 2
    ), devs AS (
        SELECT d.drained, d.quarantined_at IS NOT NULL AS quarantined, {device_busy("d")} AS busy,
               {host_online("h")} AS online, COALESCE(d.labels ->> CAST(:label AS text), '{UNGROUPED}') AS grp,
               count(*) AS n
        FROM devices d JOIN hosts h ON h.host_id = d.host_id
        WHERE {HELD}
        GROUP BY 1, 2, 3, 4, 5
    ), kept AS (
        SELECT grp FROM (SELECT grp, n AS on_devices, 0 AS queued FROM devs
                         UNION ALL SELECT grp, 0, n FROM queue) AS v
        WHERE grp <> '{UNGROUPED}'
        GROUP BY grp ORDER BY sum(on_devices) DESC, sum(queued) DESC, grp COLLATE "C"
        LIMIT CAST(:limit AS integer)
    )
    SELECT 'queue' AS kind, band, CAST(NULL AS boolean) AS drained, CAST(NULL AS boolean) AS quarantined,
           CAST(NULL AS boolean) AS busy, CAST(NULL AS boolean) AS online, {_FOLDED} AS grp,
           CAST(sum(n) AS bigint) AS n, min(oldest) AS oldest
    FROM queue GROUP BY 2, 7
    UNION ALL
    SELECT 'device', NULL, drained, quarantined, busy, online, {_FOLDED}, CAST(sum(n) AS bigint), NULL
    FROM devs GROUP BY 3, 4, 5, 6, 7
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
_OUTBOX = text("SELECT count(*) AS n, min(created_at) AS oldest FROM outbox_unsent")


@dataclass(frozen=True, slots=True)
class Grouping:
    """Count the queue and the devices by the value of `label`: in a queued task's selector, on a device.

    At most `limit` values are groups of their own: those of the most devices, then of the most queued tasks
    (then in code point order); the others are counted together as `OTHER`. Without the label: `UNGROUPED`.
    """

    label: str
    limit: int


@dataclass(frozen=True, slots=True)
class Grouped:
    """The queue and the devices by group (`Grouping`): every band and state of each group seen, and `UNGROUPED`'s."""

    queued: Mapping[tuple[str, str], int]
    """Queued tasks by (priority band, group)."""
    oldest_queued_s: Mapping[tuple[str, str], float]
    """Age of the oldest queued task by (priority band, group); 0 when none."""
    devices: Mapping[tuple[str, str], int]
    """Devices by (state, group)."""


@dataclass(frozen=True, slots=True)
class Gauges:
    """The database's state at `at`, as the metrics show it.

    Every key is present (zero when nothing is in it): a priority band in `queued`, a status in `tasks`,
    a state in `devices`. Ages are seconds, 0 when nothing waits. `grouped`: the same by group, when asked.
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
    grouped: Grouped | None = None


def _age(now: datetime, then: datetime | None) -> float:
    return max(0.0, (now - then).total_seconds()) if then is not None else 0.0


async def gauges(conn: AsyncConnection, now: datetime, grouping: Grouping | None = None) -> Gauges:
    """Read every gauge of `Gauges` (four statements), by group too with `grouping`."""
    params: dict[str, object] = {"now": now, "label": None, "limit": None}
    if grouping is not None:
        params |= {"label": grouping.label, "limit": grouping.limit}
    queued: dict[tuple[str, str], int] = {}
    first: dict[tuple[str, str], datetime] = {}
    devices: dict[tuple[str, str], int] = {}
    for row in (await conn.execute(_COUNTS, params)).all():
        if row.kind == "queue":
            queued[row.band, row.grp] = int(row.n)
            first[row.band, row.grp] = row.oldest
        else:
            state = device_state(drained=row.drained, busy=row.busy, online=row.online, quarantined=row.quarantined)
            devices[state.value, row.grp] = devices.get((state.value, row.grp), 0) + int(row.n)
    tasks = {status.value: 0 for status in TaskStatus}
    for row in (await conn.execute(_STATUSES)).all():
        tasks[row.status] = int(row.n)
    hosts = (await conn.execute(_HOSTS, {"now": now})).one()
    outbox = (await conn.execute(_OUTBOX)).one()
    groups = {g for _, g in queued.keys() | devices.keys()} | {UNGROUPED}
    grouped = Grouped(
        queued={(band, g): queued.get((band, g), 0) for g in groups for band in PRIORITY_BANDS},
        oldest_queued_s={(band, g): _age(now, first.get((band, g))) for g in groups for band in PRIORITY_BANDS},
        devices={(state.value, g): devices.get((state.value, g), 0) for g in groups for state in DeviceState},
    )
    return Gauges(
        at=now,
        queued={band: sum(n for (b, _), n in grouped.queued.items() if b == band) for band in PRIORITY_BANDS},
        oldest_queued_s={
            band: max(age for (b, _), age in grouped.oldest_queued_s.items() if b == band) for band in PRIORITY_BANDS
        },
        tasks=tasks,
        hosts_online=int(hosts.online),
        hosts_offline=int(hosts.offline),
        devices={s.value: sum(n for (d, _), n in grouped.devices.items() if d == s.value) for s in DeviceState},
        outbox_unsent=int(outbox.n),
        outbox_oldest_unsent_s=_age(now, outbox.oldest),
        grouped=grouped if grouping is not None else None,
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
