"""A task's time limits: `queue_timeout_s`, `attempt_timeout_s` and `deadline`, judged by the database clock.

The host learns of an attempt timeout or a passed deadline from its renewal replies (`stop`) and stops the
attempt at the next step boundary as it would for a cancellation, teardown included, then reports it
`failed` with the stop as its reason. The sweeper enforces both itself a lease ttl later (`overdue`), for
a host that does not stop in time (an older agent, a step that never ends): the attempt ends and its device
waits out the post-expiry grace, as after a lease expiry. A queued task fails once no device took it within
`queue_timeout_s` of entering the queue (or of the end of its backoff), or once its deadline passed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from devsched.core.expiry import ExpiryDecision
from devsched.core.lifecycle import Trigger, next_status
from devsched.core.records import TaskRecord
from devsched.core.retrying import RetryCause, retries, retry
from devsched.core.status import EventKind, TaskReason

#: The `stop` a renewal reply carries, and the reason the host reports the attempt `failed` with.
ATTEMPT_TIMEOUT = TaskReason.ATTEMPT_TIMEOUT.value
DEADLINE_EXCEEDED = TaskReason.DEADLINE_EXCEEDED.value


def stop_reason(task: TaskRecord, now: datetime) -> str | None:
    """Whether the host must stop the current attempt at `now`: `deadline_exceeded`, `attempt_timeout` or None.

    The deadline wins: it ends the task whatever the retry policy says.
    """
    if task.deadline is not None and now >= task.deadline:
        return DEADLINE_EXCEEDED
    cur = task.current
    if task.attempt_timeout_s is None or cur is None or cur.started_at is None:
        return None
    return ATTEMPT_TIMEOUT if now >= cur.started_at + timedelta(seconds=task.attempt_timeout_s) else None


def overdue(task: TaskRecord, now: datetime) -> str | None:
    """Whether the sweeper ends the current attempt at `now`: a timeout passed at least a lease ttl ago.

    The ttl is the time the host had to stop the attempt and report it.
    """
    return stop_reason(task, now - timedelta(seconds=task.lease_ttl_s))


def queue_timed_out(
    *,
    entered: datetime,
    not_before: datetime | None,
    queue_timeout_s: float | None,
    deadline: datetime | None,
    now: datetime,
) -> TaskReason | None:
    """Why a queued task fails at `now`, if it does: its deadline passed, or it waited too long.

    It waits at most `queue_timeout_s` for a device since it `entered` the queue (since `not_before` when its
    backoff ended later).
    """  # fmt: skip
    if deadline is not None and now >= deadline:
        return TaskReason.DEADLINE_EXCEEDED
    if queue_timeout_s is None:
        return None
    since = max(entered, not_before) if not_before is not None else entered
    return TaskReason.QUEUE_TIMEOUT if now >= since + timedelta(seconds=queue_timeout_s) else None


def decide_timeout(task: TaskRecord, stop: str, now: datetime) -> ExpiryDecision:
    """Cancel if a cancellation is pending; fail at a deadline; else retry or fail an attempt timeout.

    An attempt timeout is retried when the policy names it and attempts are left.
    """
    cur = task.current
    assert cur is not None, "only an attempt can time out"
    reason = TaskReason(stop)
    if task.cancel_requested:
        trigger, event, again = Trigger.TIMEOUT_CANCEL, EventKind.CANCELLED, None
    elif reason is TaskReason.DEADLINE_EXCEEDED:
        trigger, event, again = Trigger.DEADLINE, EventKind.FAILED, None
    elif retries(task.retry, RetryCause.ATTEMPT_TIMEOUT) and task.attempts_spent < task.max_attempts:
        again = retry(task.retry, RetryCause.ATTEMPT_TIMEOUT, task.attempt_count, cur.device_id, now)
        return ExpiryDecision(
            Trigger.ATTEMPT_TIMEOUT_RETRY, next_status(task.status, Trigger.ATTEMPT_TIMEOUT_RETRY), None,
            EventKind.REQUEUED, again,
        )  # fmt: skip
    else:
        trigger, event, again = Trigger.ATTEMPT_TIMEOUT, EventKind.FAILED, None
    return ExpiryDecision(trigger, next_status(task.status, trigger), reason, event, again)
