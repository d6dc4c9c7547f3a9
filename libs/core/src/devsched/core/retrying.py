"""A task's retry policy: which failures queue it again, and how long it waits before its next attempt.

A task submitted without a policy keeps the behaviour devsched always had: a lease expiry or a release
queues it again at once (within `max_attempts`), a failed report ends it. With a policy, the causes it
names are retried, each after a backoff (`not_before`, by the database clock) and preferably on another
device than the one that failed; the others end the task. `max_attempts` stays the bound either way.
Pure: the store passes `now` and applies what these functions decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from devsched.core.backoff import backoff_ceiling


class RetryCause(StrEnum):
    """Why an attempt ended without success, as a retry policy names it (`retry.on`)."""

    #: A step marked `"infra": true` failed or timed out: the device or the lab, not the code under test.
    INFRA = "infra"
    #: The attempt's lease expired before its host reported (the host died, lost its network, ...).
    LEASE_EXPIRED = "lease_expired"
    #: The host gave the attempt back (agent shutdown, drain, restart).
    RELEASED = "released"
    #: A step not marked `infra` failed or timed out: the test failed.
    STEP_FAILED = "step_failed"
    #: The attempt ran past the task's `attempt_timeout_s`.
    ATTEMPT_TIMEOUT = "attempt_timeout"


#: What a policy retries when its `on` is not given.
DEFAULT_ON: frozenset[RetryCause] = frozenset({RetryCause.INFRA, RetryCause.LEASE_EXPIRED, RetryCause.RELEASED})
#: Defaults of a policy's backoff: the first retry waits `initial_s`, each next one `multiplier` times longer,
#: never more than `max_s`.
INITIAL_S_DEFAULT, MAX_S_DEFAULT, MULTIPLIER_DEFAULT = 5.0, 300.0, 2.0
#: What a task without a policy retries (at once, on any device).
WITHOUT_POLICY: frozenset[RetryCause] = frozenset({RetryCause.LEASE_EXPIRED, RetryCause.RELEASED})
#: The report reasons the agent gives when it stopped an attempt for a timeout (`P.host.<id>.renew`'s `stop`).
TIMEOUT_REASONS: frozenset[str] = frozenset({"attempt_timeout", "deadline_exceeded"})
#: Step statuses that count as the step failing.
_FAILING_STEPS = frozenset({"failed", "timed_out"})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The causes to retry and the backoff between attempts.

    Raises:
        ValueError: a backoff that is not finite, `initial_s` or `max_s` not above 0, `max_s` below
            `initial_s`, or `multiplier` below 1.
    """

    on: frozenset[RetryCause] = DEFAULT_ON
    initial_s: float = INITIAL_S_DEFAULT
    max_s: float = MAX_S_DEFAULT
    multiplier: float = MULTIPLIER_DEFAULT

    def __post_init__(self) -> None:
        values = (self.initial_s, self.max_s, self.multiplier)
        if not all(math.isfinite(v) for v in values):
            raise ValueError("backoff values must be finite")
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {self.initial_s}, {self.max_s}")
        if self.multiplier < 1:
            raise ValueError(f"need multiplier >= 1, got {self.multiplier}")

    def delay(self, retry: int) -> float:
        """Seconds the task waits before retry number `retry` (1 for the first).

        No jitter, so the view can say exactly when; tasks that failed at different times spread out anyway.
        """
        return backoff_ceiling(retry, base_s=self.initial_s, cap_s=self.max_s, multiplier=self.multiplier)

    def to_json(self) -> dict[str, Any]:
        """The policy as stored and shown: `{"on": [...], "backoff": {...}}`, `on` in the enum's order."""
        return {
            "on": [c.value for c in RetryCause if c in self.on],
            "backoff": {"initial_s": self.initial_s, "max_s": self.max_s, "multiplier": self.multiplier},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RetryPolicy:
        """The policy `to_json` wrote (or a submit's, with its defaults)."""
        backoff = data.get("backoff") or {}
        on = data.get("on")
        return cls(
            on=DEFAULT_ON if on is None else frozenset(RetryCause(c) for c in on),
            initial_s=float(backoff.get("initial_s", INITIAL_S_DEFAULT)),
            max_s=float(backoff.get("max_s", MAX_S_DEFAULT)),
            multiplier=float(backoff.get("multiplier", MULTIPLIER_DEFAULT)),
        )


@dataclass(frozen=True, slots=True)
class Retry:
    """A decision to queue the task again: not before `not_before` (None: at once), and the device to avoid."""

    cause: RetryCause
    not_before: datetime | None = None
    avoid_device_id: str | None = field(default=None)


def retries(policy: RetryPolicy | None, cause: RetryCause) -> bool:
    """Whether a failure of `cause` queues the task again (attempts left) under `policy`."""
    return cause in (WITHOUT_POLICY if policy is None else policy.on)


def retry(policy: RetryPolicy | None, cause: RetryCause, attempt: int, device_id: str, now: datetime) -> Retry:
    """The retry of a task whose attempt number `attempt` on `device_id` ended for `cause` at `now`.

    Without a policy the task is queued at once and may take any device (devsched's behaviour before
    policies); with one, it waits `policy.delay(attempt)` and prefers another device than `device_id`.
    """
    if policy is None:
        return Retry(cause)
    return Retry(cause, now + timedelta(seconds=policy.delay(attempt)), device_id)


def failure_cause(plan: Mapping[str, Any], result: Mapping[str, Any] | None, reason: str | None) -> RetryCause | None:
    """What made a reported run fail: None for a timeout the agent stopped at the deadline (never retried).

    `attempt_timeout` when the agent stopped the run for the attempt timeout (its reason); `infra` when the
    first failing step is marked `"infra": true` in the plan; `step_failed` otherwise (also when the result
    names no failing step: a failure nobody explained is not blamed on the lab).
    """
    # the agent's reason starts with the limit's code; later failures (a teardown's) follow after "; "
    head = (reason or "").split(";", 1)[0].strip()
    if head == "deadline_exceeded":
        return None
    if head == "attempt_timeout":
        return RetryCause.ATTEMPT_TIMEOUT
    infra = {s.get("name") for s in _steps(plan) if s.get("infra") is True}
    for step in _steps(result):
        if step.get("status") in _FAILING_STEPS:
            return RetryCause.INFRA if step.get("name") in infra else RetryCause.STEP_FAILED
    return RetryCause.STEP_FAILED


def _steps(container: Mapping[str, Any] | None) -> Sequence[Mapping[str, Any]]:
    steps = (container or {}).get("steps")
    return [s for s in steps if isinstance(s, Mapping)] if isinstance(steps, list) else []
