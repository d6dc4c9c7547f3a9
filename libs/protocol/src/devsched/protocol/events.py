"""Messages that are published rather than requested: assignments, task events, nudges, drain notices, errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from devsched.core.events import DeviceEventCause, DeviceEventKind
from devsched.core.status import EventKind, TaskStatus
from devsched.protocol.base import Id, Lax, ReplyModel, Timestamp, Token
from devsched.protocol.plans import Plan, Progress

__all__ = [
    "Assignment",
    "DeviceEventMessage",
    "DrainNotice",
    "ErrorBody",
    "ErrorDetail",
    "Nudge",
    "TaskEvent",
]


class Assignment(ReplyModel):
    """JetStream message on `P.assign.<host_id>`, one per new attempt (`Nats-Msg-Id: <task_id>.<attempt>`)."""

    task_id: Id
    """The task."""
    attempt: int = Field(ge=1)
    """The new attempt's number; name it in claim, renew and report."""
    lease_id: Id
    """The new lease; name it in claim, renew and report."""
    device_id: Token
    """The reserved device, one of the host's."""
    plan: Plan
    """The steps to run."""
    ttl_s: int = Field(ge=1)
    """Lease length in seconds."""
    expires_at: Timestamp
    """When the unclaimed lease runs out (database clock)."""


class TaskEvent(ReplyModel):
    """JetStream message on `P.events.task.<task_id>`, one per state change.

    Fields that do not apply to a kind are null.
    """

    event: Lax[EventKind]
    """What happened."""
    task_id: Id
    """The task."""
    seq: int = Field(ge=1)
    """The task's events counted from 1 in commit order: readers order by it, not by arrival."""
    attempt: int | None = Field(default=None, ge=1)
    """The attempt concerned, if any."""
    status: Lax[TaskStatus]
    """The task's status after the change."""
    at: Timestamp
    """Commit time of the change."""
    host_id: Token | None = None
    """The host concerned, if any."""
    device_id: Token | None = None
    """The device concerned, if any."""
    reason: str | None = None
    """End reason, requeue reason or cancellation reason, where one applies."""
    progress: Progress | None = None
    """Only on `progress` events: the step the attempt reached."""


class DeviceEventMessage(ReplyModel):
    """JetStream message on `P.events.device.<device_id>` (an addition): a device quarantined or returned.

    `Nats-Msg-Id: device.<device_id>.<n>`, unique per event. Readers that follow only task subjects never
    see it.
    """

    event: Lax[DeviceEventKind]
    """`device_quarantined` or `device_returned`."""
    device_id: Token
    """The device."""
    host_id: Token
    """Its host."""
    at: Timestamp
    """Commit time of the change."""
    by: Lax[DeviceEventCause]
    """What changed it: `infra_failures` (the count reached the threshold), `health_check`, `operator`."""
    infra_failures: int = Field(ge=0)
    """The device's consecutive infrastructure failures after the change (0 on a return)."""
    reason: str | None = None
    """The quarantine's reason (on a return: of the quarantine lifted)."""


class Nudge(ReplyModel):
    """Core NATS message on `P.host.<host_id>.nudge`: renew now, a cancellation is pending."""

    task_id: Id
    """The task."""
    attempt: int = Field(ge=1)
    """The attempt that should stop."""


class DrainNotice(ReplyModel):
    """Core NATS message on `P.host.<host_id>.nudge` (an addition): finish the running work, take no more, exit.

    Sent on the nudge subject, which every host may already receive, so draining needs no new permission;
    an agent that does not know it reads it as a malformed nudge and ignores it.
    """

    drain: Literal[True]
    """Always true: what tells this notice from a nudge."""
    reason: str | None = None
    """The operator's reason."""


class ErrorDetail(ReplyModel):
    """The `error` member of an error reply."""

    code: str
    """Machine code from the protocol's error table (`invalid_request`, `lease_expired`, ...)."""
    message: str
    """Human text."""
    details: dict[str, Any] = Field(default_factory=dict)
    """Code-specific data; `invalid_request` carries `errors: [{path, message}]`."""


class ErrorBody(ReplyModel):
    """Body of every error reply, next to the `Nats-Service-Error*` headers."""

    error: ErrorDetail
    """What went wrong."""
