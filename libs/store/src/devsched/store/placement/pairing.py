"""One queued task onto one device, applied by the statement that chose and locked them.

The statements that assign without a plan in Python (`handover`: the device a report frees; `placement`:
a submitted task) end alike: the CTE `chosen` holds the locked task (with its next attempt) and the
device, and `apply` moves the task to `assigned` with its new attempt, lease and reservation and inserts
the `assigned` event and the `AttemptAssigned` message into the outbox (`devsched.store.inline`), with the
rows the loop's `assignment` would write for the same pair.

Handed to the reporting host (`dispatch`, a report's `take_next`), the pair is what the assignment and
the host's claim with the first step's progress would have written together: the task `dispatched`, the
attempt dispatched now with that progress and its lease running from now, the `assigned`, `dispatched`
and `progress` events numbered consecutively, and no `AttemptAssigned` message (the host has the attempt
in the report's reply, so nothing goes to its JetStream consumer).
"""

from __future__ import annotations

from typing import Any

from devsched.core.events import AttemptAssigned, StepProgress, TaskEvent
from devsched.core.ids import new_lease_id
from devsched.core.lifecycle import Trigger
from devsched.core.status import AttemptStatus, EventKind, TaskStatus
from devsched.store.eventrows import filled
from devsched.store.inline import PLACEHOLDER_ID, PLACEHOLDER_SEQ, PLACEHOLDER_TIME
from devsched.store.outbox import event_row
from devsched.store.statuses import entering

_ACTIVE = AttemptStatus.ACTIVE.value

#: The two messages of an assignment as the outbox lays them out; the statement fills in what it chose.
_ASSIGNED_ROW = event_row(
    TaskEvent(
        event=EventKind.ASSIGNED, task_id=PLACEHOLDER_ID, seq=PLACEHOLDER_SEQ, status=TaskStatus.ASSIGNED,
        at=PLACEHOLDER_TIME, attempt=1, host_id="", device_id="",
    ),
    trace={},
)  # fmt: skip
_DISPATCHED_ROW = event_row(
    TaskEvent(
        event=EventKind.DISPATCHED, task_id=PLACEHOLDER_ID, seq=PLACEHOLDER_SEQ, status=TaskStatus.DISPATCHED,
        at=PLACEHOLDER_TIME, attempt=1, host_id="", device_id="",
    ),
    trace={},
)  # fmt: skip
_PROGRESS_ROW = event_row(
    TaskEvent(
        event=EventKind.PROGRESS, task_id=PLACEHOLDER_ID, seq=PLACEHOLDER_SEQ, status=TaskStatus.DISPATCHED,
        at=PLACEHOLDER_TIME, attempt=1, host_id="", device_id="", progress=StepProgress(step="", index=0, of=1),
    ),
    trace={},
)  # fmt: skip
_ATTEMPT_ROW = event_row(
    AttemptAssigned(
        task_id=PLACEHOLDER_ID, attempt=1, lease_id=PLACEHOLDER_ID, host_id="", device_id="", plan={}, ttl_s=1,
        expires_at=PLACEHOLDER_TIME,
    ),
    trace={},
)  # fmt: skip


def _first_progress(plan: str) -> str:
    """SQL: the progress of the first step of the plan `plan` (jsonb), as the agent's claim would carry it.

    `devsched.agent.runner.first_progress`: nothing stops the first step of an attempt not yet started (a
    plan has one step at least).
    """
    steps = f"({plan} -> 'steps')"
    return f"jsonb_build_object('step', {steps} -> 0 ->> 'name', 'index', 0, 'of', jsonb_array_length({steps}))"


