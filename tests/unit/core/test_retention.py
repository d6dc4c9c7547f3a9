"""The retention rule: only ended tasks, only once both their creation and last change are older than keep."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.retention import RETENTION_DEFAULT, RETENTION_MIN, check_retention, prunable
from devsched.core.status import TERMINAL, TaskStatus

NOW = datetime(2030, 1, 1, tzinfo=UTC)
KEEP = timedelta(days=30)


def test_an_ended_task_older_than_the_retention_is_prunable() -> None:
    old = NOW - timedelta(days=31)
    for status in TERMINAL:
        assert prunable(status, old, old, NOW, KEEP)


def test_a_queued_or_running_task_is_never_prunable_however_old() -> None:
    ancient = NOW - timedelta(days=3650)
    for status in set(TaskStatus) - TERMINAL:
        assert not prunable(status, ancient, ancient, NOW, KEEP)


def test_an_old_task_that_ended_recently_is_kept() -> None:
    assert not prunable(TaskStatus.DONE, NOW - timedelta(days=90), NOW - timedelta(days=1), NOW, KEEP)


def test_a_retention_under_the_floor_is_refused() -> None:
    with pytest.raises(ValueError, match="shorter than the least allowed"):
        check_retention(RETENTION_MIN - timedelta(seconds=1))
    with pytest.raises(ValueError, match="shorter than the least allowed"):
        prunable(TaskStatus.DONE, NOW - KEEP * 2, NOW - KEEP * 2, NOW, timedelta(0))
    assert check_retention(RETENTION_MIN) == RETENTION_MIN
    assert check_retention(RETENTION_DEFAULT) == RETENTION_DEFAULT


@given(
    status=st.sampled_from(list(TaskStatus)),
    created_ago=st.integers(min_value=0, max_value=100 * 86400),
    changed_after=st.integers(min_value=0, max_value=100 * 86400),
    keep_s=st.integers(min_value=3600, max_value=60 * 86400),
)
def test_prunable_exactly_when_ended_and_last_changed_before_the_cutoff(
    status: TaskStatus, created_ago: int, changed_after: int, keep_s: int
) -> None:
    created = NOW - timedelta(seconds=created_ago)
    updated = min(created + timedelta(seconds=changed_after), NOW)  # a task changes after its creation
    keep = timedelta(seconds=keep_s)
    expected = status in TERMINAL and updated < NOW - keep
    assert prunable(status, created, updated, NOW, keep) is expected
