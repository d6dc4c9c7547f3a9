"""Why queued tasks wait, for a whole page at once: one query over the page's distinct selectors.

Core's `pending_reason` decides from a count of each task's matching devices (`Matches`); this counts
them, one row per distinct selector of the tasks given, whatever their number, so a listing of many
queued tasks costs one statement more than the listing, not one per task. A task waiting out its retry
backoff needs no count.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from devsched.core.actions import actions_of_labels, visible_labels
from devsched.core.pending import Matches, Waiting, pending_reason
from devsched.core.status import TaskKind, TaskStatus
from devsched.store.hosts import device_busy
from devsched.store.liveness import host_online

_NOW = "CAST(:now AS timestamptz)"
_IN_SERVICE = "m.full AND m.online AND NOT m.drained AND NOT m.quarantined"
_IDLE = f"{_IN_SERVICE} AND NOT m.busy"

#: Per selector (its labels, the same without the action labels, its device id, whether its task is a health
#: check), its matching devices counted as `Matches` counts them. A quarantined device counts as in service for
#: a health check, which the health pass places there (`devsched.store.healthchecks`), and as out for the rest.
#: Each registered device's state is worked out once (`dev`), then matched against every distinct selector
#: of the page: the cost grows with selectors times devices, never with tasks.
_MATCHES = text(
    f"""
    WITH s AS (
        SELECT u.k, CAST(u.labels AS jsonb) AS labels, CAST(u.visible AS jsonb) AS visible, u.device_id, u.health
        FROM unnest(CAST(:labels AS text[]), CAST(:visible AS text[]), CAST(:device_ids AS text[]),
                    CAST(:health AS boolean[])) WITH ORDINALITY AS u(labels, visible, device_id, health, k)
    ), dev AS MATERIALIZED (
        SELECT d.device_id, d.labels, {host_online("h", _NOW)} AS online, d.drained,
               d.quarantined_at IS NOT NULL AS quarantined, {device_busy("d")} AS busy, d.available_after
        FROM devices d JOIN hosts h ON h.host_id = d.host_id
        WHERE d.registered
    ), m AS (
        SELECT s.k, x.device_id, x.labels @> s.labels AS full, x.online, x.drained,
               x.quarantined AND NOT s.health AS quarantined, x.busy, x.available_after
        FROM s JOIN dev x ON x.labels @> s.visible AND (s.device_id IS NULL OR x.device_id = s.device_id)
    )
    SELECT s.k,
           count(*) FILTER (WHERE m.full) AS matching,
           count(*) FILTER (WHERE m.full AND m.online) AS online,
           count(*) FILTER (WHERE m.full AND m.online AND m.drained) AS drained,
           count(*) FILTER (WHERE m.full AND m.online AND NOT m.drained AND m.quarantined) AS quarantined,
           count(*) FILTER (WHERE {_IN_SERVICE} AND m.busy) AS busy,
           count(*) FILTER (WHERE {_IDLE} AND (m.available_after IS NULL OR m.available_after <= {_NOW})) AS ready,
           min(m.available_after) FILTER (WHERE {_IDLE} AND m.available_after > {_NOW}) AS grace_until,
           count(m.device_id) AS without_actions
    FROM s LEFT JOIN m ON m.k = s.k
    GROUP BY s.k
    """
)


def _selector(row: Any) -> tuple[str, str | None, bool]:
    return json.dumps(dict(row.selector_labels), sort_keys=True), row.selector_device_id, row.kind == TaskKind.HEALTH


def _waiting(row: Any) -> Waiting:
    return Waiting(row.attempt_count, row.not_before, actions_of_labels(row.selector_labels))


async def pending_reasons(conn: AsyncConnection, rows: Sequence[Any], now: datetime) -> dict[uuid.UUID, str]:
    """The `pending_reason` of each queued task among `rows` (task rows), by task id, in one query at most."""
    queued = [(r, _selector(r)) for r in rows if r.status == TaskStatus.QUEUED]
    keys: dict[tuple[str, str | None, bool], int] = {}
    for r, selector in queued:
        if r.not_before is None or r.not_before <= now:  # one waiting out its backoff needs no count
            keys.setdefault(selector, len(keys) + 1)
    counts: dict[int, Matches] = {}
    if keys:
        params = {
            "labels": [labels for labels, _, _ in keys],
            "visible": [json.dumps(visible_labels(json.loads(labels)), sort_keys=True) for labels, _, _ in keys],
            "device_ids": [device_id for _, device_id, _ in keys],
            "health": [health for _, _, health in keys],
            "now": now,
        }
        for c in await conn.execute(_MATCHES, params):
            counts[c.k] = Matches(
                matching=c.matching,
                online=c.online,
                drained=c.drained,
                quarantined=c.quarantined,
                busy=c.busy,
                ready=c.ready,
                grace_until=c.grace_until,
                without_actions=c.without_actions,
            )
    none = Matches()  # what a task in its backoff is given: the backoff decides before any count is read
    return {
        r.task_id: pending_reason(_waiting(r), counts.get(keys.get(selector, 0), none), now) for r, selector in queued
    }
