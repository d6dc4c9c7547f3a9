"""What happens to a task whose lease expired before a report: bounded retry, or cancellation."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from devsched.core.lifecycle import Trigger, next_status
from devsched.core.records import TaskRecord
from devsched.core.retrying import Retry, RetryCause, retries, retry
from devsched.core.status import AttemptStatus, EventKind, TaskReason, TaskStatus


@dataclass(frozen=True, slots=True)
class ExpiryDecision:
    """The fate of a task whose attempt the sweeper ended (its lease expired, or it ran out of time).

    The task's next status and reason, and the event to emit.
    """

    trigger: Trigger
    task_status: TaskStatus
    reason: TaskReason | None
    event: EventKind
    #: With a retry policy: when the requeued task may run again, and the device it should avoid.
    retry: Retry | None = None


def is_expired(task: TaskRecord, now: datetime) -> bool:
    """Whether the task's current lease is active but past its expiry at `now` (the database clock)."""
    cur = task.current
    return cur is not None and cur.status is AttemptStatus.ACTIVE and now >= cur.expires_at


def decide_expiry(task: TaskRecord, now: datetime | None = None) -> ExpiryDecision:
    """Cancel if a cancellation is pending; else requeue if attempts remain and expiries are retried; else fail.

    A pending cancellation wins whatever the attempts left: the user asked for the task to stop. Released
    attempts do not count: a task whose attempts were given back by shutting-down agents keeps its retries.
    A task with a retry policy waits out its backoff from `now` (required then) before its next attempt.
    """
    again = None
    if task.cancel_requested:
        trigger, reason, event = (
            Trigger.EXPIRE_CANCEL,
            TaskReason.CANCELLED_AFTER_LEASE_EXPIRED,
            EventKind.CANCELLED,
        )
    elif task.attempts_spent >= task.max_attempts or not retries(task.retry, RetryCause.LEASE_EXPIRED):
        trigger, reason, event = Trigger.EXPIRE_FAIL, TaskReason.LEASE_EXPIRED, EventKind.FAILED
    else:
        trigger, reason, event = Trigger.EXPIRE_REQUEUE, None, EventKind.REQUEUED
        if task.retry is not None:
            assert now is not None, "a policy's backoff counts from now"
            assert task.current is not None
            again = retry(task.retry, RetryCause.LEASE_EXPIRED, task.attempt_count, task.current.device_id, now)
    return ExpiryDecision(trigger, next_status(task.status, trigger), reason, event, again)
