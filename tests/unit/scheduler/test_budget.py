"""The storage budgets: each host's share, and the sum checked against the JetStream store."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devsched.scheduler.budget import Budget, problem
from devsched.scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.unit

MiB = 1024 * 1024
DSN = "postgresql+asyncpg://u:p@h/d"


def settings(**values: object) -> SchedulerSettings:
    return SchedulerSettings.model_validate({"database_url": DSN, **values})


def test_each_host_gets_its_share_of_the_budgets() -> None:
    s = settings(max_hosts=4, logs_max_bytes=40 * MiB, uploads_max_bytes=4 * 300 * MiB)
    assert (s.logs_host_max_bytes, s.uploads_host_max_bytes) == (10 * MiB, 300 * MiB)
    assert settings(logs_max_bytes=-1).logs_host_max_bytes == -1


def test_an_upload_share_too_small_for_the_largest_file_is_refused() -> None:
    with pytest.raises(ValidationError, match="must hold the largest artifact file"):
        settings(max_hosts=4, uploads_max_bytes=4 * MiB, artifact_max_file_bytes=2 * MiB)
    settings(max_hosts=4, uploads_max_bytes=4 * 3 * MiB, artifact_max_file_bytes=2 * MiB)


def test_an_upload_rate_window_too_small_for_an_attempts_artifacts_is_refused() -> None:
    # 16 chunks of 2 MiB, each charged 132 KiB: 2,112 KiB.
    with pytest.raises(ValidationError, match="must hold one attempt's artifacts"):
        settings(artifact_max_attempt_bytes=2 * MiB, host_upload_bytes_per_s=MiB, host_upload_rate_window_s=2.0)
    s = settings(artifact_max_attempt_bytes=2 * MiB, host_upload_bytes_per_s=1056 * 1024, host_upload_rate_window_s=2.0)
    assert s.upload_share.max_bytes == 2112 * 1024
    assert settings().upload_share.max_bytes == 1920 * MiB, "the defaults hold a whole attempt (1,056 MiB charged)"


def test_the_sum_of_the_caps_must_fit_the_store() -> None:
    s = settings(
        max_hosts=2,
        events_max_bytes=10 * MiB,
        logs_max_bytes=20 * MiB,
        uploads_max_bytes=2 * 8 * MiB,
        artifact_max_file_bytes=4 * MiB,
        artifacts_max_bytes=30 * MiB,
        revoked_sessions_max_bytes=1 * MiB,  # the dashboard's revoked sessions count too
        jetstream_reserve_bytes=3 * MiB,
    )
    budget = Budget.of(s)
    assert budget.revoked_sessions == 1 * MiB
    assert budget.total == 80 * MiB
    assert problem(budget, 80 * MiB) is None
    assert problem(budget, None) is None, "a store of unknown size is not checked"
    refusal = problem(budget, 79 * MiB)
    assert refusal is not None
    assert "\n" not in refusal
    assert f"= {80 * MiB} bytes, more than the {79 * MiB} bytes of the store" in refusal


def test_an_uncapped_stream_does_not_fit_a_store_of_known_size() -> None:
    refusal = problem(Budget.of(settings(events_max_bytes=-1)), 100 * 1024 * MiB)
    assert refusal is not None
    assert "events_max_bytes has no cap" in refusal
