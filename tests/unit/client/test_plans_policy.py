"""The CLI's submit options for retry policies and time limits, as `build_request` applies them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from devsched.client import InvalidRequest, build_request
from devsched.core.retrying import RetryCause

pytestmark = pytest.mark.unit

PLAN = {"steps": [{"name": "s", "action": "noop"}]}


def test_retry_on_gives_a_policy_with_the_default_backoff() -> None:
    req = build_request(PLAN, retry_on=["infra", "step_failed"])
    assert req.retry is not None
    assert set(req.retry.on) == {RetryCause.INFRA, RetryCause.STEP_FAILED}
    assert req.retry.backoff.initial_s == 5


def test_retry_on_keeps_the_file_s_backoff() -> None:
    source = {"plan": PLAN, "retry": {"backoff": {"initial_s": 1, "max_s": 2}}}
    req = build_request(source, retry_on=["lease_expired"])
    assert req.retry is not None
    assert (list(req.retry.on), req.retry.backoff.max_s) == ([RetryCause.LEASE_EXPIRED], 2)


def test_limits_and_a_relative_deadline() -> None:
    before = datetime.now(UTC)
    req = build_request(PLAN, queue_timeout_s=60, attempt_timeout_s=600, deadline="+3600")
    assert (req.queue_timeout_s, req.attempt_timeout_s) == (60, 600)
    assert req.deadline is not None
    assert before + timedelta(seconds=3600) <= req.deadline <= datetime.now(UTC) + timedelta(seconds=3600)
    absolute = build_request(PLAN, deadline="2030-01-01T00:00:00Z").deadline
    assert absolute == datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("kwargs", "path"), [({"deadline": "+soon"}, "deadline"), ({"retry_on": ["x"]}, "retry.on.0")])
def test_bad_options_name_their_field(kwargs: dict[str, object], path: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        build_request(PLAN, **kwargs)  # type: ignore[arg-type]
    assert path in [e["path"] for e in err.value.details["errors"]]
