"""Cancellation: immediate for a queued task, a durable request for one in flight."""

from __future__ import annotations

from enum import StrEnum

from devsched.core.lifecycle import Trigger, next_status
from devsched.core.records import TaskRecord
from devsched.core.status import IN_FLIGHT, TERMINAL, TaskStatus


class CancelKind(StrEnum):
    """What a cancel request does."""

    #: Queued: the task ends as cancelled now.
    CANCEL_NOW = "cancel_now"
    #: In flight: record a request against the current attempt, emit `cancel_requested`, nudge the host.
    RECORD_REQUEST = "record_request"
    #: In flight with a request already recorded: nothing changes, no second event.
    ALREADY_REQUESTED = "already_requested"
    #: Terminal: nothing changes.
    TERMINAL = "terminal"


def decide_cancel(task: TaskRecord) -> CancelKind:
    """How to handle a cancel of `task` in its current state."""
    if task.status in TERMINAL:
        return CancelKind.TERMINAL
    if task.status is TaskStatus.QUEUED:
        next_status(task.status, Trigger.CANCEL)
        return CancelKind.CANCEL_NOW
    assert task.status in IN_FLIGHT
    return CancelKind.ALREADY_REQUESTED if task.cancel_requested else CancelKind.RECORD_REQUEST
