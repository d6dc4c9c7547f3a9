"""Expiry: bounded retry, failure at the limit, and a pending cancellation that wins."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsched.core.errors import IllegalTransition, LeaseExpired
from devsched.core.expiry import ExpiryDecision, decide_expiry, is_expired
from devsched.core.leases import decide_renew
from devsched.core.lifecycle import Trigger
from devsched.core.status import AttemptStatus, EventKind, TaskReason, TaskStatus

from .factories import T0, TTL, attempt, in_flight, ref_for, task

pytestmark = pytest.mark.unit

IN_FLIGHT = [TaskStatus.ASSIGNED, TaskStatus.DISPATCHED]
EXPIRES = T0 + timedelta(seconds=TTL)
US = timedelta(microseconds=1)


@pytest.mark.parametrize("status", IN_FLIGHT)
@pytest.mark.parametrize(("n", "max_attempts"), [(1, 2), (1, 3), (2, 3), (99, 100)])
def test_lease_expires_with_attempts_remaining(status: TaskStatus, n: int, max_attempts: int) -> None:
    t = in_flight(status, n=n, max_attempts=max_attempts)
    assert decide_expiry(t) == ExpiryDecision(Trigger.EXPIRE_REQUEUE, TaskStatus.QUEUED, None, EventKind.REQUEUED)


@pytest.mark.parametrize("status", IN_FLIGHT)
@pytest.mark.parametrize(("n", "max_attempts"), [(1, 1), (3, 3), (100, 100)])
def test_lease_expires_at_attempt_limit(status: TaskStatus, n: int, max_attempts: int) -> None:
    t = in_flight(status, n=n, max_attempts=max_attempts)
    assert decide_expiry(t) == ExpiryDecision(
        Trigger.EXPIRE_FAIL, TaskStatus.FAILED, TaskReason.LEASE_EXPIRED, EventKind.FAILED
    )
    assert decide_expiry(t).reason == "lease_expired"


@pytest.mark.parametrize("status", IN_FLIGHT)
@pytest.mark.parametrize(("n", "max_attempts"), [(1, 3), (3, 3), (1, 1)])
def test_lease_expires_with_a_cancellation_pending(status: TaskStatus, n: int, max_attempts: int) -> None:
    t = in_flight(status, n=n, max_attempts=max_attempts, cancel_requested=True)
    assert decide_expiry(t) == ExpiryDecision(
        Trigger.EXPIRE_CANCEL,
        TaskStatus.CANCELLED,
        TaskReason.CANCELLED_AFTER_LEASE_EXPIRED,
        EventKind.CANCELLED,
    )


@pytest.mark.parametrize("status", IN_FLIGHT)
@pytest.mark.parametrize(("n", "releases", "max_attempts"), [(2, 1, 1), (11, 10, 1), (4, 2, 3)])
def test_released_attempts_do_not_count_against_the_limit(
    status: TaskStatus, n: int, releases: int, max_attempts: int
) -> None:
    # attempt n expires after `releases` earlier attempts were given back: n - releases were spent
    t = replace(in_flight(status, n=n, max_attempts=max_attempts), releases=releases)
    assert t.attempts_spent == n - releases
    expected = TaskStatus.FAILED if n - releases >= max_attempts else TaskStatus.QUEUED
    assert decide_expiry(t).task_status is expected


@settings(max_examples=100, deadline=None)
@given(
    max_attempts=st.integers(1, 100),
    data=st.data(),
    cancel=st.booleans(),
    status=st.sampled_from(IN_FLIGHT),
)
def test_expiry_decision_is_total_and_bounded(
    max_attempts: int, data: st.DataObject, cancel: bool, status: TaskStatus
) -> None:
    n = data.draw(st.integers(1, max_attempts))
    d = decide_expiry(in_flight(status, n=n, max_attempts=max_attempts, cancel_requested=cancel))
    if cancel:
        assert d.task_status is TaskStatus.CANCELLED
    elif n < max_attempts:
        assert d.task_status is TaskStatus.QUEUED
    else:
        assert d.task_status is TaskStatus.FAILED
    # a requeue never leads to an attempt past the limit
    assert d.task_status is not TaskStatus.QUEUED or n + 1 <= max_attempts
    assert d.event.value == d.task_status.value or d.event is EventKind.REQUEUED


@pytest.mark.parametrize("status", [TaskStatus.QUEUED, TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED])
def test_expiry_of_a_task_not_in_flight_is_illegal(status: TaskStatus) -> None:
    with pytest.raises(IllegalTransition):
        decide_expiry(replace(in_flight(), status=status))


# --- is_expired --------------------------------------------------------------------------------


def test_is_expired_boundaries() -> None:
    t = in_flight(TaskStatus.DISPATCHED)
    assert not is_expired(t, T0)
    assert not is_expired(t, EXPIRES - US)
    assert is_expired(t, EXPIRES)
    assert is_expired(t, EXPIRES + US)
    assert is_expired(t, EXPIRES + timedelta(days=1))


def test_is_expired_agrees_with_the_lease_rules_at_the_boundary() -> None:
    # The sweeper and renew must not both own the lease at one instant: renew fails exactly when
    # the sweep may take it.
    t = in_flight(TaskStatus.DISPATCHED)
    for now in (EXPIRES - US, EXPIRES, EXPIRES + US):
        try:
            decide_renew(t, t.current, ref_for(t), now)
        except LeaseExpired:
            renewable = False
        else:
            renewable = True
        assert renewable is not is_expired(t, now)


def test_no_attempt_is_not_expired() -> None:
    assert not is_expired(task(TaskStatus.QUEUED), EXPIRES + timedelta(days=1))


@pytest.mark.parametrize("attempt_status", [s for s in AttemptStatus if s is not AttemptStatus.ACTIVE])
def test_ended_attempt_is_not_expired_again(attempt_status: AttemptStatus) -> None:
    t = task(TaskStatus.QUEUED, attempt(1, status=attempt_status))
    assert not is_expired(t, EXPIRES + timedelta(days=1))
