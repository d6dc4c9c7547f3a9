"""What operators and clients read: a task with its attempts, a page of tasks, a host with its devices.

These are the one definition of each view's fields. The store builds them from its rows, and the
protocol's reply models (`devsched.protocol.tasks`, `.hosts`) carry the same field names and are built
from them by `WireModel.from_value`, so no layer copies the field lists by hand.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from devsched.core.records import Selector
from devsched.core.status import AttemptStatus, DeviceState, EndReason, TaskKind, TaskStatus


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One attempt of a task, kept for audit after it ends."""

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
    """A task as `P.api.tasks.get` shows it; a listing shows it without attempts."""

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
    #: Attempts its hosts gave back (released); they do not count against `max_attempts`.
    releases: int = 0
    pending_reason: str | None = None
    attempts: tuple[AttemptView, ...] = ()
    #: The retry policy as `RetryPolicy.to_json` writes it; None without one.
    retry: Mapping[str, Any] | None = None
    queue_timeout_s: float | None = None
    attempt_timeout_s: float | None = None
    deadline: datetime | None = None
    #: While a retried task waits out its backoff: when it may run again.
    not_before: datetime | None = None
    #: Its stored artifacts (an addition, issue 12): filled by the scheduler's `get`, not by `get_task`.
    artifacts: tuple[ArtifactView, ...] = ()
    #: `user`, or `health`: a health check the scheduler submitted for `health_device_id` (issue 13).
    kind: TaskKind = TaskKind.USER
    health_device_id: str | None = None


@dataclass(frozen=True, slots=True)
class ArtifactView:
    """A stored artifact: a file one attempt left in its artifacts directory, and where it is kept."""

    attempt: int
    name: str
    step: str
    size: int
    sha256: str
    host_id: str
    stored_at: datetime
    #: Its object in the artifacts bucket.
    object: str


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of a listing; `next` is the cursor of the following page, None on the last."""

    tasks: tuple[TaskView, ...]
    next: str | None


@dataclass(frozen=True, slots=True)
class DeviceView:
    """A device as operators see it (a host listing leaves out `host_id`, which its host gives)."""

    device_id: str
    host_id: str
    labels: Mapping[str, str]
    state: DeviceState
    drained: bool
    drain_reason: str | None
    #: Taken out of service by the scheduler after consecutive infrastructure failures (`core.health`).
    quarantined: bool = False
    quarantine_reason: str | None = None
    quarantined_since: datetime | None = None
    #: Its consecutive infrastructure failures so far.
    infra_failures: int = 0
    #: The labels an operator pinned (`devices.label`); in `labels` too, where they win over the host's.
    operator_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ActionInfo:
    """An action a host advertised: its name and version."""

    name: str
    version: str | None


@dataclass(frozen=True, slots=True)
class HostView:
    """A host and its devices."""

    host_id: str
    online: bool
    last_seen_at: datetime
    agent_version: str | None
    devices: tuple[DeviceView, ...]
    #: What it advertised at its latest registration, built-ins included; empty from an older agent.
    actions: tuple[ActionInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ForgottenDevice:
    """What an operator freed (`devices.forget`): the device, the host it belonged to, and the audit record."""

    device_id: str
    #: The host it belonged to; the next host that registers it owns it.
    host_id: str
    freed_at: datetime
    reason: str
    #: Who asked (there are no identities yet: the endpoint that was called).
    actor: str
    #: The `device_audit` row written in the same transaction.
    audit_id: int


@dataclass(frozen=True, slots=True)
class HealthCheckView:
    """An operator's health check: the plan run on the devices whose labels contain `selector`'s."""

    name: str
    selector: Selector
    plan: Mapping[str, Any]
    #: Seconds between two runs on a device whose check passed.
    interval_s: float
    created_at: datetime
    updated_at: datetime
