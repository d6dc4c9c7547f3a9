"""The task lifecycle: one table of transitions, the single source of truth.

ARCHITECTURE.md's table, encoded. Every state change the store makes goes through `next_status`,
so an illegal move is a bug caught before it reaches the database (which checks it again).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from devsched.core.errors import IllegalTransition
from devsched.core.status import TaskStatus


class Trigger(StrEnum):
    """What moves a task."""

    SUBMIT = "submit"
    ASSIGN = "assign"
    CLAIM = "claim"
    REPORT_DONE = "report_done"
    REPORT_FAILED = "report_failed"
    REPORT_CANCELLED = "report_cancelled"
    EXPIRE_REQUEUE = "expire_requeue"
    EXPIRE_FAIL = "expire_fail"
    EXPIRE_CANCEL = "expire_cancel"
    CANCEL = "cancel"
    #: The owning host gave the attempt back: the task waits for another device.
    RELEASE = "release"
    #: The owning host gave the attempt back while a cancellation was pending.
    RELEASE_CANCEL = "release_cancel"
    #: The owning host gave the attempt back once more than the releases a task is allowed.
    RELEASE_FAIL = "release_fail"
    #: A failed report that the task's retry policy retries: the task waits out its backoff in the queue.
    REPORT_RETRY = "report_retry"
    #: No device took the task within its `queue_timeout_s`.
    QUEUE_TIMEOUT = "queue_timeout"
    #: The task's `deadline` passed (queued or in flight).
    DEADLINE = "deadline"
    #: The attempt ran past `attempt_timeout_s` and the sweeper ended it; the task fails.
    ATTEMPT_TIMEOUT = "attempt_timeout"
    #: The attempt ran past `attempt_timeout_s` and the sweeper ended it; the retry policy queues the task again.
    ATTEMPT_TIMEOUT_RETRY = "attempt_timeout_retry"
    #: The attempt ran past a timeout and the sweeper ended it while a cancellation was pending.
    TIMEOUT_CANCEL = "timeout_cancel"


_Q, _A, _D = TaskStatus.QUEUED, TaskStatus.ASSIGNED, TaskStatus.DISPATCHED

TRANSITIONS: Mapping[tuple[TaskStatus | None, Trigger], TaskStatus] = {
    (None, Trigger.SUBMIT): _Q,
    (_Q, Trigger.ASSIGN): _A,
    (_A, Trigger.CLAIM): _D,
    (_Q, Trigger.CANCEL): TaskStatus.CANCELLED,
    (_Q, Trigger.QUEUE_TIMEOUT): TaskStatus.FAILED,
    (_Q, Trigger.DEADLINE): TaskStatus.FAILED,
    **{
        (src, trigger): dst
        for src in (_A, _D)
        for trigger, dst in (
            (Trigger.REPORT_DONE, TaskStatus.DONE),
            (Trigger.REPORT_FAILED, TaskStatus.FAILED),
            (Trigger.REPORT_CANCELLED, TaskStatus.CANCELLED),
            (Trigger.EXPIRE_REQUEUE, _Q),
            (Trigger.EXPIRE_FAIL, TaskStatus.FAILED),
            (Trigger.EXPIRE_CANCEL, TaskStatus.CANCELLED),
            (Trigger.RELEASE, _Q),
            (Trigger.RELEASE_CANCEL, TaskStatus.CANCELLED),
            (Trigger.RELEASE_FAIL, TaskStatus.FAILED),
            (Trigger.REPORT_RETRY, _Q),
            (Trigger.DEADLINE, TaskStatus.FAILED),
            (Trigger.ATTEMPT_TIMEOUT, TaskStatus.FAILED),
            (Trigger.ATTEMPT_TIMEOUT_RETRY, _Q),
            (Trigger.TIMEOUT_CANCEL, TaskStatus.CANCELLED),
        )
    },
}


def next_status(current: TaskStatus | None, trigger: Trigger) -> TaskStatus:
    """The status `trigger` moves a task in `current` to.

    Raises:
        IllegalTransition: the table has no such move.
    """
    try:
        return TRANSITIONS[(current, trigger)]
    except KeyError:
        raise IllegalTransition(f"no transition from {current} on {trigger}") from None


def sources(trigger: Trigger) -> frozenset[TaskStatus]:
    """The statuses from which `trigger` is allowed (for compare-and-set WHERE clauses)."""
    return frozenset(src for (src, trig) in TRANSITIONS if trig == trigger and src is not None)
