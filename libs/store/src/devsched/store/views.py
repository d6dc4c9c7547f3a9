"""What the repository returns: plain values, never ORM rows or open connections."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from devsched.core.events import DomainEvent
from devsched.core.records import Selector
from devsched.core.status import AttemptStatus, DeviceState, EndReason, TaskStatus


@dataclass(frozen=True, slots=True)
class NewTask:
    """A validated submit request."""

    plan: Mapping[str, Any]
    name: str | None = None
    selector: Selector = field(default_factory=Selector)
    priority: int = 0
    max_attempts: int = 3
    lease_ttl_s: int = 30
    idempotency_key: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Submitted:
    """The answer to submit; `created` is False when the idempotency key was seen before."""

    task_id: uuid.UUID
    status: TaskStatus
    created: bool


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A device as a host registers it."""

    device_id: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportReceipt:
    """The answer to a report; a duplicate carries the first report's `recorded_at`."""

    task_id: uuid.UUID
    attempt: int
    status: TaskStatus
    recorded_at: datetime
    duplicate: bool


@dataclass(frozen=True, slots=True)
class CancelReceipt:
    """The answer to cancel; `nudge` names the host and attempt to nudge when a request was recorded."""

    task_id: uuid.UUID
    status: TaskStatus
    cancel_requested: bool
    nudge: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    """One lease the sweeper ended, and what became of its task."""

    task_id: uuid.UUID
    attempt: int
    lease_id: uuid.UUID
    host_id: str
    device_id: str
    task_status: TaskStatus
    reason: str | None


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One attempt as the task view shows it."""

    attempt: int
    lease_id: uuid.UUID
    host_id: str
    device_id: str
    status: AttemptStatus
    assigned_at: datetime
    dispatched_at: datetime | None
    expires_at: datetime
    ended_at: datetime | None
    end_reason: EndReason | None
    progress: Mapping[str, Any] | None
    cancel_requested: bool
    report_reason: str | None
    result: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task as `P.api.tasks.get` shows it (attempts empty in listings)."""

    task_id: uuid.UUID
    name: str | None
    status: TaskStatus
    priority: int
    max_attempts: int
    attempt_count: int
    lease_ttl_s: int
    cancel_requested: bool
    selector: Selector
    plan: Mapping[str, Any]
    metadata: Mapping[str, Any]
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime
    reason: str | None
    result: Mapping[str, Any] | None
    pending_reason: str | None = None
    attempts: tuple[AttemptView, ...] = ()


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of a listing; `next` is the cursor of the following page, None on the last."""

    tasks: tuple[TaskView, ...]
    next: str | None


@dataclass(frozen=True, slots=True)
class DeviceView:
    """A device as operators see it."""

    device_id: str
    host_id: str
    labels: Mapping[str, str]
    state: DeviceState
    drained: bool
    drain_reason: str | None


@dataclass(frozen=True, slots=True)
class HostView:
    """A host and its devices."""

    host_id: str
    online: bool
    last_seen_at: datetime
    agent_version: str | None
    devices: tuple[DeviceView, ...]


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """A domain event committed with the change that caused it, waiting to be published.

    `headers` are the trace context (W3C `traceparent`, `tracestate`) the message is published with.
    """

    id: int
    event: DomainEvent
    headers: Mapping[str, str]
