"""Cancel: immediate while queued, a durable request while in flight, nothing once terminal."""

from __future__ import annotations

import pytest

from devsched.core.cancellation import CancelKind, decide_cancel
from devsched.core.lifecycle import Trigger, next_status
from devsched.core.status import TERMINAL, AttemptStatus, TaskStatus

from .factories import attempt, in_flight, task

pytestmark = pytest.mark.unit


def test_queued_task_is_cancelled_now() -> None:
    assert decide_cancel(task(TaskStatus.QUEUED)) is CancelKind.CANCEL_NOW
    assert next_status(TaskStatus.QUEUED, Trigger.CANCEL) is TaskStatus.CANCELLED


def test_requeued_task_is_cancelled_now() -> None:
    # queued again after an expiry: its old attempt is kept (expired) but nothing is in flight.
    t = task(TaskStatus.QUEUED, attempt(1, status=AttemptStatus.EXPIRED))
    assert decide_cancel(t) is CancelKind.CANCEL_NOW


@pytest.mark.parametrize("status", [TaskStatus.ASSIGNED, TaskStatus.DISPATCHED])
def test_in_flight_task_without_a_request_records_one(status: TaskStatus) -> None:
    assert decide_cancel(in_flight(status, cancel_requested=False)) is CancelKind.RECORD_REQUEST


@pytest.mark.parametrize("status", [TaskStatus.ASSIGNED, TaskStatus.DISPATCHED])
def test_in_flight_task_with_a_request_is_already_requested(status: TaskStatus) -> None:
    # A repeated cancel is harmless and emits no second event.
    assert decide_cancel(in_flight(status, cancel_requested=True)) is CancelKind.ALREADY_REQUESTED


@pytest.mark.parametrize("status", sorted(TERMINAL))
@pytest.mark.parametrize("requested", [False, True])
def test_terminal_task_is_left_alone(status: TaskStatus, requested: bool) -> None:
    t = task(status, attempt(1, status=AttemptStatus.EXPIRED), cancel_requested=requested)
    assert decide_cancel(t) is CancelKind.TERMINAL


def test_terminal_task_without_attempts_is_left_alone() -> None:
    # cancelled while queued before any assignment
    assert decide_cancel(task(TaskStatus.CANCELLED)) is CancelKind.TERMINAL


def test_every_status_has_a_decision() -> None:
    seen = {decide_cancel(task(s, attempt(1) if s is not TaskStatus.QUEUED else None)) for s in TaskStatus}
    assert seen == {CancelKind.CANCEL_NOW, CancelKind.RECORD_REQUEST, CancelKind.TERMINAL}