def apply(
    source: str, device: str, *, dispatch: bool = False, lease: str = "CAST(:lease_id AS uuid)", order: str = "0"
) -> str:
    """SQL: the CTEs `moved`, `new_attempt` and `event` that apply the chosen pairs.

    `source` is the FROM list holding the CTE `chosen` (`task_id`, `attempt`, `lease_ttl_s`, `plan`,
    `trace_headers` of the locked task) and `device`, the relation with the locked device's `device_id`
    and `host_id`; the CTE `c` holds `now`; `lease` is the new attempt's lease id (an expression over
    `source`: the loop's pass pairs many tasks and devices at once, each row of `chosen` with its device and
    lease, and `order` its place among them). The attempt (the device's reservation) is inserted only for the
    task moved (the foreign keys are checked at the statement's end); `event` is what `INSERTED` reads: the
    pairs' events in `order`, each task's together, in order.

    With `dispatch` (see the module doc), `chosen` also holds the task's `deadline`, and `moved` returns
    the attempt's `progress` and `stop` (as a claim's grant says it) for the host's reply.
    """
    if dispatch:
        status, events = "'dispatched'", 3  # the claim's status; assigned, dispatched and progress
        extra = f", {_first_progress('chosen.plan')} AS progress," + (
            " CASE WHEN chosen.deadline <= c.now THEN 'deadline_exceeded' END AS stop"
        )
        dispatched, progress = "now", "progress"
    else:
        status, events, extra, dispatched, progress = entering(Trigger.ASSIGN), 1, "", "NULL", "NULL"
    assigned_seq = f"moved.event_seq - {events - 1}"
    # what the statement fills in of each message (the templates of `params` hold the rest)
    pair = {"task_id": "moved.task_id", "attempt": "moved.attempt", "host_id": "moved.host_id",
            "device_id": "moved.device_id"}  # fmt: skip
    first = filled(TaskEvent, seq=assigned_seq, at="moved.now", **pair)
    if dispatch:
        second = filled(TaskEvent, seq="moved.event_seq - 1", at="moved.now", **pair)
        third = filled(TaskEvent, seq="moved.event_seq", at="moved.now", progress="moved.progress", **pair)
        values = f"""
            (1, CAST(:assigned_kind AS text), CAST(:assigned_data AS jsonb) || jsonb_build_object({first})),
            (2, CAST(:dispatched_kind AS text), CAST(:dispatched_data AS jsonb) || jsonb_build_object({second})),
            (3, CAST(:progress_kind AS text), CAST(:progress_data AS jsonb) || jsonb_build_object({third}))"""
    else:
        attempt = filled(
            AttemptAssigned, lease_id="moved.lease_id", plan="moved.plan", ttl_s="moved.lease_ttl_s",
            expires_at="moved.expires_at", **pair,
        )  # fmt: skip
        values = f"""
            (1, CAST(:assigned_kind AS text), CAST(:assigned_data AS jsonb) || jsonb_build_object({first})),
            (2, CAST(:attempt_kind AS text), CAST(:attempt_data AS jsonb) || jsonb_build_object({attempt}))"""
    return f"""
    moved AS (
        UPDATE tasks t
        SET status = {status}, attempt_count = chosen.attempt, updated_at = c.now,
            event_seq = t.event_seq + {events}
        FROM {source}, c
        WHERE t.task_id = chosen.task_id
        RETURNING t.task_id, t.event_seq, chosen.attempt, chosen.lease_ttl_s, chosen.plan, chosen.trace_headers,
                  {device}.device_id, {device}.host_id, c.now, {lease} AS lease_id, {order} AS ord,
                  c.now + make_interval(secs => chosen.lease_ttl_s) AS expires_at{extra}
    ),
    new_attempt AS (
        INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_id, status, assigned_at, expires_at,
                              dispatched_at, progress)
        SELECT task_id, attempt, lease_id, host_id, device_id, '{_ACTIVE}', now, expires_at, {dispatched},
               {progress} FROM moved
    ),
    event AS (
        INSERT INTO outbox (kind, data, headers, created_at)
        SELECT e.kind, e.data, moved.trace_headers, moved.now
        FROM moved CROSS JOIN LATERAL (VALUES {values}
        ) AS e(n, kind, data)
        ORDER BY moved.ord, moved.task_id, e.n
        RETURNING id, kind, data, headers
    )"""


def params() -> dict[str, Any]:
    """The parameters of `apply`: a new lease id, and the two messages' templates."""
    return {
        "lease_id": new_lease_id(),
        "assigned_kind": _ASSIGNED_ROW[0],
        "assigned_data": _ASSIGNED_ROW[1],
        "attempt_kind": _ATTEMPT_ROW[0],
        "attempt_data": _ATTEMPT_ROW[1],
    }


def dispatch_params() -> dict[str, Any]:
    """The parameters of `apply` with `dispatch`: a new lease id, and the three events' templates."""
    return {
        "lease_id": new_lease_id(),
        "assigned_kind": _ASSIGNED_ROW[0],
        "assigned_data": _ASSIGNED_ROW[1],
        "dispatched_kind": _DISPATCHED_ROW[0],
        "dispatched_data": _DISPATCHED_ROW[1],
        "progress_kind": _PROGRESS_ROW[0],
        "progress_data": _PROGRESS_ROW[1],
    }
