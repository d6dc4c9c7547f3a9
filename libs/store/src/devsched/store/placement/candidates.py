"""Where assignment looks: the free devices, and the queued tasks they could take, found in SQL.

Matching happens in the database so that a deep queue never travels to the scheduler: the requests'
own assignments look at the head of the queue (`HEAD` tasks) for the devices they concern; the loop's
pass looks up every queued selector among the subsets of the free devices' label sets. Nothing here
locks: the chosen rows are locked by `assignment`.
"""

from __future__ import annotations

import itertools
import json

from sqlalchemy import text

from devsched.core.lifecycle import Trigger
from devsched.core.records import DeviceRecord
from devsched.store.hosts import device_busy
from devsched.store.liveness import host_online
from devsched.store.statuses import leaving

#: Queued tasks a submit or a report looks at, from the head of the queue; a longer queue is the loop's.
HEAD = 1000
#: Free devices a submit looks at for its task.
SUBMIT_DEVICES = 8
#: Label sets up to this size are matched by looking selectors up among their subsets (2^n of them);
#: wider ones by containment, row by row.
_SUBSET_LABELS = 5

QUEUED = leaving(Trigger.ASSIGN)


def free(now: str = "CAST(:now AS timestamptz)") -> str:
    """SQL: the device (aliased `d`, its host `h`) may take work at `now` (by default `:now`).

    Registered, in service (neither drained nor quarantined), out of its grace, on an online host, idle.
    A quarantined device's health task is placed by the health pass (`devsched.store.healthchecks`).
    """
    return f"""
    d.registered AND NOT d.drained AND d.quarantined_at IS NULL
    AND (d.available_after IS NULL OR d.available_after <= {now})
    AND {host_online("h", now)}
    AND NOT {device_busy("d")}"""


_FREE = free()


#: Free devices, read without locks: only the devices a plan chooses are locked (`assignment`), so a pass that
#: finds nothing to do holds nothing that a concurrent submit or report would have to skip.
ALL_FREE = text(
    f"""
    SELECT d.device_id, d.host_id, d.labels
    FROM devices d JOIN hosts h ON h.host_id = d.host_id
    WHERE {_FREE}
    ORDER BY d.updated_at, d.device_id
    LIMIT :limit
    """
)


def matching(task: str, device: str) -> str:
    """SQL: the selector of `task` (`selector_labels`, `selector_device_id`) is satisfied by `device`.

    Core's `matches`: the device's labels contain the selector's, and its id is the one named, if any.
    """
    return f"""({device}.labels @> {task}.selector_labels
                AND ({task}.selector_device_id IS NULL OR {task}.selector_device_id = {device}.device_id))"""


#: A selector (aliased `t`) that one of the devices `f(device_id, labels)` satisfies.
_MATCHES_F = f"EXISTS (SELECT 1 FROM f WHERE {matching('t', 'f')})"


#: A queued task (aliased `t`) that is not waiting out a retry policy's backoff at `now`.
def ready(now: str) -> str:
    """SQL: the task `t` may be assigned at `now` (its `not_before`, if any, has passed)."""
    return f"(t.not_before IS NULL OR t.not_before <= {now})"


#: The CTE `head`: the first `:scan` queued tasks that are not in a backoff, in order (after the CTE `c`).
QUEUE_HEAD = f"""
    head AS (
        SELECT t.task_id, t.selector_labels, t.selector_device_id, t.priority, t.created_at, t.avoid_device_id
        FROM tasks t WHERE t.status IN {QUEUED} AND {ready("(SELECT now FROM c)")}
        ORDER BY t.priority DESC, t.created_at, t.task_id
        LIMIT :scan
    )"""

#: The CTE `m`: the first `:limit` of the head that one of the devices `f` could take, in order; nothing
#: (and the head unread) when `f` is empty.
MATCHED = f"""
    m AS (
        SELECT t.* FROM head t WHERE EXISTS (SELECT 1 FROM f) AND {_MATCHES_F}
        ORDER BY t.priority DESC, t.created_at, t.task_id
        LIMIT :limit
    )"""


#: The CTE `f` of a submitted task's placement (`placement`), after the CTE `c` that holds `now`: up to
#: `:devices` free devices that the submitted selector (`:labels`, `:device_id`) matches, in the loop's order
#: (`ALL_FREE`); read without locks.
SUBMITTED_FREE = f"""
    f AS MATERIALIZED (
        SELECT d.device_id, d.host_id, d.labels, d.updated_at
        FROM devices d JOIN hosts h ON h.host_id = d.host_id, c
        WHERE {free("c.now")} AND d.labels @> CAST(:labels AS jsonb)
          AND (CAST(:device_id AS text) IS NULL OR d.device_id = :device_id)
        ORDER BY d.updated_at, d.device_id
        LIMIT :devices
    )"""


#: In order, queued tasks that some free device could take: unpinned selectors are looked up among the
#: subsets of the free devices' label sets (a hashed lookup, so a deep queue of tasks nothing matches
#: costs one pass over it, not one per device), or found contained in a wide label set; pinned ones are
#: checked against their device. Nothing but the chosen rows reaches the scheduler.
CANDIDATES = text(
    f"""
    SELECT t.task_id, t.selector_labels, t.selector_device_id, t.avoid_device_id
    FROM tasks t
    WHERE t.status IN {QUEUED} AND {ready("CAST(:now AS timestamptz)")}
      AND ((t.selector_device_id IS NULL
            AND (t.selector_labels = ANY(CAST(:subsets AS jsonb[]))
                 OR t.selector_labels <@ ANY(CAST(:wide AS jsonb[]))))
           OR (t.selector_device_id = ANY(CAST(:device_ids AS text[]))
               AND EXISTS (SELECT 1 FROM devices d
                           WHERE d.device_id = t.selector_device_id AND d.labels @> t.selector_labels)))
    ORDER BY t.priority DESC, t.created_at, t.task_id
    LIMIT :limit
    """
)


def label_keys(free: list[DeviceRecord]) -> tuple[list[str], list[str]]:
    """(every subset of each narrow label set, each wide label set), as JSON, without repeats."""
    subsets: set[str] = set()
    wide: set[str] = set()
    for labels in {tuple(sorted(d.labels.items())) for d in free}:
        if len(labels) > _SUBSET_LABELS:
            wide.add(json.dumps(dict(labels)))
            continue
        for n in range(len(labels) + 1):
            for subset in itertools.combinations(labels, n):
                subsets.add(json.dumps(dict(subset)))
    return sorted(subsets), sorted(wide)
