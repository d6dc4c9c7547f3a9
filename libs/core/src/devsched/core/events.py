"""Domain events: what the control plane tells the world happened, as plain values.

The store records them in its outbox in the transaction of the change that caused them; the scheduler's
relay renders each as the protocol's message (model, subject, message id). Each value's fields are named as
its protocol model's (`event`, not `kind`), so the model is built from the value by name
(`WireModel.from_value`) and its JSON shape (`devsched.core.eventjson`) is the one the outbox keeps.
Nothing of the wire is here, and no clock: `at` and `expires_at` are the database times the store read.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from devsched.core.status import EventKind, TaskStatus


@dataclass(frozen=True, slots=True)
class StepProgress:
    """The step a running attempt reached: its name, and its 0-based position among `of` steps."""

    step: str
    index: int
    of: int


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One event of a task: a change of its state, a cancellation request, or progress.

    `seq` numbers the task's events from 1 in commit order (the task row's counter). Fields that do not
    apply to a kind are None; `progress` is set exactly on `progress` events.

    Raises:
        ValueError: `seq` below 1, or `progress` given to another kind or missing from a `progress` event.
    """

    event: EventKind
    task_id: uuid.UUID
    seq: int
    status: TaskStatus
    at: datetime
    attempt: int | None = None
    host_id: str | None = None
    device_id: str | None = None
    reason: str | None = None
    progress: StepProgress | None = None

    def __post_init__(self) -> None:
        if self.seq < 1:
            raise ValueError(f"event seq counts from 1, got {self.seq}")
        if (self.event is EventKind.PROGRESS) != (self.progress is not None):
            raise ValueError(f"progress is set exactly on progress events, not on {self.event.value!r}")


@dataclass(frozen=True, slots=True)
class AttemptAssigned:
    """A new attempt handed to a host: its lease on one device, and the plan to run there."""

    task_id: uuid.UUID
    attempt: int
    lease_id: uuid.UUID
    host_id: str
    device_id: str
    plan: Mapping[str, Any]
    ttl_s: int
    expires_at: datetime


class DeviceEventKind(StrEnum):
    """What happened to a device's health."""

    QUARANTINED = "device_quarantined"
    """Taken out of service: its infrastructure failures reached the threshold, or a health check failed."""
    RETURNED = "device_returned"
    """Back in service after a quarantine: a health check passed, or an operator returned it."""


class DeviceEventCause(StrEnum):
    """Who or what changed a device's health (`DeviceEvent.by`)."""

    INFRA_FAILURES = "infra_failures"
    """Consecutive infrastructure failures of attempts on it reached the threshold."""
    HEALTH_CHECK = "health_check"
    """A health check on it ended: failed (quarantined) or passed (returned)."""
    OPERATOR = "operator"
    """An operator returned it (`drain --undo` of the device or its host)."""


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """A device quarantined or returned to service, recorded with the change.

    `infra_failures` is the device's count of consecutive infrastructure failures after the change (0 on
    a return); `reason` the quarantine's reason (on a return, the reason of the quarantine lifted).
    """

    event: DeviceEventKind
    device_id: str
    host_id: str
    at: datetime
    by: DeviceEventCause
    infra_failures: int
    reason: str | None = None


#: Every kind of value the outbox holds.
DomainEvent = TaskEvent | AttemptAssigned | DeviceEvent
