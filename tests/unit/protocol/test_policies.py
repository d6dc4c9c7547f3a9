"""A submit's retry policy and time limits: defaults, and an `invalid_request` naming each bad field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devsched.core.errors import InvalidRequest
from devsched.core.retrying import RetryCause, RetryPolicy
from devsched.protocol import messages as m
from devsched.protocol.codec import decode, encode

pytestmark = pytest.mark.unit

PLAN = {"steps": [{"name": "flash", "action": "noop", "infra": True}, {"name": "test", "action": "noop"}]}


def _submit(**fields: Any) -> m.SubmitRequest:
    return decode(m.SubmitRequest, json.dumps({"plan": PLAN, **fields}).encode())


def _paths(**fields: Any) -> list[tuple[str, str]]:
    with pytest.raises(InvalidRequest) as err:
        _submit(**fields)
    return [(e["path"], e["message"]) for e in err.value.details["errors"]]


def test_a_submit_without_the_additions_has_none() -> None:
    req = decode(m.SubmitRequest, json.dumps({"plan": {"steps": [{"name": "s", "action": "noop"}]}}).encode())
    assert (req.retry, req.queue_timeout_s, req.attempt_timeout_s, req.deadline) == (None, None, None, None)
    # the plan is written as before: `infra` is left out when false
    assert "infra" not in json.loads(encode(req))["plan"]["steps"][0]


def test_an_empty_retry_is_the_issue_s_defaults() -> None:
    req = _submit(retry={})
    assert req.retry is not None
    assert req.retry.to_core() == RetryPolicy()
    assert json.loads(encode(req))["plan"]["steps"][0]["infra"] is True


def test_a_full_policy_and_limits_are_read() -> None:
    req = _submit(
        retry={"on": ["infra", "step_failed"], "backoff": {"initial_s": 1, "max_s": 60.5, "multiplier": 3}},
        queue_timeout_s=30,
        attempt_timeout_s=0.5,
        deadline="2030-01-01T00:00:00+01:00",
    )
    assert req.retry is not None
    core = req.retry.to_core()
    assert (core.on, core.initial_s, core.max_s, core.multiplier) == (
        frozenset({RetryCause.INFRA, RetryCause.STEP_FAILED}), 1, 60.5, 3
    )  # fmt: skip
    assert (req.queue_timeout_s, req.attempt_timeout_s) == (30, 0.5)
    assert req.deadline is not None
    assert req.deadline.isoformat() == "2029-12-31T23:00:00+00:00"


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"retry": {"on": ["infra", "cosmic_rays"]}}, "retry.on.1"),
        ({"retry": {"on": "infra"}}, "retry.on"),
        ({"retry": {"backoff": {"initial_s": 0}}}, "retry.backoff.initial_s"),
        ({"retry": {"backoff": {"initial_s": -1}}}, "retry.backoff.initial_s"),
        ({"retry": {"backoff": {"max_s": 0}}}, "retry.backoff.max_s"),
        ({"retry": {"backoff": {"multiplier": 0.5}}}, "retry.backoff.multiplier"),
        ({"retry": {"backoff": {"initial_s": 10, "max_s": 5}}}, "retry.backoff"),
        ({"retry": {"backoff": {"jitter": 1}}}, "retry.backoff.jitter"),
        ({"retry": {"max": 3}}, "retry.max"),
        ({"queue_timeout_s": 0}, "queue_timeout_s"),
        ({"attempt_timeout_s": -5}, "attempt_timeout_s"),
        ({"attempt_timeout_s": 1e12}, "attempt_timeout_s"),
        ({"deadline": "tomorrow"}, "deadline"),
        ({"deadline": "2030-01-01T00:00:00"}, "deadline"),
        ({"plan": {"steps": [{"name": "s", "action": "noop", "infra": "yes"}]}}, "plan.steps.0.infra"),
    ],
)
def test_a_bad_policy_or_limit_is_an_invalid_request_naming_its_field(fields: dict[str, Any], path: str) -> None:
    assert path in [p for p, _ in _paths(**fields)]


def test_max_below_initial_says_so() -> None:
    assert _paths(retry={"backoff": {"initial_s": 10, "max_s": 5}}) == [
        ("retry.backoff", "max_s must be at least initial_s")
    ]


def test_a_lease_reply_carries_stop_only_when_set() -> None:
    reply = m.LeaseReply(expires_at="2030-01-01T00:00:00Z", ttl_s=30, cancel_requested=False)  # type: ignore[arg-type]
    assert "stop" not in json.loads(encode(reply))
    stopped = decode(
        m.LeaseReply,
        b'{"expires_at": "2030-01-01T00:00:00Z", "ttl_s": 30, "cancel_requested": false, "stop": "attempt_timeout"}',
    )
    assert stopped.stop == "attempt_timeout"
