"""Health checks (an addition, issue 13): `P.api.health.set|list|delete`, for operators only.

A check is a plan the scheduler runs as a task of its own kind (`health`) on each device whose labels
contain the check's selector: on a quarantined device, before a device's first task, and again every
`interval_s` after it passed. Passing returns a quarantined device to service; failing keeps it out.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from devsched.core.health import HEALTH_INTERVAL_DEFAULT_S
from devsched.core.limits import TIMEOUT_MAX_S
from devsched.protocol.base import Labels, Name, ReplyModel, RequestModel, Timestamp, Token
from devsched.protocol.plans import Plan, refuse_reserved_labels

__all__ = [
    "HealthCheckDeleteRequest",
    "HealthCheckListReply",
    "HealthCheckListRequest",
    "HealthCheckSetRequest",
    "HealthCheckView",
    "HealthSelector",
]


class HealthSelector(RequestModel):
    """Which devices a check applies to: those whose labels contain these pairs (every device when empty)."""

    labels: Labels = Field(default_factory=dict)
    """A device matches when its labels contain every one of these pairs (bounded as a task's selector)."""

    _no_reserved_labels = field_validator("labels")(refuse_reserved_labels)


class HealthCheckSetRequest(RequestModel):
    """`P.api.health.set`: create or replace the check `name`."""

    name: Token
    """The check's name (letters, digits, `_`, `-`); setting an existing name replaces that check."""
    selector: HealthSelector = Field(default_factory=HealthSelector)
    """The devices it applies to; of several checks that apply to a device, the most recently set one runs."""
    plan: Plan
    """The steps to run on the device (a failing step fails the check)."""
    interval_s: float = Field(default=HEALTH_INTERVAL_DEFAULT_S, ge=1, le=TIMEOUT_MAX_S, allow_inf_nan=False)
    """Seconds between two runs on a device whose check passed (default a day)."""


class HealthCheckView(ReplyModel):
    """A check in force."""

    name: str
    """Its name."""
    selector: HealthSelector
    """The devices it applies to."""
    plan: Plan
    """What it runs."""
    interval_s: float
    """Seconds between two runs on a device whose check passed."""
    created_at: Timestamp
    """When it was first set."""
    updated_at: Timestamp
    """When it was last set."""


class HealthCheckListRequest(RequestModel):
    """`P.api.health.list`: every check in force, by name."""

    after: Token | None = Field(default=None, exclude_if=lambda v: v is None)
    """Addition: the `next` of the previous reply: only checks after it; left out when null."""


class HealthCheckListReply(ReplyModel):
    """The checks, by name."""

    checks: list[HealthCheckView]
    """Every check in force (up to `next`)."""
    next: str | None = None
    """Addition: set when the checks left would make the reply larger than NATS's `max_payload`: pass it as
    `after` for the rest; null when every check is listed."""


class HealthCheckDeleteRequest(RequestModel):
    """`P.api.health.delete`: remove a check (its health tasks already open run to their end)."""

    name: Name
    """The check's name; an unknown one is `not_found`."""
