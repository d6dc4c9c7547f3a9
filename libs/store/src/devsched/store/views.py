"""What the repository takes and returns: plain values, never ORM rows or open connections.

The read views (a task, a page of tasks, a host) are core's (`devsched.core.views`): the protocol's
replies carry the same fields, so they are defined once, below both.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from devsched.core.events import AttemptAssigned, DomainEvent
from devsched.core.limits import LEASE_TTL_DEFAULT_S, MAX_ATTEMPTS_DEFAULT, PRIORITY_DEFAULT
from devsched.core.records import LeaseRef, Selector
from devsched.core.retrying import RetryPolicy
from devsched.core.status import Outcome, TaskStatus


@dataclass(frozen=True, slots=True)
class NewTask:
    """A validated submit request."""

    plan: Mapping[str, Any]
    name: str | None = None
    selector: Selector = field(default_factory=Selector)
    priority: int = PRIORITY_DEFAULT
    max_attempts: int = MAX_ATTEMPTS_DEFAULT
    lease_ttl_s: int = LEASE_TTL_DEFAULT_S
    idempotency_key: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: The retry policy (None: retry as devsched always did) and the time limits (None: none).
    retry: RetryPolicy | None = None
    queue_timeout_s: float | None = None
    attempt_timeout_s: float | None = None
    deadline: datetime | None = None


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
class ActionSpec:
    """An action as a host advertises it: name, version, and the JSON Schema of a plug-in's args."""

    name: str
    version: str | None = None
    args_schema: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Handed:
    """The next attempt a report handed straight to its host, already dispatched (`handover`, `take_next`).

    What an assignment and the grant of its claim would give the host: the host runs it as if it had claimed it.
    """

    task_id: uuid.UUID
    attempt: int
    lease_id: uuid.UUID
    device_id: str
    plan: Mapping[str, Any]
    ttl_s: int
    expires_at: datetime
    cancel_requested: bool = False
    stop: str | None = None


@dataclass(frozen=True, slots=True)
class ReportReceipt:
    """The answer to a report (or a release); a duplicate carries the first one's `recorded_at`."""

    task_id: uuid.UUID
    attempt: int
    status: TaskStatus
    recorded_at: datetime
    duplicate: bool
    #: The attempt handed to the reporting host with the report (`take_next`), for a duplicate too.
    next: Handed | None = None


@dataclass(frozen=True, slots=True)
class HostReport:
    """One report of a host's batch (`Store.reports`): what `Store.report` takes."""

    ref: LeaseRef
    outcome: Outcome
    reason: str | None = None
    result: Mapping[str, Any] | None = None
    take_next: bool = False


#: The answer to a release: the fields of a report's (`status` is the task's after the release).
ReleaseReceipt = ReportReceipt


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
class OutboxMessage:
    """A domain event committed with the change that caused it, waiting to be published.

    `headers` are the trace context (W3C `traceparent`, `tracestate`) the message is published with.
    """

    id: int
    event: DomainEvent
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Committed:
    """What a committed operation leaves its process to do (`Store.on_commit`).

    `messages` are the outbox rows it wrote, to publish now (the relay would otherwise find them later);
    `assignable` says that an assignment pass may find work the operation did not take itself (it queued
    a task or freed a device, and could not place it).
    """

    operation: str
    messages: tuple[OutboxMessage, ...]
    assignable: bool


@dataclass(frozen=True, slots=True)
class Unclaimed:
    """An attempt assigned and not yet claimed, its lease still running: its assignment, to publish again.

    `assignment` is the value the assignment's outbox row held (the same plan, ttl and expiry), `headers`
    the task's trace context, `assigned_at` when the attempt was made.
    """

    assignment: AttemptAssigned
    headers: Mapping[str, str]
    assigned_at: datetime
