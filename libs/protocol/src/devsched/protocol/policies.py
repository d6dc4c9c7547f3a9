"""A task's retry policy and time limits as a submit carries them (an addition, issue 13).

The rules they feed are core's (`devsched.core.retrying`, `devsched.core.timeouts`); these models check a
request against them, so a bad policy is an `invalid_request` naming its field, never a stored surprise.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from devsched.core.limits import TIMEOUT_MAX_S
from devsched.core.retrying import DEFAULT_ON, INITIAL_S_DEFAULT, MAX_S_DEFAULT, MULTIPLIER_DEFAULT, RetryCause
from devsched.core.retrying import RetryPolicy as CorePolicy
from devsched.protocol.base import Lax, RequestModel

__all__ = [
    "Backoff",
    "RetryPolicy",
]

#: A time limit or backoff, in seconds: > 0, finite, fractional allowed, at most `TIMEOUT_MAX_S`.
Limit = Annotated[float, Field(gt=0, le=TIMEOUT_MAX_S, allow_inf_nan=False)]


class Backoff(RequestModel):
    """How long a retried task waits: `initial_s`, then `multiplier` times longer each retry, at most `max_s`."""

    initial_s: Limit = INITIAL_S_DEFAULT
    """The wait before the first retry, in seconds (> 0)."""
    max_s: Limit = MAX_S_DEFAULT
    """The longest wait, in seconds; at least `initial_s`."""
    multiplier: float = Field(default=MULTIPLIER_DEFAULT, ge=1, le=1000, allow_inf_nan=False)
    """How much longer each next wait is (>= 1; 1 waits `initial_s` every time)."""

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> Backoff:
        if self.max_s < self.initial_s:
            raise PydanticCustomError("max_below_initial", "max_s must be at least initial_s")
        return self


class RetryPolicy(RequestModel):
    """Which failures queue the task again (within `max_attempts`), and the backoff before each retry."""

    on: list[Lax[RetryCause]] = Field(
        default_factory=lambda: [c for c in RetryCause if c in DEFAULT_ON], max_length=len(RetryCause)
    )
    """Causes retried: `infra`, `lease_expired`, `released` (the default), `step_failed`, `attempt_timeout`."""
    backoff: Backoff = Field(default_factory=Backoff)
    """The wait before each retry."""

    def to_core(self) -> CorePolicy:
        """Core's policy, for the store."""
        b = self.backoff
        return CorePolicy(on=frozenset(self.on), initial_s=b.initial_s, max_s=b.max_s, multiplier=b.multiplier)
