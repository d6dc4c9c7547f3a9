"""Value objects: what the rules need to know of the stored rows, and what a host asks."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from devsched.core.retrying import RetryPolicy
from devsched.core.status import AttemptStatus, TaskStatus


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt of a task: a lease on one device of one host."""

    attempt: int
    lease_id: uuid.UUID
    host_id: str
    device_id: str
    status: AttemptStatus
    expires_at: datetime
    dispatched: bool = False
    #: When the attempt started, for its `attempt_timeout_s`: its claim, or its assignment while unclaimed.
    started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task as the rules see it.

    `current` is the attempt numbered `attempt_count` (the newest), if any. `cancel_requested` says
    whether a cancellation request is recorded against that attempt. `releases` counts the attempts its
    hosts gave back (released): they do not spend any of `max_attempts`. `retry` is the task's retry policy
    (None: the behaviour of a task submitted without one), `attempt_timeout_s` and `deadline` its limits.
    """

    task_id: uuid.UUID
    status: TaskStatus
    attempt_count: int
    max_attempts: int
    lease_ttl_s: int
    current: AttemptRecord | None = None
    cancel_requested: bool = False
    releases: int = 0
    retry: RetryPolicy | None = None
    attempt_timeout_s: float | None = None
    deadline: datetime | None = None

    @property
    def attempts_spent(self) -> int:
        """The attempts that count against `max_attempts`: every attempt but the released ones."""
        return self.attempt_count - self.releases


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """What a host names in claim, renew and report: its id (from the subject) and the lease."""

    host_id: str
    task_id: uuid.UUID
    attempt: int
    lease_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Selector:
    """Which devices a task may run on: every label pair must match, and the device id if given."""

    labels: Mapping[str, str] = field(default_factory=dict)
    device_id: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """A device that is free to reserve now (online, in service, out of its grace)."""

    device_id: str
    host_id: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class QueuedTask:
    """A queued task waiting for a device, in the order it should be served."""

    task_id: uuid.UUID
    selector: Selector
    #: The device its last attempt failed on, under a retry policy: taken only when no other match is free.
    avoid_device_id: str | None = None
