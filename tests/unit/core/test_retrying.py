"""The retry policy: which failures queue a task again, after which backoff, avoiding which device."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.expiry import decide_expiry
from devsched.core.leases import decide_release, decide_report
from devsched.core.lifecycle import Trigger
from devsched.core.retrying import (
    DEFAULT_ON,
    Retry,
    RetryCause,
    RetryPolicy,
    failure_cause,
    retries,
    retry,
)
from devsched.core.status import EventKind, Outcome, TaskReason, TaskStatus

from .factories import DEVICE, T0, in_flight, ref_for

pytestmark = pytest.mark.unit

POLICY = RetryPolicy()
PLAN = {"steps": [{"name": "flash", "infra": True}, {"name": "test"}, {"name": "logs", "always": True}]}


def _result(**statuses: str) -> dict[str, object]:
    return {"steps": [{"name": n, "status": s} for n, s in statuses.items()]}


def test_the_default_policy_is_the_issue_s() -> None:
    assert POLICY.to_json() == {
        "on": ["infra", "lease_expired", "released"],
        "backoff": {"initial_s": 5.0, "max_s": 300.0, "multiplier": 2.0},
    }
    assert RetryPolicy.from_json({}) == POLICY
    assert RetryPolicy.from_json(POLICY.to_json()) == POLICY


def test_backoff_multiplies_up_to_its_cap() -> None:
    assert [POLICY.delay(n) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert RetryPolicy(initial_s=2, max_s=9, multiplier=1).delay(50) == 2


@given(
    initial=st.floats(min_value=0.001, max_value=1000),
    extra=st.floats(min_value=0, max_value=1e6),
    multiplier=st.floats(min_value=1, max_value=100),
    n=st.integers(min_value=1, max_value=100_000),
)
def test_backoff_never_shrinks_and_stays_within_its_bounds(
    initial: float, extra: float, multiplier: float, n: int
) -> None:
    policy = RetryPolicy(initial_s=initial, max_s=initial + extra, multiplier=multiplier)
    assert initial <= policy.delay(n) <= policy.max_s
    assert policy.delay(n) <= policy.delay(n + 1)


@pytest.mark.parametrize(
    "kwargs", [{"initial_s": 0}, {"initial_s": -1}, {"max_s": 1, "initial_s": 2}, {"multiplier": 0.5},
               {"initial_s": float("nan")}, {"max_s": float("inf")}]
)  # fmt: skip
def test_nonsense_backoffs_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"need|finite"):
        RetryPolicy(**kwargs)


def test_without_a_policy_only_expiries_and_releases_are_retried_at_once_anywhere() -> None:
    assert [c for c in RetryCause if retries(None, c)] == [RetryCause.LEASE_EXPIRED, RetryCause.RELEASED]
    assert retry(None, RetryCause.LEASE_EXPIRED, 1, DEVICE, T0) == Retry(RetryCause.LEASE_EXPIRED)


def test_a_policy_waits_its_backoff_and_avoids_the_failed_device() -> None:
    assert retry(POLICY, RetryCause.INFRA, 2, DEVICE, T0) == Retry(RetryCause.INFRA, T0 + timedelta(seconds=10), DEVICE)
    assert {RetryCause.INFRA, RetryCause.LEASE_EXPIRED, RetryCause.RELEASED} == DEFAULT_ON


@pytest.mark.parametrize(
    ("result", "reason", "cause"),
    [
        (_result(flash="failed", test="skipped", logs="done"), "step flash failed", RetryCause.INFRA),
        (_result(flash="timed_out", test="skipped", logs="done"), None, RetryCause.INFRA),
        (_result(flash="done", test="failed", logs="done"), None, RetryCause.STEP_FAILED),
        (_result(flash="done", test="done", logs="failed"), None, RetryCause.STEP_FAILED),
        (None, "no result", RetryCause.STEP_FAILED),
        (_result(flash="done", test="interrupted"), "attempt_timeout", RetryCause.ATTEMPT_TIMEOUT),
        (_result(flash="done", test="interrupted"), "deadline_exceeded", None),
    ],
)
def test_the_cause_of_a_failed_run_is_its_first_failing_step(
    result: dict[str, object] | None, reason: str | None, cause: RetryCause | None
) -> None:
    assert failure_cause(PLAN, result, reason) == cause


def test_an_infra_failure_is_retried_by_a_policy_and_a_test_failure_is_not() -> None:
    task = replace(in_flight(TaskStatus.DISPATCHED), retry=POLICY)
    infra = decide_report(task, task.current, ref_for(task), Outcome.FAILED, T0,
                          cancel_requested_for_attempt=False, failure=RetryCause.INFRA)  # fmt: skip
    assert infra.task_status is TaskStatus.QUEUED
    assert infra.retry == Retry(RetryCause.INFRA, T0 + timedelta(seconds=5), DEVICE)
    failed = decide_report(task, task.current, ref_for(task), Outcome.FAILED, T0,
                           cancel_requested_for_attempt=False, failure=RetryCause.STEP_FAILED)  # fmt: skip
    assert (failed.task_status, failed.retry) == (TaskStatus.FAILED, None)


def test_a_failed_report_is_never_retried_without_a_policy_or_past_max_attempts() -> None:
    plain = in_flight(TaskStatus.DISPATCHED)
    decided = decide_report(plain, plain.current, ref_for(plain), Outcome.FAILED, T0,
                            cancel_requested_for_attempt=False, failure=RetryCause.INFRA)  # fmt: skip
    assert decided.task_status is TaskStatus.FAILED
    last = replace(in_flight(TaskStatus.DISPATCHED, n=3, max_attempts=3), retry=POLICY)
    decided = decide_report(last, last.current, ref_for(last), Outcome.FAILED, T0,
                            cancel_requested_for_attempt=False, failure=RetryCause.INFRA)  # fmt: skip
    assert decided.task_status is TaskStatus.FAILED


def test_step_failed_is_retried_when_the_policy_says_so() -> None:
    task = replace(in_flight(TaskStatus.DISPATCHED), retry=RetryPolicy(on=frozenset({RetryCause.STEP_FAILED})))
    decided = decide_report(task, task.current, ref_for(task), Outcome.FAILED, T0,
                            cancel_requested_for_attempt=False, failure=RetryCause.STEP_FAILED)  # fmt: skip
    assert decided.task_status is TaskStatus.QUEUED


def test_an_expiry_with_a_policy_backs_off_and_one_it_does_not_name_fails() -> None:
    task = replace(in_flight(n=2), retry=POLICY)
    decided = decide_expiry(task, T0)
    assert (decided.trigger, decided.retry) == (
        Trigger.EXPIRE_REQUEUE,
        Retry(RetryCause.LEASE_EXPIRED, T0 + timedelta(seconds=10), DEVICE),
    )
    strict = replace(task, retry=RetryPolicy(on=frozenset({RetryCause.INFRA})))
    decided = decide_expiry(strict, T0)
    assert (decided.task_status, decided.reason, decided.event) == (
        TaskStatus.FAILED, TaskReason.LEASE_EXPIRED, EventKind.FAILED
    )  # fmt: skip


def test_a_release_with_a_policy_backs_off_and_one_it_does_not_name_fails() -> None:
    task = replace(in_flight(), retry=POLICY)
    decided = decide_release(task, task.current, ref_for(task), T0, max_releases=10)
    assert decided.task_status is TaskStatus.QUEUED
    assert decided.retry == Retry(RetryCause.RELEASED, T0 + timedelta(seconds=5), DEVICE)
    strict = replace(task, retry=RetryPolicy(on=frozenset({RetryCause.INFRA})))
    decided = decide_release(strict, strict.current, ref_for(strict), T0, max_releases=10)
    assert (decided.task_status, decided.reason) == (TaskStatus.FAILED, TaskReason.RELEASED)
