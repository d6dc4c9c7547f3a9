"""Time limits: the stop a renewal carries, the sweeper's overdue attempts, and queue timeouts."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.leases import decide_renew
from devsched.core.retrying import Retry, RetryCause, RetryPolicy
from devsched.core.status import EventKind, TaskReason, TaskStatus
from devsched.core.timeouts import decide_timeout, overdue, queue_timed_out, stop_reason

from .factories import DEVICE, T0, TTL, attempt, in_flight, ref_for, task

pytestmark = pytest.mark.unit


def _running(timeout_s: float | None = 60, deadline_in_s: float | None = None, **kw: object):  # type: ignore[no-untyped-def]
    cur = attempt(1, dispatched=True)
    cur = replace(cur, started_at=T0, expires_at=T0 + timedelta(days=1))
    t = task(TaskStatus.DISPATCHED, cur, **kw)  # type: ignore[arg-type]
    deadline = None if deadline_in_s is None else T0 + timedelta(seconds=deadline_in_s)
    return replace(t, attempt_timeout_s=timeout_s, deadline=deadline)


def test_no_limits_never_stop() -> None:
    assert stop_reason(_running(None), T0 + timedelta(days=365)) is None


@given(elapsed=st.floats(min_value=0, max_value=1e5), timeout=st.floats(min_value=0.001, max_value=1e4))
def test_the_attempt_timeout_stops_exactly_once_it_has_passed(elapsed: float, timeout: float) -> None:
    now = T0 + timedelta(seconds=elapsed)
    expected = "attempt_timeout" if now >= T0 + timedelta(seconds=timeout) else None
    assert stop_reason(_running(timeout), now) == expected
    # the sweeper gives the host one lease ttl more to stop
    assert overdue(_running(timeout), now + timedelta(seconds=TTL)) == expected


def test_the_deadline_wins_over_the_attempt_timeout() -> None:
    assert stop_reason(_running(10, deadline_in_s=5), T0 + timedelta(seconds=20)) == "deadline_exceeded"


def test_a_renewal_carries_the_stop() -> None:
    t = _running(10)
    assert decide_renew(t, t.current, ref_for(t), T0 + timedelta(seconds=5)).stop is None
    assert decide_renew(t, t.current, ref_for(t), T0 + timedelta(seconds=10)).stop == "attempt_timeout"


def test_an_overdue_attempt_fails_its_task_unless_the_policy_retries_timeouts() -> None:
    now = T0 + timedelta(seconds=100)
    decided = decide_timeout(_running(), "attempt_timeout", now)
    assert (decided.task_status, decided.reason, decided.event) == (
        TaskStatus.FAILED, TaskReason.ATTEMPT_TIMEOUT, EventKind.FAILED
    )  # fmt: skip
    policy = RetryPolicy(on=frozenset({RetryCause.ATTEMPT_TIMEOUT}))
    decided = decide_timeout(replace(_running(), retry=policy), "attempt_timeout", now)
    assert (decided.task_status, decided.event) == (TaskStatus.QUEUED, EventKind.REQUEUED)
    assert decided.retry == Retry(RetryCause.ATTEMPT_TIMEOUT, now + timedelta(seconds=5), DEVICE)
    decided = decide_timeout(replace(_running(), retry=policy), "deadline_exceeded", now)
    assert (decided.task_status, decided.reason) == (TaskStatus.FAILED, TaskReason.DEADLINE_EXCEEDED)


def test_a_pending_cancellation_wins_over_a_timeout() -> None:
    decided = decide_timeout(_running(cancel_requested=True), "attempt_timeout", T0)
    assert (decided.task_status, decided.event) == (TaskStatus.CANCELLED, EventKind.CANCELLED)


def test_the_queue_timeout_counts_from_entering_the_queue_or_the_end_of_the_backoff() -> None:
    def check(now_s: float, *, not_before_s: float | None = None, deadline_s: float | None = None) -> TaskReason | None:
        return queue_timed_out(
            entered=T0,
            not_before=None if not_before_s is None else T0 + timedelta(seconds=not_before_s),
            queue_timeout_s=10,
            deadline=None if deadline_s is None else T0 + timedelta(seconds=deadline_s),
            now=T0 + timedelta(seconds=now_s),
        )

    assert check(9.9) is None
    assert check(10) is TaskReason.QUEUE_TIMEOUT
    assert check(14, not_before_s=5) is None
    assert check(15, not_before_s=5) is TaskReason.QUEUE_TIMEOUT
    assert check(3, deadline_s=3) is TaskReason.DEADLINE_EXCEEDED


def test_in_flight_helper_has_no_limits() -> None:
    assert stop_reason(in_flight(), T0 + timedelta(days=1)) is None
